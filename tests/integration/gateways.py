"""Fixtures of the gateway tier (marker ``gateway``): real ``smg`` / ``vllm-router`` binaries.

``gateway_pair`` is a factory: ``with gateway_pair("smg", "consistent_hashing", "sglang") as
(gateway, workers)`` runs the gateway in front of two fresh emulation servers of that dialect
on free loopback ports and stops everything when the block ends. The binaries come from
``scripts/gateways.sh setup`` (``$PRESTO_GATEWAY_HOME``, default
``~/.cache/presto-client/gateways``); a gateway that is not set up skips the test and says how
to set it up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.emulation import EmulationServer
from tests.support.gateways import GATEWAY_HOME, Gateway, gateway_binary, running_gateway

GatewayPair = Callable[
    ..., contextlib.AbstractContextManager[tuple[Gateway, list[EmulationServer]]]
]


@pytest.fixture
def gateway_pair(tmp_path: Path) -> GatewayPair:
    @contextlib.contextmanager
    def start(
        kind: str, policy: str, dialect: str = "vllm", *, retries: bool = True
    ) -> Iterator[tuple[Gateway, list[EmulationServer]]]:
        binary = gateway_binary(kind)
        if binary is None:
            pytest.skip(
                f"{kind} is not set up in {GATEWAY_HOME}: run `bash scripts/gateways.sh setup`"
            )
        workers = [EmulationServer(dialect).start() for _ in range(2)]
        try:
            with running_gateway(
                kind,
                policy,
                [w.base_url for w in workers],
                log_dir=tmp_path,
                binary=binary,
                retries=retries,
            ) as gateway:
                yield gateway, workers
        finally:
            for worker in workers:
                worker.stop()

    return start
