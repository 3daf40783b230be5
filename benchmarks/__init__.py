"""Measuring instruments of presto-client (not installed: run as ``python -m benchmarks.X``).

In a checkout that is not installed (a lent GPU machine: ``scripts/gpu_check.sh``), the package's
``presto_client.backends`` (its source in ``backends/``, mapped there by the install) is found
here instead.
"""

from __future__ import annotations

from pathlib import Path

import presto_client

try:
    import presto_client.backends
except ModuleNotFoundError:
    presto_client.__path__.append(str(Path(__file__).resolve().parents[1]))
