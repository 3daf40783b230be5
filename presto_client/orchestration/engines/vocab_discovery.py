"""The vocabulary size of each served engine, asked of its server before any chain runs.

Every answer's token ids are checked against the engine's vocabulary (an id at or past it, or a
negative one, fails the chain naming the engine, the id and the check:
:func:`presto_client.backends.parsing.check_token_ids`). The size comes from the server where it
can tell (:mod:`presto_client.backends.vocabulary`: llama.cpp's model listing, vLLM's and
SGLang's refusal of an id past it), so the check no longer depends on the config stating
``vocab_size``; a stated size the server contradicts is a config error at start, and the
replicas of one engine must agree. Found once per job, recorded in ``run.json`` with the
engine's identity (a resumed run on a server that now tells another size is refused there) and
given as the expected size on resume, which spares a search. Where nothing can tell (a server
that checks no ids, a dialect without a way to ask), one warning names the config field, and
negative ids are still refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from presto_client.backends import VocabAnswer, adopt_vocab_size, discover_vocab_size
from presto_client.errors import ConfigError
from presto_client.terminal_text import server_text

logger = logging.getLogger(__name__)

__all__ = [
    "VOCAB_IDENTITY_KEY",
    "check_prompt_vocab",
    "resolve_engine_vocab",
    "resolve_vocab_sizes",
]

VOCAB_IDENTITY_KEY = "vocab_size"
"""The key of an engine's vocabulary size in its ``engine_identity`` of ``run.json``."""


def _served(replicas: Sequence[Any]) -> list[Any]:
    """The replicas a server answers for (HTTP engines: a transport and a dialect)."""
    return [
        r
        for r in replicas
        if getattr(r, "transport", None) is not None and getattr(r, "adapter", None) is not None
    ]


async def resolve_engine_vocab(
    name: str, replicas: Sequence[Any], *, recorded: int | None = None
) -> int | None:
    """The vocabulary size of engine ``name``, set on each of its served ``replicas``: what
    their servers tell, checked against the size stated for it (the config's ``vocab_size``,
    or the one its kind knows, carried in the replicas' spec); else the stated one, else the
    ``recorded`` one (``run.json``); ``None`` where nothing tells (warned once).

    Raises :class:`ConfigError` when the stated size and the server's differ, or the replicas'
    servers tell different sizes."""
    served = _served(replicas)
    if not served:
        return None
    stated = getattr(served[0].spec, "vocab_size", None)
    expected = stated if stated is not None else recorded
    answers: list[VocabAnswer] = list(
        await asyncio.gather(*(discover_vocab_size(r, expected=expected) for r in served))
    )
    told = sorted({a.size for a in answers if a.size is not None})
    if len(told) > 1:
        raise ConfigError(
            f"engine {name}: its replicas' servers have different vocabularies "
            f"({', '.join(map(str, told))} tokens): they serve different models; point "
            "base_urls at one model"
        )
    how = next((a.how for a in answers if a.size is not None), answers[0].how)
    if not told:
        size = stated if stated is not None else recorded
        if size is None:
            logger.warning(
                "engine %s: its server does not tell its vocabulary size (%s); token ids past "
                "it cannot be caught in answers (negative ones still are): state "
                "engines[].vocab_size",
                name,
                server_text(how),
            )
        else:
            logger.info(
                "engine %s: vocabulary of %d tokens, as %s (the server does not tell: %s)",
                name,
                size,
                "stated" if stated is not None else "recorded in run.json",
                server_text(how),
            )
    else:
        size = told[0]
        if stated is not None and stated != size:
            raise ConfigError(
                f"engine {name}: vocab_size is {stated} (engines[].vocab_size, or the size "
                f"its kind's model has), but its server's model has {size} tokens "
                f"({server_text(how)}): another model is served than the config says; fix "
                "engines[].vocab_size (or leave it out: the server's is used) or the server"
            )
        logger.info("engine %s: vocabulary of %d tokens, %s", name, size, server_text(how))
    if size is not None:
        for replica in served:
            adopt_vocab_size(replica, size)
    return size


async def resolve_vocab_sizes(
    engines: Mapping[str, Any], recorded: Mapping[str, Any]
) -> dict[str, int | None]:
    """:func:`resolve_engine_vocab` for each opened engine with served replicas (``engines``:
    name -> an opened engine with ``replicas``); ``recorded``: name -> the size ``run.json``
    holds (none: absent)."""
    out: dict[str, int | None] = {}
    for name, handle in engines.items():
        if not _served(handle.replicas):
            continue
        value = recorded.get(name)
        out[name] = await resolve_engine_vocab(
            name,
            handle.replicas,
            recorded=int(value) if isinstance(value, int) and not isinstance(value, bool) else None,
        )
    return out


def check_prompt_vocab(
    prompt_ids: Mapping[str, Sequence[Sequence[int]]], sizes: Mapping[str, int | None]
) -> None:
    """Refuse a prompt whose token ids lie outside its engine's vocabulary (the config could
    not check them when the size came from the server): every chain of it would fail."""
    for name, prompts in prompt_ids.items():
        size = sizes.get(name)
        if size is None:
            continue
        for index, ids in enumerate(prompts):
            high = max(ids, default=0)
            if high >= size:
                raise ConfigError(
                    f"prompt {index} holds token id {high}, outside engine {name}'s vocabulary "
                    f"of {size} tokens (told by its server): fix prompts.token_ids"
                )
