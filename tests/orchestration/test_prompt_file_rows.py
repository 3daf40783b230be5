"""A prompts file is read row by row (issue 48, item 2): with a limit and no shuffle a JSONL, CSV
or parquet file's first rows are read and no more; with a shuffle every row is read but only the
sample's are kept; so memory follows the rows used, not the file's size. A JSON array is read
whole. Either way the prompts are those a whole read gives."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from presto_client.errors import ConfigError
from presto_client.orchestration.config.loading import load_job_config
from presto_client.orchestration.input_files import MAX_PROMPTS_BYTES, read_text_file, text_lines
from presto_client.orchestration.prompts.dataset_loader import load_local
from presto_client.orchestration.prompts.prompt_rows import load_prompts, rows_to_prompts

ROWS = 100_000
T = TypeVar("T")


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "big.jsonl"
    with path.open("w") as fh:
        fh.write("\n")  # a blank line is skipped, not counted
        for i in range(ROWS):
            fh.write(json.dumps({"question": f"What is {i} + {i}? " + "x" * 100, "answer": 2 * i}))
            fh.write("\n")
    return path


def _peak(work: Callable[[], T]) -> tuple[T, int]:
    """What ``work`` returns, and the most memory it held at once (bytes, tracemalloc's)."""
    tracemalloc.start()
    try:
        out = work()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _config(tmp_path: Path, prompts: dict[str, Any]) -> Path:
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "engines": [{"kind": "vllm", "name": "v", "base_url": "http://127.0.0.1:9"}],
                "prompts": {"field": "question", "answer_field": "answer", **prompts},
                "output_dir": str(tmp_path / "run"),
            }
        )
    )
    return config


def test_a_limit_reads_the_first_rows_only(tmp_path: Path, big: Path) -> None:
    cfg = load_job_config(_config(tmp_path, {"file": str(big), "limit": 5}))
    prompts, peak = _peak(lambda: load_prompts(cfg))
    assert [p.text for p in prompts] == [f"What is {i} + {i}? " + "x" * 100 for i in range(5)]
    assert [p.answer for p in prompts] == [str(2 * i) for i in range(5)]
    # The file is ~13 MB; read whole, its text alone would be that much.
    assert big.stat().st_size > 10 * (1 << 20)
    assert peak < 4 * (1 << 20), peak


def test_the_first_rows_are_those_a_whole_read_gives(tmp_path: Path, big: Path) -> None:
    limited = load_prompts(load_job_config(_config(tmp_path, {"file": str(big), "limit": 7})))
    whole = load_prompts(load_job_config(_config(tmp_path, {"file": str(big)})))
    assert len(whole) == ROWS
    assert [(p.text, p.answer, p.origin) for p in limited] == [
        (p.text, p.answer, p.origin) for p in whole[:7]
    ]


def test_a_shuffled_sample_keeps_only_its_rows(tmp_path: Path, big: Path) -> None:
    cfg = load_job_config(_config(tmp_path, {"file": str(big), "limit": 5, "shuffle": True}))
    sample, peak = _peak(lambda: load_prompts(cfg))
    indices = [p.origin.row for p in sample if p.origin is not None]
    assert len(indices) == 5 and max(indices) > 7  # drawn from the whole file
    # (every row read, five kept: the ~13 MB file's rows held at once were ~60 MB)
    assert peak < 4 * (1 << 20), peak


def _sampled(tmp_path: Path, path: Path, limit: int, seed: int) -> Path:
    prompts = {"file": str(path), "limit": limit, "shuffle": True, "shuffle_seed": seed}
    return _config(tmp_path, prompts)


def _whole_read_sample(tmp_path: Path, path: Path, limit: int, seed: int) -> list[Any]:
    """The sample as a whole read gives it: every row loaded, then shuffled and cut."""
    loaded = load_local(path)
    cfg = load_job_config(_sampled(tmp_path, path, limit, seed))
    return [(p.text, p.answer, p.origin) for p in rows_to_prompts(loaded, cfg.prompts)]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_a_shuffled_sample_is_the_one_a_whole_read_gives(tmp_path: Path, suffix: str) -> None:
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(300)]
    path = tmp_path / f"p{suffix}"
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    elif suffix == ".csv":
        lines = "".join(f"{r['question']},{r['answer']}\n" for r in rows)
        path.write_text("question,answer\n" + lines)
    else:
        pa = pytest.importorskip("pyarrow")
        pq = pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=64)
    for limit, seed in ((1, 0), (7, 0), (7, 3), (299, 1), (400, 2)):
        cfg = load_job_config(_sampled(tmp_path, path, limit, seed))
        got = [(p.text, p.answer, p.origin) for p in load_prompts(cfg)]
        assert got == _whole_read_sample(tmp_path, path, limit, seed)
        assert len(got) == min(limit, 300)
        numbers = [o.row for _, _, o in got]
        assert limit == 1 or numbers != sorted(numbers)  # (shuffled)


def test_rows_past_the_limit_are_not_read(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"question": "a"}\n{"question": "b"}\nnot json\n')
    prompts = load_prompts(load_job_config(_config(tmp_path, {"file": str(path), "limit": 2})))
    assert [p.text for p in prompts] == ["a", "b"]
    with pytest.raises(ConfigError, match=r"p.jsonl:3: not valid JSON"):
        load_prompts(load_job_config(_config(tmp_path, {"file": str(path)})))


def test_a_csv_files_first_rows_are_read_and_no_more(tmp_path: Path) -> None:
    """Rows of quoted cells across lines are whole, the file well past the limit is never
    read (the bytes there are not UTF-8), and a whole read gives the same first rows and
    places."""
    path = tmp_path / "p.csv"
    head = 'question,answer\n"two\nlines",1\nplain,2\n"three\nlong\nlines",3\nlast,4\n'
    more = "".join(f"row {i},{i}\n" for i in range(5, 40))
    path.write_bytes((head + more).encode() + b"\xff\xfe not text\n" * 3)
    for limit, want in ((1, ["two\nlines"]), (3, ["two\nlines", "plain", "three\nlong\nlines"])):
        cfg = load_job_config(_config(tmp_path, {"file": str(path), "limit": limit}))
        prompts = load_prompts(cfg)
        assert [p.text for p in prompts] == want
        assert [p.answer for p in prompts] == [str(i + 1) for i in range(limit)]
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_prompts(load_job_config(_config(tmp_path, {"file": str(path)})))
    clean = tmp_path / "clean.csv"
    clean.write_text(head)
    limited = load_prompts(load_job_config(_config(tmp_path, {"file": str(clean), "limit": 3})))
    whole = load_prompts(load_job_config(_config(tmp_path, {"file": str(clean)})))
    assert [(p.text, p.origin) for p in limited] == [(p.text, p.origin) for p in whole[:3]]
    every = load_prompts(load_job_config(_config(tmp_path, {"file": str(clean), "limit": 9})))
    assert len(every) == 4  # (a limit past the end: every row)
    cut = tmp_path / "cut.csv"
    cut.write_text('question,answer\nfine,1\n"never closed,2\n')
    # (a quote left open to the end reads as a whole read reads it)
    limited = load_prompts(load_job_config(_config(tmp_path, {"file": str(cut), "limit": 5})))
    whole = load_prompts(load_job_config(_config(tmp_path, {"file": str(cut)})))
    assert [p.text for p in limited] == [p.text for p in whole] == ["fine", "never closed,2\n"]


def test_a_parquet_files_first_rows_are_those_a_whole_read_gives(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "p.parquet"
    table = pa.table({"question": [f"q{i}" for i in range(50)], "answer": list(range(50))})
    pq.write_table(table, path, row_group_size=7)  # (a limit across row groups)
    for limit in (1, 7, 12, 60):
        got = load_prompts(load_job_config(_config(tmp_path, {"file": str(path), "limit": limit})))
        assert [p.text for p in got] == [f"q{i}" for i in range(min(limit, 50))]


def test_a_first_row_past_the_size_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    path.write_bytes(b'{"question": "' + b"y" * 4000 + b'"}\n')
    with pytest.raises(ConfigError, match="more than the limit"):
        next(text_lines(path, what="prompts file", max_bytes=1000, whole=False))
    assert MAX_PROMPTS_BYTES == 1 << 30  # (the real limit: 1 GiB)


# ---- input that would change the job silently (issue 48, item 6)


@pytest.mark.parametrize(
    ("value", "kind"), [(None, "null"), (["a", "list"], "list"), ({"k": 1}, "dict"), (True, "bool")]
)
def test_a_template_over_a_value_that_is_not_text_is_refused_naming_the_row(
    tmp_path: Path, value: Any, kind: str
) -> None:
    path = tmp_path / "p.jsonl"
    rows = [{"q": "fine", "n": 1}, {"q": value, "n": 2}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_job_config(_config(tmp_path, {"file": str(path), "template": "Q: {q} ({n})"}))
    with pytest.raises(ConfigError) as err:
        load_prompts(cfg)
    assert f"p.jsonl:2: prompts.template's {{q}} is {kind} in this row" in str(err.value)


def test_numbers_in_a_template_are_rendered(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"a": 3, "b": 0.5}) + "\n")
    cfg = load_job_config(_config(tmp_path, {"file": str(path), "template": "{a} + {b}"}))
    assert [p.text for p in load_prompts(cfg)] == ["3 + 0.5"]


@pytest.mark.parametrize("cell", ["", "   "])
def test_an_empty_prompt_is_a_config_error_naming_file_and_row(tmp_path: Path, cell: str) -> None:
    path = tmp_path / "p.csv"
    path.write_text(f"question,answer\nfine,1\n{cell},2\n")
    with pytest.raises(ConfigError, match=r"p\.csv:3: field 'question' is empty"):
        load_prompts(load_job_config(_config(tmp_path, {"file": str(path)})))


def test_a_csv_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_bytes("\ufeffquestion,answer\nWhat is 2+2?,4\n".encode())
    prompts = load_prompts(load_job_config(_config(tmp_path, {"file": str(path)})))
    assert [(p.text, p.answer) for p in prompts] == [("What is 2+2?", "4")]


def _every_way(tmp_path: Path, path: Path, limit: int) -> list[Any]:
    """The prompts (or the error) of a whole read, of a limit and of a shuffled sample."""
    out: list[Any] = []
    for extra in ({}, {"limit": limit}, {"limit": limit, "shuffle": True}):
        cfg = load_job_config(_config(tmp_path, {"file": str(path), **extra}))
        try:
            out.append([(p.text, p.answer, p.origin) for p in load_prompts(cfg)])
        except ConfigError as exc:
            out.append(str(exc))
    return out


def test_a_csv_file_with_old_mac_line_ends_reads_the_same_every_way(tmp_path: Path) -> None:
    path = tmp_path / "mac.csv"
    path.write_bytes(b'question,answer\r"two\rlines",1\rplain,2\r\nlast,3\r')
    whole, first, sample = _every_way(tmp_path, path, 3)
    assert [t for t, _, _ in whole] == ["two\rlines", "plain", "last"]
    assert first == whole
    assert sorted(sample, key=lambda p: p[2].row) == whole  # (the same rows, shuffled)


def test_a_line_is_read_no_further_than_the_limit(tmp_path: Path) -> None:
    """A file without a newline is not taken in whole to find where its first line ends."""
    path = tmp_path / "one_line.jsonl"
    path.write_bytes(b'{"question": "' + b"y" * (20 << 20))

    def first_line() -> None:
        with pytest.raises(ConfigError, match="more than the limit of 1 MiB"):
            next(text_lines(path, what="prompts file", max_bytes=1 << 20, whole=False))

    _, peak = _peak(first_line)
    assert peak < 4 << 20, peak


def test_a_rows_error_reads_the_same_with_a_limit_as_whole(tmp_path: Path) -> None:
    path = tmp_path / "open.jsonl"
    path.write_text('{"question": "q0"}\n{"question": "abc\n{"question": "q2"}\n')
    whole, first, sample = _every_way(tmp_path, path, 3)
    assert whole == first == sample
    assert "open.jsonl:2: not valid JSON: Unterminated string" in whole


def test_a_whole_read_takes_the_files_size_in_memory_not_the_limits(tmp_path: Path) -> None:
    """A read of n bytes takes n bytes first: reading a small JSON file up to the 1 GiB limit
    took 1 GiB (a MemoryError under `ulimit -v` of a few hundred MB)."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps([{"question": "q"}]))
    text, peak = _peak(
        lambda: read_text_file(path, what="prompts file", max_bytes=MAX_PROMPTS_BYTES)
    )
    assert json.loads(text) == [{"question": "q"}]
    assert peak < 1 << 20, peak


def test_a_file_that_grew_after_its_size_was_read_is_read_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from presto_client.orchestration import input_files

    path = tmp_path / "p.jsonl"
    path.write_text('{"question": "' + "z" * 100 + '"}\n')
    real = os.fstat

    def smaller(fd: int) -> os.stat_result:  # (as if it grew after this was asked)
        st = real(fd)
        return os.stat_result((st.st_mode, *st[1:6], 5, *st[7:]))

    monkeypatch.setattr(input_files.os, "fstat", smaller)
    assert read_text_file(path, what="prompts file", max_bytes=1000) == path.read_text()
    with pytest.raises(ConfigError, match="more than the limit of 50 bytes"):
        read_text_file(path, what="prompts file", max_bytes=50)
