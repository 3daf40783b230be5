"""A job from config to run directory: plan the chains, open the engines, run, summarise.

The faces layer (the CLI, or a Python caller) hands a validated
:class:`~presto_client.orchestration.config.JobConfig` to :func:`make_plan` and then :func:`run_job`
(blocking) or :func:`run_job_async`. The plan is plain data: arms (engine × traversal), and
chains (prompt × chain × arm) with their seeds, split from the root seed with numpy
``SeedSequence`` by (prompt, chain) so that every arm of a (prompt, chain) gets the same seed:
``sequential`` and ``crn`` then replay the same chain, and speedups compare identical work.
Chains are ordered prompt by prompt and chain by chain with the arms interleaved (rotating which
arm goes first), so machine drift hits all arms alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from presto_client.core.engine_protocol import Engine, ProposalRequest, ScoredTokens, ScoreRequest
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.sampler_config import ARM_TRAVERSALS, SamplerConfig
from presto_client.core.stats import RoundRecord
from presto_client.errors import ConfigError, EngineUnavailableError, ProbeError
from presto_client.orchestration.config import (
    EmbeddedEngineConfig,
    EngineConfig,
    HttpEngineConfig,
    JobConfig,
    Prompt,
    ReferenceEngineConfig,
    load_prompts,
    redacted_dump,
)
from presto_client.orchestration.orchestrator import (
    ChainOutcome,
    ChainSink,
    ChainSpec,
    EnginePool,
    JobFailedError,
    Orchestrator,
    OrchestratorResult,
)
from presto_client.orchestration.prompt_tokens import decode, encode
from presto_client.orchestration.quality import ChainGrader, make_chain_grader
from presto_client.orchestration.rundir import RunDir, check_output_dir, finished_ok, read_jsonl
from presto_client.orchestration.summary import summarize, summary_rows
from presto_client.urls import redact_url

logger = logging.getLogger(__name__)

SMOLLM2_EOS_TOKEN_ID = 2
"""``<|im_end|>`` of SmolLM2-Instruct, the embedded engine's model."""
EMBEDDED_MODEL = "SmolLM2-135M-Instruct"


# --------------------------------------------------------------------------------------------
# The plan (plain data)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arm:
    arm: str
    engine: str
    traversal: str


@dataclass(frozen=True, slots=True)
class PlannedChain:
    chain_id: str
    arm: Arm
    prompt_index: int
    chain_index: int
    seed: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "chain_id": self.chain_id,
            "arm": self.arm.arm,
            "engine": self.arm.engine,
            "traversal": self.arm.traversal,
            "prompt_index": self.prompt_index,
            "chain_index": self.chain_index,
            "seed": self.seed,
        }


@dataclass(slots=True)
class JobPlan:
    config: JobConfig
    prompts: list[Prompt]
    arms: list[Arm]
    chains: list[PlannedChain]
    fingerprint: dict[str, Any]

    @property
    def output_dir(self) -> Path:
        return Path(self.config.output_dir or Path("runs") / (self.config.name or "job"))


def chain_seed(root: int, prompt_index: int, chain_index: int) -> int:
    """The seed of chain ``chain_index`` of prompt ``prompt_index`` (the same for every arm)."""
    ss = np.random.SeedSequence(root, spawn_key=(prompt_index, chain_index))
    return int(ss.generate_state(1, dtype=np.uint32)[0])


def make_arms(
    cfg: JobConfig,
    *,
    engines: Sequence[str] | None = None,
    traversals: Sequence[str] | None = None,
) -> list[Arm]:
    """Engine × traversal arms, optionally restricted to some engines / other traversals."""
    names = cfg.engine_names()
    if engines:
        unknown = [e for e in engines if e not in names]
        if unknown:
            raise ConfigError(
                f"unknown engine(s) {', '.join(unknown)}; the config names: {', '.join(names)}"
            )
        names = [n for n in names if n in engines]
    rules = list(traversals) if traversals else list(cfg.sampler.traversals)
    bad = [t for t in rules if t not in ARM_TRAVERSALS]
    if bad:
        raise ConfigError(
            f"unknown traversal(s) {', '.join(bad)}; valid traversals are: "
            f"{', '.join(ARM_TRAVERSALS)}"
        )
    return [Arm(f"{e}/{t}", e, t) for e in names for t in rules]


def _prompts_digest(prompts: Sequence[Prompt]) -> str:
    payload = json.dumps(
        [[p.text, list(p.token_ids) if p.token_ids is not None else None] for p in prompts]
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def job_fingerprint(cfg: JobConfig, prompts: Sequence[Prompt]) -> dict[str, Any]:
    """What defines the work of a chain: a resumed run must agree on all of it.

    Traversals and engines may be added to a run directory later (new arms); an engine already
    there must keep its kind and model.
    """
    sampler = cfg.sampler.model_dump(mode="json", exclude={"traversals"})
    engines: dict[str, Any] = {}
    for e in cfg.engines:
        model: str | None
        if isinstance(e, HttpEngineConfig):
            model = e.model
        elif isinstance(e, EmbeddedEngineConfig):
            model = f"{EMBEDDED_MODEL}:{e.dtype}"
        else:
            model = f"reference:{e.vocab_size}:{e.model_seed}:{e.logit_scale}:{e.top_k}"
        engines[str(e.name)] = {"kind": e.kind, "model": model, "eos_token_id": e.eos_token_id}
    return {
        "sampler": sampler,
        "seed": cfg.seed,
        "chains_per_prompt": cfg.chains_per_prompt,
        "prompts": {
            "count": len(prompts),
            "digest": _prompts_digest(prompts),
            "chat_template": cfg.prompts.chat_template,
            "system_prompt": cfg.prompts.system_prompt,
        },
        "engines": engines,
    }


def make_plan(
    cfg: JobConfig,
    *,
    engines: Sequence[str] | None = None,
    traversals: Sequence[str] | None = None,
    prompts: Sequence[Prompt] | None = None,
) -> JobPlan:
    """The chains of a job, in run order (arms interleaved chain by chain)."""
    plist = list(prompts) if prompts is not None else load_prompts(cfg)
    arms = make_arms(cfg, engines=engines, traversals=traversals)
    chains: list[PlannedChain] = []
    n = len(arms)
    for p in plist:
        for c in range(cfg.chains_per_prompt):
            seed = chain_seed(cfg.seed, p.index, c)
            shift = (p.index * cfg.chains_per_prompt + c) % n
            for arm in arms[shift:] + arms[:shift]:
                cid = f"{arm.arm}/p{p.index:04d}/c{c:03d}"
                chains.append(PlannedChain(cid, arm, p.index, c, seed))
    return JobPlan(cfg, plist, arms, chains, job_fingerprint(cfg, plist))


def describe_plan(plan: JobPlan, finished: int = 0) -> str:
    """What a job would run, in words (``presto validate``)."""
    cfg = plan.config
    s = cfg.sampler
    lines = [f"job {cfg.name}: {len(plan.chains)} chain(s) -> {plan.output_dir}"]
    for e in cfg.engines:
        if isinstance(e, HttpEngineConfig):
            where = ", ".join(redact_url(u) for u in e.urls)
            extra = f" model={e.model or '(from server)'} logprob_mode={e.logprob_mode}"
        elif isinstance(e, EmbeddedEngineConfig):
            where = "embedded CPU server (started by presto)"
            extra = f" model={EMBEDDED_MODEL} dtype={e.dtype}"
        else:
            where = "in-process reference model"
            extra = f" vocab={e.vocab_size} top_k={e.top_k}"
        lines.append(
            f"  engine {e.name} [{e.kind}] {where};{extra} max_concurrency={e.max_concurrency}"
        )
    tau = s.tau if s.tau is not None else 1 / s.alpha
    lines.append(
        f"  sampler {s.sampler}: alpha={s.alpha} tau={tau:g}"
        f" block_size={s.block_size} num_blocks={s.num_blocks} K={s.steps_per_block}"
        f" n_pf={s.n_pf} window={s.window} epsilon={s.epsilon}"
    )
    lines.append(f"  arms: {', '.join(a.arm for a in plan.arms)}")
    lines.append(
        f"  {len(plan.prompts)} prompt(s) x {cfg.chains_per_prompt} chain(s) x "
        f"{len(plan.arms)} arm(s) = {len(plan.chains)} chain(s); root seed {cfg.seed}"
    )
    lines.append(
        f"  at most {cfg.max_concurrency} request(s) in flight, "
        f"{cfg.max_active_chains or cfg.max_concurrency} chain(s) at once, failure budget "
        f"{cfg.failure_budget(len(plan.chains))}"
    )
    if finished:
        lines.append(f"  {finished} chain(s) already finished in {plan.output_dir} (resume)")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------------------------


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


def engine_eos_token_id(e: EngineConfig) -> int | None:
    """The EOS at which an engine's responses are truncated: the config's, else the embedded
    engine's own (SmolLM2's ``<|im_end|>``). The one place for every path that opens an engine
    (started by presto, or handed in through ``engine_overrides``)."""
    if e.eos_token_id is not None:
        return e.eos_token_id
    return SMOLLM2_EOS_TOKEN_ID if isinstance(e, EmbeddedEngineConfig) else None


@dataclass(slots=True)
class OpenEngine:
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
        logger.info("starting the embedded engine %s (%s, %s)", e.name, EMBEDDED_MODEL, e.dtype)
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
) -> dict[str, OpenEngine]:
    """Create every engine (all replicas) of ``cfg``; closed when ``stack`` closes."""
    embedded_urls = embedded_urls or {}
    opened: dict[str, OpenEngine] = {}
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
            opened[name] = OpenEngine(
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
        handle = OpenEngine(name, e.kind, replicas, e.max_concurrency, engine_eos_token_id(e))
        if probe and do_probe:
            handle.probes = await probe_engine(handle)
        opened[name] = handle
    return opened


async def probe_engine(handle: OpenEngine) -> list[Any]:
    """Probe every replica; a replica with problems raises :class:`ProbeError`."""
    reports = await asyncio.gather(*(r.probe() for r in handle.replicas if hasattr(r, "probe")))
    for report in reports:  # (the backend logs the probe's warnings itself)
        if not report.ok:
            raise ProbeError(
                f"probe of {report.base_url} failed: {'; '.join(report.problems)}",
                engine=handle.name,
            )
    return list(reports)


async def _read_metrics(handle: OpenEngine) -> dict[str, float] | None:
    total: dict[str, float] = {}
    for r in handle.replicas:
        fn = getattr(r, "metrics", None)
        if fn is None:
            return None
        try:
            m = await asyncio.wait_for(fn(), timeout=10)
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


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


class RunDirSink:
    """Writes rounds and finished chains to the run directory as they complete."""

    def __init__(self, run: RunDir, sampler_name: str, grader: ChainGrader | None = None) -> None:
        self.run = run
        self.sampler_name = sampler_name
        self.grader = grader
        self.started = time.time()

    def chain_started(self, spec: ChainSpec, replica: int) -> None:
        return None

    def round_done(self, spec: ChainSpec, record: RoundRecord, queue_s: float) -> None:
        self.run.append_record(
            {
                "chain_id": spec.chain_id,
                "arm": spec.arm,
                "engine": spec.engine,
                "traversal": spec.traversal,
                "prompt_index": spec.prompt_index,
                "chain_index": spec.chain_index,
                **record.as_dict(),
                "queue_s": queue_s,
                "t": round(time.time() - self.started, 6),
            }
        )

    def chain_done(self, outcome: ChainOutcome) -> None:
        spec = outcome.spec
        row: dict[str, Any] = {
            "chain_id": spec.chain_id,
            "arm": spec.arm,
            "engine": spec.engine,
            "sampler": self.sampler_name,
            "traversal": spec.traversal,
            "n_pf": spec.n_pf,
            "prompt_index": spec.prompt_index,
            "chain_index": spec.chain_index,
            "seed": spec.seed,
            "replica": outcome.replica,
            "status": "ok" if outcome.ok else "failed",
            "error": outcome.error,
            "prompt_len": len(spec.prompt_ids),
            "wall_s": outcome.wall_s,
            "queue_s": outcome.queue_s,
            "session": self.run.session,
        }
        result = outcome.result
        if result is not None:
            row["token_ids"] = list(result.token_ids)
            row["text"] = outcome.text
            if self.grader is not None:
                grade = self.grader.grade(spec.prompt_index, outcome.text, result.token_ids)
                if grade is not None:
                    row["grade"] = grade
            row["stats"] = result.stats.as_dict()
            row["transitions"] = [
                [t.block, t.k, t.cut, int(t.accepted), round(float(t.log_accept), 6)]
                for t in result.transitions
            ]
        self.run.append_sample(row)


@dataclass(slots=True)
class JobResult:
    plan: JobPlan
    run_dir: Path
    summary: dict[str, Any]
    planned: int
    skipped: int
    completed: int
    failed: int
    wall_s: float


async def _tokenized_prompts(
    plan: JobPlan, engines: Mapping[str, OpenEngine]
) -> dict[str, list[tuple[int, ...]]]:
    """Prompt ids per engine (text prompts are tokenized by each engine's own tokenizer)."""
    cfg = plan.config
    out: dict[str, list[tuple[int, ...]]] = {}
    for name, handle in engines.items():
        ids: list[tuple[int, ...]] = []
        for p in plan.prompts:
            if p.token_ids is not None:
                ids.append(p.token_ids)
            else:
                assert p.text is not None
                ids.append(
                    await encode(
                        handle.replicas[0],
                        p.text,
                        chat_template=cfg.prompts.chat_template,
                        system_prompt=cfg.prompts.system_prompt,
                    )
                )
        out[name] = ids
    return out


def sampler_for(plan: JobPlan, eos_token_id: int | None) -> SamplerConfig:
    try:
        return plan.config.sampler.to_sampler_config(eos_token_id)
    except ValueError as exc:
        raise ConfigError(f"sampler: {exc}") from None


def write_summary(run: RunDir, plan: JobPlan) -> dict[str, Any]:
    summary = summarize(
        run.samples(), run.metrics(), job=plan.config.name, engine_order=plan.config.engine_names()
    )
    run.write_summary(summary, summary_rows(summary))
    return summary


async def run_job_async(
    plan: JobPlan,
    *,
    embedded_urls: Mapping[str, str] | None = None,
    engine_overrides: Mapping[str, Sequence[Engine]] | None = None,
    sinks: Sequence[ChainSink] = (),
    probe: bool = True,
    on_start: Any = None,
) -> JobResult:
    """Run (or resume) a planned job into its run directory.

    ``engine_overrides`` replaces engines by name with ready-made replicas (tests, Python
    callers). ``on_start(total, finished)`` is called once the run directory is open.
    Cancellation stops every chain and is re-raised, with the summary of what finished written.
    """
    cfg = plan.config
    start = time.perf_counter()
    run = RunDir(plan.output_dir)
    finished = run.open(
        fingerprint=plan.fingerprint,
        resolved_config=redacted_dump(cfg),
        chains=[c.as_dict() for c in plan.chains],
    )
    todo = [c for c in plan.chains if c.chain_id not in finished]
    skipped = len(plan.chains) - len(todo)
    if on_start is not None:
        on_start(len(plan.chains), skipped)
    result = OrchestratorResult()
    completed_ok = not todo
    try:
        if not todo:
            logger.info("all %d chain(s) already finished in %s", len(plan.chains), run.path)
        else:
            result = await _run_chains(
                plan, run, todo, embedded_urls, engine_overrides, sinks, probe
            )
            completed_ok = True
    finally:
        run.close(completed=completed_ok)
        # (a fresh run that never wrote anything is removed at close: no summary of nothing)
        summary = {} if run.removed else write_summary(run, plan)
    return JobResult(
        plan=plan,
        run_dir=run.path,
        summary=summary,
        planned=len(plan.chains),
        skipped=skipped,
        completed=len(result.completed),
        failed=len(result.failed),
        wall_s=time.perf_counter() - start,
    )


async def _run_chains(
    plan: JobPlan,
    run: RunDir,
    todo: Sequence[PlannedChain],
    embedded_urls: Mapping[str, str] | None,
    engine_overrides: Mapping[str, Sequence[Engine]] | None,
    sinks: Sequence[ChainSink],
    probe: bool,
) -> OrchestratorResult:
    cfg = plan.config
    async with contextlib.AsyncExitStack() as stack:
        used = {c.arm.engine for c in todo}
        overrides = dict(engine_overrides or {})
        engines = await open_engines(
            cfg,
            stack,
            embedded_urls=embedded_urls,
            only=[n for n in used if n not in overrides],
            probe=probe,
        )
        for name, replicas in overrides.items():
            if name in used:
                e = next(x for x in cfg.engines if x.name == name)
                engines[name] = OpenEngine(
                    name, e.kind, list(replicas), e.max_concurrency, engine_eos_token_id(e)
                )
        run.record_engine_identity(await _engine_identities(engines))
        check_lengths(plan, engines)  # before tokenizing: a clear error early
        prompt_ids = await _tokenized_prompts(plan, engines)
        check_lengths(plan, engines, prompt_ids)
        samplers = {n: sampler_for(plan, h.eos_token_id) for n, h in engines.items()}
        specs = [
            ChainSpec(
                chain_id=c.chain_id,
                arm=c.arm.arm,
                engine=c.arm.engine,
                traversal=c.arm.traversal,
                sampler=samplers[c.arm.engine],
                prompt_index=c.prompt_index,
                chain_index=c.chain_index,
                seed=c.seed,
                prompt_ids=prompt_ids[c.arm.engine][c.prompt_index],
                n_pf=cfg.sampler.window if c.arm.traversal == "stream" else cfg.sampler.n_pf,
                replica_key=f"p{c.prompt_index}/c{c.chain_index}",
            )
            for c in todo
        ]

        try:
            grader = make_chain_grader(cfg.grader, {p.index: p.answer for p in plan.prompts})
        except ValueError as exc:
            raise ConfigError(f"grader: {exc}") from None

        async def add_text(outcome: ChainOutcome) -> None:
            if outcome.result is not None and engines[outcome.spec.engine].kind != "reference":
                replica = engines[outcome.spec.engine].replicas[outcome.replica]
                outcome.text = await decode(replica, outcome.result.token_ids)

        orchestrator = Orchestrator(
            {n: EnginePool(n, h.replicas, h.max_concurrency) for n, h in engines.items()},
            max_concurrency=cfg.max_concurrency,
            max_active_chains=cfg.max_active_chains,
            max_failed_chains=cfg.failure_budget(len(plan.chains)),
            sinks=[RunDirSink(run, cfg.sampler.sampler, grader), *sinks],
            finish=add_text,
        )
        before = {n: await _read_metrics(h) for n, h in engines.items()}
        try:
            return await orchestrator.run(specs)
        except JobFailedError as exc:
            raise JobFailedError(
                f"{exc}\nFinished chains are saved in {run.path}; fix the cause and rerun "
                "the same command to resume (finished chains are skipped, failed ones "
                "retried)."
            ) from None
        finally:
            for n, h in engines.items():
                b = before.get(n)
                after = await _read_metrics(h) if b is not None else None
                if b is not None and after is not None:
                    run.append_metrics(
                        {
                            "engine": n,
                            "queries": after["prefix_cache_queries"] - b["prefix_cache_queries"],
                            "hits": after["prefix_cache_hits"] - b["prefix_cache_hits"],
                        }
                    )


def check_lengths(
    plan: JobPlan, engines: Mapping[str, OpenEngine], prompt_ids: Mapping[str, Any] | None = None
) -> None:
    """Refuse a response that cannot fit the server's context: the longest prompt (token ids
    per engine, when known) plus ``block_size × num_blocks`` against ``max_model_len``."""
    s = plan.config.sampler
    response = s.block_size * s.num_blocks
    known = [len(p.token_ids) for p in plan.prompts if p.token_ids is not None]
    for name, handle in engines.items():
        limits = [r.max_model_len for r in handle.replicas if getattr(r, "max_model_len", None)]
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


async def _engine_identities(engines: Mapping[str, OpenEngine]) -> dict[str, dict[str, Any]]:
    """What each HTTP engine serves (model, version, max_model_len, logprob mode); its replicas
    must agree."""
    out: dict[str, dict[str, Any]] = {}
    for name, handle in engines.items():
        found = [await r.identity() for r in handle.replicas if hasattr(r, "identity")]
        if not found:
            continue
        models = sorted({str(i["model"]) for i in found})
        if len(models) > 1:
            raise ConfigError(
                f"engine {name}: its replicas serve different models ({', '.join(models)}); "
                "a chain's replica would decide its model. Point base_urls at one model"
            )
        out[name] = found[0]
    return out


def pending_engines(plan: JobPlan) -> list[str]:
    """Engines with chains still to run in the plan's output directory (read-only peek)."""
    path = plan.output_dir / "samples.jsonl"
    done = finished_ok(read_jsonl(path)) if path.exists() else {}
    return sorted({c.arm.engine for c in plan.chains if c.chain_id not in done})


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (the ``fast`` extra) and ``PRESTO_UVLOOP`` is
    not ``0``; ``None``: asyncio's own. It makes the client's event loop cheaper per request
    (docs/benchmarks.md); nothing else depends on it."""
    if os.environ.get("PRESTO_UVLOOP", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run_job(plan: JobPlan, **kwargs: Any) -> JobResult:
    """Blocking :func:`run_job_async`, starting (and stopping) embedded servers around it."""
    check_output_dir(plan.output_dir)  # a config error before any engine starts
    with contextlib.ExitStack() as stack:
        urls = start_embedded_servers(plan.config, stack, only=pending_engines(plan))
        factory = event_loop_factory()
        logger.debug("event loop: %s", "uvloop" if factory is not None else "asyncio")
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(run_job_async(plan, embedded_urls=urls, **kwargs))
