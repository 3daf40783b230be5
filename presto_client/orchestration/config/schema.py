"""The job configuration's schema: pydantic models of a job, turned into plain objects.

The engines' classes are in :mod:`presto_client.orchestration.config.engine_config` (re-exported
here).
A job is: one or more **engines** (servers to talk to, or the in-process reference model, or the
embedded CPU server), a list of **prompts**, one **sampler** with one or more **traversals**
(each engine × traversal is an *arm*), ``chains_per_prompt`` chains per prompt and arm, a root
``seed`` and an ``output_dir``. The names a config may use (engine kinds, samplers, traversals)
come from their registries, never restated here.

Reading a YAML file, ``--set`` overrides and error messages with field paths:
:mod:`presto_client.orchestration.config.loading` and
:mod:`presto_client.orchestration.config.overrides`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)

from presto_client import defaults
from presto_client.core.kernels import (
    SAMPLER_KERNELS,
    make_kernel,
    sampler_names,
    sampler_settings,
)
from presto_client.core.methods import arm_traversal_names, get_method
from presto_client.core.sample_baselines import DEFAULT_SAMPLES
from presto_client.core.settings import MAX_ALPHA, MIN_TAU, ROUND_SIZE, WINDOW, SamplerConfig
from presto_client.orchestration.config.dataset_config import PromptsConfig
from presto_client.orchestration.config.engine_config import (
    ENGINE_TAGS,
    EmbeddedEngineConfig,
    EngineConfigBase,
    HttpEngineConfig,
    ReferenceEngineConfig,
    StrictModel,
    engine_config_type,
    engine_kinds,
    http_kinds,
    local_kinds,
    on_engine_kind_registered,
    register_engine_kind,
)
from presto_client.orchestration.config.executor_config import ExecutorConfig
from presto_client.orchestration.config.llamacpp_engine import ManagedLlamaCppConfig
from presto_client.orchestration.config.serve_config import ServeConfig, ServeLimits
from presto_client.orchestration.grading import GraderConfig
from presto_client.orchestration.planned import Prompt

EngineConfig = engine_config_type()
"""An engine entry of a job config (every registered kind, the managed llama.cpp included)."""

__all__ = [
    "ENGINE_TAGS",
    "EmbeddedEngineConfig",
    "EngineConfig",
    "EngineConfigBase",
    "HttpEngineConfig",
    "JobConfig",
    "ManagedLlamaCppConfig",
    "Prompt",
    "PromptsConfig",
    "ReferenceEngineConfig",
    "SamplerSettings",
    "ServeConfig",
    "ServeLimits",
    "engine_kinds",
    "http_kinds",
    "local_kinds",
    "register_engine_kind",
]

# --------------------------------------------------------------------------------------------
# Sampler
# --------------------------------------------------------------------------------------------


def _known_traversal(name: str) -> str:
    valid = arm_traversal_names()
    if name not in valid:
        raise ValueError(
            f"unknown traversal {name!r}; valid traversals are: {', '.join(map(repr, valid))}"
        )
    return name


def _known_sampler(name: str) -> str:
    valid = sampler_names()
    if name not in valid:
        raise ValueError(f"unknown sampler {name!r}; valid samplers are: {', '.join(valid)}")
    return name


TraversalName = Annotated[str, AfterValidator(_known_traversal)]
"""A registered method (:func:`presto_client.core.methods.arm_traversal_names`)."""
RegisteredSampler = Annotated[str, AfterValidator(_known_sampler)]
"""A registered sampler (:func:`presto_client.core.kernels.sampler_names`)."""

_CORE = SamplerConfig()
"""The core's defaults: every sampler default below is read from it, never restated."""


def _default_traversals() -> list[TraversalName]:
    # stream: the fastest PreSTO traversal measured (docs/benchmarks.md), and it replays the
    # sequential chain exactly.
    return ["stream"]


class SamplerSettings(StrictModel):
    """The sampler every arm runs, and the traversals (baseline and PreSTO rules) to run it with."""

    sampler: RegisteredSampler = Field(
        _CORE.sampler,
        description=f"Which power sampler: one of {', '.join(sampler_names())}; or a block with "
        "its own settings, e.g. {kind: entropy_cut, beta: 4} or "
        "{kind: multi_try_mh, k_try: 4, temperatures: [0.5, 1.0]}.",
    )
    alpha: float = Field(
        _CORE.alpha,
        gt=0,
        le=MAX_ALPHA,
        allow_inf_nan=False,
        description=f"Sharpening exponent α of the target p0^α: a finite number in "
        f"(0, {MAX_ALPHA:g}] (the paper uses 4; beyond ~100 it is greedy decoding in practice).",
    )
    tau: float | None = Field(
        None,
        ge=MIN_TAU,
        allow_inf_nan=False,
        description=f"Proposal temperature τ, at least {MIN_TAU:g}; null: 1/α (the paper's "
        "setting).",
    )
    block_size: int = Field(_CORE.block_size, ge=1, description="Tokens per block B.")
    num_blocks: int = Field(
        _CORE.num_blocks, ge=1, description="Blocks per response (length = B × blocks)."
    )
    steps_per_block: int = Field(
        _CORE.steps_per_block,
        description="K: Metropolis–Hastings transitions after each block's extension (>= 1).",
    )
    stop_at_eos: StrictBool = Field(
        _CORE.stop_at_eos,
        description="Stop a chain after the block whose state holds the engine's EOS, "
        "truncated after the first EOS (block_size x num_blocks is then a budget); false: run "
        "every block (fixed-length responses).",
    )
    traversals: list[TraversalName] = Field(
        default_factory=_default_traversals,
        min_length=1,
        description=f"Traversal rules to run, one arm each: {', '.join(arm_traversal_names())} "
        "(sample, low_temperature, greedy: baselines without MH). "
        "'sequential' is the PowerMH baseline; speedups are measured against it.",
    )
    n_pf: int = Field(
        ROUND_SIZE,
        ge=1,
        description="N_pf: proposal requests prefetched per round (bfs, predictive, crn).",
    )
    window: int | None = Field(
        WINDOW,
        ge=1,
        description="W of the 'stream' traversal: an optional cap on the proposals a chain keeps "
        "in flight. null (the default): the engine sizes the window, from its measured cost and "
        "the slots its chains' heads need, up to every remaining transition of the block.",
    )
    samples: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        DEFAULT_SAMPLES,
        description="N of the sampling baselines: best_of_n and majority_vote draw N samples "
        "per chain (one draw read by both when a job runs both), power_smc runs N particles. "
        "'auto': the N whose samples cost what one MH chain of this shape generates without EOS "
        "(matched_samples).",
    )
    smc_ess_threshold: float = Field(
        _CORE.smc_ess_threshold,
        gt=0,
        le=1,
        description="power_smc: resample when the effective sample size falls below this share "
        "of the particles.",
    )
    epsilon: float = Field(
        _CORE.epsilon, gt=0, lt=0.5, description="ε of ε-certain decisions (statistics, predictor)."
    )
    beta: float = Field(_CORE.beta, gt=0, description="EntropyCut: exponent of the cut law.")
    k_try: int = Field(
        _CORE.k_try, ge=1, description="MultiTryMH: candidate suffixes per transition."
    )
    temperatures: list[float] = Field(
        default_factory=lambda: list(_CORE.temperatures),
        min_length=1,
        description="MultiTryMH: temperatures a candidate may be drawn at.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Settings of a registered sampler's own (its kernel's options), given in "
        "the sampler block: sampler: {kind: NAME, SETTING: VALUE}.",
    )
    predictor: Path | None = Field(
        None,
        description="The predictive traversal's certainty predictor: a JSON file written by "
        "`presto fit-predictor RUN_DIR -o FILE` (relative to the config file); null: the "
        "paper's coefficients. It steers prefetching only, never a decision.",
    )

    @field_validator("steps_per_block")
    @classmethod
    def _some_steps(cls, k: int) -> int:
        if k < 1:
            raise ValueError(
                f"steps_per_block is {k}: with no Metropolis-Hastings step a chain is a plain "
                "sample at the proposal temperature, not a power sample (the "
                "'low_temperature' baseline arm is that); give K >= 1"
            )
        return k

    @model_validator(mode="before")
    @classmethod
    def _sampler_block(cls, data: Any) -> Any:
        """A sampler's own settings discriminated on ``kind`` (each kind's settings come from the
        samplers' registry): ``sampler: {kind: entropy_cut, beta: 4, alpha: 4}``, or the block
        ``sampler: {sampler: {kind: entropy_cut, beta: 4}, alpha: 4}``. Both are read into the
        flat fields, the form old configs use and the one a run directory records (so every form
        is the same job); a setting of another sampler is refused."""
        if isinstance(data, dict) and "kind" in data:  # sampler: {kind: entropy_cut, beta: 4}
            if "sampler" in data:
                raise ValueError("give kind or sampler, not both (they name the same thing)")
            data = dict(data)
            kind = data.pop("kind")
            own = sampler_settings(kind)
            every = {k for n in sampler_names() for k in sampler_settings(n)}
            block = {"kind": kind, **{k: data.pop(k) for k in [*data] if k in every | set(own)}}
            data["sampler"] = block
        if not isinstance(data, dict) or not isinstance(data.get("sampler"), dict):
            return data
        block = dict(data["sampler"])
        kind = block.pop("kind", None)
        valid = sampler_names()
        if kind not in valid:
            raise ValueError(
                f"sampler: {{kind: ...}} names no known sampler ({kind!r}); valid samplers "
                f"are: {', '.join(valid)}"
            )
        own = sampler_settings(kind)
        unknown = [k for k in block if k not in own]
        if unknown:
            raise ValueError(
                f"sampler {kind!r} has no setting {', '.join(map(repr, unknown))}; its own "
                f"settings are: {', '.join(own) or 'none'} (common ones, e.g. alpha, go beside "
                "the sampler block)"
            )
        twice = [k for k in block if k in data]
        if twice:
            raise ValueError(
                f"{', '.join(twice)} given twice: inside sampler: {{kind: {kind}, ...}} and "
                "beside it"
            )
        options = SAMPLER_KERNELS[kind].options
        own_options = {k: block.pop(k) for k in [*block] if k in options}
        out = {**data, "sampler": kind, **block}
        if own_options:
            out["options"] = own_options
        return out

    @model_validator(mode="after")
    def _options_of_the_sampler(self) -> SamplerSettings:
        """Each option is the chosen sampler's, and its value is what the kernel accepts."""
        declared = SAMPLER_KERNELS[self.sampler].options
        for name, value in self.options.items():
            setting = declared.get(name)
            if setting is None:
                raise ValueError(
                    f"sampler {self.sampler!r} has no setting {name!r}; its own settings are: "
                    f"{', '.join(sampler_settings(self.sampler)) or 'none'}"
                )
            try:
                setting.parse(value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"sampler {self.sampler!r}, {name}: {exc}") from None
        return self

    def method_size(self, traversal: str) -> int | None:
        """The size a method's arm runs with: ``n_pf`` (a round method), ``window``
        (``stream``) or ``None`` (a method without one)."""
        size = get_method(traversal).size
        samples = self.matched_samples() if self.samples == "auto" else self.samples
        return {"round": self.n_pf, "window": self.window, "samples": samples}.get(size)

    def matched_samples(self) -> int:
        """The N of compute-matched baselines: one MH chain, without EOS, generates its ``T``
        tokens and, at each of the ``K`` transitions of block ``b``, a proposal from a cut
        uniform over the response so far to the block's end (``b·B/2`` tokens on average, for
        each of the kernel's sequences per proposal): ``T + K·s·(B/2)·nb(nb+1)/2`` tokens, or
        N samples of ``T`` (PowerMH's cut law; the others' differ, and EOS shortens both)."""
        total = self.block_size * self.num_blocks
        per = make_kernel(self.to_sampler_config()).sequences_per_proposal
        nb = self.num_blocks
        chain = total + self.steps_per_block * per * self.block_size / 2 * nb * (nb + 1) / 2
        return max(1, round(chain / total))

    @model_validator(mode="before")
    @classmethod
    def _singular_traversal(cls, data: Any) -> Any:
        if isinstance(data, dict) and "traversal" in data:
            data = dict(data)
            if "traversals" in data:
                raise ValueError("give traversal or traversals, not both")
            data["traversals"] = data.pop("traversal")
        if isinstance(data, dict) and isinstance(data.get("traversals"), str):
            data = {**data, "traversals": [data["traversals"]]}
        return data

    @field_validator("traversals")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"traversals repeat a rule: {v}")
        return v

    @field_validator("temperatures")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if any(t <= 0 for t in v):
            raise ValueError("temperatures must all be > 0")
        return v

    def to_sampler_config(self, eos_token_id: int | None = None) -> SamplerConfig:
        """The plain :class:`SamplerConfig` the core runs (one per engine: EOS differs)."""
        return SamplerConfig(
            sampler=self.sampler,
            alpha=self.alpha,
            tau=self.tau,
            block_size=self.block_size,
            num_blocks=self.num_blocks,
            steps_per_block=self.steps_per_block,
            beta=self.beta,
            k_try=self.k_try,
            temperatures=tuple(self.temperatures),
            epsilon=self.epsilon,
            eos_token_id=eos_token_id,
            stop_at_eos=self.stop_at_eos,
            smc_ess_threshold=self.smc_ess_threshold,
            options=tuple(sorted(self.options.items())),
        )


# --------------------------------------------------------------------------------------------
# The job
# --------------------------------------------------------------------------------------------


class JobConfig(StrictModel):
    """A batch job: engines × traversals (arms), prompts × chains per prompt, one root seed."""

    name: str | None = Field(None, description="Name of the job (default: the config file name).")
    engines: list[EngineConfig] = Field(
        default_factory=list,
        description="Engines to run on; each engine × traversal is one arm. Empty: the "
        "embedded CPU engine.",
    )
    prompts: PromptsConfig = Field(description="The prompts (inline texts/token ids, or a file).")
    sampler: SamplerSettings = Field(
        default_factory=SamplerSettings, description="The sampler and its traversals."
    )
    chains_per_prompt: int = Field(1, ge=1, description="Independent chains per prompt and arm.")
    seed: int = Field(
        0, ge=0, description="Root seed; split per (prompt, chain) with numpy SeedSequence."
    )
    output_dir: Path | None = Field(
        None, description="Run directory (default: runs/<job name>); rerunning resumes it."
    )
    max_concurrency: int = Field(
        defaults.JOB_MAX_CONCURRENCY,
        ge=1,
        description="Most requests in flight over all engines together.",
    )
    max_active_chains: int | None = Field(
        None,
        ge=1,
        description="Most chains running at once (null: enough to keep max_concurrency busy).",
    )
    grader: GraderConfig | None = Field(
        None,
        description="Grade each finished chain against its prompt's answer: math, exact, "
        "choice, 'regex: PATTERN' or 'python: module:function' (null: no grading).",
    )
    compare_to: TraversalName | None = Field(
        None,
        description="Graded jobs: the traversal every other arm of an engine is tested against "
        "(McNemar, paired bootstrap of accuracy), e.g. stream to test each baseline against "
        "power sampling (null: the engine's sequential arm, else its first MH arm).",
    )
    max_failed_chains: int | None = Field(
        None,
        ge=0,
        description="Failure budget: the job stops when more chains than this have failed "
        "(null: 10% of the chains, at least 1).",
    )
    executor: ExecutorConfig = Field(
        default_factory=ExecutorConfig,
        description="Where the chains run: {kind: local} (this process) or {kind: ray, "
        "workers: N, address: null|auto|ray://HOST:PORT}.",
    )
    serve: ServeConfig = Field(
        default_factory=ServeConfig,
        description="presto serve only: the bounds of one request's settings "
        "(serve: {limits: {max_steps_per_block: 1024, ...}}); presto run ignores it.",
    )

    @model_validator(mode="after")
    def _engines(self) -> JobConfig:
        if not self.engines:
            self.engines = [EmbeddedEngineConfig(kind="embedded")]
        counts: dict[str, int] = {}
        for e in self.engines:
            counts[e.kind] = counts.get(e.kind, 0) + 1
        seen: dict[str, int] = {}
        for i, e in enumerate(self.engines):
            if e.name is None:
                n = seen.get(e.kind, 0)
                seen[e.kind] = n + 1
                e.name = e.kind if counts[e.kind] == 1 else f"{e.kind}{n}"
            if not e.name or any(c in e.name for c in "/\\ \t\n,"):
                raise ValueError(
                    f"engines[{i}].name {e.name!r} must be non-empty without '/', ',' or spaces"
                )
        names = [str(e.name) for e in self.engines]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"engine names must be unique; repeated: {', '.join(dup)}")
        for i, e in enumerate(self.engines):
            vocab = e.known_vocab_size()
            for j, ids in enumerate(self.prompts.token_ids or ()):
                if vocab is not None and max(ids) >= vocab:
                    raise ValueError(
                        f"prompts.token_ids[{j}] holds {max(ids)}, outside engines[{i}]'s "
                        f"vocabulary of {vocab} tokens"
                    )
        if self.prompts.token_ids is None:
            for i, e in enumerate(self.engines):
                if not e.takes_text:
                    raise ValueError(
                        f"engines[{i}] ({e.kind}) takes token-id prompts: "
                        "give prompts.token_ids instead of texts/file"
                    )
        return self

    @field_validator("compare_to")
    @classmethod
    def _compared_arm_runs(cls, name: str | None, info: ValidationInfo) -> str | None:
        sampler = info.data.get("sampler")  # (absent when the sampler block itself is wrong)
        if name is not None and sampler is not None and name not in sampler.traversals:
            raise ValueError(
                f"{name!r} is not among sampler.traversals "
                f"({', '.join(sampler.traversals)}): add it there or compare to one of them"
            )
        return name

    @model_validator(mode="after")
    def _executor_fits(self) -> JobConfig:
        """Each Ray worker holds at least one slot of every bound it shares (the workers'
        shares add up to the bound: ``orchestration/executors/shares.py``)."""
        if self.executor.kind != "ray":
            return self
        workers = self.executor.to_settings().workers
        bounds = [("max_concurrency", self.max_concurrency)]
        if self.max_active_chains is not None:
            bounds.append(("max_active_chains", self.max_active_chains))
        bounds += [
            (f"engines[{i}].max_concurrency", e.max_concurrency) for i, e in enumerate(self.engines)
        ]
        for field, bound in bounds:
            if workers > bound:
                raise ValueError(
                    f"executor.workers = {workers} exceeds {field} = {bound}: each worker "
                    "takes a share of at least one slot (the shares add up to the bound); "
                    f"use at most {bound} workers or raise {field}"
                )
        return self

    def engine_names(self) -> list[str]:
        return [str(e.name) for e in self.engines]

    def failure_budget(self, num_chains: int) -> int:
        if self.max_failed_chains is not None:
            return self.max_failed_chains
        return max(1, num_chains // 10)


def _rebuild_engines() -> None:
    """The ``engines`` union again from the engine kinds' registry (a kind registered after
    this module was imported is then valid, and listed in errors)."""
    JobConfig.model_fields["engines"].annotation = list[engine_config_type()]  # type: ignore[misc]
    JobConfig.model_rebuild(force=True)


on_engine_kind_registered(_rebuild_engines)
