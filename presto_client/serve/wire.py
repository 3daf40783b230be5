"""The wire: OpenAI request bodies, validated (pydantic, at the boundary), and the answer shapes.

A body is read in two passes. :func:`check_fields` looks at its keys first, so that an OpenAI
knob that has no meaning for power sampling is refused with what to use instead, and an unknown
field is refused by name (a misspelt ``max_token`` never silently means the default). The
models then validate the types and ranges; their errors become a 400 naming the parameter.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from presto_client.serve.errors import ApiError, invalid

SAMPLER_FIELDS = (
    "sampler",
    "alpha",
    "tau",
    "block_size",
    "num_blocks",
    "steps_per_block",
    "window",
    "n_pf",
    "epsilon",
    "beta",
    "k_try",
    "temperatures",
    "stop_at_eos",
)
"""Per-request power-sampling settings (extra body fields): those of the config's ``sampler:``."""

REFUSED: dict[str, str] = {
    "temperature": "power sampling targets p^alpha (at the sequence level, the nearest analogue "
    "of temperature 1/alpha); set alpha instead (the proposal temperature is tau, default "
    "1/alpha). A client that always sends temperature (lm-eval) can send alpha with it: "
    "temperature is then ignored",
    "top_p": "power sampling draws from the whole p^alpha; sharpen with alpha instead",
    "top_k": "power sampling draws from the whole p^alpha; sharpen with alpha instead",
    "min_p": "power sampling draws from the whole p^alpha; sharpen with alpha instead",
    "presence_penalty": "penalties change the target distribution; not supported",
    "frequency_penalty": "penalties change the target distribution; not supported",
    "repetition_penalty": "penalties change the target distribution; not supported",
    "logit_bias": "a logit bias changes the target distribution; not supported",
    "logprobs": "per-token logprobs of a power-sampled answer are not returned; usage and "
    "token_ids are",
    "top_logprobs": "per-token logprobs of a power-sampled answer are not returned",
    "best_of": "use n (each of the n chains is an independent sample of p^alpha)",
    "echo": "not supported; the prompt is the request's own",
    "suffix": "not supported (no infilling)",
    "tools": "tool calling is not supported",
    "tool_choice": "tool calling is not supported",
    "functions": "function calling is not supported",
    "function_call": "function calling is not supported",
    "response_format": "constrained output is not supported",
    "max_completion_tokens": "use max_tokens",
}
"""OpenAI knobs that do not apply, with what to use instead."""

IGNORED_WITH_ALPHA = ("temperature",)

_COMMON = (
    "model",
    "max_tokens",
    "n",
    "stream",
    "stream_options",
    "seed",
    "stop",
    "user",
    "traversal",
    *SAMPLER_FIELDS,
)
COMPLETION_FIELDS = ("prompt", *_COMMON)
CHAT_FIELDS = ("messages", *_COMMON)


class _Body(BaseModel):
    # Strict: a boolean is no number and a string no integer (``n: true``, ``n: "2"`` and
    # ``alpha: true`` are refused, as the config file refuses them); an integer is a float.
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    max_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: dict[str, bool] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    user: str | None = None
    traversal: str | None = None
    sampler: str | dict[str, Any] | None = None
    alpha: float | None = None
    tau: float | None = None
    block_size: int | None = Field(None, ge=1)
    num_blocks: int | None = Field(None, ge=1)
    steps_per_block: int | None = None
    window: int | None = Field(None, ge=1)
    n_pf: int | None = Field(None, ge=1)
    epsilon: float | None = None
    beta: float | None = None
    k_try: int | None = Field(None, ge=1)
    temperatures: list[float] | None = None
    stop_at_eos: bool | None = None
    """Stop each chain after the block whose state holds the engine's EOS (default: the
    config's, on): ``max_tokens`` is then a budget, not the length."""

    def sampler_overrides(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SAMPLER_FIELDS if getattr(self, k) is not None}

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionBody(_Body):
    prompt: str | list[int] | list[str] | list[list[int]]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: str
    name: str | None = None


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)


def check_fields(raw: Any, allowed: tuple[str, ...]) -> list[str]:
    """Refuse knobs that do not apply and unknown fields; returns the fields to ignore."""
    if not isinstance(raw, dict):
        raise invalid("the body must be a JSON object")
    ignored: list[str] = []
    for key in raw:
        if key in allowed:
            continue
        if key in REFUSED:
            if key in IGNORED_WITH_ALPHA and raw.get("alpha") is not None:
                ignored.append(key)
                continue
            if key in ("logprobs", "echo") and raw[key] in (None, False, 0):
                continue  # the default, stated
            raise invalid(f"{key} does not apply: {REFUSED[key]}", param=key)
        raise invalid(
            f"unknown field {key!r}; the fields are: {', '.join(sorted(allowed))}", param=key
        )
    return ignored


def parse(model: type[_Body], raw: dict[str, Any]) -> Any:
    """Validate ``raw`` into ``model``; the first error is a 400 naming its parameter."""
    try:
        return model.model_validate({k: v for k, v in raw.items() if k in model.model_fields})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        param = str(first["loc"][0]) if first["loc"] else None
        raise invalid(f"{loc}: {first['msg']}", param=param) from None


def error_event(error: ApiError) -> dict[str, Any]:
    """An error inside a stream that had started (the openai SDK raises it as an APIError)."""
    return error.body()
