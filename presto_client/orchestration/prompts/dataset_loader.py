"""Reading a job's rows: a local file (JSONL, JSON, parquet, CSV), a directory written by
``datasets``' ``save_to_disk``, or a dataset on the Hugging Face Hub, all into plain rows (one
mapping of column to value per row) with a place for each row in errors (``file:line``).

JSONL, JSON and CSV need nothing beyond the standard library; parquet needs ``pyarrow``, a saved
dataset and the Hub the ``datasets`` library (the extra ``datasets``, which brings both). The
Hub is reached only through ``datasets`` (its cache, ``HF_DATASETS_OFFLINE``, ``HF_TOKEN`` for
gated datasets); a dataset that is neither cached nor reachable is one :class:`ConfigError`
saying so. :func:`hub_cached` answers whether a Hub dataset is in the local cache without
importing ``datasets`` or touching the network (``presto validate``, ``presto report``).
"""

from __future__ import annotations

import csv
import heapq
import io
import json
import os
import re
import socket
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path
from typing import Any

from presto_client.errors import ConfigError
from presto_client.orchestration.config.dataset_config import DatasetConfig
from presto_client.orchestration.input_files import MAX_PROMPTS_BYTES, read_text_file, text_lines
from presto_client.orchestration.planned import DatasetIdentity

INSTALL_HINT = "pip install 'presto-client[datasets]'"


@dataclass(frozen=True, slots=True)
class LoadedRows:
    """The rows of a source, in its order, with where each row is (for errors)."""

    rows: list[dict[str, Any]]
    places: list[str]
    identity: DatasetIdentity
    source: str
    """The source in words (errors name it)."""
    index: list[int] | None = None
    """The rows' numbers in the source where the rows are already the job's sample (in its
    order); ``None``: the rows are the source's, in order."""


RowKey = Callable[[int], Any]
"""A row's place in a seeded order, from its number in the source."""


class DatasetNotLoaded(ConfigError):
    """A Hub dataset that was not loaded because the caller asked for no network
    (``presto validate``): it is loaded when the job runs."""


def load_rows(
    dataset: DatasetConfig,
    *,
    network: bool = True,
    first: int | None = None,
    sample: tuple[int, RowKey] | None = None,
) -> LoadedRows:
    """The rows of ``dataset`` (a relative path is taken as given: the config loader resolves
    it against the config file). ``network=False``: a Hub dataset raises
    :class:`DatasetNotLoaded` instead of loading (whether it is cached is in the message).
    ``first`` and ``sample``: see :func:`load_local` (a Hub dataset is loaded whole)."""
    if dataset.path is not None:
        path = Path(dataset.path).expanduser()
        return load_local(path, split=dataset.split, first=first, sample=sample)
    assert dataset.name is not None
    if not network:
        cached = hub_cached(dataset.name)
        where = "is in the local cache" if cached else "is not cached here: it will be downloaded"
        raise DatasetNotLoaded(
            f"prompts.dataset: {dataset.label()} {where} when the job runs (presto validate does "
            "not load Hub datasets)"
        )
    return load_hub(dataset)


# --------------------------------------------------------------------------------------------
# Local files
# --------------------------------------------------------------------------------------------


def load_local(
    path: Path,
    *,
    split: str | None = None,
    first: int | None = None,
    sample: tuple[int, RowKey] | None = None,
) -> LoadedRows:
    """Rows of a local file (by its suffix) or of a saved dataset directory. A JSONL, CSV or
    parquet file is read row by row, so memory follows the rows kept, not the file's size:
    ``first``, its first rows only (read no further); ``sample`` ``(n, key)``, the ``n`` rows
    whose numbers come first by ``key`` (the whole file read, ``n`` rows kept), in that order,
    their numbers in :attr:`LoadedRows.index`. A JSON array and a saved dataset are read
    whole."""
    identity = DatasetIdentity(path=str(path), split=split)
    if path.is_dir():
        return _load_saved(path, split, identity)
    suffix = path.suffix.lower()
    if split is not None:
        raise ConfigError(f"{path}: a file has no splits; remove prompts.dataset.split")
    if suffix == ".json":
        return _parse_json(path, _read(path), identity)
    lines: Iterable[str]
    if suffix == ".parquet":
        rows = _parquet_rows(path, batch=first)
    else:
        if first is None and sample is None:  # (every row kept: the text at once is faster)
            text = _read(path)
            lines = io.StringIO(text, newline="") if suffix == ".csv" else text.split("\n")
        else:
            lines = text_lines(
                path,
                what="prompts file",
                max_bytes=MAX_PROMPTS_BYTES,
                missing_hint=_MISSING_HINT,
                whole=first is None,
            )
            if suffix == ".csv":
                lines = _universal_lines(lines)
        rows = _csv_rows(path, iter(lines)) if suffix == ".csv" else _jsonl_rows(path, lines)
    with closing(rows):
        if sample is not None:
            size, key = sample
            picked = heapq.nsmallest(size, enumerate(rows), key=lambda item: key(item[0]))
            kept = [row for _, row in picked]
            index: list[int] | None = [i for i, _ in picked]
        else:
            kept, index = list(rows if first is None else islice(rows, first)), None
    return LoadedRows([r for r, _ in kept], [p for _, p in kept], identity, str(path), index)


_MISSING_HINT = "; fix the path (relative paths are relative to the config file)"


def _read(path: Path) -> str:
    return read_text_file(
        path, what="prompts file", max_bytes=MAX_PROMPTS_BYTES, missing_hint=_MISSING_HINT
    )


Rows = Generator[tuple[dict[str, Any], str], None, None]
"""A source's rows as they are read, each with its place (``file:line``)."""


def parse_jsonl(path: Path, text: str, identity: DatasetIdentity) -> LoadedRows:
    """One JSON object per line (blank lines skipped), each placed as ``file:line``."""
    # Split on "\n" only: str.splitlines() also splits inside a JSON string at U+2028, U+0085
    # and other line breaks that JSON allows unescaped.
    pairs = list(_jsonl_rows(path, text.split("\n")))
    return LoadedRows([r for r, _ in pairs], [p for _, p in pairs], identity, str(path))


def _jsonl_rows(path: Path, lines: Iterable[str]) -> Rows:
    try:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.removesuffix("\n"))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from None
            if not isinstance(row, dict):
                raise ConfigError(
                    f"{path}:{lineno}: a row must be a JSON object (got {type(row).__name__})"
                )
            yield row, f"{path}:{lineno}"
    finally:
        _close(lines)


def _close(lines: Iterable[str]) -> None:
    """Closes the file behind ``lines`` (a :func:`text_lines` generator) when the rows stop."""
    close = getattr(lines, "close", None)
    if close is not None:
        close()


_LONE_CR = re.compile(r"(?<=\r)(?!\n)")


def _universal_lines(lines: Iterable[str]) -> Iterator[str]:
    """Lines split at a lone ``\\r`` too, endings kept: what ``io.StringIO(text, newline="")``
    gives a CSV reader (a file saved with old Mac line ends is still read)."""
    try:
        for line in lines:
            if "\r" in line:
                yield from (part for part in _LONE_CR.split(line) if part)
            else:
                yield line
    finally:
        _close(lines)


def _parse_json(path: Path, text: str, identity: DatasetIdentity) -> LoadedRows:
    """A JSON array of objects, or an object with one array of objects (``{"data": [...]}``);
    JSON Lines in a ``.json`` file are read as JSONL."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # one object per line
            return parse_jsonl(path, text, identity)
        raise ConfigError(
            f"{path} (line {exc.lineno}, column {exc.colno}): not valid JSON: {exc.msg}"
        ) from None
    if isinstance(data, dict):
        lists = [k for k, v in data.items() if isinstance(v, list)]
        if len(lists) != 1:
            raise ConfigError(
                f"{path}: a JSON file holds an array of rows (or an object with one array); "
                f"found an object with {len(lists)} arrays"
            )
        key = lists[0]
        data = data[key]
        prefix = f"{path}: {key}"
    else:
        prefix = f"{path}: row"
    if not isinstance(data, list):
        raise ConfigError(f"{path}: a JSON file holds an array of rows, got {type(data).__name__}")
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise ConfigError(f"{prefix}[{i}]: a row must be an object, got {type(row).__name__}")
    return LoadedRows(list(data), [f"{prefix}[{i}]" for i in range(len(data))], identity, str(path))


def _csv_rows(path: Path, lines: Iterator[str]) -> Rows:
    """A CSV file with a header line; values are text (``answer`` included). A UTF-8 byte-order
    mark (spreadsheets write one) is not part of the first column's name. A row may span lines
    (a quoted cell): the lines are taken as the rows need them."""
    reader = csv.DictReader(chain([next(lines, "").removeprefix("\ufeff")], lines))
    try:
        if not reader.fieldnames:
            raise ConfigError(f"{path}: no header line (a CSV file names its columns first)")
        for row in reader:
            extra = row.pop(None, None)  # type: ignore[call-overload]
            if extra:
                raise ConfigError(
                    f"{path}:{reader.line_num}: more values than the header's "
                    f"{len(reader.fieldnames)} columns"
                )
            yield dict(row), f"{path}:{reader.line_num}"
    except csv.Error as exc:  # (in the header, before the reader counts a line: line 1)
        raise ConfigError(f"{path}:{max(reader.line_num, 1)}: not valid CSV: {exc}") from None
    finally:
        _close(lines)


def _parquet_rows(path: Path, *, batch: int | None) -> Rows:
    """A parquet file's rows, batch by batch (``batch`` rows at a time, or pyarrow's default)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            f"{path}: reading parquet needs pyarrow: {INSTALL_HINT} (or pip install pyarrow)"
        ) from None
    if not path.is_file():
        raise ConfigError(f"{path}: no such prompts file; fix the path")
    sizes = {} if batch is None else {"batch_size": max(batch, 1)}
    number = 0
    try:
        batches = pq.ParquetFile(path).iter_batches(**sizes)
        for rows in batches:
            for row in rows.to_pylist():
                yield row, f"{path}: row {number}"
                number += 1
    except Exception as exc:  # pyarrow's errors (ArrowInvalid, OSError): not a parquet file
        raise ConfigError(f"{path}: cannot read it as parquet: {_one_line(exc)}") from None


def _import_datasets(what: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"{what} needs the datasets library: {INSTALL_HINT}") from None
    return datasets


def _load_saved(path: Path, split: str | None, identity: DatasetIdentity) -> LoadedRows:
    """A directory written by ``Dataset.save_to_disk`` (or ``DatasetDict.save_to_disk``)."""
    datasets = _import_datasets(f"{path} (a saved dataset directory)")
    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise ConfigError(
            f"{path}: not a saved dataset (no dataset_info.json or dataset_dict.json: "
            f"{_one_line(exc)}); give a file (JSONL, JSON, parquet, CSV) or a directory written "
            "by save_to_disk"
        ) from None
    ds = _pick_split(loaded, split, str(path))
    rows = ds.to_list()
    where = f"{path}" + (f" [{split}]" if split else "")
    return LoadedRows(rows, [f"{where}: row {i}" for i in range(len(rows))], identity, where)


def _pick_split(loaded: Any, split: str | None, label: str) -> Any:
    """The split of a saved ``DatasetDict`` (its only one when ``split`` is null); a saved
    ``Dataset`` is its own single split."""
    if not isinstance(loaded, Mapping):  # a Dataset
        return loaded
    splits = [str(k) for k in loaded]
    if split is None:
        if len(splits) != 1:
            raise ConfigError(
                f"{label} has splits {', '.join(splits)}: choose one with prompts.dataset.split"
            )
        split = splits[0]
    if split not in splits:
        raise ConfigError(f"{label} has no split {split!r}; its splits are: {', '.join(splits)}")
    return loaded[split]


# --------------------------------------------------------------------------------------------
# The Hugging Face Hub
# --------------------------------------------------------------------------------------------


def _offline_env() -> bool:
    return any(
        os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE")
        for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    )


def hf_datasets_cache() -> Path:
    """Where ``datasets`` caches prepared datasets (its own rule: ``HF_DATASETS_CACHE``, else
    ``HF_HOME/datasets``, else ``~/.cache/huggingface/datasets``)."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "datasets"


def hub_cached(name: str) -> bool:
    """Whether a prepared copy of the Hub dataset ``name`` is in the local cache: a non-empty
    folder ``ORG___NAME`` there (datasets spells the name in snake case; compared here without
    case, ``_`` and ``-``)."""

    def key(text: str) -> str:
        return "".join(c for c in text.lower() if c.isalnum())

    org, _, base = name.rpartition("/")
    want = (key(org), key(base))
    root = hf_datasets_cache()
    if not root.is_dir():
        return False
    for folder in root.iterdir():
        a, sep, b = folder.name.partition("___")
        got = (key(a), key(b)) if sep else ("", key(a))
        if got == want and folder.is_dir() and any(folder.iterdir()):
            return True
    return False


HUB_PROBE_S = 3.0
"""How long the Hub may take to accept a connection before presto reads the cache offline
(``datasets`` itself retries for ~30 s, a warning a try)."""


def hub_reachable(timeout_s: float = HUB_PROBE_S) -> bool:
    """Whether the Hub's host (``HF_ENDPOINT``'s, default huggingface.co) accepts a connection
    within ``timeout_s``, name resolution included (run in a thread: it has no timeout)."""
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as Late
    from urllib.parse import urlsplit

    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)

    def connect() -> bool:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
        except OSError:
            return False
        return True

    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(connect).result(timeout=timeout_s)
    except Late:
        return False
    finally:
        pool.shutdown(wait=False)


def _offline_error(dataset: DatasetConfig, why: str) -> ConfigError:
    mode = " (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE is set)" if _offline_env() else ""
    return ConfigError(
        f"prompts.dataset: {dataset.label()} is not in the local Hugging Face cache "
        f"({hf_datasets_cache()}) and the Hub cannot be reached{mode}: {why}; download it once "
        'where the Hub is reachable (python -c "import datasets; datasets.load_dataset('
        f"'{dataset.name}'{_args(dataset)})\") or give a local file: --dataset FILE "
        "(prompts.dataset.path; JSONL, JSON, parquet, CSV or a saved dataset directory) with the "
        "dataset's columns (those the prompt template and answer_field name)"
    )


def _args(dataset: DatasetConfig) -> str:
    out = f", '{dataset.config}'" if dataset.config else ""
    if dataset.split:
        out += f", split='{dataset.split}'"
    if dataset.revision:
        out += f", revision='{dataset.revision}'"
    return out


def _is_connection_error(exc: BaseException) -> bool:
    """A failure to reach the Hub (offline mode, no route, DNS, a file missing from the cache
    of an offline session), through the exception's causes."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        names = {c.__name__ for c in type(cur).__mro__}
        if names & {
            "ConnectionError",
            "OfflineModeIsEnabled",
            "LocalEntryNotFoundError",
            "ConnectError",
            "ConnectTimeout",
            "Timeout",
            "TimeoutError",
        }:
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def load_hub(dataset: DatasetConfig) -> LoadedRows:
    """The rows of a Hub dataset's split, through ``datasets`` (downloaded once, then cached);
    the commit it resolved is recorded in the rows' identity."""
    assert dataset.name is not None
    local = Path(dataset.name).expanduser().exists()  # (datasets reads a folder by its path)
    if not local and not _offline_env() and not hub_reachable():
        if not hub_cached(dataset.name):
            raise _offline_error(dataset, f"no connection to the Hub within {HUB_PROBE_S:g} s")
        # (datasets reads these when imported: set first, the cache is read without retries)
        os.environ["HF_DATASETS_OFFLINE"] = os.environ["HF_HUB_OFFLINE"] = "1"
    datasets = _import_datasets(f"the Hugging Face dataset {dataset.name}")
    try:
        builder = datasets.load_dataset_builder(
            dataset.name, dataset.config, revision=dataset.revision
        )
        builder.download_and_prepare()  # (once: later runs read the cache)
        splits = [str(k) for k in (builder.info.splits or {})]
        split = dataset.split
        if split is None:
            if len(splits) != 1:
                raise ConfigError(
                    f"prompts.dataset: {dataset.label()} has splits "
                    f"{', '.join(splits) or '(unknown)'}: choose one with prompts.dataset.split"
                )
            split = splits[0]
        elif splits and split not in splits:
            raise ConfigError(
                f"prompts.dataset: {dataset.label()} has no split {split!r}; its splits are: "
                f"{', '.join(splits)}"
            )
        ds = builder.as_dataset(split=split)
    except ConfigError:
        raise
    except Exception as exc:  # datasets and huggingface_hub raise many kinds
        if _is_connection_error(exc):
            raise _offline_error(dataset, _one_line(exc)) from None
        kind = type(exc).__name__
        hint = ""
        if kind in ("DatasetNotFoundError", "RepositoryNotFoundError", "GatedRepoError"):
            hint = (
                " (a gated dataset, such as Idavidrein/gpqa, needs its terms accepted on the "
                "Hub and HF_TOKEN set)"
            )
        raise ConfigError(
            f"prompts.dataset: cannot load {dataset.label()}: {kind}: {_one_line(exc)}{hint}"
        ) from None
    commit = getattr(builder, "hash", None)
    identity = DatasetIdentity(
        name=dataset.name,
        config=dataset.config,
        split=split,
        revision=dataset.revision,
        commit=str(commit) if commit else None,
    )
    rows = ds.to_list()
    label = f"{dataset.name}" + (f"/{dataset.config}" if dataset.config else "") + f" [{split}]"
    return LoadedRows(rows, [f"{label}: row {i}" for i in range(len(rows))], identity, label)


def fields_of(rows: Sequence[dict[str, Any]]) -> str:
    """The columns of the first row, for errors."""
    return ", ".join(map(str, rows[0])) if rows else "no rows"
