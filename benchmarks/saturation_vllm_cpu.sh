#!/usr/bin/env bash
# Saturating load on vLLM-CPU (issue 9, benchmark d): 16 chains at once (4 prompts x 4 chains of
# configs/vllm_cpu.yaml, K = 8), one arm per run - sequential, stream, then sequential again to
# show the machine's drift - and per run the throughput (transitions / the session's wall time in
# run.json) and the mean chain latency (samples.jsonl). Needs the server running:
#
#   bash scripts/vllm_cpu.sh start --port 8765 --dtype float32
#   bash benchmarks/saturation_vllm_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for arm in sequential stream sequential; do
  out=runs/sat-vllm-$arm-$(date +%s)
  .venv/bin/python -m presto_client.cli run configs/vllm_cpu.yaml \
    --set "sampler.traversals=[$arm]" --set sampler.steps_per_block=8 \
    --set chains_per_prompt=4 --set max_active_chains=16 -o "$out" --no-progress -q >/dev/null || true
  .venv/bin/python - "$out" "$arm" <<'PY'
import json
import sys

out, arm = sys.argv[1], sys.argv[2]
with open(f"{out}/samples.jsonl", encoding="utf-8") as fh:
    rows = [json.loads(line) for line in fh]
with open(f"{out}/run.json", encoding="utf-8") as fh:
    session = json.load(fh)["sessions"][-1]
wall = session["finished"] - session["started"]
ok = [r for r in rows if r["status"] == "ok"]
transitions = sum(len(r.get("transitions", [])) for r in ok)
latency = sum(r["wall_s"] for r in rows) / len(rows)
print(
    f"{arm:10s} chains {len(rows)} ok {len(ok)} wall {wall:7.1f} s  transitions {transitions}  "
    f"throughput {transitions / wall:.3f}/s  mean chain latency {latency:6.1f} s"
)
PY
done
