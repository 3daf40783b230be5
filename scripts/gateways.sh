#!/usr/bin/env bash
# gateways.sh - install the real serving gateways (SGLang's model gateway `smg` and
# `vllm-router`, manylinux wheels from PyPI) into a venv of their own, for the gateway tier of
# the tests (marker `gateway`) and benchmarks/gateway_routing.py.
#
# Usage:
#   scripts/gateways.sh setup
#       Idempotent, and one at a time (flock on $PRESTO_GATEWAY_HOME/setup.lock). Creates the
#       venv (an existing one that runs is kept) and installs smg==1.13.0 and
#       vllm-router==0.1.17; a marker per finished step makes a second call take well under a
#       second. ~20 s and ~260 MB the first time.
#   scripts/gateways.sh env
#       Prints `export PRESTO_GATEWAY_HOME=...`, `export PRESTO_SMG=...`,
#       `export PRESTO_VLLM_ROUTER=...` (the console scripts).
#
# Environment:
#   PRESTO_GATEWAY_HOME   cache dir (default $HOME/.cache/presto-client/gateways)
#   PRESTO_GATEWAY_PYTHON python used to create the venv (default python3)
set -euo pipefail

SMG_VERSION=1.13.0
VLLM_ROUTER_VERSION=0.1.17

HOME_DIR=${PRESTO_GATEWAY_HOME:-$HOME/.cache/presto-client/gateways}
VENV=$HOME_DIR/venv
VPY=$VENV/bin/python
MARK_DIR=$HOME_DIR/markers
BASE_PYTHON=${PRESTO_GATEWAY_PYTHON:-python3}

log() { printf '[gateways] %s\n' "$*" >&2; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

run_step() {
    local name=$1 fn=$2 t0
    if [[ -f "$MARK_DIR/$name.done" ]]; then
        log "step $name: already done"
        return 0
    fi
    log "step $name: running"
    t0=$(now)
    "$fn" >&2
    mkdir -p "$MARK_DIR"
    date -u +%Y-%m-%dT%H:%M:%SZ > "$MARK_DIR/$name.done"
    log "step $name: done in $(elapsed "$t0") s"
}

step_venv() {
    if [[ -x "$VPY" ]] && "$VPY" -c 'import sys' 2>/dev/null; then
        echo "venv $VENV exists and runs: kept"
        return 0
    fi
    rm -rf "$VENV"
    "$BASE_PYTHON" -m venv "$VENV"
}

step_install() {
    "$VPY" -m pip install --quiet --disable-pip-version-check \
        "smg==$SMG_VERSION" "vllm-router==$VLLM_ROUTER_VERSION"
}

step_check() {
    "$VENV/bin/smg" launch --help > /dev/null
    "$VENV/bin/vllm-router" --help > /dev/null
    "$VPY" -c 'import importlib.metadata as md; print("smg", md.version("smg"), "vllm-router", md.version("vllm-router"))'
}

setup() {
    mkdir -p "$HOME_DIR"
    exec 9> "$HOME_DIR/setup.lock"
    flock 9
    local t0
    t0=$(now)
    run_step "venv" step_venv
    run_step "install-smg-$SMG_VERSION-vllm-router-$VLLM_ROUTER_VERSION" step_install
    run_step "check-smg-$SMG_VERSION-vllm-router-$VLLM_ROUTER_VERSION" step_check
    log "setup finished in $(elapsed "$t0") s"
}

case "${1:-}" in
    setup) setup ;;
    env)
        printf 'export PRESTO_GATEWAY_HOME=%q\n' "$HOME_DIR"
        printf 'export PRESTO_SMG=%q\n' "$VENV/bin/smg"
        printf 'export PRESTO_VLLM_ROUTER=%q\n' "$VENV/bin/vllm-router"
        ;;
    *) echo "usage: $0 setup|env" >&2; exit 2 ;;
esac
