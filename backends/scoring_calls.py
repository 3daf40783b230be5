"""The scoring calls of one HTTP replica: top-K logprobs of given tokens after a prefix (the
raw scoring call a scaled mode's proposal and the probe make), and exact scores of given tokens
(``Engine.score``).

:class:`Scoring` is a composed part of :class:`presto_client.backends.http_engine.HttpEngine`: it
sends its requests over the engine's transport, asks the engine only for the served model's name,
and turns exact scoring off in the :class:`~presto_client.backends.http_probe.ServerFindings` it
shares with the engine when the server refuses a full-vocabulary score.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from presto_client.backends.adapter import SCALED, Adapter, HttpCall, ScoringCalls
from presto_client.backends.generation import answer_cap
from presto_client.backends.http_probe import ServerFindings
from presto_client.backends.parsing import TokenLogprobs, check_token_ids
from presto_client.backends.pool import RequestHeaders
from presto_client.backends.spec import EngineSpec
from presto_client.backends.transport import Transport
from presto_client.concurrency import gather_or_fail
from presto_client.core.engine_protocol import ScoredTokens, ScoreRequest
from presto_client.core.scoring import exact_from_full_rows, exact_from_normalisers
from presto_client.errors import EngineRequestError


class Scoring:
    """The scoring calls of one replica (raw top-K and exact scores); the engine owns it."""

    def __init__(
        self,
        spec: EngineSpec,
        adapter: Adapter,
        transport: Transport,
        *,
        name: str,
        findings: ServerFindings,
        model: Callable[[], Awaitable[str]],
    ) -> None:
        self.spec = spec
        self.adapter = adapter
        self.transport = transport
        self.name = name
        self.findings = findings
        self._model = model
        """The served model's name (the engine discovers it once)."""

    def _part(self) -> ScoringCalls:
        """The dialect's scoring part (an error naming the fix where it has none)."""
        scoring = self.adapter.scoring
        if scoring is None:
            raise EngineRequestError(
                f"this dialect has no scoring call: {self.adapter.hint_for_scoring()}",
                engine=self.name,
            )
        return scoring

    async def raw(
        self,
        prefix: Sequence[int],
        token_ids: Sequence[int],
        model: str,
        label: str,
        top_k: int | None = None,
        headers: RequestHeaders | None = None,
    ) -> TokenLogprobs:
        """Top-K logprobs (``top_k``, default the spec's; ``-1``: the full vocabulary) of
        ``token_ids`` after ``prefix``, by the dialect's scoring calls."""
        k = self.spec.top_k if top_k is None else top_k
        slabel = f"scoring of {label}"
        scoring = self._part()
        calls = scoring.build_score_calls(prefix, token_ids, model, k, label=slabel)
        cap = answer_cap(self.spec, len(prefix) + len(token_ids), k)

        async def answer(index: int, call: HttpCall) -> Any:
            body = await self.transport.request_json(
                "POST", call.path, call.payload, label=call.label, max_bytes=cap, headers=headers
            )
            return scoring.read_score_body(body, index, k, label=slabel)

        bodies = await gather_or_fail([answer(i, c) for i, c in enumerate(calls)])
        parsed = scoring.parse_score_bodies(prefix, token_ids, bodies, k, label=slabel)
        return check_token_ids(parsed, self.spec.vocab_size, label=slabel, engine=self.name)

    async def exact(
        self, requests: Sequence[ScoreRequest], *, headers: RequestHeaders | None = None
    ) -> list[ScoredTokens]:
        """Exact ``log q`` (``lo == hi``) of given tokens under every temperature asked.

        Scaled modes: a raw scoring call plus, per temperature ≠ 1, one batched request of
        next-token top-K at that temperature (exact normalisers). Raw modes: full-vocabulary
        prompt logprobs (vLLM needs ``--max-logprobs -1``); otherwise a clear error.
        """
        if not requests:
            return []
        if self.findings.scoring_ok is False or self.adapter.scoring is None:
            raise EngineRequestError(
                f"exact scoring is not available: {self.adapter.hint_for_scoring()}",
                engine=self.name,
            )
        model = await self._model()
        return await gather_or_fail(
            [
                self._exact_one(r, model, f"score request {i}", headers)
                for i, r in enumerate(requests)
            ]
        )

    async def _exact_one(
        self, request: ScoreRequest, model: str, label: str, headers: RequestHeaders | None
    ) -> ScoredTokens:
        if not request.token_ids:
            return ScoredTokens.empty(len(request.scores.temperatures), request.scores.entropy)
        if self.adapter.semantics == SCALED:
            raw = await self.raw(request.prefix, request.token_ids, model, label, headers=headers)
            contexts = [
                (*request.prefix, *request.token_ids[:i]) for i in range(len(request.token_ids))
            ]
            temps = [t for t in request.scores.temperatures if not math.isclose(t, 1.0)]
            rows = await gather_or_fail(
                [self._next_token_topk(contexts, t, model, label, headers) for t in temps]
            )
            return exact_from_normalisers(
                raw, dict(zip(temps, rows, strict=True)), request.scores, label=label
            )
        full_k = self._part().full_vocab_top_k()
        vocab = self.spec.vocab_size
        if full_k is None:
            raise EngineRequestError(
                f"{label}: exact scoring is not available: {self.adapter.hint_for_scoring()}",
                engine=self.name,
            )
        try:
            raw = await self.raw(
                request.prefix, request.token_ids, model, label, full_k, headers=headers
            )
        except EngineRequestError as exc:
            self.findings.scoring_ok = False
            raise EngineRequestError(
                f"{exc}. {self.adapter.hint_for_scoring()}", engine=self.name
            ) from exc
        if vocab is None:
            vocab = int(np.max(raw.top_ids)) + 1 if raw.top_ids.size else 0
            vocab = max(vocab, int(raw.top_ids.shape[1]))
        # (in a thread: over whole rows it is 0.2 s for 32 positions, numpy's, off the loop)
        return await asyncio.to_thread(
            exact_from_full_rows, request.token_ids, raw, request.scores, vocab
        )

    async def _next_token_topk(
        self,
        contexts: Sequence[Sequence[int]],
        temperature: float,
        model: str,
        label: str,
        headers: RequestHeaders | None,
    ) -> TokenLogprobs:
        nlabel = f"normalisers at τ={temperature:g} for {label}"
        scoring = self._part()
        calls = scoring.build_next_token_topk(contexts, temperature, model, label=nlabel)
        send = self.transport.request_json
        bodies = await gather_or_fail(
            [send("POST", c.path, c.payload, label=nlabel, headers=headers) for c in calls]
        )
        return scoring.parse_next_token_topk(calls, bodies, len(contexts), label=nlabel)
