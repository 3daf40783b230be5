"""Measuring instruments of presto-client (not installed: run as ``python -m benchmarks.X``)."""
