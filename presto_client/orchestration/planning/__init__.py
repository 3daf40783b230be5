"""The plan: a validated config resolved (:mod:`.plan`) into plain frozen data
(:mod:`.planned`); a certainty predictor's file read for it (:mod:`.predictor_file`)."""
