#!/usr/bin/env bash
# Speed benchmark on a real engine: baseline PowerMH vs PreSTO (bfs, predictive, crn, stream) on vLLM-CPU
# with SmolLM2-135M (float32), same prompts and seeds, arms interleaved; prints the side-by-side
# table with paired speedups. Extra arguments go to `presto compare` (e.g. --set sampler.sampler=
# entropy_cut, -o runs/other).
#
#   bash scripts/bench_vllm_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
port=${PRESTO_BENCH_PORT:-8765}
[ -x .venv/bin/presto ] || { python3 -m venv .venv && .venv/bin/pip install -q -e '.[plots]'; }
bash scripts/vllm_cpu.sh setup
started=0
if ! bash scripts/vllm_cpu.sh status --port "$port" >/dev/null 2>&1; then
  bash scripts/vllm_cpu.sh start --port "$port" --dtype float32
  started=1
fi
cleanup() { if [ "$started" = 1 ]; then bash scripts/vllm_cpu.sh stop --port "$port"; fi; }
trap cleanup EXIT
.venv/bin/presto compare configs/vllm_cpu.yaml --set "engines[0].base_url=http://127.0.0.1:$port" "$@"
