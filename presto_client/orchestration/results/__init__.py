"""What a run's files say: its summary (:mod:`.summary`), answer quality (:mod:`.quality`,
:mod:`.eval_stats`; the graders themselves: :mod:`presto_client.orchestration.grading`) and the
certainty predictor refit from its decisions (:mod:`.predictor_fit`)."""
