"""The probe of one HTTP replica: health, the served model, its logprob semantics, seeds and
exact scoring, checked before any chain runs (a mixin of :class:`backends.http_engine.HttpEngine`,
whose requests it sends)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from presto_client.backends.adapter import RAW, Adapter
from presto_client.backends.gateways import check_gateway, refused_token_ids
from presto_client.backends.parsing import TokenLogprobs
from presto_client.backends.probe_checks import (
    PROBE_PROMPT,
    PROBE_SEED,
    PROBE_TEMPERATURE,
    PROBE_TOKENS,
    judge_semantics,
)
from presto_client.backends.spec import EngineSpec, ProbeReport
from presto_client.core.engine_protocol import ProposalRequest, ScoreSpec
from presto_client.errors import (
    EngineRequestError,
    EngineUnavailableError,
    InvalidResponseError,
    ProbeError,
)
from presto_client.terminal_text import server_text

if TYPE_CHECKING:
    from presto_client.backends.transport import Transport

logger = logging.getLogger("presto_client.backends.http_engine")


class ProbeMixin:
    """The probe's requests; the engine provides the transport, the adapter and the calls."""

    spec: EngineSpec
    adapter: Adapter
    transport: Transport
    base_url: str
    name: str
    last_probe: ProbeReport | None
    _model: str | None
    _seeds_honoured: bool | None
    _scoring_ok: bool | None

    if TYPE_CHECKING:  # what the engine provides

        async def model(self) -> str: ...

        async def _served_models(self) -> list[str]: ...

        def _cap(self, tokens: int, top_k: int | None = None) -> int: ...

        def _checked(self, raw: TokenLogprobs, label: str) -> TokenLogprobs: ...

        async def _score_raw(
            self,
            prefix: Sequence[int],
            token_ids: Sequence[int],
            model: str,
            label: str,
            top_k: int | None = None,
        ) -> TokenLogprobs: ...

    async def probe(self, *, check_seeds: bool = True, check_scoring: bool = True) -> ProbeReport:
        """Health, model name, logprob semantics (and seeds, exact scoring) of this replica.

        Raises :class:`EngineUnavailableError` when the server cannot be reached or is not
        healthy, :class:`ProbeError` when it serves another model or its logprob semantics are
        not the configured mode. Softer findings go to ``warnings`` and the log.
        """
        health = f"{self.base_url}{self.adapter.health_path}"
        status = await self.transport.get_status(self.adapter.health_path, refuse_redirects=True)
        if status in (404, 405, 501):  # nothing there: a wrong URL, or another kind of server
            raise EngineUnavailableError(
                f"{health} answered HTTP {status}: a wrong URL? {self.adapter.health_path} is "
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
        if self._model is None and names:
            self._model = names[0]
        model = await self.model()
        report = ProbeReport(
            engine=self.name, base_url=self.base_url, model=model, logprob_mode=self.adapter.mode
        )
        header = self.spec.routing_key_header
        gateway = await check_gateway(self.transport, self.adapter.dialect, header, report)
        try:
            if self.adapter.can_score:
                await self._probe_semantics(model, report)
            else:
                report.warnings.append(
                    "logprob semantics not checked: this dialect has no scoring call"
                )
            if check_seeds:
                await self._probe_seeds(model, report)
            if check_scoring and self.adapter.can_score and self.adapter.semantics == RAW:
                await self._probe_exact_scoring(model, report)
        except EngineRequestError as exc:
            explained = refused_token_ids(gateway, self.adapter.dialect, str(exc))
            if explained is None:
                raise
            raise ProbeError(explained, engine=self.name) from exc
        except InvalidResponseError as exc:
            if exc.engine:
                raise
            raise ProbeError(  # the parsers are pure and do not know the engine's name
                f"{self.base_url} gave the probe an unusable answer: {exc}. Check the server's "
                "log (and that it runs in float32)",
                engine=self.name,
            ) from exc
        for warning in report.warnings:
            logger.warning("[%s] %s", self.name, warning)
        self.last_probe = report
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

    async def _probe_semantics(self, model: str, report: ProbeReport) -> None:
        request = ProposalRequest(
            PROBE_PROMPT, PROBE_TOKENS, PROBE_TEMPERATURE, PROBE_SEED, ScoreSpec((1.0,))
        )
        label = "probe generation"
        call = self.adapter.build_generate(request, model, label=label)
        body = await self.transport.request_json(
            "POST", call.path, call.payload, label=label, max_bytes=self._cap(request.num_tokens)
        )
        generated = self._checked(self.adapter.parse_generate(request, body, label=label), label)
        raw = await self._score_raw(PROBE_PROMPT, generated.token_ids.tolist(), model, "probe")
        judge_semantics(generated, raw, self.adapter, self.spec.vocab_size, report)

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
        self._seeds_honoured = report.seeds_honoured
        if not report.seeds_honoured:
            report.warnings.append(f"seeds are not honoured: {self.adapter.hint_for_seeds()}")

    async def _probe_exact_scoring(self, model: str, report: ProbeReport) -> None:
        full_k = self.adapter.full_vocab_top_k()
        if full_k is None:
            self._scoring_ok = False
        else:
            try:
                await self._score_raw(PROBE_PROMPT[:-2], PROBE_PROMPT[-2:], model, "probe", full_k)
                self._scoring_ok = True
            except EngineRequestError as exc:
                self._scoring_ok = False
                logger.debug("[%s] full-vocabulary scoring refused: %s", self.name, exc)
        if not self._scoring_ok:
            report.warnings.append(
                "exact scoring unavailable: decisions are certified from top-K logprobs, and the "
                "rare one whose interval cannot settle it fails its chain (the others go on). "
                f"To tighten such decisions instead: {self.adapter.hint_for_scoring()}"
            )
        report.details["exact_scoring"] = float(bool(self._scoring_ok))
