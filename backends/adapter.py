"""The adapter contract: one serving dialect as *pure* functions.

An adapter is a set of request builders (plain objects in, an :class:`HttpCall` out) and
response parsers (a decoded JSON body in, a
:class:`~presto_client.core.scoring.TokenLogprobs` out, built with the toolkit of
:mod:`backends.parsing`). It never opens a socket;
:class:`~backends.http_engine.HttpEngine` sends what it builds over the shared
:class:`~backends.transport.Transport` and turns what it parses into scores
(:mod:`presto_client.core.scoring`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from presto_client.backends.parsing import TokenLogprobs
from presto_client.backends.spec import Capabilities, EngineSpec
from presto_client.core.engine_protocol import ProposalRequest
from presto_client.errors import ConfigError, InvalidResponseError

RAW = "raw"
SCALED = "scaled"


@dataclass(frozen=True, slots=True)
class HttpCall:
    """One HTTP request an adapter wants sent: ``POST path`` with a JSON ``payload``."""

    path: str
    payload: dict[str, Any]
    label: str
    """Names the request in error messages (e.g. ``proposal seed=7, 16 tokens``)."""
    stream: bool = False


@dataclass(slots=True)
class ParsedModels:
    names: list[str] = field(default_factory=list)
    max_model_len: int | None = None


class Adapter:
    """Base class of a dialect: pure builders and parsers plus what the dialect can do.

    Subclasses set the class attributes and implement the ``build_*``/``parse_*`` methods.
    ``build_score`` / ``parse_score`` (raw logprobs of given tokens) are needed for scaled
    semantics (two-call mode), for the start-up probe and for :meth:`Engine.score`.
    """

    dialect: ClassVar[str] = ""
    modes: ClassVar[tuple[str, ...]] = (RAW,)
    default_mode: ClassVar[str] = RAW
    health_path: ClassVar[str] = "/health"
    models_path: ClassVar[str] = "/v1/models"
    metrics_path: ClassVar[str] = "/metrics"
    metric_names: ClassVar[tuple[str, str] | None] = None
    """Prometheus names of the prefix-cache (queries, hits) token counters."""
    metric_queries_exclude_hits: ClassVar[bool] = False
    """The 'queries' counter leaves out the cached tokens (``queries = it + hits``)."""
    streaming: ClassVar[bool] = False
    stream_reports_progress: ClassVar[bool] = False
    """Its streams can stop at an end-of-generation token or leave a token out, and say so
    (:meth:`stream_stop`, :meth:`stream_generated`): the engine watches every batch."""
    stream_closes_connection: ClassVar[bool] = False
    """The server closes its connection after a streamed answer although it announced
    keep-alive: streams then ask for ``Connection: close``, so no request is written into a
    connection already closed (and retried)."""
    max_top_k: ClassVar[int | None] = None
    slots_path: ClassVar[str | None] = None
    """Where the server says how many slots (each with its own prefix cache) it has; set for
    a dialect whose requests the client places on slots (:mod:`backends.slots`)."""
    start_hint: ClassVar[str] = ""
    """How to start this dialect's server (for 'unreachable' messages)."""

    def __init__(self, spec: EngineSpec) -> None:
        mode = spec.logprob_mode
        if mode == "auto":
            mode = self.default_mode
        if mode not in self.modes:
            raise ConfigError(
                f"logprob_mode {spec.logprob_mode!r} is not valid for backend "
                f"{self.dialect!r}; valid modes are: auto, {', '.join(self.modes)}"
            )
        if spec.top_k < 1:
            raise ConfigError(f"top_k must be >= 1, got {spec.top_k}")
        self.spec = spec
        self.mode = mode

    # ---- what the dialect can do

    @property
    def semantics(self) -> str:
        """``"raw"``: generation logprobs are ``log p0``; ``"scaled"``: exact ``log q_τ``."""
        return RAW

    def capabilities(
        self, *, seeds_honoured: bool | None = None, scoring_call: bool | None = None
    ) -> Capabilities:
        scaled = self.semantics == SCALED
        return Capabilities(
            dialect=self.dialect,
            logprob_mode=self.mode,
            logprob_semantics=self.semantics,
            exact_logq=scaled,
            calls_per_proposal=2 if scaled else 1,
            seeds_honoured=seeds_honoured,
            scoring_call=self.can_score if scoring_call is None else scoring_call,
            streaming=self.streaming and not scaled,
            max_top_k=self.max_top_k,
            metrics=self.metric_names or (),
        )

    @property
    def can_score(self) -> bool:
        return False

    # ---- builders and parsers (pure)

    def build_generate(
        self, request: ProposalRequest, model: str, *, label: str, stream: bool = False
    ) -> HttpCall:
        raise NotImplementedError

    def parse_generate(self, request: ProposalRequest, body: Any, *, label: str) -> TokenLogprobs:
        raise NotImplementedError

    def parse_stream_event(
        self, request: ProposalRequest, event: Any, *, label: str
    ) -> TokenLogprobs | None:
        raise NotImplementedError

    def parse_stream_events(
        self, request: ProposalRequest, events: Sequence[Any], *, label: str
    ) -> TokenLogprobs | None:
        """The tokens of consecutive stream events (those of one network read) as one chunk:
        a client that falls behind pays the per-chunk costs once per read, not per event."""
        out: TokenLogprobs | None = None
        for event in events:
            chunk = self.parse_stream_event(request, event, label=label)
            if chunk is None or len(chunk) == 0:
                continue
            out = chunk if out is None else out.concat(chunk)
        return out

    def parse_slot_count(self, body: Any) -> int | None:
        """The server's slot count from the answer of :attr:`slots_path` (``None``: unknown)."""
        return None

    def on_slot(self, call: HttpCall, slot: int) -> HttpCall:
        """``call`` sent to the server's slot ``slot``."""
        raise NotImplementedError(f"the {self.dialect} dialect does not place requests on slots")

    def stream_generated(self, events: Sequence[Any]) -> int | None:
        """How many tokens the generation had produced at the last of ``events`` that says so,
        for a dialect whose stream can leave a token out (``None``: the dialect never does)."""
        return None

    def stream_stop(self, events: Sequence[Any]) -> str | None:
        """Why the generation ended, when ``events`` hold its last event and the dialect says
        (an ``"eos"`` stop lets :meth:`continuation` ask for the rest)."""
        return None

    def build_score(
        self, prefix: Sequence[int], token_ids: Sequence[int], model: str, top_k: int, *, label: str
    ) -> HttpCall:
        """Raw (temperature-1) logprobs of ``token_ids`` after ``prefix``, with top-``top_k``
        (``top_k == -1``: the whole vocabulary)."""
        raise NotImplementedError

    def parse_score(
        self, prefix: Sequence[int], token_ids: Sequence[int], body: Any, top_k: int, *, label: str
    ) -> TokenLogprobs:
        raise NotImplementedError

    def build_score_calls(
        self, prefix: Sequence[int], token_ids: Sequence[int], model: str, top_k: int, *, label: str
    ) -> list[HttpCall]:
        """The calls of one scoring (:meth:`build_score`'s one call, unless a dialect needs
        several, e.g. one per position)."""
        return [self.build_score(prefix, token_ids, model, top_k, label=label)]

    def parse_score_bodies(
        self,
        prefix: Sequence[int],
        token_ids: Sequence[int],
        bodies: Sequence[Any],
        top_k: int,
        *,
        label: str,
    ) -> TokenLogprobs:
        """The answers of :meth:`build_score_calls`' calls, in order, as one record."""
        return self.parse_score(prefix, token_ids, bodies[0], top_k, label=label)

    def repair_calls(self, request: ProposalRequest, body: Any, *, label: str) -> list[HttpCall]:
        """Calls that fetch what a generation answer lacks (none: the answer is whole)."""
        return []

    def parse_generate_with(
        self, request: ProposalRequest, body: Any, repairs: Sequence[Any], *, label: str
    ) -> TokenLogprobs:
        """:meth:`parse_generate`, completed by the answers of :meth:`repair_calls`."""
        return self.parse_generate(request, body, label=label)

    def continuation(self, request: ProposalRequest, got: TokenLogprobs) -> ProposalRequest | None:
        """The request for the rest of ``request`` when an answer legitimately brought fewer
        tokens (``got``, all received so far); ``None``: a short answer is an error (the
        parsers of most dialects refuse it already)."""
        return None

    def build_next_token_topk(
        self, contexts: Sequence[Sequence[int]], temperature: float, model: str, *, label: str
    ) -> list[HttpCall]:
        """Calls returning the top-K at ``temperature`` of the next token after each context."""
        raise NotImplementedError

    def parse_next_token_topk(
        self, calls: Sequence[HttpCall], bodies: Sequence[Any], n: int, *, label: str
    ) -> TokenLogprobs:
        raise NotImplementedError

    def parse_models(self, body: Any) -> ParsedModels:
        """Served model names from the models endpoint."""
        names: list[str] = []
        max_len: int | None = None
        if isinstance(body, dict):
            for entry in body.get("data") or []:
                if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                    names.append(entry["id"])
                    if max_len is None and isinstance(entry.get("max_model_len"), int):
                        max_len = entry["max_model_len"]
        return ParsedModels(names, max_len)

    # ---- the tokenizer (text prompts in, response text out): builders and parsers (pure)

    tokenize_paths: ClassVar[tuple[str, ...]] = ("/tokenize", "/v1/tokenize")
    """Tokenizer endpoints, tried in order: vLLM's (the embedded engine serves them too; SGLang
    serves the same shape on recent versions — *check*)."""
    detokenize_paths: ClassVar[tuple[str, ...]] = ("/detokenize", "/v1/detokenize")

    def build_tokenize(
        self,
        text: str,
        model: str | None,
        *,
        chat_template: bool = False,
        system_prompt: str | None = None,
    ) -> list[HttpCall]:
        """Calls that tokenize ``text`` (as a user turn through the model's chat template when
        ``chat_template``), one per endpoint to try, in order."""
        if chat_template:
            messages = [{"role": "user", "content": text}]
            if system_prompt is not None:
                messages.insert(0, {"role": "system", "content": system_prompt})
            return self.build_tokenize_messages(messages, model)
        payload: dict[str, Any] = {"prompt": text, "add_special_tokens": True}
        if model is not None:
            payload = {"model": model, **payload}
        return [HttpCall(path, payload, "tokenize") for path in self.tokenize_paths]

    def build_tokenize_messages(
        self,
        messages: Sequence[Mapping[str, str]],
        model: str | None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[HttpCall]:
        """Calls that tokenize a conversation (``role``/``content`` turns) through the model's
        chat template, ending with the prompt for the assistant's next turn (or, with
        ``add_generation_prompt=False``, with the last turn closed; with
        ``continue_final_message``, with the last turn left open: vLLM's fields)."""
        payload: dict[str, Any] = {
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
        }
        if continue_final_message:
            payload["continue_final_message"] = True
        if model is not None:
            payload = {"model": model, **payload}
        return [HttpCall(path, payload, "tokenize") for path in self.tokenize_paths]

    def tokenize_next(self, body: Any) -> list[HttpCall] | None:
        """Calls to send next with a tokenizer answer that is not the token ids yet (a chat
        template's text, say), one per endpoint to try; ``None``: ``body`` is the answer."""
        return None

    def parse_tokenize(self, body: Any) -> tuple[int, ...]:
        """The token ids of a tokenize answer (``{"tokens": [...]}``)."""
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise InvalidResponseError(
                f"/tokenize answered without a token list: {str(body)[:200]}"
            )
        if not tokens:
            raise InvalidResponseError("a prompt tokenized to zero tokens")
        return tuple(tokens)

    def build_detokenize(self, token_ids: Sequence[int], model: str | None) -> list[HttpCall]:
        """Calls that turn ``token_ids`` into text, one per endpoint to try, in order."""
        payload: dict[str, Any] = {"tokens": [int(t) for t in token_ids]}
        if model is not None:
            payload = {"model": model, **payload}
        return [HttpCall(path, payload, "detokenize") for path in self.detokenize_paths]

    def parse_detokenize(self, body: Any) -> str | None:
        """The text of a detokenize answer (``prompt`` or ``text``); ``None`` without one."""
        text = body.get("prompt", body.get("text")) if isinstance(body, dict) else None
        return text if isinstance(text, str) else None

    def full_vocab_top_k(self) -> int | None:
        """What to send as top-K to get the whole vocabulary (``None``: not possible)."""
        return None

    def hint_for_semantics(self, detected: str) -> str:
        """The fix to suggest when the server's logprob semantics are not the configured ones."""
        return ""

    def hint_for_seeds(self) -> str:
        return ""

    def hint_for_scoring(self) -> str:
        return ""
