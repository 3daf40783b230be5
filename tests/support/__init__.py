"""Test doubles shared by the tests and the benchmarks; not part of the installed packages.

- :mod:`tests.support.emulation`: HTTP servers of the exact reference model in vLLM's and
  SGLang's dialects (the backend and end-to-end tests; ``benchmarks/latency_server.py`` serves the
  same content with a latency model).
- :mod:`tests.support.exact_law`: enumerated transition laws of the three kernels (the exactness
  tests measure the samplers against them).
- :mod:`tests.support.memory_pool`: an in-memory :class:`backends.pool.Pool` (a handler answers
  each request), under the real transport of the backend tests.
- :mod:`tests.support.toy_backend`: a complete third-party backend in one file (the example of
  docs/architecture.md), registered by the tests through the registry and an entry point.

Importable as ``tests.support`` from the repository root (pytest puts the root on ``sys.path``:
``pythonpath`` in pyproject.toml; ``python -m benchmarks...`` runs from the root).
"""
