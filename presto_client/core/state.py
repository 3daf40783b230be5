"""The state of one chain: prompt, response tokens and their per-token scores."""

from __future__ import annotations

from dataclasses import dataclass

from presto_client.core.engine_protocol import ScoredTokens


@dataclass(frozen=True, slots=True)
class ChainState:
    """An immutable chain state. Scores are those recorded when each token was generated.

    States are values: splicing returns a new state, so a prefetch tree can hold the states of
    many nodes at once without copying bookkeeping.
    """

    prompt: tuple[int, ...]
    response: ScoredTokens

    @property
    def length(self) -> int:
        return len(self.response)

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(int(t) for t in self.response.token_ids)

    def prefix(self, cut: int) -> tuple[int, ...]:
        """Prompt plus the first ``cut`` response tokens: the context of a proposal at ``cut``."""
        return self.prompt + tuple(int(t) for t in self.response.token_ids[:cut])

    def splice(self, cut: int, suffix: ScoredTokens) -> ChainState:
        """The state whose first ``cut`` tokens are ours and the rest is ``suffix``."""
        if cut + len(suffix) != self.length:
            raise ValueError(
                f"suffix of {len(suffix)} tokens at cut {cut} does not fill length {self.length}"
            )
        return ChainState(self.prompt, self.response.slice(0, cut).concat(suffix))

    def extend(self, block: ScoredTokens) -> ChainState:
        return ChainState(self.prompt, self.response.concat(block))

    def with_response(self, response: ScoredTokens) -> ChainState:
        return ChainState(self.prompt, response)
