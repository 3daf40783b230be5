"""``/metrics`` cannot be forged or flooded: route templates as labels, escaped by the Prometheus
client library, bounded however many paths are scanned; latency histograms are there."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import ServiceThread, load, reference_job, write_config

from presto_client.serve.app import ServeOptions


def _families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    out: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = [(s.name, s.labels, s.value) for s in family.samples]
    return out


def test_a_crafted_path_forges_no_metric_and_adds_no_series(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.yaml", reference_job(tmp_path / "run"))
    with ServiceThread(load(config), ServeOptions(port=0)) as service:
        forged = '/x",status="200"} 1\nforged_metric_total 42\n#'
        assert httpx.get(service.url + forged.replace("\n", "%0a"), timeout=10).status_code == 404
        for i in range(300):  # a scanner
            httpx.get(f"{service.url}/scan/{i}", timeout=10)
        r = httpx.post(
            f"{service.url}/v1/completions",
            json={"model": "ref", "prompt": [1, 2], "seed": 1},
            timeout=30,
        )
        assert r.status_code == 200
        metrics = httpx.get(f"{service.url}/metrics", timeout=10)
        assert metrics.headers["Content-Type"].startswith("text/plain")
        text = metrics.text
    assert "forged_metric_total" not in text
    families = _families(text)  # (the library's own parser reads it back)
    assert "forged_metric" not in families
    requests = families["presto_serve_requests"]
    endpoints = {labels["endpoint"] for name, labels, _ in requests if name.endswith("_total")}
    assert endpoints <= {"/v1/completions", "other", "/metrics", "/health", "/v1/models"}
    other = [v for n, labels, v in requests if labels.get("endpoint") == "other"]
    assert sum(other) == 301  # every scanned path in one series
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    assert series < 120, series  # bounded, not one per scanned path
    latency = families["presto_serve_request_duration_seconds"]
    counts = {labels["endpoint"]: v for n, labels, v in latency if n.endswith("_count")}
    assert counts["/v1/completions"] == 1 and counts["other"] == 301
    assert any(n.endswith("_bucket") and labels.get("le") == "0.5" for n, labels, _ in latency)
    assert families["presto_serve_queue_wait_seconds"]
    assert [v for n, _, v in families["presto_serve_chains"] if n.endswith("_total")] == [1.0]
    assert "presto_serve_active_requests" in families
