"""Serving gateways in front of an engine's URL: which one it is, and what it cannot carry.

A gateway (SGLang's model gateway ``smg``, ``vllm-router``) spreads requests over replicas. Two
things must hold for power sampling through it: a chain's requests reach one replica (the
``routing_key_header`` its consistent-hash policy reads), and the token ids and logprob fields
reach the engine unchanged (presto never re-tokenises text: a token boundary that moves changes
the chain's law). What each gateway does was measured against its binary (docs/backends.md);
the start-up probe asks ``GET /workers`` once, names the gateway, and refuses a combination that
cannot work before any chain runs. Pure functions, but for :func:`detect_gateway`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from presto_client.backends.spec import ProbeReport
from presto_client.backends.transport import Transport
from presto_client.errors import EngineError, ProbeError

logger = logging.getLogger(__name__)

ROUTING_HEADERS: dict[str, tuple[str, ...]] = {
    "smg": ("x-smg-routing-key",),
    "vllm-router": (
        "x-session-id",
        "x-user-id",
        "x-tenant-id",
        "x-correlation-id",
        "x-request-id",
        "x-trace-id",
    ),
}
"""The headers each gateway's consistent-hash policy reads (smg: policies consistent_hashing
and manual; vllm-router: consistent_hash, the first non-empty in this order)."""

KEY_POLICY = {"smg": "consistent_hashing", "vllm-router": "consistent_hash"}
"""The policy under which each gateway routes by the key (others ignore it)."""

INSTEAD = (
    "smg in front of SGLang workers with kind: sglang (its /generate carries input_ids) and "
    "routing_key_header: x-smg-routing-key, or vllm-router in front of vLLM workers with kind: "
    "vllm (its /v1/completions carries token-id prompts) and routing_key_header: x-session-id"
)
"""The routes that carry token ids and top-K logprob fields unchanged (docs/backends.md)."""


@dataclass(frozen=True, slots=True)
class Gateway:
    """What ``GET /workers`` told of the gateway at an engine's URL."""

    name: str
    """``smg``, ``vllm-router``, or ``a gateway`` (a worker list of an unknown shape)."""
    workers: int

    @property
    def known(self) -> bool:
        return self.name in ROUTING_HEADERS

    def describe(self) -> str:
        return f"{self.name} in front of {self.workers} worker(s)"


def parse_workers(body: Any) -> Gateway | None:
    """The gateway a ``GET /workers`` answer comes from; ``None``: not a worker list."""
    if not isinstance(body, dict) or not isinstance(body.get("workers"), list):
        return None
    rows = [r for r in body["workers"] if isinstance(r, dict) and isinstance(r.get("url"), str)]
    if len(rows) != len(body["workers"]):
        return None
    if any("runtime_type" in r or ("status" in r and "models" in r) for r in rows):
        name = "smg"  # smg 1.13 lists each worker's runtime, status and models
    elif "stats" in body and "total" in body:
        name = "vllm-router"  # vllm-router 0.1.17 adds a total and per-type counts
    else:
        name = "a gateway"
    return Gateway(name, len(rows))


async def detect_gateway(transport: Transport) -> Gateway | None:
    """The gateway at the transport's URL (one ``GET /workers``, not retried); ``None``: no
    worker list there, which is what an engine itself answers."""
    try:
        if await transport.get_status("/workers") != 200:
            return None
        body = await transport.request_json("GET", "/workers", label="gateway check")
    except EngineError as exc:
        logger.debug("%s: no gateway worker list (%s)", transport.base_url, exc)
        return None
    return parse_workers(body)


async def check_gateway(
    transport: Transport, dialect: str, header: str | None, report: ProbeReport
) -> Gateway | None:
    """The gateway at the transport's URL (if any, named in ``report``, warnings added):
    :class:`ProbeError` when ``dialect`` with ``routing_key_header`` ``header`` cannot work
    through it."""
    gateway = await detect_gateway(transport)
    problems, warnings = routing_findings(gateway, header)
    if gateway is not None:
        problems = [*gateway_problems(gateway, dialect), *problems]
        report.gateway = gateway.name
    if problems:
        raise ProbeError("; ".join(problems), engine=report.engine)
    report.warnings.extend(warnings)
    if gateway is not None and gateway.known and header is not None:
        logger.info(
            "%s: %s; the routing key keeps a chain on one worker under --policy %s only "
            "(the client cannot see the policy)",
            transport.base_url,
            gateway.describe(),
            KEY_POLICY[gateway.name],
        )
    return gateway


def gateway_problems(gateway: Gateway, dialect: str) -> list[str]:
    """Why ``dialect`` cannot run through ``gateway`` (empty: it can, as far as is known)."""
    if gateway.name == "vllm-router" and dialect == "sglang":
        return [
            f"the gateway ({gateway.describe()}) drops top_logprobs_num, logprob_start_len "
            "and sampling_seed from SGLang's /generate (measured with vllm-router 0.1.17), "
            f"so kind: sglang gets no top-K logprobs and no seeds through it. Instead: {INSTEAD}"
        ]
    return []


def refused_token_ids(gateway: Gateway | None, dialect: str, message: str) -> str | None:
    """The explanation of a refused probe generation when the gateway is why (``None``: it is
    not): smg 1.13 refuses a token-id prompt on ``/v1/completions`` before any worker sees it."""
    if gateway is None or gateway.name != "smg" or "StringOrArray" not in message:
        return None
    return (
        f"the gateway ({gateway.describe()}) refuses token-id prompts on /v1/completions "
        f"(kind: {dialect}; HTTP 400 'did not match any variant of untagged enum "
        "StringOrArray', measured with smg 1.13), and presto sends token ids: it never "
        "re-tokenises text (a token boundary that moves changes the chain's law). "
        f"Instead: {INSTEAD}"
    )


def routing_findings(gateway: Gateway | None, header: str | None) -> tuple[list[str], list[str]]:
    """Problems and warnings of ``routing_key_header`` against the gateway found (if any)."""
    if gateway is None:
        if header is None:
            return [], []
        return [], [
            f"routing_key_header {header} is set, but the engine's URL lists no workers "
            "(GET /workers), as smg and vllm-router do: if it is a gateway, make sure it "
            "routes by that header; if it is a server itself, the header does nothing"
        ]
    if header is None:
        if gateway.workers < 2:
            return [], []
        fix = (
            f"set routing_key_header: {ROUTING_HEADERS[gateway.name][0]} and run it with "
            f"--policy {KEY_POLICY[gateway.name]}"
            if gateway.known
            else "set routing_key_header to the header its consistent-hash policy reads"
        )
        return [], [
            f"the engine's URL is a gateway ({gateway.describe()}) and no routing_key_header "
            "is set: a chain's requests may land on different workers, which loses its prefix "
            f"cache; {fix}"
        ]
    if gateway.known and header.lower() not in ROUTING_HEADERS[gateway.name]:
        reads = ", ".join(ROUTING_HEADERS[gateway.name])
        return [
            f"routing_key_header {header}: the gateway ({gateway.describe()}) does not read it "
            f"(it routes by {reads}); set routing_key_header: {ROUTING_HEADERS[gateway.name][0]}"
        ], []
    return [], []
