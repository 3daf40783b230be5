"""A job's engines: how a planned engine's replicas open (:mod:`.engine_openers`), opening and
probing them (:mod:`.opening`), what is asked of their servers before any chain runs
(:mod:`.eos_discovery`, :mod:`.vocab_discovery`) and the servers presto started, watched
(:mod:`.server_watch`)."""
