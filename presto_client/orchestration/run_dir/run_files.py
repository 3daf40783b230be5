"""The files of a run directory, one at a time: atomic writes, whole-line JSONL appends, tolerant
JSONL reads, and the grouping of their rows by chain (presto_client.orchestration.run_dir.rundir
owns the directory: which files, the lock, resume)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from presto_client.errors import ConfigError

logger = logging.getLogger(__name__)


class RunDirWriteError(ConfigError):
    """A file of the run directory could not be written (disk full, quota, I/O error).

    A local error, not a chain's: the job stops, nothing is counted as failed, and a rerun
    after the cause is fixed resumes. A :class:`ConfigError`, so the exit status is 2.
    """


def write_error(path: Path, exc: OSError) -> RunDirWriteError:
    reason = (exc.strerror or str(exc)).lower()
    return RunDirWriteError(
        f"cannot write {path}: {reason}; free some space (or fix the cause) and rerun the same "
        "command to resume"
    )


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_error(path, exc) from None


_warned: set[tuple[str, int, int, int]] = set()
"""(file, size, mtime, line) of the bad lines already warned about: a session reads a file
several times (resume check, resume, summary), and one warning per line is enough."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file; a truncated or corrupt line is skipped with a warning
    (once per line and version of the file)."""
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = []
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        st = os.fstat(fh.fileno())
        lines = fh.read().split("\n")
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            key = (str(path.resolve()), st.st_size, st.st_mtime_ns, lineno)
            if key in _warned:
                continue
            _warned.add(key)
            last = lineno >= len(lines) - 1
            logger.warning(
                "%s:%d: skipping %s line", path, lineno, "a truncated last" if last else "a corrupt"
            )
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


class AppendFile:
    """A JSONL file appended one whole line at a time: a line that cannot be written in full
    (disk full) is cut off again, so the file never keeps a torn line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise write_error(path, exc) from None
        self._size = os.fstat(self._fd).st_size

    def write(self, text: str) -> None:
        raw = text.encode("utf-8")
        data = memoryview(raw)
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)  # (needs no space)
            raise write_error(self.path, exc) from None
        self._size += len(raw)

    def fsync(self) -> None:
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise write_error(self.path, exc) from None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def dumps(row: Mapping[str, Any]) -> str:
    return json.dumps(row, separators=(",", ":"), allow_nan=False, default=json_default)


def json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


def latest_by_chain(samples: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The last sample line of every chain id."""
    out: dict[str, dict[str, Any]] = {}
    for row in samples:
        cid = row.get("chain_id")
        if isinstance(cid, str):
            out[cid] = dict(row)
    return out


def finished_ok(samples: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The chains whose last sample line says they finished without error."""
    return {cid: row for cid, row in latest_by_chain(samples).items() if row.get("status") == "ok"}


def rows_to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    columns: list[str] = []
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(key)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in columns})
    return buf.getvalue()


def iter_chain_records(
    records: Iterable[Mapping[str, Any]], chain_ids: set[str] | None = None
) -> Iterator[tuple[str, list[Mapping[str, Any]]]]:
    """Records grouped by chain id (in file order), optionally only for ``chain_ids``."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        cid = r.get("chain_id")
        if not isinstance(cid, str) or (chain_ids is not None and cid not in chain_ids):
            continue
        grouped.setdefault(cid, []).append(r)
    yield from grouped.items()
