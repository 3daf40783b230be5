"""The plan of a job: a validated config resolved into plain frozen data
(:mod:`presto_client.orchestration.planned`).

Arms are engine × traversal, chains prompt × chain × arm. Seeds are split from the root seed with
numpy ``SeedSequence`` by (prompt, chain) so that every arm of a (prompt, chain) gets the same
seed: ``sequential`` and ``crn`` then replay the same chain, and speedups compare identical work.
Chains are ordered prompt by prompt and chain by chain with the arms interleaved (rotating which
arm goes first), so machine drift hits all arms alike. The fingerprint is what a resumed run must
agree on. The plan does no file I/O: the prompts are handed to it (the faces read them,
:func:`~presto_client.orchestration.prompts.prompt_rows.load_prompts`), and what is finished in a
run directory is the run directory's answer (:meth:`RunDir.finished_chains`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from presto_client.core.methods import arm_traversal_names
from presto_client.core.predictor import CertaintyPredictor
from presto_client.core.settings import SamplerConfig
from presto_client.errors import ConfigError
from presto_client.orchestration.config.loading import redacted_dump
from presto_client.orchestration.config.schema import JobConfig
from presto_client.orchestration.planned import (
    Arm,
    JobPlan,
    JobSettings,
    PlannedChain,
    PlannedEngine,
    Prompt,
)
from presto_client.orchestration.planning.predictor_file import (
    load_predictor,
    predictor_fingerprint,
)
from presto_client.orchestration.prompts.prompt_rows import dataset_fingerprint

__all__ = ["Arm", "JobPlan", "PlannedChain", "describe_plan", "make_plan"]


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
    valid = arm_traversal_names()
    bad = [t for t in rules if t not in valid]
    if bad:
        raise ConfigError(
            f"unknown traversal(s) {', '.join(bad)}; valid traversals are: {', '.join(valid)}"
        )
    return [Arm(f"{e}/{t}", e, t) for e in names for t in rules]


def _prompts_digest(prompts: Sequence[Prompt]) -> str:
    def entry(p: Prompt) -> list[Any]:
        out: list[Any] = [p.text, list(p.token_ids) if p.token_ids is not None else None]
        if p.messages is not None:  # (absent otherwise: the digest of prompts as it always was)
            out.append([list(m) for m in p.messages])
        return out

    payload = json.dumps([entry(p) for p in prompts])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def job_fingerprint(
    cfg: JobConfig, prompts: Sequence[Prompt], predictor: CertaintyPredictor | None = None
) -> dict[str, Any]:
    """What defines the work of a chain: a resumed run must agree on all of it.

    Traversals and engines may be added to a run directory later (new arms); an engine already
    there must keep its kind and model. A refit predictor enters as its coefficients.
    """
    # The stream window changes the speed, never a chain (stream replays the sequential chain).
    sampler = cfg.sampler.model_dump(mode="json", exclude={"traversals", "predictor", "window"})
    if not sampler["options"]:
        del sampler["options"]  # (the fingerprint of a sampler without options, as it always was)
    if predictor is not None:  # (absent otherwise: the fingerprint of a job without one)
        sampler["predictor"] = predictor_fingerprint(predictor)
    engines: dict[str, Any] = {}
    for e in cfg.engines:
        engines[str(e.name)] = {
            "kind": e.kind,
            "model": e.fingerprint_model(),
            "eos_token_id": e.eos_token_id,
        }
    fingerprint: dict[str, Any] = {
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
    dataset = dataset_fingerprint(prompts)
    if dataset is not None:  # (prompts of a file or dataset: which rows, from where)
        fingerprint["dataset"] = dataset
    return fingerprint


def make_plan(
    cfg: JobConfig,
    prompts: Sequence[Prompt],
    *,
    engines: Sequence[str] | None = None,
    traversals: Sequence[str] | None = None,
) -> JobPlan:
    """The job resolved: its engines, samplers and settings as plain data, and its chains in run
    order (arms interleaved chain by chain)."""
    plist = tuple(prompts)
    arms = make_arms(cfg, engines=engines, traversals=traversals)
    samplers = engine_samplers(cfg)
    chains: list[PlannedChain] = []
    n = len(arms)
    for p in plist:
        for c in range(cfg.chains_per_prompt):
            seed = chain_seed(cfg.seed, p.index, c)
            shift = (p.index * cfg.chains_per_prompt + c) % n
            for arm in arms[shift:] + arms[:shift]:
                cid = f"{arm.arm}/p{p.index:04d}/c{c:03d}"
                size = cfg.sampler.method_size(arm.traversal)
                sampler = samplers[arm.engine]
                chains.append(PlannedChain(cid, arm, p.index, c, seed, size, sampler))
    predictor = load_predictor(cfg.sampler.predictor) if cfg.sampler.predictor else None
    return JobPlan(
        settings=job_settings(cfg, len(chains)),
        prompts=plist,
        engines=planned_engines(cfg),
        arms=tuple(arms),
        chains=tuple(chains),
        fingerprint=job_fingerprint(cfg, plist, predictor),
        samplers=samplers,
        predictor=predictor,
    )


def engine_samplers(cfg: JobConfig) -> dict[str, SamplerConfig]:
    """The plain :class:`SamplerConfig` of each engine: the job's sampler with the engine's EOS
    (a config error names the sampler's field)."""
    out: dict[str, SamplerConfig] = {}
    for e in cfg.engines:
        try:
            out[str(e.name)] = cfg.sampler.to_sampler_config(e.resolved_eos_token_id())
        except ValueError as exc:
            raise ConfigError(f"sampler: {exc}") from None
    return out


def planned_engines(cfg: JobConfig) -> dict[str, PlannedEngine]:
    """Every engine of the config as plain data, in the config's order."""
    return {str(e.name): e.planned(i) for i, e in enumerate(cfg.engines)}


def job_settings(cfg: JobConfig, num_chains: int) -> JobSettings:
    """The job-wide settings of ``cfg`` (the failure budget resolved for ``num_chains``)."""
    s = cfg.sampler
    return JobSettings(
        name=cfg.name,
        output_dir=Path(cfg.output_dir or Path("runs") / (cfg.name or "job")),
        chains_per_prompt=cfg.chains_per_prompt,
        seed=cfg.seed,
        max_concurrency=cfg.max_concurrency,
        max_active_chains=cfg.max_active_chains,
        failure_budget=cfg.failure_budget(num_chains),
        sampler_name=s.sampler,
        block_size=s.block_size,
        num_blocks=s.num_blocks,
        steps_per_block=s.steps_per_block,
        chat_template=cfg.prompts.chat_template,
        system_prompt=cfg.prompts.system_prompt,
        grader=cfg.grader.to_spec() if cfg.grader is not None else None,
        compare_to=cfg.compare_to,
        resolved_config=redacted_dump(cfg),
        executor=cfg.executor.to_settings(),
    )


def describe_plan(cfg: JobConfig, plan: JobPlan, finished: int = 0) -> str:
    """What the job of ``cfg`` would run, as planned, in words (``presto validate``)."""
    s = cfg.sampler
    lines = [f"job {plan.settings.name}: {len(plan.chains)} chain(s) -> {plan.output_dir}"]
    for e in plan.engines.values():
        lines.append(
            f"  engine {e.name} [{e.kind}] {e.description} max_concurrency={e.max_concurrency}"
            f" speculation_tolerance={e.speculation_tolerance:g}"
        )
    tau = s.tau if s.tau is not None else 1 / s.alpha
    lines.append(
        f"  sampler {s.sampler}: alpha={s.alpha} tau={tau:g}"
        f" block_size={s.block_size} num_blocks={s.num_blocks} K={s.steps_per_block}"
        f" n_pf={s.n_pf} window={'engine-sized' if s.window is None else s.window}"
        f" samples={s.samples if s.samples != 'auto' else f'auto={s.matched_samples()}'}"
        f" epsilon={s.epsilon} stop_at_eos={str(s.stop_at_eos).lower()}"
    )
    if s.stop_at_eos:
        for e in plan.engines.values():
            if e.eos_token_id is None and e.takes_text:
                lines.append(
                    f"  engine {e.name}: no eos_token_id in the config: its EOS is asked of the "
                    "server before any chain runs (where it states one, else of its chat "
                    "template; where neither can "
                    "tell, its chains run every block; engines[].eos_token_id sets it)"
                )
            elif e.eos_token_id is None:
                lines.append(
                    f"  engine {e.name}: no EOS token known, so its chains run every block "
                    f"(set engines[].eos_token_id to stop at the end of an answer)"
                )
    lines.append(f"  arms: {', '.join(a.arm for a in plan.arms)}")
    lines.append(
        f"  {len(plan.prompts)} prompt(s) x {cfg.chains_per_prompt} chain(s) x "
        f"{len(plan.arms)} arm(s) = {len(plan.chains)} chain(s); root seed {cfg.seed}"
    )
    j = plan.settings
    lines.append(
        f"  at most {j.max_concurrency} request(s) in flight, "
        f"{j.max_active_chains or j.max_concurrency} chain(s) at once, failure budget "
        f"{j.failure_budget}"
    )
    x = j.executor
    if x.kind == "ray":
        where = "a local Ray instance" if x.address is None else f"the Ray cluster at {x.address}"
        lines.append(
            f"  executor ray: {x.workers} worker(s) on {where}, each a share of every bound"
        )
    if finished:
        lines.append(f"  {finished} chain(s) already finished in {plan.output_dir} (resume)")
    return "\n".join(lines)
