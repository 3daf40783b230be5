"""The embedded default engine: SmolLM2-135M-Instruct on the CPU, served in vLLM's dialect.

With no server configured, ``presto`` starts this engine as a subprocess on loopback and talks
to it through the ordinary vLLM adapter. Importing this package does not import torch. This
package is the server (what runs in the child); starting and stopping it is
:mod:`presto_client.child_servers.embedded` (``embedded_server``, ``async_embedded_server``),
beside the other servers presto starts.

- :func:`main`: the ``presto serve-embedded`` command (``python -m presto_client.embedded``).
- :mod:`.model` prepares and loads the model; :mod:`.batching` batches and samples;
  :mod:`.api` is vLLM's API without HTTP (requests checked, responses rendered with
  :mod:`.vllm_shapes`, shared with the test emulation); :mod:`.server` carries it over HTTP
  (its docstring has the measured speed);
  ``benchmarks/embedded_bench.py`` measures it.
"""

from __future__ import annotations

SERVED_MODEL_NAME = "smollm2-135m"
"""The model id the embedded server answers to."""

__all__ = [
    "SERVED_MODEL_NAME",
    "main",
]


def main(argv: list[str] | None = None) -> int:
    """``presto serve-embedded``: see ``python -m presto_client.embedded --help``."""
    from presto_client.embedded.__main__ import main as _main

    return _main(argv)
