"""The run directory: everything a job leaves on disk, readable without the code.

    <output_dir>/
      config.resolved.yaml   the validated config, defaults filled in, secrets redacted
      run.json               what identifies the work (fingerprint), sessions, every chain's seed,
                             what each engine served (engine_identity: model, version, ...)
      records.jsonl          one line per engine call of a chain (a round), appended and flushed
      samples.jsonl          one line per finished chain (ok or failed, with the error)
      metrics.jsonl          per session and engine: prefix-cache counters before/after
      summary.json, summary.csv   per arm, written atomically (tmp + os.replace)
      plots/*.png            written by ``presto report`` from the files above
      .lock                  held by the session writing the directory (one at a time)

Resume: opening an existing directory keeps the chains that finished ok (the last sample line
of a chain wins; a truncated last line is tolerated), drops the records and samples of every
other chain (unfinished or failed: they restart from their seed) by rewriting both files
atomically, and refuses a directory whose fingerprint (the work-defining part of the config)
differs from the job's where finished chains depend on it (a run that died before any chain
finished is re-planned), or whose finished chains ran on an engine that now serves another model
(or version, context length, logprob mode).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import yaml

from presto_client.errors import ConfigError, PrestoError
from presto_client.orchestration.run_dir.run_files import (
    AppendFile,
    RunDirWriteError,
    atomic_write_text,
    dumps,
    finished_ok,
    iter_chain_records,
    json_default,
    latest_by_chain,
    read_jsonl,
    rows_to_csv,
)

logger = logging.getLogger(__name__)

__all__ = [
    "RunDir",
    "RunDirWriteError",
    "atomic_write_text",
    "check_output_dir",
    "finished_ok",
    "iter_chain_records",
    "latest_by_chain",
    "read_jsonl",
    "rows_to_csv",
]

CONFIG_FILE = "config.resolved.yaml"
RUN_FILE = "run.json"
RECORDS_FILE = "records.jsonl"
SAMPLES_FILE = "samples.jsonl"
METRICS_FILE = "metrics.jsonl"
SUMMARY_JSON = "summary.json"
SUMMARY_CSV = "summary.csv"
LOCK_FILE = ".lock"
ENGINE_IDENTITY = "engine_identity"
FORMAT_VERSION = 1
SAMPLES_FSYNC_S = 1.0
"""At most one fsync of samples.jsonl per this many seconds (and one at close)."""


def fingerprint_conflicts(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The fingerprint fields on which two jobs disagree.

    ``engines`` maps engine names to their identity: engines may be added to a run, but an
    engine present in both must agree.
    """
    out: list[str] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if key == "engines" and isinstance(a, dict) and isinstance(b, dict):
            out.extend(f"engines.{n}" for n in sorted(set(a) & set(b)) if a[n] != b[n])
        elif key == "dataset":
            # Runs before datasets were recorded have none (their prompts' digest still
            # guards them); the path and the resolved commit are recorded, not compared: the
            # rows' digest says whether the rows are the same.
            if a is None and key not in old:
                continue
            da, db = a if isinstance(a, dict) else {}, b if isinstance(b, dict) else {}
            out.extend(
                f"dataset.{k}"
                for k in sorted(set(da) | set(db))
                if k not in DATASET_RECORDED_ONLY and da.get(k) != db.get(k)
            )
        elif key == "sampler" and isinstance(a, dict) and isinstance(b, dict):
            # Older runs recorded the stream window, which defines no work: a run made with
            # window 16 resumes without a cap (or another one).
            if {k: v for k, v in a.items() if k != "window"} != {
                k: v for k, v in b.items() if k != "window"
            }:
                out.append(key)
        elif a != b:
            out.append(key)
    return out


DATASET_RECORDED_ONLY = ("path", "commit")
"""Fields of the fingerprint's ``dataset`` recorded in run.json but not compared on resume."""


def dataset_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """The dataset of two fingerprints side by side, in words: what a refused resume says."""
    a, b = old.get("dataset") or {}, new.get("dataset") or {}

    def rows(d: Mapping[str, Any]) -> str:
        where = d.get("name") or d.get("path") or "inline prompts"
        commit = f", commit {d['commit']}" if d.get("commit") else ""
        return f"{d.get('rows', '?')} row(s) of {where}{commit}, digest {d.get('digest')}"

    parts = [
        f"{k} {a.get(k)!r} -> {b.get(k)!r}"
        for k in ("name", "config", "split", "revision")
        if a.get(k) != b.get(k)
    ]
    if a.get("digest") != b.get("digest") or a.get("rows") != b.get("rows"):
        parts.append(f"rows: {rows(a)} -> {rows(b)}")
    elif a.get("answers") != b.get("answers"):
        parts.append("the same rows, other reference answers")
    return "; ".join(parts)


def identity_conflicts(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The identity fields (model, version, ...) both sides know and disagree on."""
    return [
        k
        for k in sorted(set(old) & set(new))
        if old[k] is not None and new[k] is not None and old[k] != new[k]
    ]


def check_output_dir(path: Path, *, create: bool = False) -> None:
    """Make sure ``path`` is (or can become) a writable directory, before any engine starts.

    A directory that does not exist yet is not created here (``create=False``): only its nearest
    existing ancestor is checked, so that a job that dies before any chain ran leaves nothing
    behind. Raises :class:`ConfigError` naming the path and the cause (an existing file, no
    permission, a read-only file system).
    """
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"output directory {path} is not a directory (a file is there); choose another "
            "--output (or output_dir)"
        )
    if not path.exists() and not create:
        ancestor = path.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise ConfigError(
                f"cannot create the output directory {path}: {ancestor} is not a directory; "
                "choose another --output (or output_dir)"
            )
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise ConfigError(
                f"cannot create the output directory {path}: {ancestor} is not writable; choose "
                "another --output (or output_dir), or fix its permissions"
            )
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".presto-write-check."):
            pass
    except OSError as exc:
        raise ConfigError(
            f"cannot write the output directory {path}: {exc.strerror or exc}; choose another "
            "--output (or output_dir), or fix its permissions"
        ) from None


_TMP_NAME = re.compile(r"\..+\.\d+\.tmp")
"""The temporaries of :func:`atomic_write_text`: ``.<file name>.<pid>.tmp``."""


def _ours(name: str) -> bool:
    """Whether a file in a directory without ``run.json`` may be left by a session of ours that
    died before writing it (the lock, a temporary), so the directory is still a new run's."""
    return name == LOCK_FILE or bool(_TMP_NAME.fullmatch(name))


class RunDir:
    """One run directory, opened for a session of a job (or read by ``presto report``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._records: AppendFile | None = None
        self._samples: AppendFile | None = None
        self._samples_synced = float("-inf")
        self.finished: dict[str, dict[str, Any]] = {}
        self.session = 0
        self._lock_fh: IO[str] | None = None
        # Whether this session made the directory / made a fresh run in it, and wrote anything
        # (a chain's record or sample, metrics, a summary): a session that never reached its
        # engine leaves nothing behind (see close).
        self._created_dir = False
        self._fresh_run = False
        self._wrote = False
        self.removed = False
        self.write_error: RunDirWriteError | None = None
        """The first write that failed: every later write raises it again (the session is
        over; a rerun resumes)."""

    # --- reading ------------------------------------------------------------------------------

    def exists(self) -> bool:
        return (self.path / RUN_FILE).exists()

    def run_info(self) -> dict[str, Any]:
        try:
            data = json.loads((self.path / RUN_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PrestoError(
                f"{self.path} is not a run directory (no {RUN_FILE}); give the output_dir of a run"
            ) from None
        except json.JSONDecodeError as exc:
            raise PrestoError(f"{self.path / RUN_FILE} is corrupt: {exc}") from None
        if not isinstance(data, dict):
            raise PrestoError(f"{self.path / RUN_FILE} is corrupt: not an object")
        return data

    def samples(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path / SAMPLES_FILE)

    def records(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path / RECORDS_FILE)

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path / METRICS_FILE)

    def finished_chains(self) -> dict[str, dict[str, Any]]:
        """The chains finished ok, by chain id (read-only; empty for a directory not yet run)."""
        path = self.path / SAMPLES_FILE
        return finished_ok(read_jsonl(path)) if path.exists() else {}

    def resolved_config(self) -> dict[str, Any]:
        try:
            data = yaml.safe_load((self.path / CONFIG_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        return data if isinstance(data, dict) else {}

    def check_resumable(self, fingerprint: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Whether a job with ``fingerprint`` may run in this directory (read-only; what
        ``presto validate`` and ``presto run`` both ask); returns the chains finished ok.

        A difference matters only where finished chains depend on it: an engine's identity for
        the chains of that engine, the rest (sampler, seed, prompts) for any finished chain. A
        run that died before any chain finished (a wrong model name at the probe) is re-planned.
        Raises :class:`ConfigError` otherwise.
        """
        if not self.exists():
            if self.path.is_dir() and any(not _ours(p.name) for p in self.path.iterdir()):
                raise ConfigError(
                    f"{self.path} exists and is not a run directory; choose another --output"
                )
            return {}
        old = self.run_info().get("fingerprint", {})
        finished = finished_ok(self.samples())
        ran = {str(row.get("engine")) for row in finished.values()}
        keys = [
            k
            for k in fingerprint_conflicts(old, fingerprint)
            if (k.partition(".")[2] in ran if k.startswith("engines.") else bool(finished))
        ]
        if keys:
            rows = ""
            if any(k.startswith("dataset.") for k in keys):
                rows = f" (dataset: {dataset_differences(old, fingerprint)})"
            raise ConfigError(
                f"{self.path} holds a run of a different job (differs in: {', '.join(keys)})"
                f"{rows} with {len(finished)} chain(s) finished; choose another --output, or "
                "delete the directory to start over"
            )
        return finished

    # --- opening a session ----------------------------------------------------------------------

    def _check_grader(self, grader: Any) -> None:
        """A run directory holds one grader's grades: a resume with another grader is refused
        (its new chains would be graded otherwise than the finished ones, silently)."""

        def plain(g: Any) -> Any:  # (fields at their default do not differ)
            return (
                {k: v for k, v in g.items() if v not in (None, False)} if isinstance(g, dict) else g
            )

        old = self.resolved_config().get("grader") if (self.path / CONFIG_FILE).exists() else None
        graded = any("grade" in row for row in self.finished_chains().values())
        if graded and plain(old) != plain(grader):
            raise ConfigError(
                f"{self.path}: its finished chains were graded by grader {plain(old)}, and this "
                f"run grades with {plain(grader)}: one run directory holds one grader's grades. "
                "Give the same grader to resume here, or write this run to another directory "
                "(-o DIR)"
            )

    def open(
        self,
        *,
        fingerprint: Mapping[str, Any],
        resolved_config: Mapping[str, Any],
        chains: Sequence[Mapping[str, Any]],
    ) -> dict[str, dict[str, Any]]:
        """Start a session: check/create the directory, prepare resume; returns finished chains.

        ``chains`` (chain id, arm, prompt, chain, seed, ...) are merged into ``run.json`` so that
        every chain's seed is on disk before it runs.
        """
        self._created_dir = not self.path.exists()
        check_output_dir(self.path, create=True)
        self._fresh_run = not self.exists()
        if self._fresh_run:
            self.check_resumable(fingerprint)  # (a folder of other files is refused)
        self._lock()
        try:
            return self._open_locked(fingerprint, resolved_config, chains)
        except BaseException:
            if self._fresh_run:
                self._remove_unused_run()  # (else a rerun finds a directory it refuses)
            else:
                self._unlock()
            raise

    def _open_locked(
        self,
        fingerprint: Mapping[str, Any],
        resolved_config: Mapping[str, Any],
        chains: Sequence[Mapping[str, Any]],
    ) -> dict[str, dict[str, Any]]:
        self._remove_stale_temporaries()
        info: dict[str, Any] = {}
        merged_engines: dict[str, Any] = dict(dict(fingerprint).get("engines", {}))
        if self.exists():
            self.check_resumable(fingerprint)
            self._check_grader(resolved_config.get("grader"))
            info = self.run_info()
            old = info.get("fingerprint", {})
            replanned = fingerprint_conflicts(old, fingerprint)
            if replanned:
                logger.info(
                    "%s: re-planned (no finished chain depends on %s)",
                    self.path,
                    ", ".join(replanned),
                )
            merged_engines = {**old.get("engines", {}), **dict(fingerprint).get("engines", {})}
        self.finished = self._prepare_resume({str(c["chain_id"]) for c in chains})
        sessions = list(info.get("sessions", []))
        self.session = len(sessions)
        sessions.append({"session": self.session, "started": time.time(), "finished": None})
        known = {c["chain_id"]: c for c in info.get("chains", [])}
        for c in chains:
            known[str(c["chain_id"])] = dict(c)
        info.update(
            format=FORMAT_VERSION,
            fingerprint={**dict(fingerprint), "engines": merged_engines},
            sessions=sessions,
            chains=list(known.values()),
        )
        atomic_write_text(self.path / RUN_FILE, json.dumps(info, indent=1, default=json_default))
        atomic_write_text(
            self.path / CONFIG_FILE, yaml.safe_dump(dict(resolved_config), sort_keys=False)
        )
        self._records = AppendFile(self.path / RECORDS_FILE)
        self._samples = AppendFile(self.path / SAMPLES_FILE)
        return self.finished

    def _remove_stale_temporaries(self) -> None:
        """Delete what an atomic write killed midway left (``.<file>.<pid>.tmp``): with the
        lock held, no other session is writing here."""
        for tmp in self.path.glob(".*.tmp"):
            if _TMP_NAME.fullmatch(tmp.name) and tmp.is_file():
                try:
                    tmp.unlink()
                    logger.info("removed %s (left by an interrupted write)", tmp)
                except OSError as exc:
                    logger.warning("could not remove %s: %s", tmp, exc)

    def rewrite_samples(
        self, samples: Sequence[Mapping[str, Any]], resolved_config: Mapping[str, Any]
    ) -> None:
        """Replace the sample lines and the resolved config at once (a re-grading), while no
        session runs here (refused like a second session)."""
        self._lock()
        try:
            atomic_write_text(self.path / SAMPLES_FILE, "".join(dumps(r) + "\n" for r in samples))
            atomic_write_text(
                self.path / CONFIG_FILE, yaml.safe_dump(dict(resolved_config), sort_keys=False)
            )
        finally:
            self._unlock()

    def _unlock(self) -> None:
        if self._lock_fh is not None:
            self._lock_fh.close()  # closing the file releases the lock
            self._lock_fh = None

    def _lock(self) -> None:
        """One session at a time per directory (an advisory lock, released on close/exit)."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return
        fh = (self.path / LOCK_FILE).open("a")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise ConfigError(
                f"{self.path} is in use by another presto process; wait for it to finish, or "
                "choose another --output"
            ) from None
        self._lock_fh = fh

    def _prepare_resume(self, planned: set[str]) -> dict[str, dict[str, Any]]:
        samples_path = self.path / SAMPLES_FILE
        records_path = self.path / RECORDS_FILE
        if not samples_path.exists() and not records_path.exists():
            return {}
        finished = finished_ok(read_jsonl(samples_path))
        records = [r for r in read_jsonl(records_path) if r.get("chain_id") in finished]
        dropped = len(latest_by_chain(read_jsonl(samples_path))) - len(finished)
        atomic_write_text(samples_path, "".join(dumps(r) + "\n" for r in finished.values()))
        atomic_write_text(records_path, "".join(dumps(r) + "\n" for r in records))
        logger.info(
            "resuming %s: %d chain(s) finished, %d failed chain(s) to retry",
            self.path,
            len(finished.keys() & planned),
            dropped,
        )
        return finished

    def record_engine_identity(self, identities: Mapping[str, Mapping[str, Any]]) -> None:
        """Check what each engine serves (model, version, max_model_len, logprob mode) against
        what the chains already finished here ran on, then record it in ``run.json``.

        Raises :class:`ConfigError` naming the difference when resuming would put chains of two
        different engines under one engine name (and so in one summary).
        """
        info = self.run_info()
        stored: dict[str, Any] = dict(info.get(ENGINE_IDENTITY, {}))
        ran: dict[str, int] = {}
        for row in self.finished.values():
            ran[str(row.get("engine"))] = ran.get(str(row.get("engine")), 0) + 1
        problems: list[str] = []
        for name, new in identities.items():
            old = stored.get(name)
            if isinstance(old, dict) and ran.get(name):
                problems.extend(
                    f"engine {name} now has {key} {new[key]!r}, but the {ran[name]} chain(s) "
                    f"finished here ran with {key} {old[key]!r}"
                    for key in identity_conflicts(old, new)
                )
                stored[name] = {**old, **{k: v for k, v in new.items() if v is not None}}
            else:
                stored[name] = dict(new)
        if problems:
            raise ConfigError(
                f"{self.path}: resuming would mix engines in one run: {'; '.join(problems)}. "
                "Point the engine at the server the run started with (or set its model), or "
                "choose another --output"
            )
        info[ENGINE_IDENTITY] = stored
        atomic_write_text(self.path / RUN_FILE, json.dumps(info, indent=1, default=json_default))

    # --- writing --------------------------------------------------------------------------------

    def _writing(self) -> None:
        if self.write_error is not None:
            raise self.write_error
        self._wrote = True

    def _failed(self, exc: RunDirWriteError) -> RunDirWriteError:
        if self.write_error is None:
            self.write_error = exc
        return exc

    def append_record(self, row: Mapping[str, Any]) -> None:
        if self._records is None:
            raise RuntimeError("run directory not opened")
        self._writing()
        try:
            self._records.write(dumps(row) + "\n")
        except RunDirWriteError as exc:
            raise self._failed(exc) from None

    def append_sample(self, row: Mapping[str, Any]) -> None:
        """One finished chain: written at once (a killed process loses nothing), as one whole
        line (a line that does not fit on the disk is cut off again); fsynced at most every
        :data:`SAMPLES_FSYNC_S` and at close, not per chain (an fsync blocks the event loop for
        milliseconds; with thousands of chains that was the loop's time). An OS crash can lose
        the last second of samples: those chains rerun on resume, from their seeds, and a
        truncated last line is tolerated."""
        if self._samples is None:
            raise RuntimeError("run directory not opened")
        self._writing()
        try:
            self._samples.write(dumps(row) + "\n")
            now = time.monotonic()
            if now - self._samples_synced >= SAMPLES_FSYNC_S:
                self._samples.fsync()
                self._samples_synced = now
        except RunDirWriteError as exc:
            raise self._failed(exc) from None

    def append_metrics(self, row: Mapping[str, Any]) -> None:
        self._writing()
        try:
            fh = AppendFile(self.path / METRICS_FILE)
            try:
                fh.write(dumps({"session": self.session, **row}) + "\n")
            finally:
                fh.close()
        except RunDirWriteError as exc:
            raise self._failed(exc) from None

    def write_summary(self, summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> None:
        """``summary.json`` (everything) and ``summary.csv`` (one row per arm), atomically."""
        self._writing()
        try:
            atomic_write_text(
                self.path / SUMMARY_JSON,
                json.dumps(summary, indent=1, default=json_default, allow_nan=False) + "\n",
            )
            atomic_write_text(self.path / SUMMARY_CSV, rows_to_csv(rows))
        except RunDirWriteError as exc:
            raise self._failed(exc) from None

    def close(self, *, completed: bool = False) -> None:
        for fh in (self._records, self._samples):
            if fh is not None:
                if fh is self._samples and self.write_error is None:
                    with contextlib.suppress(RunDirWriteError):
                        fh.fsync()
                fh.close()
        self._records = self._samples = None
        if self.write_error is not None:
            # the disk refused a write: leave run.json as it is (a rerun resumes from it)
            self._unlock()
            return
        if self._fresh_run and not self._wrote and not completed and self._lock_fh is not None:
            self._remove_unused_run()
            return
        if self.exists() and self._lock_fh is not None:
            try:
                info = self.run_info()
                sessions = info.get("sessions", [])
                if sessions:
                    sessions[-1]["finished"] = time.time()
                    sessions[-1]["completed"] = completed
                atomic_write_text(
                    self.path / RUN_FILE, json.dumps(info, indent=1, default=json_default)
                )
            except PrestoError as exc:  # never mask the error that closes a session
                logger.warning("could not update %s: %s", self.path / RUN_FILE, exc)
        self._unlock()

    def _remove_unused_run(self) -> None:
        """A fresh run that wrote nothing (it died at the probe, say): remove what ``open`` made,
        and the directory if this session created it, so that no empty run is left behind."""
        for name in (RUN_FILE, CONFIG_FILE, RECORDS_FILE, SAMPLES_FILE):
            with contextlib.suppress(FileNotFoundError):
                (self.path / name).unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.path / LOCK_FILE).unlink()
        self._unlock()
        self.removed = True
        if self._created_dir:
            with contextlib.suppress(OSError):  # (not empty: someone else's file; keep it)
                self.path.rmdir()
        logger.info("%s: nothing ran; removed the empty run directory", self.path)

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
