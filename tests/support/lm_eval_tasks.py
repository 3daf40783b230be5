"""An lm-eval task written to a folder, so the lm-eval tests run offline on local data."""

from __future__ import annotations

import json
from pathlib import Path


def write_arithmetic_task(
    folder: Path, *, name: str, n: int, until: str, max_gen_toks: int | None = None
) -> None:
    """``n`` questions "What is i+1?" with their answers, as lm-eval task ``name``: generation
    stops at ``until`` (a YAML-escaped string) and, when given, after ``max_gen_toks`` tokens."""
    rows = [{"question": f"What is {i}+1?", "answer": str(i + 1)} for i in range(n)]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    limit = f"  max_gen_toks: {max_gen_toks}\n" if max_gen_toks is not None else ""
    (folder / "task.yaml").write_text(
        f"task: {name}\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    test: {folder / 'data.jsonl'}\n"
        "test_split: test\n"
        "output_type: generate_until\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "generation_kwargs:\n"
        f'  until: ["{until}"]\n'
        f"{limit}"
        "metric_list:\n"
        "  - metric: exact_match\n"
        "    aggregation: mean\n"
        "    higher_is_better: true\n"
    )
