"""The math (layer 1) and the engine protocol it talks to (layer 2): numpy only, no I/O.

- :mod:`.engine_protocol`: the :class:`Engine` protocol and its messages (``ProposalRequest``,
  ``ScoredTokens``, ...); :mod:`.reference`: the exact in-process model implementing it.
- :mod:`.sampler_config`: the plain settings of one sampler, the names of samplers/traversals.
- :mod:`.kernels`: the three MH kernels, every ``log A``; :mod:`.tree`: the prefetch tree and
  its traversal rules; :mod:`.predictor`, :mod:`.rng`, :mod:`.state`, :mod:`.logprob_math`.
- :mod:`.runners` (sequential and PreSTO), :mod:`.stream`, :mod:`.baseline_runners`:
  one chain's walk against an engine; :mod:`.speculation`, :mod:`.stats`.
"""
