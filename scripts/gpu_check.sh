#!/usr/bin/env bash
# The GPU check (issue 45) in one command, for a lent GPU machine (no network, no vLLM; Python
# with torch, transformers, aiohttp there): drift with the batch in bf16 (with and without
# deterministic algorithms) and float32 on a random-weight model of Llama-3-8B's shape, the
# decode step's cost against the batch, and sequential vs stream end to end on that measured
# cost; one table, in $OUT/gpu_check.md (benchmarks/gpu_check.py says more).
#
#   bash scripts/gpu_check.sh --fetch-wheels   # here, once: what the GPU machine lacks (orjson),
#                                              # into .whl/ (carried with the call: carry [".whl"])
#   bash scripts/gpu_check.sh                  # there: python -m benchmarks.gpu_check --out $OUT
#   bash scripts/gpu_check.sh --dry-run        # here: every step on a tiny model on the CPU
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--fetch-wheels" ]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl orjson
  ls -l .whl
  exit 0
fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ "${1:-}" = "--dry-run" ] && python=.venv/bin/python
out=${OUT:-runs/gpu_check}
if [ "${1:-}" = "--dry-run" ]; then
  out=runs/gpu_check_dry
fi
exec timeout 480 "$python" -m benchmarks.gpu_check --out "$out" "$@"
