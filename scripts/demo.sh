#!/usr/bin/env bash
# The demo of presto-client in one command, set-up included:
#
#   bash scripts/demo.sh
#
# 1. a virtual environment .venv with presto-client (extra plots), if there is none;
# 2. `presto run configs/demo.yaml`: power sampling on a real model on this machine's CPU
#    (llama.cpp's llama-server with SmolLM2-135M-Instruct, built by presto the first time:
#    about 10 min, cached): real answers, and PreSTO's chains replaying the sequential chain
#    token for token;
# 3. the same traversals against a model of a GPU engine's latency (benchmarks/latency_server.py,
#    `gpu` profile: a 7-8B model on one H100 with vLLM), where PreSTO's speed-up shows.
#
# Arguments are passed to `presto run` (e.g. -o DIR). After the build, about a minute here.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv" >&2
  "$python" -m venv .venv
fi
echo "== installing presto-client (extra plots)" >&2
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[plots]'

echo "== 1/2: power sampling on a real model on this CPU (configs/demo.yaml)" >&2
.venv/bin/presto run configs/demo.yaml "$@"

echo
echo "== 2/2: the same traversals on a model of a GPU engine's latency" >&2
echo "The speed-up where a decode step costs about the same for 1 or 64 sequences (the gpu"
echo "profile of benchmarks/latency_server.py: a 7-8B model on one H100 with vLLM); each arm's"
echo "chains against the sequential chain of the same prompt and seed (median [min-max]):"
exec .venv/bin/python -m benchmarks.bench_stream --T 128 --K 16 --prompts 3 \
  --arms sequential,stream,crn --n-pf auto --out runs/demo/gpu_model --quiet
