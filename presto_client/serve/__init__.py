"""``presto serve``: power sampling behind an OpenAI-compatible API (a face beside the CLI).

:mod:`.wire` validates request bodies, :mod:`.mapping` turns a request into chains,
:mod:`.chains` is the one seam to the orchestration (opening the engine, running chains),
:mod:`.admission` bounds what runs and waits, :mod:`.metrics` counts, :mod:`.app` serves.
"""
