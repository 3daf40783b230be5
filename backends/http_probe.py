"""The probe of one HTTP replica: health, the served model, its logprob semantics, seeds and
exact scoring, checked before any chain runs.

:class:`Probe` is a composed part of :class:`presto_client.backends.http_engine.HttpEngine`: it
sends its requests over the engine's transport and asks the engine only for what the engine owns
(the served model's names, the model it settles on, its raw scoring call). What it finds that later
requests depend on (seeds, exact scoring) goes to the :class:`ServerFindings` it shares with
the engine.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from presto_client.backends.adapter import RAW, Adapter
from presto_client.backends.gateways import check_gateway, refused_token_ids
from presto_client.backends.generation import answer_cap
from presto_client.backends.parsing import TokenLogprobs, check_token_ids
from presto_client.backends.probe_checks import (
    PROBE_PROMPT,
    PROBE_SEED,
    PROBE_TEMPERATURE,
    PROBE_TOKENS,
    drift_batches,
    judge_drift,
    judge_semantics,
)
from presto_client.backends.spec import EngineSpec, ProbeReport
from presto_client.backends.transport import Transport
from presto_client.concurrency import gather_or_fail
from presto_client.core.engine_protocol import FloatArray, ProposalRequest, ScoreSpec
from presto_client.errors import (
    EngineError,
    EngineRequestError,
    EngineUnavailableError,
    InvalidResponseError,
    ProbeError,
)
from presto_client.terminal_text import server_text

# The engine's logger: what a user filters on is the engine, not the module of its probe.
logger = logging.getLogger("presto_client.backends.http_engine")


_KIND_SIGNS = {"llamacpp": ("/props", "total_slots"), "sglang": ("/get_model_info", "model_path")}
"""Where a kind of server says what it is: its own endpoint, and a key only it answers."""
_KIND_NAMES = {"llamacpp": "llama.cpp's llama-server", "sglang": "SGLang"}


@dataclass
class ServerFindings:
    """What is known of a server beyond its configuration, ``None`` until found out: the probe
    sets both, and a refused full-vocabulary score turns ``scoring_ok`` off (the engine's
    capabilities read them)."""

    seeds_honoured: bool | None = None
    scoring_ok: bool | None = None


class RawScorer(Protocol):
    """The engine's raw scoring call (top-K logprobs of given tokens after a prefix)."""

    def __call__(
        self,
        prefix: Sequence[int],
        token_ids: Sequence[int],
        model: str,
        label: str,
        top_k: int | None = None,
    ) -> Awaitable[TokenLogprobs]: ...


class Probe:
    """The start-up checks of one replica; the engine owns it and answers its few questions."""

    def __init__(
        self,
        spec: EngineSpec,
        adapter: Adapter,
        transport: Transport,
        *,
        name: str,
        base_url: str,
        findings: ServerFindings,
        served_models: Callable[[], Awaitable[list[str]]],
        settle_model: Callable[[Sequence[str]], Awaitable[str]],
        score_raw: RawScorer,
    ) -> None:
        self.spec = spec
        self.adapter = adapter
        self.transport = transport
        self.name = name
        self.base_url = base_url
        """The replica's URL as shown in messages (credentials redacted)."""
        self.findings = findings
        self._served_models = served_models
        self._settle_model = settle_model
        """The model the engine uses, given the served names (the first one where the spec
        names none)."""
        self._score_raw = score_raw
        self.last_report: ProbeReport | None = None
        """The latest probe's report (kept also when it failed on its problems)."""

    async def run(self, *, check_seeds: bool = True, check_scoring: bool = True) -> ProbeReport:
        """Health, model name, logprob semantics (and seeds, exact scoring) of this replica.

        Raises :class:`EngineUnavailableError` when the server cannot be reached or is not
        healthy, :class:`ProbeError` when it serves another model or its logprob semantics are
        not the configured mode. Softer findings go to ``warnings`` and the log.
        """
        path = self.adapter.traits.health_path
        health = f"{self.base_url}{path}"
        status = await self.transport.get_status(path, refuse_redirects=True)
        if status in (404, 405, 501):  # nothing there: a wrong URL, or another kind of server
            raise EngineUnavailableError(
                f"{health} answered HTTP {status}: a wrong URL? {path} is "
                "not served there, so this is not the root of a vLLM/SGLang/OpenAI-compatible "
                "server; base_url is the server's root (e.g. http://localhost:8000, no /v1)",
                engine=self.name,
            )
        if status != 200:
            raise EngineUnavailableError(
                f"{health} answered HTTP {status}: the server is not ready (still loading?)",
                engine=self.name,
            )
        names = await self._served_models()
        if self.spec.model is not None and names and self.spec.model not in names:
            raise ProbeError(
                f"{self.base_url} serves {server_text(', '.join(names))}, not "
                f"{self.spec.model!r}: fix `model` in the engine spec (or leave it out to use "
                "the served one)",
                engine=self.name,
            )
        model = await self._settle_model(names)
        report = ProbeReport(
            engine=self.name, base_url=self.base_url, model=model, logprob_mode=self.adapter.mode
        )
        header = self.spec.routing_key_header
        gateway = await check_gateway(self.transport, self.adapter.traits.dialect, header, report)
        try:
            if self.adapter.scoring is not None:
                await self._probe_semantics(model, report)
            else:
                report.warnings.append(
                    "logprob semantics not checked: this dialect has no scoring call"
                )
            if check_seeds:
                await self._probe_seeds(model, report)
            if check_scoring and self.adapter.scoring is not None and self.adapter.semantics == RAW:
                await self._probe_exact_scoring(model, report)
            if check_scoring and self.adapter.scoring is not None:
                await self._probe_drift(model, report)
        except EngineRequestError as exc:
            explained = refused_token_ids(gateway, self.adapter.traits.dialect, str(exc))
            if explained is None:
                raise
            raise ProbeError(explained, engine=self.name) from exc
        except InvalidResponseError as exc:
            if exc.engine:
                raise
            kind = await self._other_kind()
            fix = (
                f"it answers as {_KIND_NAMES[kind]} does: give --backend {kind} "
                f"(engines[].kind: {kind})"
                if kind is not None
                else "check the server's log (and its precision: bf16 with batch invariance on a "
                "GPU, float32 on a CPU)"
            )
            raise ProbeError(  # the parsers are pure and do not know the engine's name
                f"{self.base_url} gave the probe an unusable answer: {exc}; {fix}",
                engine=self.name,
            ) from exc
        for warning in report.warnings:
            logger.warning("[%s] %s", self.name, warning)
        self.last_report = report
        if report.problems:
            raise ProbeError("; ".join(report.problems), engine=self.name)
        logger.info(
            "[%s] probe ok: model %s, logprob mode %s (max |Δ| %.2g)",
            self.name,
            server_text(model),
            self.adapter.mode,
            report.max_abs_logprob_diff or 0.0,
        )
        return report

    async def _other_kind(self) -> str | None:
        """The backend this server answers as when it is not the configured one: each kind's
        own endpoint, asked once its answer failed the configured dialect's parser."""
        for kind, (path, key) in _KIND_SIGNS.items():
            if kind == self.adapter.traits.dialect:
                continue
            try:
                body = await self.transport.request_json("GET", path, label="server kind")
            except EngineError:  # (no such endpoint, or not this kind's answer)
                continue
            if isinstance(body, dict) and key in body:
                return kind
        return None

    async def _probe_semantics(self, model: str, report: ProbeReport) -> None:
        request = ProposalRequest(
            PROBE_PROMPT, PROBE_TOKENS, PROBE_TEMPERATURE, PROBE_SEED, ScoreSpec((1.0,))
        )
        label = "probe generation"
        call = self.adapter.build_generate(request, model, label=label)
        cap = answer_cap(self.spec, request.num_tokens)
        body = await self.transport.request_json(
            "POST", call.path, call.payload, label=label, max_bytes=cap
        )
        parsed = self.adapter.parse_generate(request, body, label=label)
        generated = check_token_ids(parsed, self.spec.vocab_size, label=label, engine=self.name)
        raw = await self._score_raw(PROBE_PROMPT, generated.token_ids.tolist(), model, "probe")
        judge_semantics(generated, raw, self.adapter, self.spec.vocab_size, report)

    async def _probe_drift(self, model: str, report: ProbeReport) -> None:
        """The same context scored alone, again, and in the middle of batches of other
        requests (generations of other prompts and lengths), up to the engine's concurrency:
        how far its logprobs move with the batch (:func:`judge_drift`)."""
        prefix, tokens = PROBE_PROMPT[:2], list(PROBE_PROMPT[2:])

        async def scored() -> FloatArray:
            raw = await self._score_raw(prefix, tokens, model, "probe drift")
            return raw.logprobs

        async def other(i: int) -> None:
            # (other prompts and lengths, none longer than the probe's own: a small context fits)
            prompt = (PROBE_PROMPT * 2)[i % 7 : i % 7 + 2 + i % 7]
            request = ProposalRequest(prompt, PROBE_TOKENS, 1.0, PROBE_SEED + i, ScoreSpec((1.0,)))
            call = self.adapter.build_generate(request, model, label="probe drift batch")
            await self.transport.request_json(
                "POST", call.path, call.payload, label="probe drift batch"
            )

        alone = await scored()
        beside = [(1, await scored())]
        for size in drift_batches(self.spec.max_concurrency):
            calls: list[Awaitable[Any]] = [other(i) for i in range(size - 1)]
            calls.insert((size - 1) // 2, scored())  # (in the middle of the batch)
            results = await gather_or_fail(calls)
            beside.append((size, results[(size - 1) // 2]))
        judge_drift(alone, beside, report)

    async def _probe_seeds(self, model: str, report: ProbeReport) -> None:
        request = ProposalRequest(
            PROBE_PROMPT, PROBE_TOKENS, 1.0, PROBE_SEED + 1, ScoreSpec((1.0,))
        )
        label = "probe seed check"
        outs: list[list[int]] = []
        for _ in range(2):
            call = self.adapter.build_generate(request, model, label=label)
            body = await self.transport.request_json("POST", call.path, call.payload, label=label)
            outs.append(self.adapter.parse_generate(request, body, label=label).token_ids.tolist())
        report.seeds_honoured = outs[0] == outs[1]
        self.findings.seeds_honoured = report.seeds_honoured
        if not report.seeds_honoured:
            report.warnings.append(f"seeds are not honoured: {self.adapter.hint_for_seeds()}")

    async def _probe_exact_scoring(self, model: str, report: ProbeReport) -> None:
        scoring = self.adapter.scoring
        full_k = scoring.full_vocab_top_k() if scoring is not None else None
        if full_k is None:
            self.findings.scoring_ok = False
        else:
            try:
                await self._score_raw(PROBE_PROMPT[:-2], PROBE_PROMPT[-2:], model, "probe", full_k)
                self.findings.scoring_ok = True
            except EngineRequestError as exc:
                self.findings.scoring_ok = False
                logger.debug("[%s] full-vocabulary scoring refused: %s", self.name, exc)
        if not self.findings.scoring_ok:
            report.warnings.append(
                "exact scoring unavailable: decisions are certified from top-K logprobs, and the "
                "rare one whose interval cannot settle it fails its chain (the others go on). "
                f"To tighten such decisions instead: {self.adapter.hint_for_scoring()}"
            )
        report.details["exact_scoring"] = float(bool(self.findings.scoring_ok))
