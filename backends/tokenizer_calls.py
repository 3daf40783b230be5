"""The tokenizer part of a dialect (text prompts in, response text out): pure builders and parsers.

:class:`ServerTokenizer` is vLLM's shape (``/tokenize`` with ``prompt`` or ``messages``,
``/detokenize`` with ``tokens``), which the vLLM, SGLang and OpenAI-compatible dialects expose
(:attr:`presto_client.backends.adapter.Adapter.tokenizer`; llama.cpp's subclass in
:mod:`presto_client.backends.llamacpp`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from presto_client.backends.adapter import HttpCall
from presto_client.errors import InvalidResponseError


class ServerTokenizer:
    """:class:`~presto_client.backends.adapter.TokenizerCalls` of vLLM's shape: calls to the
    server's tokenizer, one per endpoint to try, and parsers of the answers."""

    def __init__(
        self,
        tokenize_paths: tuple[str, ...] = ("/tokenize", "/v1/tokenize"),
        detokenize_paths: tuple[str, ...] = ("/detokenize", "/v1/detokenize"),
    ) -> None:
        # vLLM's endpoints, tried in order (the embedded engine serves them too)
        self.tokenize_paths = tokenize_paths
        self.detokenize_paths = detokenize_paths

    def build_tokenize(
        self,
        text: str,
        model: str | None,
        *,
        chat_template: bool = False,
        system_prompt: str | None = None,
    ) -> list[HttpCall]:
        """Calls that tokenize ``text`` (as a user turn through the model's chat template when
        ``chat_template``), one per endpoint to try, in order."""
        if chat_template:
            messages = [{"role": "user", "content": text}]
            if system_prompt is not None:
                messages.insert(0, {"role": "system", "content": system_prompt})
            return self.build_tokenize_messages(messages, model)
        payload: dict[str, Any] = {"prompt": text, "add_special_tokens": True}
        if model is not None:
            payload = {"model": model, **payload}
        return [HttpCall(path, payload, "tokenize") for path in self.tokenize_paths]

    def build_tokenize_messages(
        self,
        messages: Sequence[Mapping[str, str]],
        model: str | None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[HttpCall]:
        """Calls that tokenize a conversation (``role``/``content`` turns) through the model's
        chat template, ending with the prompt for the assistant's next turn (or, with
        ``add_generation_prompt=False``, with the last turn closed; with
        ``continue_final_message``, with the last turn left open: vLLM's fields)."""
        payload: dict[str, Any] = {
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
        }
        if continue_final_message:
            payload["continue_final_message"] = True
        if model is not None:
            payload = {"model": model, **payload}
        return [HttpCall(path, payload, "tokenize") for path in self.tokenize_paths]

    def tokenize_next(self, body: Any) -> list[HttpCall] | None:
        """Calls to send next with a tokenizer answer that is not the token ids yet (a chat
        template's text, say), one per endpoint to try; ``None``: ``body`` is the answer."""
        return None

    def parse_tokenize(self, body: Any) -> tuple[int, ...]:
        """The token ids of a tokenize answer (``{"tokens": [...]}``)."""
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise InvalidResponseError(
                f"/tokenize answered without a token list: {str(body)[:200]}"
            )
        if not tokens:
            raise InvalidResponseError("a prompt tokenized to zero tokens")
        return tuple(tokens)

    def build_detokenize(self, token_ids: Sequence[int], model: str | None) -> list[HttpCall]:
        """Calls that turn ``token_ids`` into text, one per endpoint to try, in order."""
        payload: dict[str, Any] = {"tokens": [int(t) for t in token_ids]}
        if model is not None:
            payload = {"model": model, **payload}
        return [HttpCall(path, payload, "detokenize") for path in self.detokenize_paths]

    def parse_detokenize(self, body: Any) -> str | None:
        """The text of a detokenize answer (``prompt`` or ``text``); ``None`` without one."""
        text = body.get("prompt", body.get("text")) if isinstance(body, dict) else None
        return text if isinstance(text, str) else None


SERVER_TOKENIZER = ServerTokenizer()
