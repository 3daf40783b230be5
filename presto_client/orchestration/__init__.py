"""Orchestration (layer 4): many chains over many engines, from a job config to a run directory.

It drives the core (:mod:`presto_client.core`) through the engine protocol and knows no serving
dialect (engines are built by :mod:`backends`' registry).

- :mod:`.config`: the job config's schema (pydantic); :mod:`.loading`: reading it (YAML,
  validation, errors with field paths, prompts, redaction); :mod:`.overrides`: ``--set``;
- :mod:`.plan`: the config resolved into :mod:`.planned`'s plain frozen data (settings,
  engines with their openers, arms, chains and their seeds); below it nothing sees pydantic;
- :mod:`.engines`: opening a job's engines (replicas, probes, identities, context lengths);
- :mod:`.orchestrator`: chains over engine pools, bounded in-flight requests, failures;
- :mod:`.job`: a planned job run (or resumed) into its run directory;
- :mod:`.rundir`: the run directory (append-only JSONL, atomic summaries, resume);
- :mod:`.summary`: the run's summary (speedups, equivalence tests, quality) from its files;
- :mod:`.prompt_tokens`, :mod:`.grading`, :mod:`.quality`, :mod:`.eval_stats`.
"""
