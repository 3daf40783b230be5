"""presto-client as an lm-evaluation-harness model (extra ``eval``).

``lm_eval --model presto --model_args config=JOB.yaml[,traversal=crn][,output_dir=DIR] --tasks
...`` runs every ``generate_until`` request of the tasks as one job of the configured engine and
sampler (power sampling, or a baseline arm: ``traversal=greedy``): one chain per request, the
job's seed, its run directory (a rerun with the same requests resumes it). Each response is cut
at the first of the request's ``until`` strings or of the chat template's end-of-turn tokens
(:data:`CHAT_END_MARKERS`). The length is the sampler's
(``block_size × num_blocks``); ``max_gen_toks`` and the task's sampling options are not used:
the sampler decides how tokens are drawn. Log-likelihood requests are not supported.

The model is registered with lm-eval's registry when this module is imported;
:func:`register` does it explicitly (``python -m presto_client.lm_eval_model ARGS`` runs lm-eval's
CLI with it registered, for lm-eval versions that load no model plugins).
"""

from __future__ import annotations

import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from presto_client.orchestration.config.loading import load_job_config
from presto_client.orchestration.config.schema import JobConfig, Prompt
from presto_client.orchestration.job import run_job
from presto_client.orchestration.planning.plan import make_plan
from presto_client.orchestration.run_dir.rundir import RunDir

log = logging.getLogger(__name__)

MODEL_NAME = "presto"

CHAT_END_MARKERS: tuple[str, ...] = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end|>",
    "<end_of_turn>",
    "</s>",
)
"""End-of-turn tokens of common chat templates (ChatML, Llama 3, Phi, Gemma, Llama 2). A chain
stops at the engine's end token, which the server's detokenizer writes out as text; lm-eval
compares the text itself, so a response is cut there as at the request's ``until`` strings."""


def cut_at_stops(text: str, until: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest of the ``until`` strings."""
    end = len(text)
    for stop in until:
        if stop:
            i = text.find(stop)
            if i != -1:
                end = min(end, i)
    return text[:end]


def generate_texts(
    cfg: JobConfig,
    contexts: Sequence[str],
    *,
    traversal: str | None = None,
    output_dir: Path | None = None,
) -> list[str]:
    """Run one chain per context with the job's engine and sampler; the responses, in order."""
    if not contexts:
        return []
    arm_traversal = traversal or cfg.sampler.traversals[0]
    out = output_dir or Path(tempfile.mkdtemp(prefix="presto-lm-eval-"))
    # lm-eval scores the answers itself: no grader, one chain per request
    job = cfg.model_copy(update={"output_dir": out, "chains_per_prompt": 1, "grader": None})
    prompts = [Prompt(i, text=c) for i, c in enumerate(contexts)]
    plan = make_plan(job, prompts, traversals=[arm_traversal])
    engines = {a.engine for a in plan.arms}
    if len(engines) > 1:  # one response per request: the first engine answers
        first = cfg.engine_names()[0]
        plan = make_plan(job, prompts, engines=[first], traversals=[arm_traversal])
    result = run_job(plan)
    texts: dict[int, str] = {}
    for row in RunDir(result.run_dir).samples():
        if row.get("status") == "ok" and isinstance(row.get("text"), str):
            texts[int(row["prompt_index"])] = str(row["text"])
    missing = [i for i in range(len(contexts)) if i not in texts]
    if missing:
        log.warning(
            "%d of %d request(s) have no finished chain (see %s): empty answers",
            len(missing),
            len(contexts),
            result.run_dir,
        )
    return [texts.get(i, "") for i in range(len(contexts))]


def _build_lm_class() -> type[Any]:
    from lm_eval.api.model import LM  # type: ignore[import-not-found]

    class PrestoLM(LM):  # type: ignore[misc]
        """lm-eval's view of a presto job (see the module docstring)."""

        def __init__(
            self,
            config: str,
            traversal: str | None = None,
            output_dir: str | None = None,
            **kwargs: Any,
        ) -> None:
            super().__init__()
            if kwargs:
                log.info("lm-eval model args not used by presto: %s", sorted(kwargs))
            self.job_config = load_job_config(config)
            self.traversal = traversal
            self.output_dir = Path(output_dir) if output_dir else None

        @classmethod
        def create_from_arg_string(
            cls, arg_string: str, additional_config: dict[str, Any] | None = None
        ) -> PrestoLM:
            args: dict[str, Any] = {}
            for part in arg_string.split(","):
                if part.strip():
                    key, _, value = part.partition("=")
                    args[key.strip()] = value.strip()
            extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
            return cls(**args, **extra)

        def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
            contexts = [str(r.args[0]) for r in requests]
            texts = generate_texts(
                self.job_config, contexts, traversal=self.traversal, output_dir=self.output_dir
            )
            out = []
            for r, text in zip(requests, texts, strict=True):
                gen_kwargs = r.args[1] if len(r.args) > 1 and isinstance(r.args[1], dict) else {}
                until = gen_kwargs.get("until") or []
                if isinstance(until, str):
                    until = [until]
                out.append(cut_at_stops(text, [*until, *CHAT_END_MARKERS]))
            return out

        def loglikelihood(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[Any]:
            raise NotImplementedError("presto runs generate_until tasks only")

        def loglikelihood_rolling(
            self, requests: Sequence[Any], disable_tqdm: bool = False
        ) -> list[Any]:
            raise NotImplementedError("presto runs generate_until tasks only")

    return PrestoLM


_REGISTERED: type[Any] | None = None


def register() -> type[Any]:
    """Register the ``presto`` model with lm-eval (idempotent); the model class."""
    global _REGISTERED
    if _REGISTERED is not None:
        return _REGISTERED
    from lm_eval.api.registry import MODEL_REGISTRY, register_model  # type: ignore[import-not-found]

    cls = _build_lm_class()
    if MODEL_NAME not in MODEL_REGISTRY:
        register_model(MODEL_NAME)(cls)
    _REGISTERED = cls
    return cls


def main(argv: Sequence[str] | None = None) -> None:
    """lm-eval's CLI with the ``presto`` model registered."""
    register()
    from lm_eval.__main__ import cli_evaluate  # type: ignore[import-not-found]

    sys.argv = ["lm_eval", *(argv if argv is not None else sys.argv[1:])]
    cli_evaluate()


if __name__ == "__main__":
    main()
