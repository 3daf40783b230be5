"""The GPU check (issue 45): what a lent GPU says about serving as GPU users serve, in one
command of a few minutes, with no network and no vLLM (``scripts/gpu_check.sh`` runs it there).

1. A random-weight model of a real architecture and size (Llama-3-8B's shape, bf16) is built on
   the device: no weights travel.
2. **Drift with the batch**: one context's logprobs scored alone and inside batches of other
   sequences of other lengths (2, 8, 32), in bf16, in bf16 with torch's deterministic algorithms
   (deterministic run to run, which is not batch-invariant), and in float32.
3. **The decode step's cost** against the number of sequences (and prefill per token): the cost
   model of ``benchmarks.latency_server``, measured on this GPU.
4. **The job's shape**, sequential vs stream end to end, against the latency server with that
   measured cost (``benchmarks.bench_stream --cost``).

All printed as one table and written to ``OUT/gpu_check.md`` and ``OUT/gpu_check.json``::

    python -m benchmarks.gpu_check --out "$OUT"              # on the GPU (scripts/gpu_check.sh)
    python -m benchmarks.gpu_check --dry-run --out /tmp/gpu  # here: a tiny model on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# cuBLAS reads this when its first handle is made: set before torch touches the GPU, so that the
# deterministic row below is deterministic (harmless for the others).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np

LLAMA_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
}
TINY = {**LLAMA_8B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}  # fmt: skip
BATCHES = (2, 8, 32)
COST_BATCHES = (1, 4, 16, 64)


def build_model(shape: dict[str, int | float], device: str) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**shape, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    return model.eval().requires_grad_(False)


def context_logprobs(model: Any, context: list[int], others: list[list[int]]) -> np.ndarray:
    """The logprobs of ``context``'s tokens (after its first) with ``others`` in the same batch
    (right-padded: a causal model's positions before the padding see none of it)."""
    import torch

    rows = [context, *others]
    width = max(map(len, rows))
    device = next(model.parameters()).device
    ids = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, device=device)
        mask[i, : len(row)] = 1
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[0, : len(context) - 1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    picked = logp.gather(1, torch.tensor(context[1:], device=device).unsqueeze(1))
    return picked.squeeze(1).double().cpu().numpy()


def drift_row(model: Any, vocab: int, seed: int = 0) -> dict[str, float]:
    """Largest and median |logprob alone - logprob in a batch| over the batches of BATCHES."""
    rng = np.random.default_rng(seed)
    context = rng.integers(0, vocab, 64).tolist()
    alone = context_logprobs(model, context, [])
    diffs = [np.abs(context_logprobs(model, context, []) - alone)]  # run to run
    for size in BATCHES:
        lengths = rng.integers(8, 160, size - 1)
        others = [rng.integers(0, vocab, int(n)).tolist() for n in lengths]
        diffs.append(np.abs(context_logprobs(model, context, others) - alone))
    every = np.concatenate(diffs)
    return {
        "max_nats": float(every.max()),
        "median_nats": float(np.median(every)),
        "run_to_run_nats": float(diffs[0].max()),
    }


def measure_cost(model: Any, vocab: int, prompt_len: int) -> dict[str, Any]:
    """Decode-step seconds against the batch (least squares ``a + b * sequences``) and prefill
    seconds per token, with the KV cache of ``prompt_len`` tokens per sequence."""
    import torch

    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    steps: list[tuple[int, float]] = []
    prefill: list[float] = []
    for b in COST_BATCHES:
        ids = torch.randint(0, vocab, (b, prompt_len), device=device)
        with torch.no_grad():
            sync()
            t0 = time.perf_counter()
            out = model(input_ids=ids, use_cache=True)
            sync()
            prefill.append((time.perf_counter() - t0) / (b * prompt_len))
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            times = []
            for _ in range(6):
                sync()
                t0 = time.perf_counter()
                out = model(input_ids=token, past_key_values=cache, use_cache=True)
                sync()
                times.append(time.perf_counter() - t0)
                cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        steps.append((b, float(np.median(times[1:]))))
    x = np.array([b for b, _ in steps], dtype=float)
    y = np.array([t for _, t in steps])
    b_fit, a_fit = np.polyfit(x, y, 1)
    return {
        "step_s": dict(steps),
        "a_ms": max(float(a_fit), 1e-6) * 1e3,
        "b_ms": max(float(b_fit), 0.0) * 1e3,
        "prefill_us": float(np.median(prefill)) * 1e6,
    }


def job_shape(cost: dict[str, Any], out: Path, dry_run: bool) -> list[dict[str, Any]]:
    """Sequential vs stream end to end on the latency server with the measured cost."""
    t, k, prompts = (32, 4, 1) if dry_run else (128, 16, 3)
    shape = ["--T", str(t), "--K", str(k), "--prompts", str(prompts)]
    cmd = [
        sys.executable, "-m", "benchmarks.bench_stream", *shape, "--time-scale", "1",
        "--arms", "sequential,stream", "--n-pf", "auto", "--quiet", "--out", str(out / "bench"),
        "--cost", f"{cost['a_ms']:.4f},{cost['b_ms']:.5f},{cost['prefill_us']:.3f}",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=Path(__file__).resolve().parents[1], timeout=300)
    rows = json.loads((out / "bench" / "results.json").read_text())["rows"]
    return [r for r in rows if r.get("arm") != "sequential"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="a tiny model on the CPU")
    args = parser.parse_args(argv)
    import torch

    t_start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    shape = TINY if args.dry_run else LLAMA_8B
    args.out.mkdir(parents=True, exist_ok=True)
    vocab = int(shape["vocab_size"])
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    size = "tiny" if args.dry_run else "Llama-3-8B shape"
    print(f"device {device} ({name}), model {size}, random weights", flush=True)
    model = build_model(shape, device)
    drift = {"bf16": drift_row(model, vocab)}
    torch.use_deterministic_algorithms(True)
    drift["bf16, deterministic algorithms"] = drift_row(model, vocab)
    torch.use_deterministic_algorithms(False)
    cost = measure_cost(model, vocab, prompt_len=64 if args.dry_run else 512)
    print(
        f"cost: a {cost['a_ms']:.3f} ms + {cost['b_ms']:.4f} ms/seq, prefill "
        f"{cost['prefill_us']:.2f} us/token",
        flush=True,
    )
    model = model.float()
    drift["float32"] = drift_row(model, vocab)
    del model
    speed = job_shape(cost, args.out, args.dry_run)
    lines = ["| what | measured |", "|---|---:|"]
    for k, v in drift.items():
        lines.append(
            f"| drift with the batch, {k}: max / median (run to run) | {v['max_nats']:.3g} / "
            f"{v['median_nats']:.3g} nats ({v['run_to_run_nats']:.3g}) |"
        )
    lines.append(
        f"| decode step, bf16 | {cost['a_ms']:.2f} ms + {cost['b_ms']:.4f} ms a sequence |"
    )
    lines.append(f"| prefill, bf16 | {cost['prefill_us']:.2f} us per token |")
    for r in speed:
        lines.append(
            f"| {r['arm']} vs sequential, end to end (model calls) | "
            f"{r['speedup_wall']['median']:.2f}x ({r['speedup_calls']['median']:.2f}x), "
            f"replays {r['replays_sequential']} |"
        )
    table = "\n".join(lines)
    print(table)
    wall = time.perf_counter() - t_start
    result = {"device": device, "drift": drift, "cost": cost, "speed": speed, "wall_s": wall}
    (args.out / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (args.out / "gpu_check.md").write_text(table + "\n")
    print(f"total {result['wall_s']:.0f} s; wrote {args.out / 'gpu_check.md'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
