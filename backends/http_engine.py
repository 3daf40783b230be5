"""The HTTP engine: drives one dialect's pure adapter over the shared transport.

``generate`` sends one HTTP request per proposal (each with its own seed), concurrently, and
in scaled modes a scoring call per proposal after it; ``stream`` yields a proposal's scores as
server-sent events arrive (raw modes); both fill a proposal through the dialect's generation
protocol (:mod:`presto_client.backends.generation`: slots, repairs, continuations); ``score``
returns exact scores of given tokens (:mod:`presto_client.backends.scoring_calls`, which also makes
a scaled mode's scoring call); ``probe`` checks health, model and logprob semantics before a job
(:mod:`presto_client.backends.http_probe`); ``metrics`` reads the prefix-cache counters. Each of
those three parts is an object the engine owns, sharing its transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from presto_client.backends.adapter import RAW, Adapter, HttpCall, TokenizerCalls
from presto_client.backends.generation import Generation, proposal_label
from presto_client.backends.http_probe import Probe, ServerFindings
from presto_client.backends.metrics import prefix_cache_metrics
from presto_client.backends.parsing import TokenLogprobs
from presto_client.backends.pool import Pool, RequestHeaders
from presto_client.backends.retry import Sleep
from presto_client.backends.routing import RoutedEngine
from presto_client.backends.scoring_calls import Scoring
from presto_client.backends.spec import Capabilities, EngineSpec, ProbeReport
from presto_client.backends.transport import Transport
from presto_client.concurrency import gather_or_fail
from presto_client.core.engine_protocol import (
    ProposalRequest,
    ScoredTokens,
    ScoreRequest,
)
from presto_client.core.scoring import (
    scored_from_scaled,
)
from presto_client.errors import EngineError, EngineRequestError, InvalidResponseError
from presto_client.urls import redact_url

logger = logging.getLogger(__name__)

_MODEL_LISTINGS = (
    ("/v1/models", "an OpenAI-compatible server (kind: vllm, or openai)"),
    ("/get_model_info", "an SGLang server (kind: sglang)"),
)
"""The model listings that tell the built-in dialects apart when the configured one fails."""


class HttpEngine:
    """:class:`~presto_client.core.engine_protocol.Engine` over one replica of an HTTP server."""

    def __init__(
        self,
        spec: EngineSpec,
        adapter: Adapter,
        *,
        replica: int = 0,
        pool: Pool | None = None,
        sleep: Sleep | None = None,
    ) -> None:
        self.spec = spec
        self.adapter = adapter
        self.replica = replica
        self.base_url = redact_url(spec.base_urls[replica])
        """The replica's URL as shown in messages (credentials redacted)."""
        self.name = spec.display_name(replica)
        self.transport = Transport(
            spec.base_urls[replica],
            engine_name=self.name,
            max_concurrency=spec.max_concurrency,
            request_timeout_s=spec.request_timeout_s,
            connect_timeout_s=spec.connect_timeout_s,
            max_retries=spec.max_retries,
            restart_window_s=spec.restart_window_s,
            request_deadline_s=spec.request_deadline_s,
            max_response_mb=spec.max_response_mb,
            api_key=spec.api_key,
            pool=pool,
            sleep=sleep,
            start_hint=adapter.traits.start_hint,
        )
        self._model: str | None = spec.model
        self._model_lock = asyncio.Lock()
        self.findings = ServerFindings()
        """What the probe (and a refused exact score) found out about the server."""
        self.generation = Generation(spec, adapter, self.transport, self.name, self.model)
        """How a proposal's tokens come out of the dialect (whole and streamed)."""
        self.scoring = Scoring(
            spec, adapter, self.transport, name=self.name, findings=self.findings, model=self.model
        )
        """The scoring calls: raw top-K of given tokens, and exact scores (:meth:`score`)."""
        self.probing = Probe(
            spec,
            adapter,
            self.transport,
            name=self.name,
            base_url=self.base_url,
            findings=self.findings,
            served_models=self._served_models,
            settle_model=self._settle_model,
            score_raw=self.scoring.raw,
        )
        """The start-up checks of this replica (:meth:`probe`)."""
        # Whether proposals stream is the dialect's and its mode's, fixed here: every stream
        # asks, and building the capabilities each time is a cost per proposal.
        self._streams = adapter.capabilities().streaming
        self.max_model_len: int | None = None
        """The server's context length, where ``/v1/models`` gives it (read with the model)."""

    # ---- properties

    @property
    def capabilities(self) -> Capabilities:
        return self.adapter.capabilities(
            seeds_honoured=self.findings.seeds_honoured, scoring_call=self.findings.scoring_ok
        )

    @property
    def last_probe(self) -> ProbeReport | None:
        """The latest probe's report (kept also when it failed on its problems)."""
        return self.probing.last_report

    @property
    def top_k(self) -> int:
        return self.spec.top_k

    @property
    def max_concurrency(self) -> int:
        """Requests this replica serves at once (the transport's bound)."""
        return self.spec.max_concurrency

    async def model(self) -> str:
        """The served model name (discovered once when the spec does not give it)."""
        if self._model is not None:
            return self._model
        async with self._model_lock:
            if self._model is None:
                names = await self._served_models()
                if not names:
                    raise EngineError(
                        f"{self.base_url}{self.adapter.traits.models_path} lists no model",
                        engine=self.name,
                    )
                self._model = names[0]
        return self._model

    async def _settle_model(self, names: Sequence[str]) -> str:
        """The model to use once the server listed ``names``: the known one, else the first."""
        if self._model is None and names:
            self._model = names[0]
        return await self.model()

    async def _served_models(self) -> list[str]:
        try:
            body = await self.transport.request_json(
                "GET", self.adapter.traits.models_path, label="model discovery"
            )
        except EngineRequestError as exc:
            other = await self._other_dialect()
            if other is None:
                raise
            raise EngineRequestError(
                f"{exc.detail}; but {self.base_url}{other[0]} answers: this looks like {other[1]}, "
                "not the configured kind: fix `kind` in the engine config",
                engine=self.name,
            ) from exc
        parsed = self.adapter.parse_models(body)
        if parsed.max_model_len is not None:
            self.max_model_len = parsed.max_model_len
        return parsed.names

    async def _other_dialect(self) -> tuple[str, str] | None:
        """Which other dialect's model listing this server answers (only on a failure path:
        one GET each), as ``(path, dialect in words)``."""
        for path, dialect in _MODEL_LISTINGS:
            if path == self.adapter.traits.models_path:
                continue
            try:
                if await self.transport.get_status(path) == 200:
                    return path, dialect
            except EngineError:
                continue
        return None

    async def identity(self) -> dict[str, Any]:
        """What the run directory records of this server, so that a resume cannot mix engines:
        the resolved model, the logprob mode, ``max_model_len`` and the server's version (each
        ``None`` where the server does not tell)."""
        model = await self.model()
        if self.max_model_len is None:
            with contextlib.suppress(EngineError):
                await self._served_models()
        return {
            "model": model,
            "logprob_mode": self.adapter.mode,
            "max_model_len": self.max_model_len,
            "version": await self._server_version(),
        }

    async def _server_version(self) -> str | None:
        """``GET /version`` (vLLM), one attempt; ``None`` when the server has no such route."""
        try:
            if await self.transport.get_status("/version") != 200:
                return None
            body = await self.transport.request_json("GET", "/version", label="version")
        except EngineError:
            return None
        version = body.get("version") if isinstance(body, dict) else None
        return str(version) if version is not None else None

    # ---- a chain's view

    def routed(self, key: str) -> HttpEngine | RoutedEngine:
        """A chain's view sending ``routing_key_header: key`` (without the header: itself)."""
        header = self.spec.routing_key_header
        if header is None:
            return self
        return RoutedEngine(self, key, self.transport.with_header(header, key))

    # ---- generate

    async def generate(
        self, requests: Sequence[ProposalRequest], *, headers: RequestHeaders | None = None
    ) -> list[ScoredTokens]:
        model = await self.model() if requests else ""
        return await gather_or_fail(
            [
                self._generate_one(r, model, proposal_label(r, i), headers)
                for i, r in enumerate(requests)
            ]
        )

    async def _generate_one(
        self, request: ProposalRequest, model: str, label: str, headers: RequestHeaders | None
    ) -> ScoredTokens:
        if self.adapter.semantics == RAW:
            return await self.generation.whole_scored(request, label, headers)
        generated = await self.generation.whole(request, label, headers)
        raw = await self._score_raw(
            request.prefix, generated.token_ids.tolist(), model, label, headers=headers
        )
        return scored_from_scaled(
            generated, request.temperature, raw, request.scores, self.spec.vocab_size
        )

    def stream(
        self, request: ProposalRequest, *, headers: RequestHeaders | None = None
    ) -> AsyncGenerator[ScoredTokens, None]:
        """Scores of one proposal, chunk by chunk as the server produces them.

        Raw modes stream over SSE (:meth:`Generation.stream`: a stream stopped at an
        end-of-generation token goes on in a second one, one that leaves a token out is
        completed from the whole proposal); scaled modes (two calls) and dialects without
        streaming yield the whole proposal as one chunk. Closing the iterator closes the HTTP
        stream.
        """
        if not self._streams:
            return self._in_one_chunk(request, headers)
        # The protocol's own generator, not one wrapped around it: a level per chunk costs.
        return self.generation.stream(request, headers)

    async def _in_one_chunk(
        self, request: ProposalRequest, headers: RequestHeaders | None
    ) -> AsyncGenerator[ScoredTokens, None]:
        (whole,) = await self.generate([request], headers=headers)
        yield whole

    async def _score_raw(
        self,
        prefix: Sequence[int],
        token_ids: Sequence[int],
        model: str,
        label: str,
        top_k: int | None = None,
        headers: RequestHeaders | None = None,
    ) -> TokenLogprobs:
        """Top-K logprobs of given tokens after a prefix (:meth:`Scoring.raw`)."""
        return await self.scoring.raw(prefix, token_ids, model, label, top_k, headers)

    # ---- exact scores

    async def score(
        self, requests: Sequence[ScoreRequest], *, headers: RequestHeaders | None = None
    ) -> list[ScoredTokens]:
        """Exact ``log q`` (``lo == hi``) of given tokens under every temperature asked
        (:meth:`Scoring.exact`: where the server cannot, a clear error)."""
        return await self.scoring.exact(requests, headers=headers)

    # ---- metrics

    async def metrics(self) -> dict[str, float]:
        """Prefix-cache counters (``prefix_cache_queries``, ``prefix_cache_hits``, tokens)."""
        if self.adapter.traits.metric_names is None:
            return {}
        text = await self.transport.get_text(self.adapter.traits.metrics_path, label="metrics")
        return prefix_cache_metrics(
            text,
            self.adapter.traits.metric_names,
            queries_exclude_hits=self.adapter.traits.metric_queries_exclude_hits,
        )

    # ---- probe

    async def probe(self, *, check_seeds: bool = True, check_scoring: bool = True) -> ProbeReport:
        """Health, model name, logprob semantics (and seeds, exact scoring) of this replica.

        Raises :class:`EngineUnavailableError` when the server cannot be reached or is not
        healthy, :class:`ProbeError` when it serves another model or its logprob semantics are
        not the configured mode (:meth:`Probe.run`).
        """
        return await self.probing.run(check_seeds=check_seeds, check_scoring=check_scoring)

    # ---- the tokenizer

    async def tokenize(
        self, text: str, *, chat_template: bool = False, system_prompt: str | None = None
    ) -> tuple[int, ...]:
        """Token ids of ``text`` under the served model's tokenizer (optionally as a chat turn)."""
        tokenizer = self._tokenizer()
        calls = tokenizer.build_tokenize(
            text, await self.model(), chat_template=chat_template, system_prompt=system_prompt
        )
        body = await self._tokenizer_answer(calls)
        try:
            return tokenizer.parse_tokenize(body)
        except InvalidResponseError as exc:
            raise InvalidResponseError(str(exc), engine=self.name) from None

    async def stated_eos_token_id(self) -> int | None:
        """The EOS the server states for its model, where its dialect can ask (llama.cpp:
        ``/props``' EOS text, tokenized as one special token); ``None`` where it cannot."""
        adapter = self.adapter
        parse = getattr(adapter, "parse_eos_text", None)
        build = getattr(adapter, "build_tokenize_special", None)
        if parse is None or build is None:
            return None
        text = parse(await self.transport.request_json("GET", "/props", None, label="/props"))
        if text is None:
            return None
        call = build(text)
        body = await self.transport.request_json("POST", call.path, call.payload, label=call.label)
        ids = self._tokenizer().parse_tokenize(body)
        return ids[0] if len(ids) == 1 else None

    async def tokenize_messages(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> tuple[int, ...]:
        """Token ids of a conversation through the served model's chat template (by default
        ending with the prompt for the assistant's next turn)."""
        tokenizer = self._tokenizer()
        calls = tokenizer.build_tokenize_messages(
            messages,
            await self.model(),
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
        )
        body = await self._tokenizer_answer(calls)
        try:
            return tokenizer.parse_tokenize(body)
        except InvalidResponseError as exc:
            raise InvalidResponseError(str(exc), engine=self.name) from None

    async def _tokenizer_answer(self, calls: Sequence[HttpCall]) -> Any:
        tokenizer = self._tokenizer()
        body = await self._first_answer(calls, "tokenize", "give prompts.token_ids, or use")
        while (following := tokenizer.tokenize_next(body)) is not None:
            body = await self._first_answer(following, "tokenize", "give prompts.token_ids, or use")
        return body

    def _tokenizer(self) -> TokenizerCalls:
        tokenizer = self.adapter.tokenizer
        if tokenizer is None:
            raise EngineRequestError(
                f"the {self.adapter.traits.dialect} dialect has no tokenizer calls: give "
                "prompts.token_ids",
                engine=self.name,
            )
        return tokenizer

    async def detokenize(self, token_ids: Sequence[int]) -> str | None:
        """The text of ``token_ids`` (``None`` when the server's answer has none)."""
        tokenizer = self._tokenizer()
        calls = tokenizer.build_detokenize(token_ids, await self.model())
        return tokenizer.parse_detokenize(
            await self._first_answer(calls, "detokenize", "responses need")
        )

    async def _first_answer(self, calls: Sequence[HttpCall], label: str, fix: str) -> Any:
        """The answer of the first call the server accepts (a 404 on one path: the next)."""
        last: EngineRequestError | None = None
        for call in calls:
            try:
                return await self.transport.request_json(
                    "POST", call.path, call.payload, label=label
                )
            except EngineRequestError as exc:
                last = exc
        assert last is not None
        paths = " or ".join(c.path for c in calls)
        raise EngineRequestError(  # every path rejected: asking again will not help
            f"the server cannot {label} ({last}); {fix} a server with a {paths} endpoint",
            engine=self.name,
        )

    # ---- lifecycle

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def __aenter__(self) -> HttpEngine:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
