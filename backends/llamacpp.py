"""llama.cpp's ``llama-server``, native ``/completion`` dialect: raw one-call mode.

What its probabilities are (read in ``tools/server/server-context.cpp`` and measured): with
``n_probs: K`` and ``post_sampling_probs: false`` every generated token carries ``logprob``, the
softmax of the model's *raw* logits over the whole vocabulary (before temperature, logit biases
and samplers; float32), i.e. ``log p0``, and the top-``K`` of that same distribution. So ``log
q_τ`` is the certified interval from the top-K, as for vLLM's raw mode. ``post_sampling_probs:
true`` would return the distribution after the sampler chain instead (never both).

Traps, each handled here:

* ``ignore_eos: true`` does not just keep generating: it puts a ``-inf`` logit bias on every
  end-of-generation token, so the proposal never samples EOS while ``log p0`` still gives it its
  mass: the proposal law would not be ``p0^(1/τ)``. It is never sent. A generation that samples
  an end-of-generation token stops there (``stop_type: "eos"``); :meth:`continuation` asks for
  the rest after it (the EOS in the prompt, a seed derived from the proposal's), which is the same
  law as sampling on through it.
* A token whose text ends inside a UTF-8 character gets no ``completion_probabilities`` entry
  (the server holds the text back and never adds the token's probabilities), so an answer with
  fewer probability entries than ``tokens`` is refused by name.
* Streamed (``stream: true``), the held-back token never appears at all: each event carries
  one token and its probabilities, and only ``tokens_predicted`` (the generation's count so
  far) shows that one was skipped. The engine then fetches the proposal whole, unstreamed (the
  same seed gives the same tokens), and repairs it as above. The final event carries no tokens,
  only ``stop_type`` (an ``"eos"`` stop continues in a second stream).
* Samplers: ``samplers: ["temperature"]`` makes temperature the only sampler before the final
  draw (top-k, top-p, min-p, typical, penalties, DRY, XTC are not in the chain); the knobs are
  sent neutral too, mirostat off (it replaces the chain), dynamic temperature off.
* ``seed`` is a uint32 and ``0xFFFFFFFF`` means "random": seeds are reduced below it.

One distribution per context needs the server's KV cache in bf16 (``-fa on -ctk bf16 -ctv
bf16``): with f16 or f32 the CPU flash attention picks its kernel by batch size and context
length, and the Q4_1 matmuls' Q8 activations amplify the rounding differences to 0.1-0.5 nats
of ``log Z`` between two requests of one context (docs/backends.md). One answer per request
needs ``--cache-ram 0``: with the host prompt cache, a request pinned to a busy slot (as the
engine places them) has the server load another prompt's KV into the running generation.

Exact scores: no prompt-logprob route exists, but a one-token generation whose sampled token is
forced by a logit bias reports the raw ``log p0`` of that token (logit biases act after the
reported probabilities), with the raw top-K or, with ``n_probs`` past the vocabulary, the whole
row; one request per position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from presto_client.backends.adapter import (
    Adapter,
    AnswerRepairs,
    DialectTraits,
    HttpCall,
    ScoringCalls,
    SlotPlacement,
)
from presto_client.backends.parsing import (
    BULK_ROW,
    TokenLogprobs,
    bulk_row,
    check_ids,
    logprob_value,
    token_id_value,
    topk_rows,
)
from presto_client.backends.tokenizer_calls import ServerTokenizer
from presto_client.core.engine_protocol import FloatArray, IntArray, ProposalRequest
from presto_client.errors import InvalidResponseError

SEED_MODULUS = 0xFFFFFFFF
"""llama.cpp's seed is a uint32 and ``LLAMA_DEFAULT_SEED = 0xFFFFFFFF`` draws a random one."""
FULL_ROW = 2**31 - 1
"""``n_probs`` past the vocabulary: the server clamps it to the whole row."""
FORCE_BIAS = 1e9
"""A logit bias that makes the given token the one sampled (scoring requests)."""
CONTINUATION_SALT = 0x9E3779B1
TRUNCATED = (
    "the server truncated the generation at its context size; start llama-server with a "
    "larger -c (the context is shared by its -np slots)"
)

NEUTRAL_SAMPLING: dict[str, Any] = {
    "samplers": ["temperature"],
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "typical_p": 1.0,
    "top_n_sigma": -1.0,
    "xtc_probability": 0.0,
    "dynatemp_range": 0.0,
    "mirostat": 0,
    "repeat_penalty": 1.0,
    "repeat_last_n": 0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "dry_multiplier": 0.0,
    "ignore_eos": False,
    # An empty list replaces the server's biases (--ignore-eos puts -inf on EOS there).
    "logit_bias": [],
    "post_sampling_probs": False,
    "backend_sampling": False,
    "cache_prompt": True,
    # Cache reuse by KV shifting re-rotates cached keys: logprobs would depend on what the
    # slot held before. Plain prefix reuse (cache_prompt) keeps the computed keys as they are.
    "n_cache_reuse": 0,
    "return_tokens": True,
}
RESPONSE_FIELDS = [
    "tokens",
    "completion_probabilities",
    "stop_type",
    "truncated",
    "tokens_predicted",
    "index",
]
"""What is read of an answer (the server leaves out the rest: settings, the prompt's text)."""


def request_seed(seed: int) -> int:
    """``seed`` as a llama.cpp seed (a uint32 other than the 'random' value)."""
    return int(seed) % SEED_MODULUS


def continuation_seed(seed: int, offset: int) -> int:
    """The seed of the rest of a proposal after ``offset`` tokens ended in an EOS (the RNG
    stream restarts there, so the rest needs its own, fixed by the proposal's seed)."""
    return (int(seed) * CONTINUATION_SALT + int(offset)) % SEED_MODULUS


def _body(body: Any, label: str) -> dict[str, Any]:
    if isinstance(body, list):
        if len(body) != 1:
            raise InvalidResponseError(f"{label}: {len(body)} results, expected 1")
        body = body[0]
    if not isinstance(body, dict):
        raise InvalidResponseError(f"{label}: the response is not a JSON object")
    if body.get("error"):
        err = body["error"]
        msg = err.get("message") if isinstance(err, dict) else err
        raise InvalidResponseError(f"{label}: the engine reported an error: {msg}")
    return body


def _entry_id(entry: Any, label: str, what: str) -> int:
    if not isinstance(entry, dict):
        raise InvalidResponseError(f"{label}: malformed {what}: {str(entry)[:80]}")
    return token_id_value(entry.get("id"), label=label, what=what)


def parse_probabilities(probs: Any, k: int, *, label: str, full_row: bool = False) -> TokenLogprobs:
    """``completion_probabilities`` (``[{id, logprob, top_logprobs: [{id, logprob}]}]``) as
    normalised records; ``full_row``: keep every entry of the rows (a whole vocabulary)."""
    if not isinstance(probs, list):
        raise InvalidResponseError(
            f"{label}: the answer has no completion_probabilities (was n_probs > 0 sent?)"
        )
    ids: list[int] = []
    values: list[float] = []
    rows: list[list[tuple[int, float]] | tuple[IntArray, FloatArray]] = []
    for i, item in enumerate(probs):
        what = f"completion_probabilities[{i}]"
        if not isinstance(item, dict):
            raise InvalidResponseError(f"{label}: malformed {what}")
        if "logprob" not in item and "prob" in item:
            raise InvalidResponseError(
                f"{label}: {what} carries post-sampling probabilities ('prob'), not raw "
                "logprobs: send post_sampling_probs: false"
            )
        ids.append(_entry_id(item, label, what))
        values.append(logprob_value(item.get("logprob"), label=label, what=what))
        top = item.get("top_logprobs")
        if not isinstance(top, list):
            raise InvalidResponseError(f"{label}: {what}.top_logprobs is missing")
        bulk = bulk_row(top) if len(top) >= BULK_ROW else None
        if bulk is not None:
            rows.append(bulk)
            continue
        rows.append(
            [
                (
                    _entry_id(e, label, f"{what}.top_logprobs"),
                    logprob_value(e.get("logprob"), label=label, what=f"{what}.top_logprobs"),
                )
                for e in top
            ]
        )
    width = max((len(r[0] if isinstance(r, tuple) else r) for r in rows), default=0)
    width = width if full_row else k
    top_ids, top_lps = topk_rows(rows, width, label=label)
    return TokenLogprobs(np.asarray(ids, dtype=np.int64), np.asarray(values), top_ids, top_lps)


def ascii_token_ids(probs: Any) -> frozenset[int]:
    """Ids that an answer's probability entries (and their top entries) show to be ASCII only:
    text ending in such a token ends on a whole character, so it is never held back."""
    out: set[int] = set()
    if not isinstance(probs, list):
        return frozenset()
    for entry in probs:
        if not isinstance(entry, dict):
            continue
        for e in [entry, *(entry.get("top_logprobs") or [])]:
            raw = e.get("bytes") if isinstance(e, dict) else None
            tid = e.get("id") if isinstance(e, dict) else None
            if (
                isinstance(tid, int)
                and isinstance(raw, list)
                and raw
                and all(isinstance(b, int) and 0 <= b < 0x80 for b in raw)
            ):
                out.add(tid)
    return frozenset(out)


def held_back_positions(
    tokens: Sequence[int],
    entry_ids: Sequence[int],
    *,
    label: str,
    whole: frozenset[int] = frozenset(),
) -> tuple[list[int], int]:
    """Positions of the tokens whose probabilities must be fetched, and how many of the entries
    (from the first) belong to the others.

    A token whose text ends inside a UTF-8 character gets no probability entry (the server held
    it back and recorded nothing), and every entry belongs to the token that completed the
    character, so the held-back ones are the gaps of an in-order match of the entries' ids to the
    tokens. Where the match is ambiguous (a repeated token that either of two positions could
    take), a place that would make a token of ``whole`` (ASCII only: never held back) a gap is
    ruled out; if that leaves more than one, every position from there on is fetched instead:
    only the unambiguous entries are used, so no probability is ever attributed to the wrong
    position.
    """
    missing = len(tokens) - len(entry_ids)
    if missing < 0:
        raise InvalidResponseError(f"{label}: more probability entries than tokens")
    out: list[int] = []
    pos = 0
    for m, token in enumerate(entry_ids):
        last = min(pos + missing - len(out), len(tokens) - (len(entry_ids) - m))
        places = [p for p in range(pos, last + 1) if int(tokens[p]) == int(token)]
        if not places:
            raise InvalidResponseError(
                f"{label}: {missing} token(s) came without probabilities (their text ends inside "
                f"a UTF-8 character) and entry {m} (token {int(token)}) matches none of them: "
                "the answer does not line up with its tokens"
            )
        if len(places) > 1:
            possible = [p for p in places if not any(int(t) in whole for t in tokens[pos:p])]
            places = possible if len(possible) == 1 else places
        if len(places) > 1:
            return [*out, *range(pos, len(tokens))], m
        out.extend(range(pos, places[0]))
        pos = places[0] + 1
    out.extend(range(pos, len(tokens)))
    return out, len(entry_ids)


def parse_completion(
    body: Any,
    k: int,
    num_tokens: int,
    *,
    label: str,
    full_row: bool = False,
    repairs: Sequence[Any] = (),
) -> TokenLogprobs:
    """One ``/completion`` answer: its tokens with their raw logprobs and top-K, checked.

    ``repairs``: the answers of :meth:`LlamaCppAdapter.repair_calls` (a whole row after each
    held-back token's context), which fill the positions that came without probabilities.
    Fewer tokens than asked for are returned only when the generation stopped at an
    end-of-generation token (``stop_type: "eos"``, the last token); anything else short is an
    error, as are probability entries that do not line up with the tokens.
    """
    body = _body(body, label)
    out = parse_probabilities(
        body.get("completion_probabilities"), k, label=label, full_row=full_row
    )
    tokens = body.get("tokens")
    if isinstance(tokens, list) and tokens:
        tokens = [token_id_value(t, label=label, what="tokens") for t in tokens]
        if len(tokens) != len(out):
            whole = ascii_token_ids(body.get("completion_probabilities"))
            out = _fill_held_back(out, tokens, repairs, k, whole, label=label)
        check_ids(out.token_ids, tokens, label=label)
    if body.get("truncated"):
        raise InvalidResponseError(f"{label}: {TRUNCATED}")
    stop = body.get("stop_type")
    if len(out) > num_tokens or (len(out) < num_tokens and stop != "eos"):
        raise InvalidResponseError(
            f"{label}: the engine returned {len(out)} tokens, {num_tokens} were requested "
            f"(stop_type {stop!r})"
        )
    return out


def read_whole_row(body: Any, *, label: str) -> TokenLogprobs:
    """The whole-vocabulary row of one repair answer (:meth:`LlamaCppAdapter.repair_calls`)."""
    row = parse_probabilities(
        _body(body, label).get("completion_probabilities"), -1, label=label, full_row=True
    )
    if len(row) != 1:
        raise InvalidResponseError(f"{label}: {len(row)} entries, expected 1")
    return row


def _fill_held_back(
    kept: TokenLogprobs,
    tokens: list[int],
    repairs: Sequence[Any],
    k: int,
    whole: frozenset[int],
    *,
    label: str,
) -> TokenLogprobs:
    missing, used = held_back_positions(tokens, kept.token_ids.tolist(), label=label, whole=whole)
    if len(repairs) != len(missing):
        raise InvalidResponseError(
            f"{label}: {len(tokens)} tokens but {len(kept)} probability entries: llama.cpp "
            "sends no probabilities for a token that ends inside a UTF-8 character, and the "
            "rows of those positions were not fetched"
        )
    n = len(tokens)
    ids = np.asarray(tokens, dtype=np.int64)
    values = np.empty(n)
    top_ids = np.full((n, k), -1, dtype=np.int64)
    top_lps = np.full((n, k), -np.inf)
    have = np.setdiff1d(np.arange(n), np.asarray(missing, dtype=np.int64))
    values[have] = kept.logprobs[:used]
    top_ids[have] = kept.top_ids[:used, :k]
    top_lps[have] = kept.top_logprobs[:used, :k]
    for j, body in zip(missing, repairs, strict=True):
        what = f"{label} (the row of held-back token {j})"
        row = body if isinstance(body, TokenLogprobs) else read_whole_row(body, label=what)
        found = np.flatnonzero(row.top_ids[0] == tokens[j])
        if found.size == 0:
            raise InvalidResponseError(f"{what}: the whole row lacks token {tokens[j]}")
        values[j] = row.top_logprobs[0, found[0]]
        width = min(k, row.top_ids.shape[1])  # (a vocabulary smaller than K: padded)
        top_ids[j, :width] = row.top_ids[0, :width]
        top_lps[j, :width] = row.top_logprobs[0, :width]
    return TokenLogprobs(ids, values, top_ids, top_lps)


class LlamaCppAdapter(Adapter):
    """The core, plus every optional part: scoring, slots, repairs and its own tokenizer."""

    traits: ClassVar[DialectTraits] = DialectTraits(
        dialect="llamacpp",
        # prompt_tokens counts the prompt tokens computed (the cached ones are left out).
        metric_names=("llamacpp:prompt_tokens", "llamacpp:prompt_tokens_cached"),
        metric_queries_exclude_hits=True,
        streaming=True,
        stream_reports_progress=True,
        # cpp-httplib answers "Keep-Alive: timeout=5, max=100" to a stream, then closes it.
        stream_closes_connection=True,
        # One prefix cache per slot: proposals are placed on slots (backends/slots.py).
        slots_path="/props",
        start_hint=(
            "start it with `llama-server -m MODEL.gguf --port PORT -np 4 --metrics -fa on "
            "-ctk bf16 -ctv bf16 --cache-ram 0 --poll 0` (--poll 0: 10x faster on a shared CPU); "
            "or `bash scripts/llamacpp.sh start` for the CPU test server (port 8790)"
        ),
    )

    @property
    def scoring(self) -> ScoringCalls:
        return self

    @property
    def slots(self) -> SlotPlacement:
        return self

    @property
    def repairs(self) -> AnswerRepairs:
        return self

    @property
    def tokenizer(self) -> ServerTokenizer:
        return LLAMACPP_TOKENIZER

    def _payload(self, prefix: Sequence[int], n: int, temperature: float, seed: int) -> dict:
        if not prefix:
            raise ValueError("a proposal needs a non-empty prefix (the prompt)")
        return {
            "prompt": [int(t) for t in prefix],
            "n_predict": int(n),
            "temperature": float(temperature),
            "seed": int(seed),
            "n_probs": int(self.spec.top_k),
            **NEUTRAL_SAMPLING,
            "response_fields": RESPONSE_FIELDS,
            "stream": False,
        }

    def build_generate(
        self, request: ProposalRequest, model: str, *, label: str, stream: bool = False
    ) -> HttpCall:
        payload = self._payload(
            request.prefix, request.num_tokens, request.temperature, request_seed(request.seed)
        )
        payload["stream"] = bool(stream)
        return HttpCall("/completion", payload, label, stream=stream)

    def parse_slot_count(self, body: Any) -> int | None:
        count = body.get("total_slots") if isinstance(body, dict) else None
        return (
            count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None
        )

    def on_slot(self, call: HttpCall, slot: int) -> HttpCall:
        return HttpCall(call.path, {**call.payload, "id_slot": int(slot)}, call.label, call.stream)

    def parse_eos_text(self, props: Any) -> str | None:
        """``/props``' ``eos_token``: the model's EOS (``llama_vocab_eos``) as special text."""
        text = props.get("eos_token") if isinstance(props, dict) else None
        return text if isinstance(text, str) and text else None

    def build_tokenize_special(self, text: str) -> HttpCall:
        """``text`` tokenized as special tokens, nothing added (one EOS's id)."""
        payload = {"content": text, "add_special": False, "parse_special": True}
        return HttpCall("/tokenize", payload, "tokenize the EOS")

    def parse_stream_event(
        self, request: ProposalRequest, event: Any, *, label: str
    ) -> TokenLogprobs | None:
        """One streamed event: a token with its raw probabilities, or the final one (none)."""
        body = _body(event, label)
        if "stop_type" in body:  # the final event: its tokens were all streamed before it
            if body.get("truncated"):
                raise InvalidResponseError(f"{label}: {TRUNCATED}")
            return None
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not tokens:
            return None
        out = parse_probabilities(
            body.get("completion_probabilities"), self.spec.top_k, label=label
        )
        check_ids(
            out.token_ids,
            [token_id_value(t, label=label, what="tokens") for t in tokens],
            label=label,
        )
        return out

    def stream_generated(self, events: Sequence[Any]) -> int | None:
        for event in reversed(events):
            if isinstance(event, dict) and isinstance(event.get("tokens_predicted"), int):
                return int(event["tokens_predicted"])
        return None

    def stream_stop(self, events: Sequence[Any]) -> str | None:
        for event in reversed(events):
            if isinstance(event, dict) and isinstance(event.get("stop_type"), str):
                return str(event["stop_type"])
        return None

    def parse_generate(self, request: ProposalRequest, body: Any, *, label: str) -> TokenLogprobs:
        return parse_completion(body, self.spec.top_k, request.num_tokens, label=label)

    def repair_calls(self, request: ProposalRequest, body: Any, *, label: str) -> list[HttpCall]:
        """One whole-row request per held-back token (no probabilities came for it): the
        row after its context, whatever token is then drawn (token 0 is forced: a whole
        piece of text, so the server records it)."""
        if not isinstance(body, dict):
            return []
        tokens, probs = body.get("tokens"), body.get("completion_probabilities")
        if not (isinstance(tokens, list) and isinstance(probs, list)) or len(tokens) <= len(probs):
            return []
        kept = [_entry_id(e, label, "completion_probabilities") for e in probs]
        calls = []
        whole = ascii_token_ids(probs)
        for j in held_back_positions(tokens, kept, label=label, whole=whole)[0]:
            payload = self._payload((*request.prefix, *tokens[:j]), 1, 1.0, 0)
            payload["n_probs"] = FULL_ROW
            payload["logit_bias"] = [[0, FORCE_BIAS]]
            calls.append(HttpCall("/completion", payload, f"{label} (row of token {j})"))
        return calls

    def read_repair_body(self, body: Any, *, label: str) -> TokenLogprobs:
        return read_whole_row(body, label=label)

    def parse_generate_with(
        self, request: ProposalRequest, body: Any, repairs: Sequence[Any], *, label: str
    ) -> TokenLogprobs:
        return parse_completion(
            body, self.spec.top_k, request.num_tokens, label=label, repairs=repairs
        )

    def continuation(self, request: ProposalRequest, got: TokenLogprobs) -> ProposalRequest:
        """The rest of ``request`` after ``got``, which ended in an end-of-generation token."""
        offset = len(got)
        return ProposalRequest(
            (*request.prefix, *got.token_ids.tolist()),
            request.num_tokens - offset,
            request.temperature,
            continuation_seed(request.seed, offset),
            request.scores,
        )

    # ---- scoring: one forced one-token generation per position

    def build_score_calls(
        self, prefix: Sequence[int], token_ids: Sequence[int], model: str, top_k: int, *, label: str
    ) -> list[HttpCall]:
        if not prefix:
            raise ValueError("scoring needs a non-empty prefix")
        calls = []
        for j, token in enumerate(token_ids):
            payload = self._payload((*prefix, *token_ids[:j]), 1, 1.0, 0)
            payload["n_probs"] = FULL_ROW if top_k < 0 else max(int(top_k), 1)
            payload["logit_bias"] = [[int(token), FORCE_BIAS]]
            calls.append(HttpCall("/completion", payload, f"{label} (token {j})"))
        return calls

    def read_score_body(self, body: Any, index: int, top_k: int, *, label: str) -> TokenLogprobs:
        """The answer's row, read as it arrives (a whole vocabulary is 4.7 MB of JSON)."""
        return parse_completion(
            body, top_k, 1, label=f"{label} (token {index})", full_row=top_k < 0
        )

    def parse_score_bodies(
        self,
        prefix: Sequence[int],
        token_ids: Sequence[int],
        bodies: Sequence[Any],
        top_k: int,
        *,
        label: str,
    ) -> TokenLogprobs:
        if len(bodies) != len(token_ids):
            raise InvalidResponseError(f"{label}: {len(bodies)} answers for {len(token_ids)}")
        rows = [
            body
            if isinstance(body, TokenLogprobs)
            else self.read_score_body(body, j, top_k, label=label)
            for j, body in enumerate(bodies)
        ]
        if not rows:
            return TokenLogprobs.empty(max(top_k, 0))
        out = TokenLogprobs.joined(rows)
        if top_k >= 0:
            out = TokenLogprobs(
                out.token_ids, out.logprobs, out.top_ids[:, :top_k], out.top_logprobs[:, :top_k]
            )
        check_ids(out.token_ids, token_ids, label=label)
        return out

    def full_vocab_top_k(self) -> int | None:
        return -1

    def build_next_token_topk(
        self, contexts: Sequence[Sequence[int]], temperature: float, model: str, *, label: str
    ) -> list[HttpCall]:
        # Only a scaled mode asks for next-token normalisers; this dialect has none.
        raise NotImplementedError("llama.cpp has no scaled mode")

    def parse_next_token_topk(
        self, calls: Sequence[HttpCall], bodies: Sequence[Any], n: int, *, label: str
    ) -> TokenLogprobs:
        raise NotImplementedError("llama.cpp has no scaled mode")

    def hint_for_seeds(self) -> str:
        return (
            "identical seeds gave different tokens: is llama-server running with speculative "
            "decoding or a draft model? (start it without)"
        )

    def hint_for_scoring(self) -> str:
        return (
            "llama.cpp scores a token by a forced one-token generation per position; the "
            "server refused it"
        )


class LlamaCppTokenizer(ServerTokenizer):
    """llama-server's tokenizer: ``/tokenize`` takes ``content``; a conversation goes through
    ``/apply-template`` first (its answer's ``prompt`` is then tokenized)."""

    def build_tokenize(
        self,
        text: str,
        model: str | None,
        *,
        chat_template: bool = False,
        system_prompt: str | None = None,
    ) -> list[HttpCall]:
        if chat_template:
            return super().build_tokenize(
                text, model, chat_template=True, system_prompt=system_prompt
            )
        payload = {"content": text, "add_special": True, "parse_special": True}
        return [HttpCall("/tokenize", payload, "tokenize")]

    def build_tokenize_messages(
        self,
        messages: Sequence[Mapping[str, str]],
        model: str | None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[HttpCall]:
        # (/apply-template has no continue_final_message: a final turn is rendered closed)
        payload = {
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
        }
        return [HttpCall("/apply-template", payload, "chat template")]

    def tokenize_next(self, body: Any) -> list[HttpCall] | None:
        if isinstance(body, dict) and "tokens" not in body and isinstance(body.get("prompt"), str):
            # The template wrote the special tokens as text: parse them, add no BOS of its own.
            payload = {"content": body["prompt"], "add_special": False, "parse_special": True}
            return [HttpCall("/tokenize", payload, "tokenize")]
        return None

    def parse_detokenize(self, body: Any) -> str | None:
        text = body.get("content") if isinstance(body, dict) else None
        return text if isinstance(text, str) else None


LLAMACPP_TOKENIZER = LlamaCppTokenizer(("/tokenize",), ("/detokenize",))
