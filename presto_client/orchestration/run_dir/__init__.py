"""The run directory (:mod:`.rundir`) and its files, one at a time (:mod:`.run_files`)."""
