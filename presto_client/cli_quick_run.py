"""``presto run`` without a YAML file, like ``vllm bench serve``, and ready benchmark configs by
name (issue 37).

    presto run --base-url http://gpu:8000 --dataset HuggingFaceH4/MATH-500 --num-prompts 50
    presto run --base-url http://gpu:8000 --dataset ./problems.jsonl --field question
    presto run math500 --base-url http://gpu:8000 --alpha 4 --traversal stream

A CONFIG that is not a file but the name of a ready config (``configs/benchmarks/NAME.yaml``:
math500, gsm8k, aime2024, aime2025, gpqa_diamond) is that config, for every command that reads
one. Without a CONFIG, ``--dataset`` names the rows (a Hub dataset, or a local file or saved
dataset directory): a Hub dataset with a ready config (HuggingFaceH4/MATH-500, ...) runs that
config, anything else a job built from the flags. The flags are applied to the config before
``--set``. The run directory is the usual one, its ``config.resolved.yaml`` the whole job:
``presto run RUN_DIR/config.resolved.yaml`` runs it again.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.resources
import json
import logging
import re
from pathlib import Path
from typing import Any

from presto_client.errors import ConfigError
from presto_client.orchestration import input_files
from presto_client.orchestration.config.dataset_config import looks_local
from presto_client.orchestration.config.schema import JobConfig
from presto_client.orchestration.input_files import load_yaml, read_text_file
from presto_client.orchestration.planned import Prompt

progress = logging.getLogger("presto_client.progress")

PACKAGED_CONFIGS = Path(str(importlib.resources.files("presto_client.configs")))
"""The configs presto_client installs (the repository's configs/ in a checkout)."""
READY_DIRS = (PACKAGED_CONFIGS / "benchmarks", Path("configs") / "benchmarks")
"""Where ready benchmark configs are looked up by name (``presto run math500``): the installed
ones, then the working directory's configs/benchmarks."""


def ready_configs() -> dict[str, Path]:
    """The ready benchmark configs by name (the file's stem)."""
    out: dict[str, Path] = {}
    for folder in READY_DIRS:
        if folder.is_dir():
            for path in sorted(folder.glob("*.yaml")):
                out.setdefault(path.stem, path)
    return out


def resolve_config(name: str) -> Path:
    """The config file ``name`` stands for: itself, or a ready config of that name."""
    path = Path(name)
    if path.exists():
        return path
    ready = ready_configs()
    if name in ready:
        return ready[name]
    packaged = PACKAGED_CONFIGS / f"{name}.yaml"
    if "/" not in name and packaged.is_file():  # the demo's and the examples' (presto run demo)
        return packaged
    if path.suffix or "/" in name:
        return path  # (a path: the loader says it does not exist)
    raise ConfigError(
        f"{name}: no such config file, nor a ready benchmark config (ready: "
        f"{', '.join(ready) or 'none found'})"
    )


def _ready_for_dataset(dataset: str) -> Path | None:
    """The ready config whose Hub dataset is ``dataset`` (case-insensitive), if any."""
    for path in ready_configs().values():
        try:
            data = load_yaml(
                read_text_file(path, what="config file", max_bytes=input_files.MAX_CONFIG_BYTES),
                source=str(path),
            )
        except ConfigError:
            continue
        ds = (data or {}).get("prompts", {}).get("dataset") if isinstance(data, dict) else None
        name = ds.get("name") if isinstance(ds, dict) else ds if isinstance(ds, str) else None
        if isinstance(name, str) and name.lower() == dataset.lower():
            return path
    return None


def add_options(run: argparse.ArgumentParser) -> None:
    """The flags of a run without a config file; CONFIG becomes optional."""
    for action in run._actions:
        if action.dest == "config":
            action.nargs = "?"
            action.default = None
            action.required = False
            action.help = (
                "job config (YAML), or a ready benchmark config's name (math500, gsm8k, "
                "aime2024, aime2025, gpqa_diamond); optional with --dataset"
            )
    g = run.add_argument_group(
        "a run without a config file (or changes to CONFIG, applied before --set)"
    )
    g.add_argument("--base-url", metavar="URL", help="the server (engines[0].base_url)")
    g.add_argument("--model", metavar="M", help="the served model (engines[0].model)")
    g.add_argument(
        "--backend",
        metavar="KIND",
        help="the server's dialect without a config: vllm (default), sglang, openai, llamacpp",
    )
    g.add_argument(
        "--dataset",
        metavar="NAME|FILE",
        help="a Hugging Face dataset (HuggingFaceH4/MATH-500) or a local file (JSONL, JSON, "
        "parquet, CSV) or saved dataset directory",
    )
    g.add_argument("--dataset-config", metavar="C", help="the Hub dataset's configuration")
    g.add_argument("--split", metavar="S", help="the dataset's split")
    g.add_argument("--field", metavar="F", help="the row field holding the prompt")
    g.add_argument("--answer-field", metavar="F", help="the row field holding the answer")
    g.add_argument("--template", metavar="T", help="the prompt made from a row: '{problem} ...'")
    g.add_argument("--grader", metavar="G", help="math, gsm8k, integer, choice, exact, ...")
    g.add_argument("--num-prompts", type=int, metavar="N", help="the first N rows (limit)")
    g.add_argument(
        "--chat-template", action="store_true", default=None, help="apply the chat template"
    )
    g.add_argument("--sampler", metavar="S", help="power_mh, entropy_cut, multi_try_mh")
    g.add_argument("--alpha", type=float, metavar="A", help="the sharpening exponent")
    g.add_argument("--traversal", metavar="LIST", help="comma-separated traversals (arms)")
    g.add_argument("--block-size", type=int, metavar="B", help="tokens per block")
    g.add_argument("--num-blocks", type=int, metavar="N", help="blocks per response")
    g.add_argument("--steps-per-block", type=int, metavar="K", help="MH steps per block")


def _flag(args: argparse.Namespace, name: str) -> Any:
    return getattr(args, name, None)


def _slug(text: str) -> str:
    stem = Path(text).stem if looks_local(text) else text.rpartition("/")[2]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-").lower() or "run"


def _apply_flags(data: dict[str, Any], args: argparse.Namespace, *, fresh: bool) -> None:
    """The flags given, written into the config's data (``fresh``: a job without a file)."""
    engines = data.get("engines")
    if _flag(args, "base_url") or _flag(args, "model") or _flag(args, "backend"):
        if not isinstance(engines, list) or not engines:
            engines = [{"kind": _flag(args, "backend") or "vllm"}]
        engine = dict(engines[0])
        if _flag(args, "backend"):
            engine["kind"] = args.backend
        if _flag(args, "base_url"):
            engine.pop("base_urls", None)
            engine["base_url"] = args.base_url
        if _flag(args, "model"):
            engine["model"] = args.model
        data["engines"] = [engine, *engines[1:]]
    prompts = data.get("prompts")
    prompts = dict(prompts) if isinstance(prompts, dict) else {}
    dataset = _flag(args, "dataset")
    if dataset:
        for key in ("texts", "token_ids", "file", "dataset", "answers"):
            prompts.pop(key, None)
        # (A file named on the command line is where the user is, not where the config is.)
        local = looks_local(dataset)
        spec: dict[str, Any] = (
            {"path": str(Path(dataset).expanduser().resolve())} if local else {"name": dataset}
        )
        prompts["dataset"] = spec
    if isinstance(prompts.get("dataset"), dict):
        if _flag(args, "dataset_config"):
            prompts["dataset"]["config"] = args.dataset_config
        if _flag(args, "split"):
            prompts["dataset"]["split"] = args.split
    elif _flag(args, "dataset_config") or _flag(args, "split"):
        raise ConfigError("--dataset-config and --split apply to a dataset (--dataset)")
    replaces_template = _flag(args, "field") is not None and _flag(args, "template") is None
    if replaces_template and prompts.pop("template", None) is not None:  # (else it wins silently)
        progress.info("--field %s replaces the config's prompts.template", args.field)
    for flag, key in (
        ("field", "field"),
        ("answer_field", "answer_field"),
        ("template", "template"),
        ("num_prompts", "limit"),
        ("chat_template", "chat_template"),
    ):
        if _flag(args, flag) is not None:
            prompts[key] = getattr(args, flag)
    data["prompts"] = prompts
    if _flag(args, "grader"):
        data["grader"] = args.grader
    sampler = data.get("sampler")
    sampler = dict(sampler) if isinstance(sampler, dict) else {}
    for flag, key in (
        ("sampler", "sampler"),
        ("alpha", "alpha"),
        ("block_size", "block_size"),
        ("num_blocks", "num_blocks"),
        ("steps_per_block", "steps_per_block"),
    ):
        if _flag(args, flag) is not None:
            sampler[key] = getattr(args, flag)
    if _flag(args, "traversal"):
        sampler.pop("traversal", None)
        sampler["traversals"] = [t.strip() for t in args.traversal.split(",") if t.strip()]
    if sampler or fresh:
        data["sampler"] = sampler


def load(args: argparse.Namespace, overrides: list[str]) -> JobConfig:
    """The job of the command line: CONFIG (a file or a ready config's name) or, without one,
    the flags, then ``--set``."""
    from presto_client.orchestration.config.loading import load_job_data

    config = _flag(args, "config")
    dataset = _flag(args, "dataset")
    if config is None and dataset and not looks_local(dataset):
        ready = _ready_for_dataset(dataset)
        if ready is not None:
            progress.info("%s: the ready config %s", dataset, ready)
            config = str(ready)
            args.dataset = None  # (the config names it, with its split and revision)
    if config is not None:
        path = resolve_config(config)
        text = read_text_file(path, what="config file", max_bytes=input_files.MAX_CONFIG_BYTES)
        data = load_yaml(text, source=str(path))
        data = {} if data is None else data
        if isinstance(data, dict):
            _apply_flags(data, args, fresh=False)
        return load_job_data(data, overrides, source=str(path), base=path.parent, name=path.stem)
    if not dataset:
        raise ConfigError(
            "give a CONFIG (a job config, or a ready benchmark config: "
            f"{', '.join(ready_configs()) or 'none found'}) or --dataset NAME|FILE"
        )
    data: dict[str, Any] = {}
    _apply_flags(data, args, fresh=True)
    work = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:8]
    data["name"] = f"{_slug(dataset)}-{work}"
    if not any(o.partition("=")[0].strip() == "output_dir" for o in overrides):
        data["output_dir"] = str(Path("runs") / data["name"])
    cfg = load_job_data(
        data, overrides, source="the command line", base=Path.cwd(), name=data["name"]
    )
    progress.info(
        "a run without a config file: %s/config.resolved.yaml will hold the whole job "
        "(presto run %s/config.resolved.yaml runs it again)",
        cfg.output_dir,
        cfg.output_dir,
    )
    return cfg


def validate_prompts(cfg: JobConfig) -> tuple[list[Prompt], str | None]:
    """The prompts ``presto validate`` checks, without the network: a Hub dataset is not loaded
    (``None`` prompts and a note saying whether it is cached; the job loads it when it runs)."""
    from presto_client.orchestration.prompts.dataset_loader import DatasetNotLoaded
    from presto_client.orchestration.prompts.prompt_rows import load_prompts

    try:
        return load_prompts(cfg, network=False), None
    except DatasetNotLoaded as exc:
        return [], str(exc)
