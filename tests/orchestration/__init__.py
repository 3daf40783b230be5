"""Tests of layers 4-5: orchestration, job configs, run directories, reports, the CLI."""
