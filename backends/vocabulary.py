"""The vocabulary size of a served model, asked of its server before any chain runs.

A token id at or past the model's vocabulary (or a negative one) in an answer means a broken
server or another model behind the URL; a sample that carried it would be stored as "ok" and be
unreadable. :func:`~presto_client.backends.parsing.check_token_ids` refuses such ids in every
answer once the size is known; this module finds the size where the server can tell, so the
check does not depend on the config stating ``vocab_size``. What each dialect can tell (read in
the servers' sources, checked on the real ones where marked):

* **llama.cpp** (``llama-server``): ``GET /v1/models`` lists ``meta.n_vocab``, the size of the
  model's vocabulary and of its logit rows (``tools/server/server-context.cpp``; real server).
* **vLLM**: no route lists it, and ``/detokenize`` decodes an id past the vocabulary to an
  empty string without complaint (vLLM 0.32, real server). A completion request whose
  ``logit_bias`` names an id past the vocabulary is refused before anything runs, with the
  size in the message (``Vocabulary size: 49152``, the model's logit width,
  ``sampling_params._validate_logit_bias``; real server): one request. Where a version words
  it otherwise, the same request answers "accepted" or "refused" per id, and a bounded search
  over ids finds the first refused one (about 18 requests; a bias of 0 changes nothing, and an
  accepted probe generates one token).
* **SGLang**: ``/get_model_info`` and ``/get_server_info`` do not say it; ``/generate`` refuses
  ``input_ids`` at or past the model's vocabulary
  (``TokenizerManager._validate_input_ids_in_vocab``: ``... greater than the vocab size
  (151936).``), so one request with a huge id reads it from
  the message, else the same bounded search (``max_new_tokens: 0``: a one-token prefill per
  accepted probe). Read in SGLang's sources only; no SGLang server runs here.
* **openai** (any other OpenAI-compatible server): ``meta.n_vocab`` where its model listing has
  it (a llama-server does); else vLLM's one request (a ``logit_bias`` naming an id past every
  vocabulary), since such a server is often vLLM behind a gateway or the generic dialect: its
  refusal states the size. A server that accepts the id, or refuses it without a size, tells
  nothing (no search: what a refusal means is unknown there), and the config's ``vocab_size`` is
  then the only source.

The size is then set on the engine (:func:`adopt_vocab_size`), which also makes the top-K tail
bound (temperatures above 1) and SGLang's full-row scoring work without the config stating it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from presto_client.errors import EngineError, EngineRequestError

logger = logging.getLogger(__name__)

__all__ = [
    "DISCOVERY_TIMEOUT_S",
    "FAR_ID",
    "VocabAnswer",
    "adopt_vocab_size",
    "discover_vocab_size",
    "vocab_from_message",
]

FAR_ID = 2**31 - 1
"""An id past every vocabulary that every server still parses (a signed 32-bit int)."""
SEARCH_START = 1 << 15
"""Where the bounded search starts doubling: most vocabularies lie between 2^15 and 2^18."""
SEARCH_CEILING = 1 << 24
"""A server that accepts this id validates nothing: the search gives up (nothing to tell)."""
DISCOVERY_TIMEOUT_S = 120.0
"""Bound on one replica's whole discovery (a search's requests together)."""

_SIZE_PATTERNS = (
    re.compile(r"vocabulary size:?\s*(\d+)", re.IGNORECASE),  # vLLM
    re.compile(r"vocab(?:ulary)? size \((\d+)\)", re.IGNORECASE),  # SGLang
    re.compile(r"\[0,\s*(\d+)\)"),  # "valid range is [0, N)" (SGLang, newer)
)


@dataclass(frozen=True, slots=True)
class VocabAnswer:
    """What a server told of its vocabulary: the size, or ``None`` and why not."""

    size: int | None
    how: str
    """Where the size came from (``size`` set), or why the server could not tell."""


def vocab_from_message(message: str) -> int | None:
    """The vocabulary size a server's refusal states (vLLM's, SGLang's wording), if any."""
    for pattern in _SIZE_PATTERNS:
        m = pattern.search(message)
        if m is not None and 0 < int(m.group(1)) < FAR_ID:
            return int(m.group(1))
    return None


def models_meta_vocab(body: Any) -> int | None:
    """``meta.n_vocab`` of the first model of a ``/v1/models`` listing (llama-server's)."""
    entries = body.get("data") if isinstance(body, dict) else None
    for entry in entries if isinstance(entries, list) else ():
        meta = entry.get("meta") if isinstance(entry, dict) else None
        n = meta.get("n_vocab") if isinstance(meta, dict) else None
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return None


Probe = Callable[[int], Awaitable[str | None]]
"""Sends one request naming a token id: ``None`` when the server accepts it, else the message
of its refusal (4xx)."""


async def search_vocab_size(probe: Probe, *, expected: int | None = None) -> VocabAnswer:
    """The vocabulary size by asking ``probe`` about ids: the message of a refused far id when
    it states the size; else, with ``expected`` (the config's or a recorded size), whether
    ``expected - 1`` is accepted and ``expected`` refused; else the first refused id, doubling
    from :data:`SEARCH_START` then bisecting."""
    refusal = await probe(FAR_ID)
    if refusal is None:
        return VocabAnswer(None, f"the server accepts token id {FAR_ID} (it checks no ids)")
    told = vocab_from_message(refusal)
    if told is not None:
        return VocabAnswer(told, "stated in the server's refusal of an id past it")
    if await probe(0) is not None:
        return VocabAnswer(None, "the server refuses the probe itself (token id 0 too)")
    if (
        expected is not None
        and expected > 0
        and await probe(expected - 1) is None
        and await probe(expected) is not None
    ):
        return VocabAnswer(expected, "confirmed by the server (accepts id - 1, refuses id)")
    lo, hi = 0, SEARCH_START
    while await probe(hi) is None:
        lo, hi = hi, hi * 2
        if hi > SEARCH_CEILING:
            return VocabAnswer(None, f"the server accepts token ids up to {lo}")
    while hi - lo > 1:  # (id lo accepted, id hi refused)
        mid = (lo + hi) // 2
        if await probe(mid) is None:
            lo = mid
        else:
            hi = mid
    return VocabAnswer(hi, "found by asking the server which token ids it accepts")


def _vllm_probe(engine: Any, model: str) -> Probe:
    async def probe(token_id: int) -> str | None:
        payload = {
            "model": model,
            "prompt": [0],
            "max_tokens": 1,
            "temperature": 0.0,
            "logit_bias": {str(token_id): 0.0},
        }
        return await _refused(engine, "/v1/completions", payload)

    return probe


def _sglang_probe(engine: Any) -> Probe:
    async def probe(token_id: int) -> str | None:
        payload = {"input_ids": [token_id], "sampling_params": {"max_new_tokens": 0}}
        return await _refused(engine, "/generate", payload)

    return probe


async def _refused(engine: Any, path: str, payload: dict[str, Any]) -> str | None:
    """``None`` when the server answers ``payload`` at ``path``, the server's message when it
    refuses it (4xx; other failures propagate: they say nothing about the id)."""
    try:
        await engine.transport.request_json("POST", path, payload, label="vocabulary probe")
    except EngineRequestError as exc:
        return exc.detail
    return None


async def _listed_vocab(engine: Any) -> int | None:
    body = await engine.transport.request_json(
        "GET", engine.adapter.traits.models_path, label="vocabulary size"
    )
    return models_meta_vocab(body)


async def discover_vocab_size(
    engine: Any, *, expected: int | None = None, timeout_s: float = DISCOVERY_TIMEOUT_S
) -> VocabAnswer:
    """The vocabulary size ``engine``'s server tells (see the module's docstring per dialect);
    ``expected`` (the config's, or a recorded size) spares the search where the server's
    refusal does not state the size. Any failure of the server is an answer of ``None``."""
    adapter = getattr(engine, "adapter", None)
    if adapter is None or getattr(engine, "transport", None) is None:
        return VocabAnswer(None, "the engine is not a served one")
    dialect = str(getattr(getattr(adapter, "traits", None), "dialect", ""))
    try:
        async with asyncio.timeout(timeout_s):
            if dialect == "vllm":
                return await search_vocab_size(
                    _vllm_probe(engine, await engine.model()), expected=expected
                )
            if dialect == "sglang":
                return await search_vocab_size(_sglang_probe(engine), expected=expected)
            n = await _listed_vocab(engine)
            if n is not None:
                return VocabAnswer(n, f"meta.n_vocab of {adapter.traits.models_path}")
            refusal = await _vllm_probe(engine, await engine.model())(FAR_ID)
    except TimeoutError:
        return VocabAnswer(None, f"no answer within {timeout_s:g} s")
    except EngineError as exc:
        return VocabAnswer(None, f"the server failed the probe ({exc.detail})")
    told = vocab_from_message(refusal) if refusal is not None else None
    if told is not None:
        return VocabAnswer(told, "stated in the server's refusal of an id past it")
    return VocabAnswer(
        None,
        f"its {adapter.traits.models_path} has no meta.n_vocab, and it "
        + ("accepts" if refusal is None else "refuses without a size")
        + f" a logit_bias for token id {FAR_ID}",
    )


def adopt_vocab_size(engine: Any, size: int) -> None:
    """Set ``size`` as ``engine``'s vocabulary: the answer check refuses ids at or past it,
    and the top-K tail bound and full-row scoring use it. The spec is frozen and shared by
    the engine's parts (its adapter, its generation loop), so each part holding the engine's
    spec gets the new one."""
    old = engine.spec
    spec = dataclasses.replace(old, vocab_size=size)
    engine.spec = spec
    for part in (getattr(engine, "adapter", None), getattr(engine, "generation", None)):
        if part is not None and getattr(part, "spec", None) is old:
            part.spec = spec
