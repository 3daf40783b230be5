"""Streamed proposals and the placement of requests on a server's slots (a mixin of
:class:`backends.http_engine.HttpEngine`, whose requests it sends).

A stream yields a proposal's scores chunk by chunk as the server produces them, so the walk
can decide (and reject early) before the proposal ends; a stream that stops at an
end-of-generation token goes on in a second one, and one that leaves a token out is completed
from the whole proposal, fetched unstreamed. Where the dialect keeps a prefix cache per slot
(llama.cpp), every generation request is placed on a slot (:mod:`backends.slots`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from presto_client.backends.adapter import Adapter
from presto_client.backends.parsing import TokenLogprobs
from presto_client.backends.pool import RequestHeaders
from presto_client.backends.slots import SlotPlan
from presto_client.backends.spec import Capabilities, EngineSpec
from presto_client.core.engine_protocol import IntArray, ProposalRequest, ScoredTokens
from presto_client.core.scoring import scored_from_raw
from presto_client.errors import EngineError, EngineUnavailableError

if TYPE_CHECKING:
    from presto_client.backends.transport import Transport

logger = logging.getLogger("presto_client.backends.http_engine")


def _joined(chunks: Sequence[TokenLogprobs]) -> TokenLogprobs:
    out = chunks[0]
    for chunk in chunks[1:]:
        out = out.concat(chunk)
    return out


def _tail(tokens: TokenLogprobs, start: int) -> TokenLogprobs:
    return TokenLogprobs(
        tokens.token_ids[start:],
        tokens.logprobs[start:],
        tokens.top_ids[start:],
        tokens.top_logprobs[start:],
    )


def _generated_after(prefix: Sequence[int], chunks: Sequence[TokenLogprobs]) -> IntArray:
    """What a slot's cache holds after a request: its prefix and the tokens it generated."""
    return np.concatenate([np.asarray(prefix, dtype=np.int64), *(c.token_ids for c in chunks)])


def proposal_label(request: ProposalRequest, index: int | None = None) -> str:
    """A proposal request as error messages name it."""
    where = "" if index is None else f" {index}"
    return (
        f"proposal{where} (seed={request.seed}, {request.num_tokens} tokens at "
        f"τ={request.temperature:g} after {len(request.prefix)} prefix tokens)"
    )


class StreamMixin:
    """Streams and slot placement; the engine provides the transport, the adapter and the
    whole-proposal path."""

    spec: EngineSpec
    adapter: Adapter
    transport: Transport
    name: str
    _model_lock: asyncio.Lock
    _slot_plan: SlotPlan | None
    _slots_read: bool

    if TYPE_CHECKING:  # what the engine provides

        @property
        def capabilities(self) -> Capabilities: ...

        async def model(self) -> str: ...

        async def generate(
            self, requests: Sequence[ProposalRequest], *, headers: RequestHeaders | None = None
        ) -> list[ScoredTokens]: ...

        async def _generate_tokens(
            self,
            request: ProposalRequest,
            model: str,
            label: str,
            headers: RequestHeaders | None,
        ) -> TokenLogprobs: ...

        def _cap(self, tokens: int, top_k: int | None = None) -> int: ...

        def _checked(self, raw: TokenLogprobs, label: str) -> TokenLogprobs: ...

    async def slot_plan(self) -> SlotPlan | None:
        """The placement of requests on the server's slots (read once), where the dialect
        places them (:mod:`backends.slots`); ``None``: the server chooses."""
        if self._slots_read:
            return self._slot_plan
        async with self._model_lock:
            if not self._slots_read:
                path = self.adapter.slots_path
                assert path is not None
                try:
                    body = await self.transport.request_json("GET", path, None, label=path)
                    count = self.adapter.parse_slot_count(body)
                except EngineError as exc:
                    count = None
                    logger.warning("%s: %s unreadable (%s)", self.name, path, exc)
                if count is None:
                    logger.warning(
                        "%s: the server's slot count is unknown; it places requests itself "
                        "(a proposal sent right after an early rejection may prefill its "
                        "prompt on another slot)",
                        self.name,
                    )
                else:
                    self._slot_plan = SlotPlan(count)
                self._slots_read = True
        return self._slot_plan

    async def stream(
        self, request: ProposalRequest, *, headers: RequestHeaders | None = None
    ) -> AsyncGenerator[ScoredTokens, None]:
        """Scores of one proposal, chunk by chunk as the server produces them.

        Raw modes stream over SSE; scaled modes (two calls) and dialects without streaming
        yield the whole proposal as one chunk. Closing the iterator closes the HTTP stream.
        A stream that stops at an end-of-generation token goes on in a second one (the
        adapter's :meth:`~backends.adapter.Adapter.continuation`); one that leaves a token out
        (:meth:`~backends.adapter.Adapter.stream_generated` counts past what came) is closed,
        and the rest comes from the whole proposal, fetched unstreamed.
        """
        label = proposal_label(request)
        model = await self.model()
        if not self.capabilities.streaming:
            (whole,) = await self.generate([request], headers=headers)
            yield whole
            return
        if self.adapter.stream_closes_connection:
            sent = headers if headers is not None else self.transport.headers
            headers = RequestHeaders.of({**sent.plain, "Connection": "close"})
        # Only a dialect whose streams can stop at an EOS or leave a token out pays for
        # watching them (the count and the stop of each batch, the chunks kept).
        watch = self.adapter.stream_reports_progress
        part = request
        received: list[TokenLogprobs] = []  # the chunks so far, for a continuation's prefix
        total = 0
        plan = self._slot_plan if self._slots_read else await self.slot_plan()
        while True:
            gap, stop, taken = False, None, 0
            call = self.adapter.build_generate(part, model, label=label, stream=True)
            slot = plan.take(part.prefix) if plan is not None else None
            if slot is not None:
                call = self.adapter.on_slot(call, slot)
            first = len(received)
            # Events arrive in batches (those completed by one network read), parsed and scored
            # as one chunk: when the client falls behind, its costs per chunk are shared.
            events = self.transport.stream_event_batches(
                call.path,
                call.payload,
                label=label,
                max_bytes=self._cap(part.num_tokens),
                headers=headers,
            )
            try:
                async for batch in events:
                    chunk = self.adapter.parse_stream_events(part, batch, label=label)
                    n = 0 if chunk is None else len(chunk)
                    if watch:
                        stop = self.adapter.stream_stop(batch) or stop
                        generated = self.adapter.stream_generated(batch)
                        if generated is not None and generated > taken + n:
                            gap = True
                            break
                    if chunk is None or n == 0:
                        continue
                    self._checked(chunk, label)
                    taken += n
                    total += n
                    if total > request.num_tokens:
                        raise EngineError(
                            f"{label}: the stream delivered {total} tokens, "
                            f"{request.num_tokens} were requested",
                            engine=self.name,
                        )
                    if watch:
                        received.append(chunk)
                    yield scored_from_raw(chunk, request.scores, self.spec.vocab_size)
            finally:
                await events.aclose()
                if plan is not None and slot is not None:
                    plan.give_back(slot, _generated_after(part.prefix, received[first:]))
            if gap:
                async for rest in self._unstreamed_rest(request, received, model, label, headers):
                    yield rest
                return
            if total == request.num_tokens:
                return
            following = None
            if stop == "eos" and taken:
                following = self.adapter.continuation(request, _joined(received))
            if following is None:
                # A stream that ends short without an error is a connection that went away
                # midway (the server died or restarted): a reader may request it again.
                raise EngineUnavailableError(
                    f"{label}: the stream ended after {total} of {request.num_tokens} tokens "
                    "(the server is unavailable, or dropped the connection)",
                    engine=self.name,
                    retryable=True,
                )
            part = following

    async def _unstreamed_rest(
        self,
        request: ProposalRequest,
        received: Sequence[TokenLogprobs],
        model: str,
        label: str,
        headers: RequestHeaders | None,
    ) -> AsyncGenerator[ScoredTokens, None]:
        """What follows the chunks ``received`` of ``request``, from the whole proposal fetched
        unstreamed as :meth:`generate` fetches it (its seeds give the same tokens, its repairs
        fill what the stream left out)."""
        whole = await self._generate_tokens(request, model, label, headers)
        streamed = _joined(received).token_ids if received else np.zeros(0, dtype=np.int64)
        n = len(streamed)
        if len(whole) < n or not np.array_equal(whole.token_ids[:n], streamed):
            raise EngineError(
                f"{label}: the proposal fetched again after its stream left a token out differs "
                f"from what was streamed; {self.adapter.hint_for_seeds()}",
                engine=self.name,
            )
        rest = _tail(whole, n)
        if len(rest):
            yield scored_from_raw(rest, request.scores, self.spec.vocab_size)
