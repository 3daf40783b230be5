"""An exact reference language model, and an engine serving it in-process.

The model has a handful of tokens and deterministic, context-dependent logits, so that
``π_α`` over short responses can be enumerated exactly. It is the zero-dependency engine of the
fast tests, and the model behind the HTTP emulation servers of the backend tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import numpy as np

from presto_client.engine import (
    FloatArray,
    ProposalRequest,
    ScoredTokens,
    ScoreRequest,
    ScoreSpec,
)
from presto_client.logprob_math import exact_scores, log_softmax, scores_from_topk


class ReferenceModel:
    """A tiny LM: next-token logits are a fixed pseudo-random function of the whole context."""

    def __init__(
        self,
        vocab_size: int = 3,
        *,
        seed: int = 0,
        logit_scale: float = 1.5,
        eos_token_id: int | None = None,
    ) -> None:
        if vocab_size < 2:
            raise ValueError("vocab_size must be at least 2")
        self.vocab_size = vocab_size
        self.seed = seed
        self.logit_scale = logit_scale
        self.eos_token_id = eos_token_id
        self._cache: dict[tuple[int, ...], FloatArray] = {}

    def logprobs(self, context: Sequence[int]) -> FloatArray:
        """Raw ``log p0(· | context)`` over the vocabulary."""
        key = tuple(int(t) for t in context)
        row = self._cache.get(key)
        if row is None:
            # SeedSequence hashes the whole context: the logits depend on every token of it.
            rng = np.random.default_rng(
                np.random.SeedSequence(self.seed, spawn_key=(len(key), *key))
            )
            row = log_softmax(rng.normal(scale=self.logit_scale, size=self.vocab_size))[0]
            self._cache[key] = row
        return row

    def sample(
        self, prefix: Sequence[int], num_tokens: int, temperature: float, seed: int
    ) -> tuple[list[int], FloatArray]:
        """Sample ``num_tokens`` at ``temperature`` (deterministic in ``seed``).

        Returns the ids and the ``[n, V]`` raw logprob rows of the positions they were drawn at.
        """
        rng = np.random.default_rng(seed)
        context = list(prefix)
        ids: list[int] = []
        rows = np.empty((num_tokens, self.vocab_size))
        for i in range(num_tokens):
            row = self.logprobs(context)
            rows[i] = row
            q = np.exp(log_softmax(row / temperature)[0])
            drawn = int(np.searchsorted(np.cumsum(q), rng.random(), side="right"))
            token = min(drawn, len(q) - 1)  # guards the rounding of the last cumulative sum
            ids.append(token)
            context.append(token)
        return ids, rows

    def rows(self, prefix: Sequence[int], token_ids: Sequence[int]) -> FloatArray:
        """The ``[n, V]`` raw logprob rows at each position of ``token_ids`` after ``prefix``."""
        context = list(prefix)
        out = np.empty((len(token_ids), self.vocab_size))
        for i, token in enumerate(token_ids):
            out[i] = self.logprobs(context)
            context.append(int(token))
        return out

    def sequence_logp0(self, prefix: Sequence[int], token_ids: Sequence[int]) -> float:
        rows = self.rows(prefix, token_ids)
        return float(rows[np.arange(len(token_ids)), np.asarray(token_ids, dtype=np.int64)].sum())


class ReferenceEngine:
    """:class:`~presto_client.engine.Engine` over a :class:`ReferenceModel`, in-process.

    With ``top_k`` set it behaves like a one-call HTTP engine that only returns the raw top-K
    logprobs: ``log q`` comes back as a certified interval, and :meth:`score` tightens it.
    Counters let tests check how many calls and requests a runner made.
    """

    def __init__(self, model: ReferenceModel, *, top_k: int | None = None, name: str = "reference"):
        self.model = model
        self.top_k = top_k
        self.name = name
        self.generate_calls = 0
        self.score_calls = 0
        self.requests_served = 0

    def _scored(self, ids: Sequence[int], rows: FloatArray, spec: ScoreSpec) -> ScoredTokens:
        logp0, logq, entropy = exact_scores(ids, rows, spec.temperatures)
        if self.top_k is None or self.top_k >= self.model.vocab_size:
            return ScoredTokens.exact(ids, logp0, logq, entropy if spec.entropy else None)
        top = -np.sort(-rows, axis=1)[:, : self.top_k]
        derived = scores_from_topk(logp0, top, spec.temperatures, self.model.vocab_size)
        return ScoredTokens(
            token_ids=np.asarray(ids, dtype=np.int64),
            logp0=logp0,
            logq_lo=derived.logq_lo,
            logq_hi=derived.logq_hi,
            entropy=derived.entropy if spec.entropy else None,
        )

    def _generate_one(self, request: ProposalRequest) -> ScoredTokens:
        ids, rows = self.model.sample(
            request.prefix, request.num_tokens, request.temperature, request.seed
        )
        return self._scored(ids, rows, request.scores)

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        self.generate_calls += 1
        self.requests_served += len(requests)
        return [self._generate_one(r) for r in requests]

    async def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        whole = self._generate_one(request)
        for i in range(len(whole)):
            await asyncio.sleep(0)
            yield whole.slice(i, i + 1)

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoredTokens]:
        self.score_calls += 1
        out = []
        for r in requests:
            rows = self.model.rows(r.prefix, r.token_ids)
            logp0, logq, entropy = exact_scores(r.token_ids, rows, r.scores.temperatures)
            out.append(ScoredTokens.exact(r.token_ids, logp0, logq, entropy))
        return out

    async def aclose(self) -> None:
        return None
