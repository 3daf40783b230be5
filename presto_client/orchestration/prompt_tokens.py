"""Prompt text to token ids (and responses back to text) through the engine's own tokenizer.

Chains work on token ids. Text prompts are tokenized by the server that will serve them, so the
ids are exactly the model's: ``POST /tokenize`` with ``{"prompt": text}``, or with
``{"messages": [...], "add_generation_prompt": true}`` to apply the model's chat template, and
``POST /detokenize`` with ``{"tokens": [...]}`` (vLLM's endpoints, which the embedded engine
serves too; SGLang serves the same shape on recent versions — *check*, and ``/v1/tokenize`` is
tried when ``/tokenize`` is missing). An engine object may also offer ``tokenize``/
``detokenize`` coroutines of its own; those are preferred.

Requests go through the engine's own HTTP transport (its client, timeouts and retries).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Sequence
from typing import Any

from presto_client.errors import EngineError, EngineRequestError

logger = logging.getLogger(__name__)

_NO_DETOKENIZE: weakref.WeakSet[Any] = weakref.WeakSet()
"""Engines whose server cannot detokenize: asked (and logged) once, not once per chain."""


async def _post(engine: Any, paths: Sequence[str], payload: dict[str, Any], label: str) -> Any:
    transport = getattr(engine, "transport", None)
    if transport is None or not hasattr(transport, "request_json"):
        raise EngineError(
            f"engine cannot {label} text (no HTTP transport); give prompts.token_ids",
            engine=getattr(engine, "name", ""),
        )
    model_fn = getattr(engine, "model", None)
    if callable(model_fn):
        payload = {"model": await model_fn(), **payload}
    last: EngineRequestError | None = None
    for path in paths:
        try:
            return await transport.request_json("POST", path, payload, label=label)
        except EngineRequestError as exc:  # 404 on one path: try the next
            last = exc
    assert last is not None
    fix = "give prompts.token_ids, or use" if label == "tokenize" else "responses need"
    raise EngineRequestError(  # every path rejected: asking again will not help
        f"the server cannot {label} ({last}); {fix} a server with a {' or '.join(paths)} endpoint",
        engine=getattr(engine, "name", ""),
    )


async def encode(
    engine: Any, text: str, *, chat_template: bool = False, system_prompt: str | None = None
) -> tuple[int, ...]:
    """Token ids of ``text`` under the engine's tokenizer (optionally as a chat turn)."""
    own = getattr(engine, "tokenize", None)
    if callable(own):
        ids = await own(text, chat_template=chat_template, system_prompt=system_prompt)
        return tuple(int(t) for t in ids)
    payload: dict[str, Any]
    if chat_template:
        messages = [{"role": "user", "content": text}]
        if system_prompt is not None:
            messages.insert(0, {"role": "system", "content": system_prompt})
        payload = {"messages": messages, "add_generation_prompt": True}
    else:
        payload = {"prompt": text, "add_special_tokens": True}
    body = await _post(engine, ("/tokenize", "/v1/tokenize"), payload, "tokenize")
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise EngineError(
            f"/tokenize answered without a token list: {str(body)[:200]}",
            engine=getattr(engine, "name", ""),
        )
    if not tokens:
        raise EngineError("a prompt tokenized to zero tokens", engine=getattr(engine, "name", ""))
    return tuple(tokens)


async def decode(engine: Any, token_ids: Sequence[int]) -> str | None:
    """The text of ``token_ids``; ``None`` when the engine cannot say (never fails a chain)."""
    own = getattr(engine, "detokenize", None)
    try:
        if callable(own):
            return str(await own(list(token_ids)))
        if getattr(engine, "transport", None) is None or engine in _NO_DETOKENIZE:
            return None
        body = await _post(
            engine,
            ("/detokenize", "/v1/detokenize"),
            {"tokens": [int(t) for t in token_ids]},
            "detokenize",
        )
    except EngineError as exc:
        if isinstance(exc, EngineRequestError):
            with contextlib.suppress(TypeError):  # not weak-referenceable: ask each time
                _NO_DETOKENIZE.add(engine)
        logger.info("no response text (samples keep the token ids): %s", exc)
        return None
    text = body.get("prompt", body.get("text")) if isinstance(body, dict) else None
    return text if isinstance(text, str) else None
