"""One context, several request paths: does llama-server give it one distribution?

    python -m benchmarks.llamacpp_drift [--url http://127.0.0.1:8790] [--long]

A proposal is generated (τ = 0.25, 48 tokens: its first row comes from the prompt's batch, the
others from one-token decode steps); then the same contexts are asked for again in the other
ways a chain asks for them: the same request twice; the context as a prompt (a one-token
generation forced by a logit bias, the adapter's scoring) without the prompt cache (the whole
context in one batch); with a cached prefix, so that the last ``n`` tokens are processed as one
batch of ``n``; and while the other slots generate (their tokens share the batch). Per path the
largest difference from the generation's own rows, in nats, of the token's ``log p0`` and of
the row's normaliser ``log Σ_topK p0^(1/τ)`` (a function of the row only, what the chains'
``drift_max`` compares). ``--long`` repeats the decode-vs-prompt comparison past 512 tokens of
context (CPU flash attention splits the KV of a one-token query there). Then the server's
speed: prompt tokens/s of a 256-token prompt, decode tokens/s of one 64-token generation.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

TAU = 0.25
K = 20
NEUTRAL: dict[str, Any] = {
    "samplers": ["temperature"],
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "typical_p": 1.0,
    "repeat_penalty": 1.0,
    "repeat_last_n": 0,
    "dry_multiplier": 0.0,
    "xtc_probability": 0.0,
    "post_sampling_probs": False,
    "n_cache_reuse": 0,
    "return_tokens": True,
    "response_fields": ["tokens", "completion_probabilities", "timings"],
}
Row = tuple[int, float, list[float]]
"""A position's token, its ``log p0`` and the row's top-K ``log p0``."""


class Server:
    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=900.0)

    def tokens(self, text: str) -> list[int]:
        messages = [{"role": "user", "content": text}]
        body = {"messages": messages, "add_generation_prompt": True}
        prompt = self.http.post("/apply-template", json=body).json()["prompt"]
        body = {"content": prompt, "add_special": False, "parse_special": True}
        return list(self.http.post("/tokenize", json=body).json()["tokens"])

    def complete(self, prompt: Sequence[int], n: int, **kw: Any) -> dict[str, Any]:
        body = {
            "prompt": list(prompt),
            "n_predict": n,
            "temperature": TAU,
            "seed": 7,
            "n_probs": K,
            "logit_bias": [],
            "cache_prompt": True,
            **NEUTRAL,
            **kw,
        }
        answer = self.http.post("/completion", json=body)
        answer.raise_for_status()
        out: dict[str, Any] = answer.json()
        return out

    def generate(self, prompt: Sequence[int], n: int, **kw: Any) -> list[Row]:
        return rows(self.complete(prompt, n, **kw))

    def score(self, context: Sequence[int], token: int, **kw: Any) -> Row:
        """The row after ``context`` through a forced one-token generation (the adapter's)."""
        body = self.complete(context, 1, temperature=1.0, logit_bias=[[token, 1e9]], **kw)
        (row,) = rows(body)
        if row[0] != token:
            raise RuntimeError(f"forced token {token}, got {row[0]}")
        return row


def rows(body: dict[str, Any]) -> list[Row]:
    return [
        (int(e["id"]), float(e["logprob"]), [float(t["logprob"]) for t in e["top_logprobs"]])
        for e in body["completion_probabilities"]
    ]


def log_z(row: Row) -> float:
    lp = np.asarray(row[2]) / TAU
    return float(lp.max() + np.log(np.exp(lp - lp.max()).sum()))


def worst(pairs: Sequence[tuple[Row, Row]]) -> tuple[float, float]:
    dp = max(abs(a[1] - b[1]) for a, b in pairs)
    dz = max(abs(log_z(a) - log_z(b)) for a, b in pairs)
    return dp, dz


def busy_slots(server: Server, prompts: Sequence[list[int]], n: int) -> list[threading.Thread]:
    """Generations on the other slots, running while the caller's requests are served."""
    threads = [
        threading.Thread(
            target=server.generate, args=(p, n), kwargs={"seed": 11 + i, "id_slot": 2 + i}
        )
        for i, p in enumerate(prompts)
    ]
    for t in threads:
        t.start()
    return threads


def paths(server: Server, prompt: list[int], g: int) -> dict[str, tuple[float, float]]:
    """Each path against the generation's own rows; slot 0 keeps the generation's KV (the
    cached-prefix paths reuse it), the other paths run on slots 1-3."""
    ref = server.generate(prompt, g, id_slot=0)
    x = [r[0] for r in ref]
    out: dict[str, tuple[float, float]] = {}
    j = g - 4
    context = prompt + x[:j]
    # Longest cached prefix first: each step leaves slot 0's first m tokens as the generation
    # computed them (a prompt of context[:m] plus another token evaluates one token).
    for n in (1, 8, 63, 64, 65, len(context) - 1):
        m = len(context) - n
        if n > 1:
            other = (context[m] + 1) % 49152
            server.score([*context[:m], other], x[j], id_slot=0)
        row = server.score(context, x[j], id_slot=0)
        out[f"prompt, cached prefix, batch of {n}"] = worst([(ref[j], row)])
    again = server.generate(prompt, g, id_slot=1, cache_prompt=False)
    out["the same generation again"] = worst(list(zip(ref, again, strict=True)))
    positions = range(0, g, max(g // 6, 1))
    nocache = [
        (ref[i], server.score(prompt + x[:i], x[i], cache_prompt=False, id_slot=1))
        for i in positions
    ]
    out["prompt, no cache (one batch)"] = worst(nocache)
    others = [server.tokens(t) for t in ("Name three prime numbers.", "Why is the sky blue?")]
    threads = busy_slots(server, others, 48)
    beside = [
        (ref[i], server.score(prompt + x[:i], x[i], cache_prompt=False, id_slot=1))
        for i in positions
    ]
    for t in threads:
        t.join()
    out["prompt beside other slots"] = worst(beside)
    return out


def speed(server: Server, prompt: list[int]) -> dict[str, float]:
    long = (prompt * 8)[:256]
    t = server.complete(long, 1, cache_prompt=False)["timings"]
    d = server.complete(prompt, 64, cache_prompt=False)["timings"]
    return {
        "prompt_tokens_per_s": round(float(t["prompt_per_second"]), 1),
        "decode_tokens_per_s": round(float(d["predicted_per_second"]), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8790")
    ap.add_argument("--long", action="store_true")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    server = Server(args.url)
    props = server.http.get("/props").json()
    prompt = server.tokens("What is 17 times 23? Think step by step.")
    found = paths(server, prompt, 48)
    if args.long:
        filler = server.tokens("Count from one to two hundred in words, one per line. " * 45)
        found.update({f"long: {k}": v for k, v in paths(server, filler, 24).items()})
    for what, (dp, dz) in found.items():
        print(f"{args.label:>12} {what:<42} |Δ log p0| {dp:9.2e}   |Δ log Z| {dz:9.2e}")
    summary = {
        "label": args.label,
        "max_dlogp0": max(v[0] for v in found.values()),
        "max_dlogZ": max(v[1] for v in found.values()),
        "n_ctx": props.get("default_generation_settings", {}).get("n_ctx"),
        **speed(server, prompt),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
