"""An exact reference language model, and an engine serving it in-process.

The model has a handful of tokens and deterministic, context-dependent logits, so that
``π_α`` over short responses can be enumerated exactly. It is the zero-dependency engine of the
fast tests, and the model behind the HTTP emulation servers of the backend tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import numpy as np

from presto_client.core.engine_protocol import (
    Engine,
    FloatArray,
    ProposalRequest,
    ScoredTokens,
    ScoreRequest,
    ScoreSpec,
)
from presto_client.core.logprob_math import exact_scores, log_softmax, scores_from_topk


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
        self._seed_words: np.ndarray | None = None

    def logprobs(self, context: Sequence[int]) -> FloatArray:
        """Raw ``log p0(· | context)`` over the vocabulary."""
        key = tuple(map(int, context))
        row = self._cache.get(key)
        if row is None:
            # SeedSequence hashes the whole context: the logits depend on every token of it.
            rng = np.random.default_rng(self._seed_sequence(key))
            row = log_softmax(rng.normal(scale=self.logit_scale, size=self.vocab_size))[0]
            self._cache[key] = row
        return row

    def trim_cache(self, max_rows: int) -> None:
        """Forget the cached rows once there are more than ``max_rows`` (long-running servers)."""
        if len(self._cache) > max_rows:
            self._cache.clear()

    def _seed_sequence(self, key: tuple[int, ...]) -> np.random.SeedSequence:
        """``SeedSequence(seed, spawn_key=(len(key), *key))``, built without its slow path.

        NumPy coerces a ``spawn_key`` tuple element by element in Python (~1 µs per token, the
        bulk of a row's cost on long contexts); its assembled entropy is the seed's 32-bit words
        zero-padded to the pool size, then the spawn key's words, so passing that array as the
        entropy gives the same pool, hence the same stream. Keys with an element outside
        ``[0, 2**32)`` (several words, or invalid) take NumPy's own path.
        """
        if self._seed_words is None:
            seed, words = int(self.seed), []
            if seed < 0:
                raise ValueError("the reference model's seed must be non-negative")
            while True:
                words.append(seed & 0xFFFFFFFF)
                seed >>= 32
                if seed == 0:
                    break
            pool = np.random.SeedSequence().pool_size
            self._seed_words = np.array(words + [0] * (pool - len(words)), dtype=np.uint32)
        try:
            tokens = np.fromiter(key, dtype=np.int64, count=len(key))
        except OverflowError:
            tokens = None
        if tokens is None or (tokens.size and (tokens.min() < 0 or tokens.max() > 0xFFFFFFFF)):
            return np.random.SeedSequence(self.seed, spawn_key=(len(key), *key))
        entropy = np.concatenate(
            [self._seed_words, np.array([len(key)], dtype=np.uint32), tokens.astype(np.uint32)]
        )
        return np.random.SeedSequence(entropy)

    def sample(
        self, prefix: Sequence[int], num_tokens: int, temperature: float, seed: int
    ) -> tuple[list[int], FloatArray]:
        """Sample ``num_tokens`` at ``temperature`` (deterministic in ``seed``).

        Returns the ids and the ``[n, V]`` raw logprob rows of the positions they were drawn at.
        """
        ids: list[int] = []
        rows = np.empty((num_tokens, self.vocab_size))
        for i, (token, row) in enumerate(self.iter_sample(prefix, num_tokens, temperature, seed)):
            rows[i] = row
            ids.append(token)
        return ids, rows

    def iter_sample(
        self, prefix: Sequence[int], num_tokens: int, temperature: float, seed: int
    ) -> Iterator[tuple[int, FloatArray]]:
        """:meth:`sample` one token at a time: ``(token, raw row it was drawn from)``."""
        rng = np.random.default_rng(seed)
        context = list(prefix)
        for _ in range(num_tokens):
            row = self.logprobs(context)
            if temperature == 0.0:  # greedy (the `greedy` baseline arm), as engines do
                token = int(np.argmax(row))
                context.append(token)
                yield token, row
                continue
            q = np.exp(log_softmax(row / temperature)[0])
            drawn = int(np.searchsorted(np.cumsum(q), rng.random(), side="right"))
            token = min(drawn, len(q) - 1)  # guards the rounding of the last cumulative sum
            context.append(token)
            yield token, row

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
    """The :class:`~presto_client.core.engine_protocol.Engine` of a :class:`ReferenceModel`.

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


class SimulatedLatencyEngine:
    """The reference engine with a simulated serving time (demos of speedups without a server).

    A call of a batch costs ``latency_s + token_latency_s × (longest request)``, like a batched
    server where a call costs about its longest suffix.
    """

    def __init__(self, inner: Engine, latency_s: float, token_latency_s: float) -> None:
        self.inner = inner
        self.name = inner.name
        self.latency_s = latency_s
        self.token_latency_s = token_latency_s

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        longest = max((r.num_tokens for r in requests), default=0)
        await asyncio.sleep(self.latency_s + self.token_latency_s * longest)
        return await self.inner.generate(requests)

    def stream(self, request: ProposalRequest) -> Any:
        return self.inner.stream(request)

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoredTokens]:
        await asyncio.sleep(self.latency_s)
        return await self.inner.score(requests)

    async def aclose(self) -> None:
        await self.inner.aclose()
