"""The job config: its schema (:mod:`.schema`, the engines' classes in :mod:`.engine_config`
and :mod:`.llamacpp_engine`, the ``dataset``, ``executor`` and ``serve`` sections), reading it
(:mod:`.loading`) and ``--set`` overrides (:mod:`.overrides`). Above the plan: pydantic lives
here."""
