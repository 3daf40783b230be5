"""The generation protocol of one replica: how a proposal's tokens come out of the dialect, by
one loop for the whole (unstreamed) and the streamed path alike.

A proposal is filled part by part, each part one generation request:

* **placement**: where the dialect keeps one prefix cache per server slot (llama.cpp), each
  request goes to the slot the client chooses (:mod:`presto_client.backends.slots`; read once from
  the dialect's ``traits.slots_path`` by its slots part), and the slot is given back as soon as
  its answer is in;
* **repair**: a whole answer may lack what a dialect leaves out (llama.cpp sends no
  probabilities for a token whose text ends inside a UTF-8 character): the dialect's
  repairs (:meth:`~presto_client.backends.adapter.AnswerRepairs.repair_calls`) fetch it before the
  answer is parsed; a stream that leaves such a token out
  (:meth:`~presto_client.backends.adapter.AnswerRepairs.stream_generated` counts past what came) is
  closed, and the rest comes from the whole proposal, fetched unstreamed and repaired (its seed
  gives the same tokens);
* **continuation**: a part that ends legitimately short (an end-of-generation token sampled,
  which llama.cpp cannot sample through without changing the law) goes on in a next part, the
  dialect's :meth:`~presto_client.backends.adapter.AnswerRepairs.continuation`; any other short part
  is an error;
* **retries** are the transport's: each request is retried there, never a part here (a
  streamed part that ends early is a connection that went away, marked retryable for the
  walk).

A streamed chunk is scored here as it comes (streams are raw modes only); a whole proposal's
tokens go back to the engine, which scores them (in scaled modes after its scoring call).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import numpy as np

from presto_client.backends.adapter import Adapter, HttpCall
from presto_client.backends.completions import top_values_of_rows
from presto_client.backends.parsing import TokenLogprobs, check_token_ids
from presto_client.backends.pool import RequestHeaders
from presto_client.backends.slots import SlotPlan
from presto_client.backends.spec import EngineSpec
from presto_client.backends.stream_scoring import StreamScorer
from presto_client.backends.transport import Transport, response_cap
from presto_client.concurrency import gather_or_fail
from presto_client.core.engine_protocol import IntArray, ProposalRequest, ScoredTokens, ScoreSpec
from presto_client.core.scoring import scored_from_raw, scored_from_top_values
from presto_client.errors import EngineError, EngineUnavailableError, InvalidResponseError

# The engine's logger: what a user filters on is the engine, not the module of its loop.
logger = logging.getLogger("presto_client.backends.http_engine")

Out = TypeVar("Out")


def proposal_label(request: ProposalRequest, index: int | None = None) -> str:
    """A proposal request as error messages name it."""
    where = "" if index is None else f" {index}"
    return (
        f"proposal{where} (seed={request.seed}, {request.num_tokens} tokens at "
        f"τ={request.temperature:g} after {len(request.prefix)} prefix tokens)"
    )


def answer_cap(spec: EngineSpec, tokens: int, top_k: int | None = None) -> int:
    """The size cap of an answer carrying ``tokens`` tokens' top-K logprobs (a full
    vocabulary's, ``top_k == -1``, counted at the known vocabulary size)."""
    k = spec.top_k if top_k is None else top_k
    if k < 0:
        k = spec.vocab_size or 0
    return response_cap(spec.max_response_mb, tokens, k)


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


def _answer_tokens(prefix: Sequence[int], body: Any) -> Sequence[int]:
    """What a slot's cache holds after a whole answer: the prefix and the answer's ``tokens``
    (where it lists them)."""
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
        return [*prefix, *tokens]
    return prefix


def _generated_after(prefix: Sequence[int], chunks: Sequence[TokenLogprobs]) -> IntArray:
    """What a slot's cache holds after a stream: its prefix and the tokens it generated."""
    return np.concatenate([np.asarray(prefix, dtype=np.int64), *(c.token_ids for c in chunks)])


def _as_tokens(chunk: TokenLogprobs) -> TokenLogprobs:
    return chunk


class Generation:
    """The generation protocol of one replica: a proposal's tokens, whole or streamed, through
    one loop (placement, repair, continuation). The engine owns it."""

    def __init__(
        self,
        spec: EngineSpec,
        adapter: Adapter,
        transport: Transport,
        name: str,
        model: Callable[[], Awaitable[str]],
    ) -> None:
        self.spec = spec
        self.adapter = adapter
        self.transport = transport
        self.name = name
        self._model = model
        """The served model's name (the engine discovers it once)."""
        self._slot_plan: SlotPlan | None = None
        self._slot_free: asyncio.Semaphore | None = None
        """Free slots, where the client places requests: a request waits here for one, not in
        the server's queue (where its wait would count against its timeout, and a timeout
        retried would queue it again behind the same work)."""
        # The optional parts, looked up once: ``None`` where the dialect has none.
        self._slots = adapter.slots if adapter.traits.slots_path is not None else None
        self._fixes = adapter.repairs
        self._slots_read = self._slots is None
        self._slots_lock = asyncio.Lock()
        # Only a dialect whose streams can stop at an EOS or leave a token out pays for
        # watching them (the count and the stop of each batch, the chunks kept).
        self._watch = adapter.traits.stream_reports_progress and self._fixes is not None
        self.scorer = StreamScorer(spec.top_k)
        """Streamed chunks scored together (its counts: how many a pass took)."""

    async def slot_plan(self) -> SlotPlan | None:
        """The placement of requests on the server's slots (read once), where the dialect
        places them (:mod:`presto_client.backends.slots`); ``None``: the server chooses."""
        if self._slots_read:
            return self._slot_plan
        async with self._slots_lock:
            if not self._slots_read:
                path, slots = self.adapter.traits.slots_path, self._slots
                assert path is not None and slots is not None
                try:
                    body = await self.transport.request_json("GET", path, None, label=path)
                    count = slots.parse_slot_count(body)
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
                    self._slot_free = asyncio.Semaphore(count)
                self._slots_read = True
        return self._slot_plan

    # ---- the two paths

    async def whole(
        self, request: ProposalRequest, label: str, headers: RequestHeaders | None
    ) -> TokenLogprobs:
        """The proposal's tokens, every part fetched whole."""
        fill = self._fill(request, label, headers, _as_tokens, stream=False)
        return _joined([chunk async for chunk in fill])

    async def whole_scored(
        self, request: ProposalRequest, label: str, headers: RequestHeaders | None
    ) -> ScoredTokens:
        """:meth:`whole` scored from raw logprobs (``scored_from_raw``). Where the answer is one
        part in vLLM's shape, from its rows' values alone, as streamed chunks are
        (:func:`~presto_client.backends.completions.top_values_of_rows`: no id of a row parsed,
        the scores bit-identical, what it takes the full parse takes); anything else through
        the full parse, whose checks raise the precise error."""
        scores = request.scores
        if self._fixes is not None:  # (repairs and continuations: the whole loop)
            parsed = await self.whole(request, label, headers)
            return scored_from_raw(parsed, scores, self.spec.vocab_size)
        model = await self._model()
        plan = self._slot_plan if self._slots_read else await self.slot_plan()
        body = await self._whole_body(request, model, label, headers, plan)
        vocab = self.spec.vocab_size  # (as known when the answer came: it may be learnt meanwhile)
        choices = body.get("choices") if isinstance(body, dict) else None
        choice = self.adapter.stream_choice([body]) if type(choices) is list else None
        if choice is not None and len(choices) == 1:
            ids = choice["token_ids"]
            if len(ids) == request.num_tokens:
                rows = choice["logprobs"]
                keys = self.scorer.keys
                fast = top_values_of_rows(
                    ids, rows["token_logprobs"], rows["top_logprobs"], self.spec.top_k, keys, vocab
                )
                if fast is not None:
                    return scored_from_top_values(*fast, scores, vocab)
        parsed = await self._parsed(request, body, label, headers)
        if len(parsed) < request.num_tokens:
            raise self._short(request, len(parsed), label, stream=False)
        return scored_from_raw(parsed, scores, vocab)

    def stream(
        self, request: ProposalRequest, headers: RequestHeaders | None
    ) -> AsyncGenerator[ScoredTokens, None]:
        """The proposal's scores (raw modes), chunk by chunk as the server produces them;
        closing the iterator closes the HTTP stream."""
        if self.adapter.traits.stream_closes_connection:
            sent = headers if headers is not None else self.transport.headers
            headers = RequestHeaders.of({**sent.plain, "Connection": "close"})
        scores, vocab = request.scores, self.spec.vocab_size

        def scored(chunk: TokenLogprobs) -> ScoredTokens:
            return scored_from_raw(chunk, scores, vocab)

        return self._fill(
            request, proposal_label(request), headers, scored, stream=True, scores=scores
        )

    # ---- the one loop

    async def _fill(
        self,
        request: ProposalRequest,
        label: str,
        headers: RequestHeaders | None,
        out: Callable[[TokenLogprobs], Out],
        *,
        stream: bool,
        scores: ScoreSpec | None = None,
    ) -> AsyncGenerator[Out, None]:
        """The tokens of ``request`` as they come, part by part (the module's protocol), each
        chunk handed out as ``out(chunk)`` (streamed chunks with ``scores``: scored with the
        other streams' chunks of the same loop turn, where the dialect allows,
        :mod:`presto_client.backends.stream_scoring`; ``out`` is then ``scored_from_raw`` with
        ``scores``).

        A streamed part is received here, not in a generator of its own: its loop runs once
        per network read, the client's hottest path, and every generator level costs there.
        """
        model = await self._model()
        plan = self._slot_plan if self._slots_read else await self.slot_plan()
        adapter, vocab, watch = self.adapter, self.spec.vocab_size, self._watch
        fixes = self._fixes
        # Chunks scored together need none of the watch's per-chunk records.
        scorer = self.scorer if scores is not None and not watch else None
        received: list[TokenLogprobs] = []  # the chunks kept: a continuation's prefix
        total = 0
        part = request
        while True:
            if not stream:
                answer = await self._whole_part(part, model, label, headers, plan)
                received.append(answer)
                total += len(answer)
                yield out(answer)
                # A whole answer its parser accepted short stopped legitimately (at an EOS).
                taken, may_continue, gap = len(answer), True, False
            else:
                taken, stop, gap = 0, None, False
                events, slot = await self._open_part(part, model, label, headers, plan)
                first = len(received)
                try:
                    async for batch in events:
                        ready: Out | None = None
                        if scorer is not None and scores is not None:
                            choice = adapter.stream_choice(batch)
                            if choice is not None:
                                if not choice["token_ids"]:
                                    continue
                                ready = cast(Out | None, await scorer.score(choice, scores, vocab))
                        if ready is None:
                            chunk = adapter.parse_stream_events(part, batch, label=label)
                            n = 0 if chunk is None else len(chunk)
                            if watch and fixes is not None:
                                stop = fixes.stream_stop(batch) or stop
                                generated = fixes.stream_generated(batch)
                                if generated is not None and generated > taken + n:
                                    gap = True
                                    break
                            if chunk is None or n == 0:
                                continue
                            check_token_ids(chunk, vocab, label=label, engine=self.name)
                            if watch:
                                received.append(chunk)
                            ready = out(chunk)
                        else:
                            n = len(cast(ScoredTokens, ready))
                        taken += n
                        total += n
                        if total > request.num_tokens:
                            raise EngineError(
                                f"{label}: the stream delivered {total} tokens, "
                                f"{request.num_tokens} were requested",
                                engine=self.name,
                            )
                        yield ready
                finally:
                    await events.aclose()
                    if plan is not None and slot is not None:
                        plan.give_back(slot, _generated_after(part.prefix, received[first:]))
                    self._slot_freed()
                may_continue = stop == "eos"
            if gap:
                rest = await self._unstreamed_rest(request, received, label, headers)
                if len(rest):
                    yield out(rest)
                return
            if total >= request.num_tokens:
                return
            following = None
            if taken and may_continue and fixes is not None:
                following = fixes.continuation(request, _joined(received))
            if following is None:
                raise self._short(request, total, label, stream=stream)
            part = following

    async def _open_part(
        self,
        part: ProposalRequest,
        model: str,
        label: str,
        headers: RequestHeaders | None,
        plan: SlotPlan | None,
    ) -> tuple[AsyncGenerator[list[Any], None], int | None]:
        """A streamed part's events, placed on a slot (and the slot, to give back; the caller
        gives it back and calls :meth:`_slot_freed`)."""
        await self._slot_wait()
        try:
            call, slot = self._placed(part, model, label, plan, stream=True)
        except BaseException:
            self._slot_freed()
            raise
        # Events arrive in batches (those completed by one network read), parsed and scored as
        # one chunk: when the client falls behind, its costs per chunk are shared.
        events = self.transport.stream_event_batches(
            call.path,
            call.payload,
            label=label,
            max_bytes=answer_cap(self.spec, part.num_tokens),
            headers=headers,
        )
        return events, slot

    def _placed(
        self, part: ProposalRequest, model: str, label: str, plan: SlotPlan | None, *, stream: bool
    ) -> tuple[HttpCall, int | None]:
        """A part's generation call, on the slot the plan takes for it (where there is one)."""
        call = self.adapter.build_generate(part, model, label=label, stream=stream)
        slot = plan.take(part.prefix) if plan is not None else None
        return (call if slot is None else self._on_slot(call, slot)), slot

    async def _slot_wait(self) -> None:
        """Wait for a free slot, where the client places requests (:attr:`_slot_free`)."""
        if self._slot_free is not None:
            await self._slot_free.acquire()

    def _slot_freed(self) -> None:
        if self._slot_free is not None:
            self._slot_free.release()

    def _short(
        self, request: ProposalRequest, total: int, label: str, *, stream: bool
    ) -> EngineError:
        """The error of a proposal that ended after ``total`` tokens with no way to go on."""
        if stream:
            # A stream that ends short without an error is a connection that went away
            # midway (the server died or restarted): a reader may request it again.
            return EngineUnavailableError(
                f"{label}: the stream ended after {total} of {request.num_tokens} tokens "
                "(the server is unavailable, or dropped the connection)",
                engine=self.name,
                retryable=True,
            )
        return InvalidResponseError(
            f"{label}: the engine returned {total} of {request.num_tokens} tokens",
            engine=self.name,
        )

    async def _whole_part(
        self,
        part: ProposalRequest,
        model: str,
        label: str,
        headers: RequestHeaders | None,
        plan: SlotPlan | None,
    ) -> TokenLogprobs:
        """One part fetched whole, placed on a slot and repaired."""
        body = await self._whole_body(part, model, label, headers, plan)
        return await self._parsed(part, body, label, headers)

    async def _parsed(
        self, part: ProposalRequest, body: Any, label: str, headers: RequestHeaders | None
    ) -> TokenLogprobs:
        """A whole part's answer parsed (repaired where the dialect repairs) and its ids
        checked."""
        repairs = self._fixes
        if repairs is None:
            parsed = self.adapter.parse_generate(part, body, label=label)
        else:
            fixes = repairs.repair_calls(part, body, label=label)
            extra = await self._repairs(fixes, headers) if fixes else []
            parsed = repairs.parse_generate_with(part, body, extra, label=label)
        return check_token_ids(parsed, self.spec.vocab_size, label=label, engine=self.name)

    async def _whole_body(
        self,
        part: ProposalRequest,
        model: str,
        label: str,
        headers: RequestHeaders | None,
        plan: SlotPlan | None,
    ) -> Any:
        """One part's answer, fetched whole on the slot the plan takes for it."""
        await self._slot_wait()
        body = None
        slot = None
        try:
            call, slot = self._placed(part, model, label, plan, stream=False)
            body = await self.transport.request_json(
                "POST",
                call.path,
                call.payload,
                label=label,
                max_bytes=answer_cap(self.spec, part.num_tokens),
                headers=headers,
            )
        finally:
            # Given back before the repairs: they are not placed, and another proposal may
            # want this slot's cache now.
            if plan is not None and slot is not None:
                plan.give_back(slot, _answer_tokens(part.prefix, body))
            self._slot_freed()
        return body

    def _on_slot(self, call: HttpCall, slot: int) -> HttpCall:
        # A slot is taken only from a plan, and a plan is made only with a slots part.
        assert self._slots is not None
        return self._slots.on_slot(call, slot)

    async def _repairs(
        self, fixes: Sequence[HttpCall], headers: RequestHeaders | None
    ) -> list[Any]:
        assert self._fixes is not None  # (repair calls come from the repairs part)
        read = self._fixes.read_repair_body

        async def answer(call: HttpCall) -> Any:
            body = await self.transport.request_json(
                "POST",
                call.path,
                call.payload,
                label=call.label,
                max_bytes=answer_cap(self.spec, 1, -1),
                headers=headers,
            )
            return read(body, label=call.label)

        return await gather_or_fail([answer(c) for c in fixes])

    async def _unstreamed_rest(
        self,
        request: ProposalRequest,
        received: Sequence[TokenLogprobs],
        label: str,
        headers: RequestHeaders | None,
    ) -> TokenLogprobs:
        """What follows the chunks ``received`` of ``request``, from the whole proposal fetched
        unstreamed as :meth:`whole` fetches it (its seeds give the same tokens, its repairs
        fill what the stream left out)."""
        whole = await self.whole(request, label, headers)
        streamed = _joined(received).token_ids if received else np.zeros(0, dtype=np.int64)
        n = len(streamed)
        if len(whole) < n or not np.array_equal(whole.token_ids[:n], streamed):
            raise EngineError(
                f"{label}: the proposal fetched again after its stream left a token out "
                f"differs from what was streamed; {self.adapter.hint_for_seeds()}",
                engine=self.name,
            )
        return _tail(whole, n)
