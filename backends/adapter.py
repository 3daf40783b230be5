"""The adapter contract: one serving dialect as *pure* functions, a small core plus optional parts.

An adapter is a set of request builders (plain objects in, an :class:`HttpCall` out) and
response parsers (a decoded JSON body in, a
:class:`~presto_client.core.scoring.TokenLogprobs` out, built with the toolkit of
:mod:`presto_client.backends.parsing`). It never opens a socket;
:class:`~presto_client.backends.http_engine.HttpEngine` sends what it builds over the shared
:class:`~presto_client.backends.transport.Transport` and turns what it parses into scores
(:mod:`presto_client.core.scoring`).

The core a dialect must write is close to lm-eval's ``TemplateAPI``: its :class:`DialectTraits`
(what the server is: name, paths, counters, limits), :meth:`Adapter.build_generate`,
:meth:`Adapter.parse_generate` and, if it streams, :meth:`Adapter.parse_stream_event`. What only
some servers can do is an optional part the dialect exposes as an attribute (``None`` when it
cannot), each checked once where it is used: :class:`ScoringCalls` (raw logprobs of given tokens),
:class:`SlotPlacement`, :class:`AnswerRepairs` (what an answer leaves out, an early stop) and the
tokenizer (:class:`TokenizerCalls`; vLLM's shape in :mod:`presto_client.backends.tokenizer_calls`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from presto_client.backends.parsing import TokenLogprobs
from presto_client.backends.spec import Capabilities, EngineSpec
from presto_client.core.engine_protocol import ProposalRequest
from presto_client.errors import ConfigError

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


@dataclass(frozen=True, slots=True)
class DialectTraits:
    """What a dialect's server is, as data (no behaviour): one frozen value per dialect."""

    dialect: str
    modes: tuple[str, ...] = (RAW,)
    default_mode: str = RAW
    health_path: str = "/health"
    models_path: str = "/v1/models"
    metrics_path: str = "/metrics"
    metric_names: tuple[str, str] | None = None
    """Prometheus names of the prefix-cache (queries, hits) token counters."""
    metric_queries_exclude_hits: bool = False
    """The 'queries' counter leaves out the cached tokens (``queries = it + hits``)."""
    streaming: bool = False
    stream_reports_progress: bool = False
    """Its streams can stop at an end-of-generation token or leave a token out, and say so
    (:meth:`AnswerRepairs.stream_stop`, :meth:`AnswerRepairs.stream_generated`): the engine
    watches every batch."""
    stream_closes_connection: bool = False
    """The server closes its connection after a streamed answer although it announced
    keep-alive: streams then ask for ``Connection: close``, so no request is written into a
    connection already closed (and retried)."""
    max_top_k: int | None = None
    slots_path: str | None = None
    """Where the server says how many slots (each with its own prefix cache) it has; set for
    a dialect whose requests the client places on slots (:mod:`presto_client.backends.slots`); such
    a dialect exposes :class:`SlotPlacement`."""
    start_hint: str = ""
    """How to start this dialect's server (for 'unreachable' messages)."""


class ScoringCalls(Protocol):
    """Optional part: the server scores given tokens (raw logprobs, top-K or whole rows) and
    gives the top-K of the next token at a temperature (a scaled mode's normalisers)."""

    def build_score_calls(
        self, prefix: Sequence[int], token_ids: Sequence[int], model: str, top_k: int, *, label: str
    ) -> list[HttpCall]:
        """The calls of one scoring: raw (temperature-1) logprobs of ``token_ids`` after
        ``prefix``, with top-``top_k`` (``top_k == -1``: the whole vocabulary)."""
        ...

    def read_score_body(self, body: Any, index: int, top_k: int, *, label: str) -> Any:
        """What is kept of call ``index``'s answer as it arrives, before the others: the body,
        or its record where the answers are large (llama.cpp's whole-vocabulary rows, one call
        a position: held as bodies until the last, 32 of them took ~750 MB)."""
        ...

    def parse_score_bodies(
        self,
        prefix: Sequence[int],
        token_ids: Sequence[int],
        bodies: Sequence[Any],
        top_k: int,
        *,
        label: str,
    ) -> TokenLogprobs:
        """The answers of :meth:`build_score_calls`' calls (as :meth:`read_score_body` kept
        them), in order, as one record."""
        ...

    def full_vocab_top_k(self) -> int | None:
        """What to send as top-K to get the whole vocabulary (``None``: not possible)."""
        ...

    def build_next_token_topk(
        self, contexts: Sequence[Sequence[int]], temperature: float, model: str, *, label: str
    ) -> list[HttpCall]:
        """Calls returning the top-K at ``temperature`` of the next token after each context."""
        ...

    def parse_next_token_topk(
        self, calls: Sequence[HttpCall], bodies: Sequence[Any], n: int, *, label: str
    ) -> TokenLogprobs: ...


class OneCallScoring:
    """:class:`ScoringCalls` for a dialect that scores in one call (:meth:`build_score`,
    :meth:`parse_score`); the dialect writes those and the next-token pair."""

    def build_score(
        self, prefix: Sequence[int], token_ids: Sequence[int], model: str, top_k: int, *, label: str
    ) -> HttpCall:
        raise NotImplementedError

    def parse_score(
        self, prefix: Sequence[int], token_ids: Sequence[int], body: Any, top_k: int, *, label: str
    ) -> TokenLogprobs:
        raise NotImplementedError

    def build_score_calls(
        self, prefix: Sequence[int], token_ids: Sequence[int], model: str, top_k: int, *, label: str
    ) -> list[HttpCall]:
        return [self.build_score(prefix, token_ids, model, top_k, label=label)]

    def read_score_body(self, body: Any, index: int, top_k: int, *, label: str) -> Any:
        return body

    def parse_score_bodies(
        self,
        prefix: Sequence[int],
        token_ids: Sequence[int],
        bodies: Sequence[Any],
        top_k: int,
        *,
        label: str,
    ) -> TokenLogprobs:
        return self.parse_score(prefix, token_ids, bodies[0], top_k, label=label)


class SlotPlacement(Protocol):
    """Optional part: the server has slots (each its own prefix cache) a request can name
    (with :attr:`DialectTraits.slots_path`)."""

    def parse_slot_count(self, body: Any) -> int | None:
        """The server's slot count from the answer of ``slots_path`` (``None``: unknown)."""
        ...

    def on_slot(self, call: HttpCall, slot: int) -> HttpCall:
        """``call`` sent to the server's slot ``slot``."""
        ...


class AnswerRepairs(Protocol):
    """Optional part: a server whose answers can lack a token's row or stop early, and say so."""

    def repair_calls(self, request: ProposalRequest, body: Any, *, label: str) -> list[HttpCall]:
        """Calls that fetch what a generation answer lacks (none: the answer is whole)."""
        ...

    def read_repair_body(self, body: Any, *, label: str) -> Any:
        """One answer of :meth:`repair_calls` read as it arrives, kept in its place (a whole
        row is megabytes of JSON: read one at a time, never all in one step)."""
        ...

    def parse_generate_with(
        self, request: ProposalRequest, body: Any, repairs: Sequence[Any], *, label: str
    ) -> TokenLogprobs:
        """``parse_generate``, completed by the answers of :meth:`repair_calls` (as
        :meth:`read_repair_body` kept them)."""
        ...

    def continuation(self, request: ProposalRequest, got: TokenLogprobs) -> ProposalRequest | None:
        """The request for the rest of ``request`` when an answer legitimately brought fewer
        tokens (``got``, all received so far); ``None``: a short answer is an error."""
        ...

    def stream_generated(self, events: Sequence[Any]) -> int | None:
        """How many tokens the generation had produced at the last of ``events`` that says so
        (``None``: they do not say)."""
        ...

    def stream_stop(self, events: Sequence[Any]) -> str | None:
        """Why the generation ended, when ``events`` hold its last event and the dialect says
        (an ``"eos"`` stop lets :meth:`continuation` ask for the rest)."""
        ...


class TokenizerCalls(Protocol):
    """Optional part: the server's tokenizer (text prompts in, response text out); vLLM's
    shape is :class:`presto_client.backends.tokenizer_calls.ServerTokenizer`."""

    def build_tokenize(
        self,
        text: str,
        model: str | None,
        *,
        chat_template: bool = False,
        system_prompt: str | None = None,
    ) -> list[HttpCall]:
        """Calls that tokenize ``text`` (optionally as a chat turn), one per endpoint to try."""
        ...

    def build_tokenize_messages(
        self,
        messages: Sequence[Mapping[str, str]],
        model: str | None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[HttpCall]:
        """Calls that tokenize a conversation through the model's chat template."""
        ...

    def tokenize_next(self, body: Any) -> list[HttpCall] | None:
        """Calls to send next with a tokenizer answer that is not the token ids yet;
        ``None``: ``body`` is the answer."""
        ...

    def parse_tokenize(self, body: Any) -> tuple[int, ...]: ...

    def build_detokenize(self, token_ids: Sequence[int], model: str | None) -> list[HttpCall]: ...

    def parse_detokenize(self, body: Any) -> str | None: ...


class Adapter:
    """Base class of a dialect: its traits, pure builders and parsers, and optional parts.

    Required: :attr:`traits`, :meth:`build_generate`, :meth:`parse_generate` and, when
    ``traits.streaming``, :meth:`parse_stream_event`. Optional overrides with defaults:
    :attr:`semantics` (a dialect with a scaled mode), :meth:`parse_stream_events` and
    :meth:`stream_choice` (speed), :meth:`parse_models`, the ``hint_for_*`` messages. Optional
    parts (``None``: absent): :attr:`scoring`, :attr:`slots`, :attr:`repairs`, :attr:`tokenizer`.
    """

    traits: ClassVar[DialectTraits] = DialectTraits("")

    def __init__(self, spec: EngineSpec) -> None:
        traits = self.traits
        mode = spec.logprob_mode
        if mode == "auto":
            mode = traits.default_mode
        if mode not in traits.modes:
            raise ConfigError(
                f"logprob_mode {spec.logprob_mode!r} is not valid for backend "
                f"{traits.dialect!r}; valid modes are: auto, {', '.join(traits.modes)}"
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
        traits = self.traits
        return Capabilities(
            dialect=traits.dialect,
            logprob_mode=self.mode,
            logprob_semantics=self.semantics,
            exact_logq=scaled,
            calls_per_proposal=2 if scaled else 1,
            seeds_honoured=seeds_honoured,
            scoring_call=self.scoring is not None if scoring_call is None else scoring_call,
            streaming=traits.streaming and not scaled,
            max_top_k=traits.max_top_k,
            metrics=traits.metric_names or (),
        )

    # ---- the optional parts (None: the dialect has no such part)

    @property
    def scoring(self) -> ScoringCalls | None:
        return None

    @property
    def slots(self) -> SlotPlacement | None:
        return None

    @property
    def repairs(self) -> AnswerRepairs | None:
        return None

    @property
    def tokenizer(self) -> TokenizerCalls | None:
        return None

    # ---- the core: builders and parsers (pure)

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

    def stream_choice(self, events: Sequence[Any]) -> dict[str, Any] | None:
        """The tokens of consecutive stream events (or of a whole answer, as one event) as one
        choice of the completions shape (``token_ids``, ``logprobs.token_logprobs``,
        ``logprobs.top_logprobs`` keyed ``token_id:N``), for scoring from the rows' values alone:
        many streams' chunks in one pass (:mod:`presto_client.backends.stream_scoring`), a whole
        answer in :meth:`Generation.whole_scored`. ``None`` (the default): not this shape, or
        unusual, and :meth:`parse_stream_events` / :meth:`parse_generate` parse it. A dialect
        that answers in this shape but parses differently returns ``None``."""
        return None

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

    def hint_for_semantics(self, detected: str) -> str:
        """The fix to suggest when the server's logprob semantics are not the configured ones."""
        return ""

    def hint_for_seeds(self) -> str:
        return ""

    def hint_for_scoring(self) -> str:
        return ""
