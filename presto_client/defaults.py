"""Every default of an engine and a job, in one place.

The job config (:mod:`presto_client.orchestration.config.schema`), the backends' engine spec
(:class:`presto_client.backends.spec.EngineSpec`) and the HTTP transport read their defaults from
here, so that a YAML job, a Python caller and a test mean the same thing by "the default".
"""

from __future__ import annotations

# ---- HTTP engines (backends)

TOP_K = 20
"""Top-K raw logprobs requested per token (vLLM's ``--max-logprobs`` default is 20)."""
ENGINE_MAX_CONCURRENCY = 32
"""Most requests in flight to one engine (all replicas together in a job config)."""
REQUEST_TIMEOUT_S = 300.0
"""Timeout of one HTTP request, seconds."""
CONNECT_TIMEOUT_S = 10.0
"""Connect timeout, seconds."""
REQUEST_DEADLINE_S = 900.0
"""The most one HTTP request may take from sending to its last byte, seconds (the request
timeout is the longest *silence*: a server that sends a keepalive comment every second, or one
byte a second, never trips it). Generous: a long generation on a slow CPU server fits."""
MAX_RESPONSE_MB = 32.0
"""The least size cap of one response, MiB (a request's own cap grows with what it asks:
tokens × top-K); an SSE line may take a sixteenth of it. Beyond it the answer is refused
after reading at most the cap, whatever the server sends."""
MAX_RETRIES = 3
"""Retries of timeouts and HTTP 408/429/500 (a restart's symptoms: :data:`RESTART_WINDOW_S`)."""
RESTART_WINDOW_S = 60.0
"""How long (summed backoff) a request keeps retrying the symptoms of a server restart:
connection refused/reset and HTTP 502/503/504. A self-hosted vLLM or SGLang server takes some
30-60 s to come back (process start, weights, warm-up), which the openai SDK's defaults (2
retries, 0.5-8 s backoff: a few seconds, sized for a hosted API's blips) do not ride out; vLLM's
own benchmark client does not retry requests at all but waits for the server to be ready before
it starts. Other failures (timeouts, 408/429/500) keep ``max_retries``; a 4xx is never retried."""

# ---- the embedded engine

EMBEDDED_MODEL = "SmolLM2-135M-Instruct"
"""The embedded engine's model (as recorded in a run's fingerprint)."""
EMBEDDED_VOCAB_SIZE = 49152
"""SmolLM2's vocabulary: ids at or past it in an answer are refused."""
EMBEDDED_EOS_TOKEN_ID = 2
"""``<|im_end|>`` of SmolLM2-Instruct: where the embedded engine's responses are truncated."""
EMBEDDED_REQUEST_TIMEOUT_S = 600.0
"""Timeout of one request to the embedded CPU server, seconds."""
EMBEDDED_STARTUP_TIMEOUT_S = 600.0
"""How long to wait for the embedded server to start (a first start prepares the model)."""

# ---- a job

JOB_MAX_CONCURRENCY = 64
"""Most requests in flight over all engines of a job together."""
