"""Prompt text to token ids (and responses back to text) through the engine's own tokenizer.

Chains work on token ids. Text prompts are tokenized by the engine that will serve them, so the
ids are exactly the model's. An engine offers this through the optional capabilities
:class:`~presto_client.core.engine_protocol.Tokenizing` and
:class:`~presto_client.core.engine_protocol.Detokenizing`; the HTTP engine implements them with
its adapter's pure builders and parsers (``build_tokenize``/``parse_tokenize``, vLLM's
``/tokenize`` and ``/detokenize``, which the embedded engine serves too) over its own transport
(its client, timeouts and retries).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Sequence
from typing import Any

from presto_client.core.engine_protocol import ChatTokenizing, Detokenizing, Tokenizing
from presto_client.errors import EngineError, EngineRequestError

logger = logging.getLogger(__name__)

_NO_DETOKENIZE: weakref.WeakSet[Any] = weakref.WeakSet()
"""Engines whose server cannot detokenize: asked (and logged) once, not once per chain."""


async def encode(
    engine: Any, text: str, *, chat_template: bool = False, system_prompt: str | None = None
) -> tuple[int, ...]:
    """Token ids of ``text`` under the engine's tokenizer (optionally as a chat turn)."""
    if not isinstance(engine, Tokenizing):
        raise EngineError(
            "engine cannot tokenize text (no HTTP transport); give prompts.token_ids",
            engine=getattr(engine, "name", ""),
        )
    ids = await engine.tokenize(text, chat_template=chat_template, system_prompt=system_prompt)
    return tuple(int(t) for t in ids)


async def encode_messages(engine: Any, messages: Sequence[tuple[str, str]]) -> tuple[int, ...]:
    """Token ids of a conversation (``(role, content)`` turns) through the engine's chat
    template: every turn where the engine renders conversations; otherwise one user turn (with
    an optional system turn before it), anything longer refused with what to do."""
    turns = [{"role": r, "content": c} for r, c in messages]
    if isinstance(engine, ChatTokenizing):
        ids = await engine.tokenize_messages(turns)
        return tuple(int(t) for t in ids)
    system = messages[0][1] if len(messages) == 2 and messages[0][0] == "system" else None
    if messages[-1][0] != "user" or len(messages) - (system is not None) != 1:
        raise EngineError(
            "engine cannot render a conversation of several turns through its chat template; "
            "give one user message (and an optional system message) per row",
            engine=getattr(engine, "name", ""),
        )
    return await encode(engine, messages[-1][1], chat_template=True, system_prompt=system)


async def decode(engine: Any, token_ids: Sequence[int]) -> str | None:
    """The text of ``token_ids``; ``None`` when the engine cannot say (never fails a chain)."""
    if not isinstance(engine, Detokenizing) or engine in _NO_DETOKENIZE:
        return None
    try:
        text = await engine.detokenize([int(t) for t in token_ids])
    except EngineError as exc:
        if isinstance(exc, EngineRequestError):
            with contextlib.suppress(TypeError):  # not weak-referenceable: ask each time
                _NO_DETOKENIZE.add(engine)
        logger.info("no response text (samples keep the token ids): %s", exc)
        return None
    return None if text is None else str(text)
