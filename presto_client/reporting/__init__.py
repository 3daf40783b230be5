"""Reporting (faces): tables, plots and comparisons made from a run directory's saved files.

- :mod:`.tables`: the summary and side-by-side tables (text, as the CLI prints them);
- :mod:`.plots`: PNG plots from saved results (never re-running a job);
- :mod:`.compare`: ``presto compare`` (engines side by side, paired ratios).
"""
