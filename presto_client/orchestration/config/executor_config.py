"""The job config's ``executor``: where the chains of a job run (this process, or Ray workers).

``executor: {kind: local}`` (the default) runs every chain in the job's own asyncio process;
``executor: {kind: ray, workers: N, address: null}`` shards the chains over ``N`` Ray actors
(:mod:`presto_client.orchestration.executors.ray_executor`), each an asyncio orchestrator of its
own. ``address: null`` starts a local Ray instance of ``N`` CPUs; ``auto`` joins the cluster this
machine belongs to (``ray start``, or ``RAY_ADDRESS``); ``ray://HOST:PORT`` joins one through the
Ray client, ``HOST:PORT`` through its GCS. The executor never changes a chain (the same seeds, the
same replicas, the same tokens): it is no part of the run directory's fingerprint.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from presto_client.orchestration.config.engine_config import StrictModel
from presto_client.orchestration.planned import ExecutorSettings

RAY_EXTRA_HINT = "install the extra: pip install 'presto-client[ray]'"
DEFAULT_RAY_WORKERS = 2

_HOST_PORT = re.compile(r"^(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")


def ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


class ExecutorConfig(StrictModel):
    """Where the chains run: ``local`` (this process) or ``ray`` (``workers`` Ray actors)."""

    kind: Literal["local", "ray"] = Field(
        "local", description="local: this process; ray: Ray actors (the extra 'ray')."
    )
    workers: int | None = Field(
        None,
        description=f"Ray actors the chains are sharded over (kind ray; default "
        f"{DEFAULT_RAY_WORKERS}); each gets a share of every engine's max_concurrency.",
    )
    address: str | None = Field(
        None,
        description="The Ray cluster to join: null starts a local one, 'auto' joins this "
        "machine's, 'ray://HOST:PORT' or 'HOST:PORT' a remote one (kind ray).",
    )
    connect_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Bound on joining the cluster and on placing the workers, seconds.",
    )
    cpus_per_worker: float = Field(
        1.0, gt=0, description="CPUs a worker reserves on its node (Ray's num_cpus)."
    )
    runtime_env: dict[str, Any] | None = Field(
        None,
        description="Ray runtime_env of the job (e.g. pip/py_modules for the workers of a "
        "cluster whose nodes lack presto-client); null: the nodes' own Python.",
    )

    @field_validator("workers")
    @classmethod
    def _some_workers(cls, workers: int | None) -> int | None:
        if workers is not None and workers < 1:
            raise ValueError(f"executor.workers must be at least 1 (got {workers})")
        return workers

    @model_validator(mode="after")
    def _consistent(self) -> ExecutorConfig:
        if self.kind == "local":
            for name in ("workers", "address", "runtime_env"):
                if getattr(self, name) is not None:
                    raise ValueError(f"executor.{name} applies to kind ray only (kind is local)")
            return self
        if self.address is not None:
            address = self.address.strip()
            if address != "auto" and not _HOST_PORT.match(address):
                raise ValueError(
                    f"executor.address {self.address!r} is not a Ray address: null (start a "
                    "local one), 'auto', 'ray://HOST:PORT' or 'HOST:PORT'"
                )
            self.address = address
        if not ray_installed():
            raise ValueError(
                f"executor.kind ray needs Ray, which is not installed; {RAY_EXTRA_HINT}"
            )
        return self

    def to_settings(self) -> ExecutorSettings:
        return ExecutorSettings(
            kind=self.kind,
            workers=(self.workers or DEFAULT_RAY_WORKERS) if self.kind == "ray" else 1,
            address=self.address,
            connect_timeout_s=self.connect_timeout_s,
            cpus_per_worker=self.cpus_per_worker,
            runtime_env=dict(self.runtime_env) if self.runtime_env is not None else None,
        )
