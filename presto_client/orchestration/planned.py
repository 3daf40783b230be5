"""The plan of a job as plain frozen data: everything the layers below the plan read.

:func:`~presto_client.orchestration.planning.plan.make_plan` resolves a validated job config
(pydantic)
into these objects; the engines' opening, the job's run, the orchestrator and the run directory
see only them, never the config's models. An engine kind says how its replicas are opened by
handing the plan a :class:`ReplicaOpener` (a plain object of its own). A chain's key for a
gateway (:func:`routing_key`) is derived from the plan's fingerprint here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from presto_client.child_servers.embedded import EmbeddedServer as EmbeddedProcess
from presto_client.child_servers.lifecycle import ChildServer
from presto_client.child_servers.llamacpp import LlamaServerProcess
from presto_client.core.predictor import CertaintyPredictor
from presto_client.core.settings import SamplerConfig
from presto_client.core.speculation import DEFAULT_TOLERANCE


@dataclass(frozen=True, slots=True)
class DatasetIdentity:
    """Where a job's rows came from: a Hugging Face dataset (``name``, ``config``, ``split``,
    ``revision`` as asked, ``commit`` as resolved) or a local file or saved dataset (``path``)."""

    name: str | None = None
    path: str | None = None
    config: str | None = None
    split: str | None = None
    revision: str | None = None
    commit: str | None = None
    """The revision the loader resolved (the Hub commit, as ``datasets`` reports it)."""


@dataclass(frozen=True, slots=True)
class PromptOrigin:
    """The dataset row a prompt was made from (the fingerprint's ``dataset`` entry)."""

    dataset: DatasetIdentity
    row: int
    """The row's index in its split or file (before any shuffle or limit)."""
    digest: str
    """A digest of the row's fields (every column), so a changed row is seen."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt: its text (to be tokenized by the engine), its token ids, or a conversation
    (``messages``: (role, content) turns through the engine's chat template)."""

    index: int
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    answer: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    """A conversation (``text`` is then its last user turn, shown in tables)."""
    origin: PromptOrigin | None = None


class ReplicaOpener(Protocol):
    """How an engine's replicas are made (one plain object per engine of the plan)."""

    def open_replicas(self, embedded_urls: Mapping[str, str]) -> list[Any]:
        """The engine's replicas, ready to use (``embedded_urls``: the URL of each embedded
        server started for the job, by engine name); their owner closes them."""
        ...


class ServerToStart(Protocol):
    """A server that presto starts for an engine before it opens (its URL is then the
    engine's): plain settings, and the child process they make."""

    what: ClassVar[str]
    """The engine it serves, in an error message ("the embedded engine did not start")."""

    def child(self) -> ChildServer:
        """The server's process, not started yet."""
        ...


@dataclass(frozen=True, slots=True)
class EmbeddedServer:
    """An embedded CPU server to start before the engines open."""

    port: int | None
    dtype: str
    startup_timeout_s: float

    what: ClassVar[str] = "the embedded engine"

    def child(self) -> ChildServer:
        return EmbeddedProcess(
            self.port, dtype=self.dtype, startup_timeout_s=self.startup_timeout_s
        )


@dataclass(frozen=True, slots=True)
class LlamaCppServer:
    """A llama.cpp server that presto sets up (once, cached) and starts before the engines
    open."""

    parallel: int
    port: int | None
    startup_timeout_s: float
    setup_timeout_s: float
    threads: int | None = None
    """llama-server's threads (``None``: its default, every core)."""

    what: ClassVar[str] = "the llama.cpp engine"

    def child(self) -> ChildServer:
        return LlamaServerProcess(
            parallel=self.parallel,
            port=self.port,
            threads=self.threads,
            startup_timeout_s=self.startup_timeout_s,
            setup_timeout_s=self.setup_timeout_s,
        )


@dataclass(frozen=True, slots=True)
class PlannedEngine:
    """An engine of the job, resolved: what the orchestration needs to open and bound it."""

    name: str
    kind: str
    max_concurrency: int
    eos_token_id: int | None
    """The EOS at which its responses are truncated (the config's, else the engine's own)."""
    takes_text: bool
    """Whether it tokenizes text prompts (and detokenizes responses) itself."""
    probes: bool
    """Whether its replicas are probed before the job (a served engine)."""
    description: str
    """Where it is and what it serves, in words (``presto validate``)."""
    opener: ReplicaOpener
    server: ServerToStart | None = None
    """A server presto starts for the engine before it opens (``None``: none)."""
    speculation_tolerance: float = DEFAULT_TOLERANCE
    """How much speculation may slow a decode step of a replica (its budget's tolerance)."""
    speculation_probe: bool = True
    """Whether its budgets probe the cost under load with one speculative proposal before it
    is measured (off where prefix caches are per slot: llama.cpp)."""


@dataclass(frozen=True, slots=True)
class GraderSpec:
    """The job's grader, plain: ``math``/``exact``/``choice``, a regex or a python function."""

    kind: str
    pattern: str | None = None
    function: str | None = None
    strict: bool = False
    """Only the answer the reference evaluation reads (the last ``\\boxed{}``, ...), no fallback."""

    def label(self) -> str:
        if self.kind == "regex":
            return f"regex: {self.pattern}"
        if self.kind == "python":
            return f"python: {self.function}"
        return f"strict {self.kind}" if self.strict else self.kind


@dataclass(frozen=True, slots=True)
class ExecutorSettings:
    """Where the chains run (``executor`` of the config): this process, or Ray workers."""

    kind: str = "local"
    workers: int = 1
    address: str | None = None
    """The Ray cluster to join (``None``: start a local one)."""
    connect_timeout_s: float = 30.0
    cpus_per_worker: float = 1.0
    runtime_env: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class JobSettings:
    """The job-wide settings the run reads (bounds, output, prompt formatting, grading)."""

    name: str | None
    output_dir: Path
    chains_per_prompt: int
    seed: int
    max_concurrency: int
    max_active_chains: int | None
    failure_budget: int
    """Most failed chains before the job stops (resolved for the plan's chain count)."""
    sampler_name: str
    block_size: int
    num_blocks: int
    steps_per_block: int
    chat_template: bool
    system_prompt: str | None
    grader: GraderSpec | None
    resolved_config: Mapping[str, Any]
    """The resolved config as plain data, secrets removed (``config.resolved.yaml``)."""
    executor: ExecutorSettings = ExecutorSettings()
    """Where the chains run; no part of the fingerprint (it never changes a chain)."""
    compare_to: str | None = None
    """The traversal graded arms are tested against (null: sequential, else the first MH arm)."""


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
    size: int | None = None
    """The method's size parameter (``n_pf`` or ``window``), resolved from the config; not part
    of the chain's identity (``as_dict``, what run.json records)."""
    sampler: SamplerConfig | None = None
    """The plain sampler the chain runs (its engine's: the EOS differs)."""

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


@dataclass(frozen=True, slots=True)
class JobPlan:
    """A job, planned: its settings, prompts, engines, arms and chains in run order."""

    settings: JobSettings
    prompts: tuple[Prompt, ...]
    engines: Mapping[str, PlannedEngine]
    """Every engine of the config, in its order (arms may use only some)."""
    arms: tuple[Arm, ...]
    chains: tuple[PlannedChain, ...]
    fingerprint: Mapping[str, Any]
    samplers: Mapping[str, SamplerConfig]
    """The plain sampler of each engine (its EOS differs), resolved when the plan is made."""
    predictor: CertaintyPredictor | None = None
    """The predictive traversal's predictor (``sampler.predictor``); ``None``: the paper's."""

    @property
    def output_dir(self) -> Path:
        return self.settings.output_dir


def routing_key(fingerprint: Mapping[str, Any], replica_key: str) -> str:
    """The key a chain's requests carry to a gateway (``routing_key_header``): the same for the
    same chain in every session of the same work, so a resumed or rerun chain goes back to the
    replica that holds its prefix, and different for another job's chain of the same index.

    The chain is named by its replica key (its prompt and chain index), which the arms of one
    (prompt, chain) share: they replay one chain's prefixes, so one replica's cache serves them
    all. The fingerprint enters without its engines, which a run may gain later (a new arm must
    not move the chains already there).
    """
    work = {k: v for k, v in fingerprint.items() if k != "engines"}
    payload = json.dumps(work, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(f"{payload}\n{replica_key}".encode()).hexdigest()
    return f"presto-{digest[:20]}"
