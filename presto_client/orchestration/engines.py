"""A job's engines, opened: every replica of every engine, probed, identified, checked.

An HTTP engine is built by the backends' registry (:func:`backends.create_engine`) from an
:class:`~backends.spec.EngineSpec`; the embedded engine is a vLLM-dialect server on loopback;
the reference engine is the in-process model. Optional capabilities of a replica (a probe,
an identity, prefix-cache metrics, a context length) are read through the protocols of
:mod:`presto_client.core.engine_protocol`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from presto_client import defaults
from presto_client.core.engine_protocol import (
    ContextLimited,
    Identified,
    PrefixCacheMetered,
    Probing,
)
from presto_client.core.reference import ReferenceEngine, ReferenceModel, SimulatedLatencyEngine
from presto_client.errors import ConfigError, EngineUnavailableError, ProbeError
from presto_client.orchestration.config import (
    EmbeddedEngineConfig,
    EngineConfig,
    HttpEngineConfig,
    JobConfig,
    ReferenceEngineConfig,
)
from presto_client.orchestration.plan import JobPlan
from presto_client.terminal_text import server_text

logger = logging.getLogger(__name__)


def engine_eos_token_id(e: EngineConfig) -> int | None:
    """The EOS at which an engine's responses are truncated: the config's, else the embedded
    engine's own (SmolLM2's ``<|im_end|>``). The one place for every path that opens an engine
    (started by presto, or handed in through ``engine_overrides``)."""
    if e.eos_token_id is not None:
        return e.eos_token_id
    return defaults.EMBEDDED_EOS_TOKEN_ID if isinstance(e, EmbeddedEngineConfig) else None


@dataclass(slots=True)
class OpenedEngine:
    """An engine of the job, opened: its replicas and what the orchestration needs to know."""

    name: str
    kind: str
    replicas: list[Any]
    max_concurrency: int
    eos_token_id: int | None = None
    probes: list[Any] = field(default_factory=list)


def start_embedded_servers(
    cfg: JobConfig, stack: contextlib.ExitStack, only: Sequence[str] | None = None
) -> dict[str, str]:
    """Start one embedded server per embedded engine; returns engine name → base URL."""
    urls: dict[str, str] = {}
    embedded = [
        e
        for e in cfg.engines
        if isinstance(e, EmbeddedEngineConfig) and (only is None or e.name in only)
    ]
    if not embedded:
        return urls
    try:
        from presto_client.embedded.launch import embedded_server
    except ImportError as exc:
        raise ConfigError(
            f"the embedded engine is not available ({exc}); install it with "
            "pip install 'presto-client[embedded]', or point engines: at a running server"
        ) from None
    for e in embedded:
        logger.info(
            "starting the embedded engine %s (%s, %s)", e.name, defaults.EMBEDDED_MODEL, e.dtype
        )
        try:
            urls[str(e.name)] = stack.enter_context(
                embedded_server(e.port, dtype=e.dtype, startup_timeout_s=e.startup_timeout_s)
            )
        except (RuntimeError, OSError) as exc:
            raise EngineUnavailableError(
                f"the embedded engine did not start: {exc}", engine=str(e.name)
            ) from exc
    return urls


def _api_key(e: HttpEngineConfig, index: int) -> str | None:
    if e.api_key_env is None:
        return None
    key = os.environ.get(e.api_key_env)
    if not key:
        raise ConfigError(
            f"engines[{index}].api_key_env: environment variable {e.api_key_env} is not set; "
            f"export {e.api_key_env}=... before running"
        )
    return key


async def open_engines(
    cfg: JobConfig,
    stack: contextlib.AsyncExitStack,
    *,
    embedded_urls: Mapping[str, str] | None = None,
    only: Sequence[str] | None = None,
    probe: bool = True,
) -> dict[str, OpenedEngine]:
    """Create every engine (all replicas) of ``cfg``; closed when ``stack`` closes."""
    embedded_urls = embedded_urls or {}
    opened: dict[str, OpenedEngine] = {}
    for index, e in enumerate(cfg.engines):
        name = str(e.name)
        if only is not None and name not in only:
            continue
        if isinstance(e, ReferenceEngineConfig):
            model = ReferenceModel(
                e.vocab_size,
                seed=e.model_seed,
                logit_scale=e.logit_scale,
                eos_token_id=e.eos_token_id,
            )
            engine: Any = ReferenceEngine(model, top_k=e.top_k, name=name)
            if e.latency_s or e.token_latency_s:
                engine = SimulatedLatencyEngine(engine, e.latency_s, e.token_latency_s)
            opened[name] = OpenedEngine(
                name, e.kind, [engine], e.max_concurrency, engine_eos_token_id(e)
            )
            continue
        from backends import EngineSpec, create_engine

        if isinstance(e, EmbeddedEngineConfig):
            if name not in embedded_urls:
                raise ConfigError(f"engine {name}: the embedded server was not started")
            spec = EngineSpec(
                kind="vllm",
                base_urls=(embedded_urls[name],),
                top_k=e.top_k,
                max_concurrency=e.max_concurrency,
                request_timeout_s=e.request_timeout_s,
                name=name,
            )
            do_probe = e.probe
        else:
            spec = EngineSpec(
                kind=e.kind,
                base_urls=e.urls,
                model=e.model,
                logprob_mode=e.logprob_mode,
                top_k=e.top_k,
                max_concurrency=e.max_concurrency,
                request_timeout_s=e.request_timeout_s,
                connect_timeout_s=e.connect_timeout_s,
                max_retries=e.max_retries,
                restart_window_s=e.restart_window_s,
                api_key=_api_key(e, index),
                name=name,
                vocab_size=e.vocab_size,
            )
            do_probe = e.probe
        replicas = [create_engine(spec, i) for i in range(len(spec.base_urls))]
        for r in replicas:
            stack.push_async_callback(r.aclose)
        handle = OpenedEngine(name, e.kind, replicas, e.max_concurrency, engine_eos_token_id(e))
        if probe and do_probe:
            handle.probes = await probe_engine(handle)
        opened[name] = handle
    return opened


async def probe_engine(handle: OpenedEngine) -> list[Any]:
    """Probe every replica; a replica with problems raises :class:`ProbeError`."""
    reports = await asyncio.gather(*(r.probe() for r in handle.replicas if isinstance(r, Probing)))
    for report in reports:  # (the backend logs the probe's warnings itself)
        if not report.ok:
            raise ProbeError(
                f"probe of {report.base_url} failed: {'; '.join(report.problems)}",
                engine=handle.name,
            )
    return list(reports)


async def read_prefix_cache_counters(handle: OpenedEngine) -> dict[str, float] | None:
    total: dict[str, float] = {}
    for r in handle.replicas:
        if not isinstance(r, PrefixCacheMetered):
            return None
        try:
            m = await asyncio.wait_for(r.metrics(), timeout=10)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.info("engine %s: no metrics (%s)", handle.name, exc)
            return None
        if "prefix_cache_queries" not in m or "prefix_cache_hits" not in m:
            return None
        for k in ("prefix_cache_queries", "prefix_cache_hits"):
            total[k] = total.get(k, 0.0) + float(m[k])
    return total


def check_lengths(
    plan: JobPlan, engines: Mapping[str, OpenedEngine], prompt_ids: Mapping[str, Any] | None = None
) -> None:
    """Refuse a response that cannot fit the server's context: the longest prompt (token ids
    per engine, when known) plus ``block_size × num_blocks`` against ``max_model_len``."""
    s = plan.config.sampler
    response = s.block_size * s.num_blocks
    known = [len(p.token_ids) for p in plan.prompts if p.token_ids is not None]
    for name, handle in engines.items():
        limits = [
            r.max_model_len
            for r in handle.replicas
            if isinstance(r, ContextLimited) and r.max_model_len
        ]
        if not limits:
            continue
        limit = min(limits)
        if prompt_ids is not None and prompt_ids.get(name):
            prompt, what = max(len(p) for p in prompt_ids[name]), "the longest prompt"
        elif known and len(known) == len(plan.prompts):
            prompt, what = max(known), "the longest prompt"
        else:
            prompt, what = 1, "at least one prompt token"
        if prompt + response > limit:
            raise ConfigError(
                f"engine {name} serves a context of max_model_len = {limit} tokens, but a "
                f"response of sampler.block_size x num_blocks = {s.block_size} x "
                f"{s.num_blocks} = {response} tokens after {what} ({prompt}) needs "
                f"{prompt + response}: lower block_size or num_blocks, shorten the prompts, or "
                "serve the model with a larger --max-model-len"
            )


async def engine_identities(engines: Mapping[str, OpenedEngine]) -> dict[str, dict[str, Any]]:
    """What each HTTP engine serves (model, version, max_model_len, logprob mode); its replicas
    must agree."""
    out: dict[str, dict[str, Any]] = {}
    for name, handle in engines.items():
        found = [await r.identity() for r in handle.replicas if isinstance(r, Identified)]
        if not found:
            continue
        models = sorted({str(i["model"]) for i in found})
        if len(models) > 1:
            raise ConfigError(
                f"engine {name}: its replicas serve different models "
                f"({server_text(', '.join(models))}); a chain's replica would decide its model. "
                "Point base_urls at one model"
            )
        out[name] = found[0]
    return out
