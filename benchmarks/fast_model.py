"""Reference models for timing runs: O(1) rows per token, and an EOS whose hazard is set.

:class:`~presto_client.core.reference.ReferenceModel` hashes the whole context for every row (its
logits depend on every token), which costs O(context) per generated token: at ``T = 1024`` the
latency server's worker thread cannot keep up with a GPU-speed step clock on a 2-core machine,
and the run then measures this machine's CPU instead of the cost model (``starved_share``).

:class:`WindowedReferenceModel` draws its rows from a fixed table of ``rows`` log-softmaxed normal
logit vectors (the reference model's row law), picked by a hash of the position and the last
``memory`` tokens: a finite-memory language model. Same row law, same sampling and rendering
through the emulation, but a row is one table lookup. Only timing runs use it (``--model
windowed``); the exactness tests and the latency server's default keep the reference model.

:class:`EosHazard` gives either model an end: one token (the EOS) whose logit in every row is set
so that its probability *at the proposal temperature* ``τ`` is exactly ``hazard``, whatever the
context (the other tokens keep their relative probabilities). Sampling at ``τ`` then ends an
answer at each position with probability ``hazard``, independently of what came before, so the
first EOS's position ``L`` (1-based) is geometric: ``P(L > n) = (1 − hazard)^n``, median
``≈ ln 2 / hazard``. :meth:`EosHazard.from_median` picks the hazard for a median; with a median of
a third of the budget, ``(1/2)^3 = 12.5 %`` of answers run past it (the issue-36 job: median 1024
of 3072). The rows stay a deterministic function of the context (the model's seed and the
hazard), so everything the emulation serves is as exact as without it; the engines ignore EOS
(fixed-length proposals, as the method asks), only the client's stop rule reads it. Off by
default: without an :class:`EosHazard` both models are exactly what they were.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from presto_client.core.engine_protocol import FloatArray
from presto_client.core.logprob_math import log_softmax
from presto_client.core.reference import ReferenceModel


@dataclass(frozen=True, slots=True)
class EosHazard:
    """Token ``token_id`` has probability ``hazard`` at temperature ``temperature`` in every row."""

    token_id: int
    hazard: float
    temperature: float = 0.25

    def __post_init__(self) -> None:
        if not 0.0 < self.hazard < 1.0:
            raise ValueError(f"the EOS hazard must lie in (0, 1), got {self.hazard}")
        if not self.temperature > 0.0:
            raise ValueError(f"the EOS temperature must be positive, got {self.temperature}")
        if self.token_id < 0:
            raise ValueError(f"the EOS token id must be non-negative, got {self.token_id}")

    @classmethod
    def from_median(cls, token_id: int, median: float, temperature: float = 0.25) -> EosHazard:
        """The hazard whose geometric answer length has median ``median`` tokens."""
        if not median > 0:
            raise ValueError(f"the median answer length must be positive, got {median}")
        return cls(token_id, -math.expm1(-math.log(2.0) / median), temperature)

    def survival(self, n: int) -> float:
        """``P(L > n)``: no EOS among the first ``n`` tokens sampled at ``temperature``."""
        return (1.0 - self.hazard) ** n

    def median(self) -> float:
        """The (continuous) median of the answer length: ``ln 2 / −ln(1 − hazard)``."""
        return math.log(2.0) / -math.log1p(-self.hazard)

    def apply(self, rows: FloatArray) -> FloatArray:
        """Rows (``[V]`` or ``[n, V]`` raw logprobs) with the EOS logit set, renormalised.

        With ``S = logsumexp_{w ≠ eos}(row_w / τ)``, the EOS logit ``τ·(S + logit(hazard))``
        makes ``softmax(row / τ)[eos] = hazard`` exactly.
        """
        x = np.array(rows, dtype=np.float64, ndmin=2)
        if not 0 <= self.token_id < x.shape[1]:
            raise ValueError(f"EOS token {self.token_id} is outside the vocabulary of {x.shape[1]}")
        scaled = x / self.temperature
        scaled[:, self.token_id] = -np.inf
        top = scaled.max(axis=1, keepdims=True)
        others = top[:, 0] + np.log(np.exp(scaled - top).sum(axis=1))
        x[:, self.token_id] = self.temperature * (
            others + math.log(self.hazard) - math.log1p(-self.hazard)
        )
        out = log_softmax(x)
        return out if np.ndim(rows) == 2 else out[0]


class EosReferenceModel(ReferenceModel):
    """The reference model (rows hashed from the whole context) with an :class:`EosHazard`."""

    def __init__(
        self, vocab_size: int, eos: EosHazard, *, seed: int = 0, logit_scale: float = 1.5
    ) -> None:
        super().__init__(vocab_size, seed=seed, logit_scale=logit_scale, eos_token_id=eos.token_id)
        self.eos = eos
        eos.apply(np.zeros(vocab_size))  # checks the token id against the vocabulary

    def logprobs(self, context: Sequence[int]) -> FloatArray:
        key = tuple(map(int, context))
        row = self._cache.get(key)
        if row is None:  # the base caches its row under the key: replaced at once
            row = self.eos.apply(super().logprobs(context))
            self._cache[key] = row
        return row


class WindowedReferenceModel(ReferenceModel):
    """Rows from a table indexed by ``hash(position, last memory tokens)``."""

    def __init__(
        self,
        vocab_size: int,
        *,
        seed: int = 0,
        logit_scale: float = 1.5,
        memory: int = 8,
        rows: int = 1 << 14,
        eos: EosHazard | None = None,
    ) -> None:
        super().__init__(
            vocab_size,
            seed=seed,
            logit_scale=logit_scale,
            eos_token_id=None if eos is None else eos.token_id,
        )
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x5EED,)))
        self._table = log_softmax(rng.normal(scale=logit_scale, size=(rows, vocab_size)))
        if eos is not None:
            self._table = eos.apply(self._table)
        self.eos = eos
        self._memory = memory
        self._rows: list[FloatArray] = list(self._table)
        """The table's rows as lasting objects: a row's identity names it (servers' memos)."""
        self._cumulative: dict[tuple[int, float], FloatArray] = {}

    def _index(self, context: Sequence[int]) -> int:
        # Python's hash of a tuple of ints is deterministic (no per-process salt for ints).
        return hash((len(context), *context[-self._memory :])) % len(self._rows)

    def logprobs(self, context: Sequence[int]) -> FloatArray:
        return self._rows[self._index(context)]

    def iter_sample(
        self, prefix: Sequence[int], num_tokens: int, temperature: float, seed: int
    ) -> Iterator[tuple[int, FloatArray]]:
        """:meth:`ReferenceModel.iter_sample`'s tokens (the same arithmetic, the same draws),
        with each row's cumulative ``q_τ`` computed once per temperature."""
        if temperature == 0.0:
            yield from super().iter_sample(prefix, num_tokens, temperature, seed)
            return
        rng = np.random.default_rng(seed)
        context = list(prefix)
        for _ in range(num_tokens):
            index = self._index(context)
            row = self._rows[index]
            cumulative = self._cumulative.get((index, temperature))
            if cumulative is None:
                q = np.exp(log_softmax(row / temperature)[0])
                cumulative = self._cumulative[index, temperature] = np.cumsum(q)
            drawn = int(np.searchsorted(cumulative, rng.random(), side="right"))
            token = min(drawn, len(cumulative) - 1)
            context.append(token)
            yield token, row

    def trim_cache(self, max_rows: int) -> None:
        return None


def make_model(
    kind: str, vocab_size: int, *, seed: int = 0, eos: EosHazard | None = None
) -> ReferenceModel | None:
    """The latency server's model: ``windowed`` or ``reference`` (``None``: the emulation's own,
    the reference model without an EOS)."""
    if kind == "windowed":
        return WindowedReferenceModel(vocab_size, seed=seed, eos=eos)
    if kind != "reference":
        raise ValueError(f"unknown model {kind!r}; valid models are: reference, windowed")
    return None if eos is None else EosReferenceModel(vocab_size, eos, seed=seed)
