"""The plan: a validated config resolved (:mod:`.plan`) into the plain frozen data of
:mod:`presto_client.orchestration.planned`; a certainty predictor's file read for it
(:mod:`.predictor_file`)."""
