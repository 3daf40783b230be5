"""The EOS of a served engine whose config gives none, asked of the server before any chain runs.

The stop rule (``sampler.stop_at_eos``) needs the token that ends an answer. An HTTP engine's
config may name it (``engines[].eos_token_id``, which always wins); otherwise the server states it
where it can (llama.cpp: ``/props``' EOS text, tokenized as one special token), and else its chat
template says it: a short conversation ending with an assistant turn is tokenized twice through
the engine's ``/tokenize``, once with that turn closed (``add_generation_prompt: false``) and
once left open (``continue_final_message: true``), and the first token of the closing sequence
is the end-of-turn token (ChatML's ``<|im_end|>``). The answer is deterministic (a tokenizer,
no sampling), found once per job and recorded in ``run.json`` with the engine's identity; a
resumed run whose chains already finished on the engine uses the recorded one, so the stop rule
stays a function of the state for the whole job. Where the server cannot tell (no chat
template, no such route), the EOS stays unknown and one warning names the config field.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from presto_client.core.engine_protocol import ChatTokenizing
from presto_client.errors import ConfigError, EngineError

logger = logging.getLogger(__name__)

__all__ = ["EOS_IDENTITY_KEY", "PROBE_CONVERSATION", "closing_token", "discover_eos_token_id"]

EOS_IDENTITY_KEY = "eos_token_id"
"""The key of a discovered EOS in an engine's ``engine_identity`` of ``run.json``."""

PROBE_CONVERSATION: tuple[Mapping[str, str], ...] = (
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
)
"""The conversation whose closing sequence is asked for (no trailing whitespace in the last
turn: a chat template cuts an open turn after its stripped content)."""


def closing_token(closed: Sequence[int], open_: Sequence[int]) -> int | None:
    """The first token ``closed`` adds after ``open_`` (the turn's end); ``None`` where the
    closed conversation does not extend the open one."""
    n = len(open_)
    if len(closed) <= n or list(closed[:n]) != list(open_):
        return None
    return int(closed[n])


async def discover_eos_token_id(engine: Any) -> tuple[int | None, str]:
    """The EOS the server states (llama.cpp's ``/props``), else the end-of-turn token of
    ``engine``'s chat template; and, where there is none, why."""
    stated = getattr(engine, "stated_eos_token_id", None)
    if stated is not None:
        try:
            eos = await stated()
        except EngineError as exc:
            logger.info("the server did not state its EOS (%s); asking its chat template", exc)
            eos = None
        if eos is not None:
            return eos, ""
    if not isinstance(engine, ChatTokenizing):
        return None, "the engine cannot tokenize a conversation"
    turns = [dict(m) for m in PROBE_CONVERSATION]
    try:
        closed = await engine.tokenize_messages(turns, add_generation_prompt=False)  # type: ignore[call-arg]
        open_ = await engine.tokenize_messages(  # type: ignore[call-arg]
            turns, add_generation_prompt=False, continue_final_message=True
        )
    except TypeError:  # (a tokenize_messages without these fields)
        return None, "the engine cannot render an open assistant turn"
    except EngineError as exc:
        return None, f"the server could not tokenize a conversation ({exc})"
    eos = closing_token(closed, open_)
    if eos is None:
        return None, "its chat template renders a closed and an open assistant turn alike"
    return eos, ""


async def resolve_eos_token_ids(
    wanted: Sequence[str],
    replicas: Mapping[str, Any],
    recorded: Mapping[str, Any],
) -> dict[str, int | None]:
    """The EOS of each engine in ``wanted`` (served, stop rule on, none in the config): the one
    ``recorded`` for it (``run.json``, where chains already finished on it), else the server's.
    ``replicas`` maps engine names to a replica to ask."""
    out: dict[str, int | None] = {}
    for name in wanted:
        if name in recorded:
            value = recorded[name]
            out[name] = None if value is None else int(value)
            if value is None:
                logger.warning(
                    "engine %s: its chains finished here ran every block (no EOS token known), "
                    "so the resumed ones do too; set engines[].eos_token_id (in a new "
                    "output_dir) to stop at the end of an answer",
                    name,
                )
            else:
                logger.info("engine %s: EOS token %d, as recorded in run.json", name, value)
            continue
        eos, why = await discover_eos_token_id(replicas[name])
        out[name] = eos
        if eos is None:
            logger.warning(
                "engine %s: no EOS token known (%s), so its chains run every block; set "
                "engines[].eos_token_id to stop at the end of an answer",
                name,
                why,
            )
        else:
            logger.info("engine %s: EOS token %d, as the server states it", name, eos)
    return out


def vocab_of(name: str, replicas: Sequence[Any], served: Mapping[str, int | None]) -> int | None:
    """An engine's vocabulary size: its server's (``served``), else what its in-process model
    or its spec states (through the wrappers that hold it as ``inner``)."""
    if name in served:
        return served[name]
    replica = replicas[0] if replicas else None
    while replica is not None:
        for holder in (getattr(replica, "spec", None), getattr(replica, "model", None)):
            size = getattr(holder, "vocab_size", None)
            if isinstance(size, int) and not isinstance(size, bool):
                return size
        replica = getattr(replica, "inner", None)
    return None


def check_eos_ids(
    samplers: Mapping[str, Any],
    engine_order: Sequence[str],
    discovered: Mapping[str, int | None],
    vocab: Mapping[str, int | None],
) -> None:
    """Each engine's EOS checked like every other token id: one outside the vocabulary is
    never sampled, so the stop rule would silently never fire and every chain would run its
    whole budget (:class:`ConfigError`); where the vocabulary is unknown, a warning."""
    for name, sampler in samplers.items():
        if not sampler.stop_at_eos:
            continue
        given = sampler.eos_token_id is not None
        eos = sampler.eos_token_id if given else discovered.get(name)
        if eos is None:
            continue
        where = (
            f"engines[{list(engine_order).index(name)}].eos_token_id={eos}"
            if given
            else f"the EOS id {eos} the server's tokenizer named"
        )
        size = vocab.get(name)
        fix = "give the id of the model's end-of-answer token as engines[].eos_token_id"
        if eos < 0:
            raise ConfigError(f"engine {name}: {where} is negative, not a token id; {fix}")
        if size is not None and eos >= size:
            raise ConfigError(
                f"engine {name}: {where} is outside the model's vocabulary of {size} tokens: "
                "it is never sampled, so the stop at EOS would never fire and every chain "
                f"would run its whole budget; {fix} (or sampler.stop_at_eos: false)"
            )
        if size is None:
            logger.warning(
                "engine %s: %s cannot be checked (the vocabulary size is unknown: state it as "
                "engines[].vocab_size); an id the model never samples turns the stop at EOS off",
                name,
                where,
            )
