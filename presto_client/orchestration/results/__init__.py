"""What a run's files say: its summary (:mod:`.summary`), answer quality (:mod:`.grading`,
:mod:`.quality`, :mod:`.eval_stats`) and the certainty predictor refit from its decisions
(:mod:`.predictor_fit`)."""
