"""An OpenAI request, turned into a :class:`~presto_client.serve.chains.ChainBatch`.

- **Prompts**: ``prompt`` is token ids, text, or a list of either (one prompt each; choice
  ``i * n + j`` is chain ``j`` of prompt ``i``, OpenAI's order). Text goes through the engine's
  tokenizer. Chat ``messages`` (system, user and assistant turns, ending with a user turn) go
  through the engine's chat template as a whole conversation.
- **max_tokens** is the budget ``num_blocks × block_size``: the blocks are the config's (or the
  request's) ``num_blocks``, lowered to the largest divisor of ``max_tokens`` not above it, so
  every block is as long as the others, as the kernels need. A chain stops after the block whose
  state holds the engine's EOS (``stop_at_eos``, on by default: the answer ends at its EOS,
  ``finish_reason: stop``); with ``stop_at_eos: false`` every block runs and the answer is
  ``max_tokens`` long unless it is cut at an EOS at the end. Absent: the config's
  ``block_size × num_blocks``.
- **seed**: the root seed of the request's chains; a request without one gets a fresh random
  seed (reported in the answer's ``presto.seed``), as an OpenAI request without one is random.
- Power-sampling settings in the body (``alpha``, ``steps_per_block``, ``sampler``,
  ``traversal``, ...) override the config's ``sampler:`` and are validated as it is.
"""

from __future__ import annotations

import secrets
from typing import Any

from pydantic import ValidationError

from presto_client.core.sampler_config import arm_traversal_names
from presto_client.errors import ConfigError
from presto_client.orchestration.config.schema import JobConfig, SamplerSettings
from presto_client.orchestration.config.serve_config import ServeLimits
from presto_client.serve.chains import ChainBatch, ServingEngine, chain_window, sampler_for
from presto_client.serve.errors import ApiError, invalid
from presto_client.serve.wire import ChatBody, CompletionBody

Limits = ServeLimits
"""What one request may ask for: the config's ``serve.limits`` (or the service's options)."""


def above_limit(what: str, value: int, limit: int, name: str, param: str) -> ApiError:
    """A 400 naming the server's bound (and where an operator raises it)."""
    return invalid(
        f"{what} {value} is above this server's limit {limit} (serve.limits.{name})",
        param=param,
        code="limit_exceeded",
    )


def blocks_for(max_tokens: int, num_blocks: int) -> tuple[int, int]:
    """``(block_size, num_blocks)`` with ``block_size × num_blocks == max_tokens``: the largest
    number of blocks that divides ``max_tokens`` and is at most ``num_blocks``.

    O(sqrt(max_tokens)): divisors come in pairs ``(d, max_tokens // d)`` with ``d <= sqrt``."""
    if max_tokens < 1 or num_blocks < 1:
        raise ValueError("max_tokens and num_blocks must be >= 1")
    best = 1
    d = 1
    while d * d <= max_tokens:
        if max_tokens % d == 0:
            for blocks in (d, max_tokens // d):
                if best < blocks <= num_blocks:
                    best = blocks
        d += 1
    return max_tokens // best, best


def _check_overrides(changes: dict[str, Any], max_tokens: int | None, limits: Limits) -> None:
    """The request's own numbers against the server's bounds, before any work that grows with
    them (a divisor scan, a sampler's validation, a chain)."""
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise above_limit("max_tokens", max_tokens, limits.max_tokens, "max_tokens", "max_tokens")
    block = changes.get("sampler")
    nested = block if isinstance(block, dict) else {}
    bounds = (
        ("steps_per_block", limits.max_steps_per_block, "max_steps_per_block"),
        ("num_blocks", limits.max_num_blocks, "max_num_blocks"),
        ("block_size", limits.max_tokens, "max_tokens"),
        ("n_pf", limits.max_n_pf, "max_n_pf"),
        ("window", limits.max_window, "max_window"),
        ("k_try", limits.max_k_try, "max_k_try"),
    )
    for key, limit, name in bounds:
        for value in (changes.get(key), nested.get(key)):
            if isinstance(value, int) and not isinstance(value, bool) and value > limit:
                raise above_limit(key, value, limit, name, key)
    for temps in (changes.get("temperatures"), nested.get("temperatures")):
        if isinstance(temps, list) and len(temps) > limits.max_temperatures:
            raise above_limit(
                "temperatures: a list of",
                len(temps),
                limits.max_temperatures,
                "max_temperatures",
                "temperatures",
            )


def check_settings(settings: SamplerSettings, chains: int, limits: Limits) -> None:
    """The settings a request runs with (its own and the config's) against the bounds."""
    bounds = (
        (
            "steps_per_block",
            settings.steps_per_block,
            limits.max_steps_per_block,
            "max_steps_per_block",
        ),
        ("num_blocks", settings.num_blocks, limits.max_num_blocks, "max_num_blocks"),
        ("max_tokens", settings.block_size * settings.num_blocks, limits.max_tokens, "max_tokens"),
        ("n_pf", settings.n_pf, limits.max_n_pf, "max_n_pf"),
        ("window", settings.window or 0, limits.max_window, "max_window"),
        ("k_try", settings.k_try, limits.max_k_try, "max_k_try"),
        (
            "temperatures: a list of",
            len(settings.temperatures),
            limits.max_temperatures,
            "max_temperatures",
        ),
    )
    for what, value, limit, name in bounds:
        if value > limit:
            param = what.partition(":")[0]
            raise above_limit(what, value, limit, name, param)
    work = chains * settings.num_blocks * settings.steps_per_block
    if work > limits.max_transitions:
        raise invalid(
            f"{chains} chain(s) x num_blocks {settings.num_blocks} x steps_per_block "
            f"{settings.steps_per_block} = {work} transitions is above this server's limit "
            f"{limits.max_transitions} (serve.limits.max_transitions)",
            param="steps_per_block",
            code="limit_exceeded",
        )


def check_config_within(cfg: JobConfig, limits: Limits) -> None:
    """The config's own sampler must fit the bounds, or every request would be refused."""
    settings = cfg.sampler
    try:
        check_settings(settings, 1, limits)
    except ApiError as exc:
        raise ConfigError(
            f"sampler: {exc.message}; raise the limit in the config's serve.limits (or with "
            "--set serve.limits.NAME=VALUE) or lower the sampler's setting"
        ) from None


def settings_for(
    base: SamplerSettings, body: CompletionBody | ChatBody, limits: Limits | None = None
) -> SamplerSettings:
    """The config's sampler settings with the request's overrides and ``max_tokens``."""
    limits = limits or Limits()
    changes = body.sampler_overrides()
    _check_overrides(changes, body.max_tokens, limits)
    data = base.model_dump(mode="json")
    data.pop("traversals")
    if isinstance(changes.get("sampler"), dict):  # {kind: ..., own settings}: the block form
        for key in SamplerSettings.model_fields:
            if key in changes["sampler"] and key not in changes:
                data.pop(key, None)
    data.update(changes)
    if body.max_tokens is not None:
        if "block_size" in changes and "num_blocks" in changes:
            if changes["block_size"] * changes["num_blocks"] != body.max_tokens:
                raise invalid(
                    f"max_tokens = {body.max_tokens} but block_size x num_blocks = "
                    f"{changes['block_size']} x {changes['num_blocks']}; give one or the other",
                    param="max_tokens",
                )
        elif "block_size" in changes:
            if body.max_tokens % changes["block_size"]:
                raise invalid(
                    f"max_tokens = {body.max_tokens} is not a multiple of block_size = "
                    f"{changes['block_size']}",
                    param="max_tokens",
                )
            data["num_blocks"] = body.max_tokens // changes["block_size"]
        else:
            data["block_size"], data["num_blocks"] = blocks_for(
                body.max_tokens, int(data["num_blocks"])
            )
    try:
        return SamplerSettings.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "sampler"
        param = str(first["loc"][0]) if first["loc"] else "sampler"
        raise invalid(f"{loc}: {first['msg']}", param=param) from None


def traversal_for(body: CompletionBody | ChatBody, default: str) -> str:
    traversal = body.traversal or default
    valid = arm_traversal_names()
    if traversal not in valid:
        raise invalid(
            f"unknown traversal {traversal!r}; valid traversals are: {', '.join(valid)}",
            param="traversal",
        )
    return traversal


async def prompt_ids(
    engine: ServingEngine, body: CompletionBody | ChatBody, limits: Limits | None = None
) -> list[tuple[int, ...]]:
    """The request's prompts as token ids under the engine's tokenizer."""
    if isinstance(body, ChatBody):
        return [await _encode_chat(engine, body)]
    prompt: Any = body.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    if not prompt:
        raise invalid("prompt is empty", param="prompt")
    limits = limits or Limits()
    if len(prompt) > limits.max_prompts:
        raise above_limit("prompts:", len(prompt), limits.max_prompts, "max_prompts", "prompt")
    out: list[tuple[int, ...]] = []
    for p in prompt:
        if isinstance(p, str):
            out.append(await _encode(engine, p, chat=False, system=None))
        else:
            if not p:
                raise invalid("a prompt of zero tokens", param="prompt")
            out.append(tuple(int(t) for t in p))
    return out


async def _encode_chat(engine: ServingEngine, body: ChatBody) -> tuple[int, ...]:
    """The conversation through the engine's chat template. An engine that renders whole
    conversations gets every turn; one that only templates a single user turn (with an
    optional system prompt) gets that, and anything longer is refused."""
    if not engine.can_tokenize:
        raise invalid(
            f"engine {engine.name} ({engine.kind}) cannot tokenize text; send the prompt as "
            "token ids to /v1/completions",
            param="messages",
        )
    if body.messages[-1].role == "assistant":
        raise invalid(
            "messages: the last message is the assistant's; end with a user message (to "
            "continue a partial assistant answer, send the templated text as the prompt to "
            "/v1/completions)",
            param="messages",
        )
    if engine.can_tokenize_chat:
        turns = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.content}
            for m in body.messages
        ]
        return await engine.tokenize_messages(turns)
    messages = list(body.messages)
    system = None
    if messages[0].role in ("system", "developer"):
        system = messages.pop(0).content
    if len(messages) != 1 or messages[0].role != "user":
        raise invalid(
            f"messages: engine {engine.name} ({engine.kind}) applies its chat template to one "
            "user message (and an optional system message) only; render the conversation "
            "with the model's chat template and send it to /v1/completions as the prompt",
            param="messages",
        )
    return await _encode(engine, messages[0].content, chat=True, system=system)


async def _encode(
    engine: ServingEngine, text: str, *, chat: bool, system: str | None
) -> tuple[int, ...]:
    if not engine.can_tokenize:
        raise invalid(
            f"engine {engine.name} ({engine.kind}) cannot tokenize text; send the prompt as "
            "token ids to /v1/completions",
            param="messages" if chat else "prompt",
        )
    return await engine.tokenize(text, chat=chat, system_prompt=system)


def check_request(
    engine: ServingEngine,
    body: CompletionBody | ChatBody,
    prompts: list[tuple[int, ...]],
    settings: SamplerSettings,
    limits: Limits,
) -> None:
    """Sizes the service allows and the engine's context can hold."""
    chains = body.n * len(prompts)
    if chains > limits.max_chains:
        raise invalid(
            f"{len(prompts)} prompt(s) x n {body.n} = {chains} chains is above this server's "
            f"limit {limits.max_chains} (serve.limits.max_chains)",
            param="n",
            code="limit_exceeded",
        )
    check_settings(settings, chains, limits)
    length = settings.block_size * settings.num_blocks
    vocab = engine.vocab_size
    for p in prompts:
        if not p:
            raise invalid("a prompt of zero tokens", param="prompt")
        low, high = min(p), max(p)
        if low < 0:
            raise invalid(f"a prompt token id is negative ({low})", param="prompt")
        if vocab is not None and high >= vocab:
            raise invalid(
                f"a prompt token id ({high}) is outside the vocabulary [0, {vocab})", "prompt"
            )
    limit = engine.max_model_len
    longest = max(len(p) for p in prompts)
    if limit is not None and longest + length > limit:
        raise invalid(
            f"the prompt ({longest} tokens) and max_tokens ({length}) need {longest + length} "
            f"tokens; the model's context is {limit}",
            param="max_tokens" if longest < limit else "prompt",
            code="context_length_exceeded",
        )
    if body.stops() and not engine.can_detokenize:
        raise invalid(
            f"stop needs the response text; engine {engine.name} ({engine.kind}) cannot detokenize",
            param="stop",
        )


async def batch_for(
    engine: ServingEngine, body: CompletionBody | ChatBody, default_traversal: str, limits: Limits
) -> ChainBatch:
    """The request's chains (prompts tokenized, settings validated, sizes checked): every
    bound is checked before the work that grows with it."""
    if body.n > limits.max_n:
        raise above_limit("n", body.n, limits.max_n, "max_n", "n")
    if len(body.stops()) > limits.max_stops:
        raise above_limit(
            "stop: a list of", len(body.stops()), limits.max_stops, "max_stops", "stop"
        )
    settings = settings_for(engine.config.sampler, body, limits)
    traversal = traversal_for(body, default_traversal)
    prompts = await prompt_ids(engine, body, limits)
    check_request(engine, body, prompts, settings, limits)
    try:
        sampler = sampler_for(settings, engine.eos_token_id)
    except ValueError as exc:
        raise invalid(f"sampler: {exc}", param="sampler") from None
    seed = body.seed if body.seed is not None else secrets.randbits(32)
    return ChainBatch(
        prompts=tuple(prompts),
        sampler=sampler,
        traversal=traversal,
        size=chain_window(settings, traversal),
        n=body.n,
        seed=seed,
    )
