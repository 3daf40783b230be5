# lib.sh - what the set-up scripts share: logging, timing, idempotent steps and the venv step.
# Sourced, not run. The sourcing script sets, before calling these:
#   LOG_TAG      prefix of every log line (e.g. vllm_cpu)
#   MARK_DIR     where a finished step leaves its marker
#   VENV, VPY    the script's own venv and its python; BASE_PYTHON creates it

log() { printf '[%s] %s\n' "$LOG_TAG" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$LOG_TAG" "$*" >&2; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# run_step NAME FUNCTION: run FUNCTION unless marker NAME exists; time it. A marker per finished
# step is what makes a second set-up take well under a second.
run_step() {
    local name=$1 fn=$2 t0
    if [[ -f "$MARK_DIR/$name.done" ]]; then
        log "step $name: already done (marker $MARK_DIR/$name.done)"
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
    # A venv whose python runs is kept (its marker may be lost, or set up by hand): recreating
    # it would throw away what is installed in it. Only a broken one is rebuilt.
    if [[ -x "$VPY" ]] && "$VPY" -c 'import sys' 2>/dev/null; then
        echo "venv $VENV exists and runs: kept"
        return 0
    fi
    rm -rf "$VENV"
    "$BASE_PYTHON" -m venv "$VENV"
}
