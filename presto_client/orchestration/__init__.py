"""Orchestration (layer 4): many chains over many engines, from a job config to a run directory.

It drives the core (:mod:`presto_client.core`) through the engine protocol and knows no serving
dialect (engines are built by :mod:`backends`' registry). Its folders, by concept:

- :mod:`.config`: the job config's schema (pydantic), reading it (YAML, validation, errors with
  field paths, redaction) and ``--set`` overrides;
- :mod:`.planning`: the config resolved into plain frozen data (settings, engines with their
  openers, arms, chains and their seeds); below it nothing sees pydantic;
- :mod:`.prompts`: input files, datasets, rows to prompts, prompts to token ids;
- :mod:`.engines`: opening a job's engines (replicas, probes, identities, context lengths, EOS,
  vocabularies) and watching the servers presto started;
- :mod:`.executors`: chains over engine pools (the orchestrator), locally or over Ray workers;
- :mod:`.run_dir`: the run directory (append-only JSONL, atomic summaries, resume);
- :mod:`.results`: the run's summary, grading and quality, the predictor's refit;
- :mod:`.job`: a planned job run (or resumed) into its run directory (ties the folders together).
"""
