"""A job's prompts: untrusted input files read (:mod:`.input_files`), datasets loaded
(:mod:`.dataset_loader`), rows turned into prompts (:mod:`.prompt_rows`) and prompts into token
ids (:mod:`.prompt_tokens`)."""
