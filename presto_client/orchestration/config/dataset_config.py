"""The job config's ``prompts``: where a job's prompts come from (inline, a file, a Hugging Face
dataset or a local saved one), the template its rows go through, and how a multiple-choice row's
options are shown. Reading the rows:
:mod:`presto_client.orchestration.prompts.dataset_loader`; turning them into prompts (templates,
choices, chat messages, shuffle): :mod:`presto_client.orchestration.prompts.prompt_rows`.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from presto_client.orchestration.config.engine_config import StrictModel

LOCAL_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".csv")
"""The local file formats the loader reads (a directory is a saved Hugging Face dataset)."""


class DatasetConfig(StrictModel):
    """A Hugging Face dataset (``name``, with ``config``, ``split``, ``revision``), or a local
    file or saved dataset directory (``path``). The string shorthand ``dataset: ORG/NAME`` is a
    Hub name; ``dataset: ./rows.parquet`` (a path with a known suffix, or starting with ``.`` or
    ``/``) is a local path."""

    name: str | None = Field(
        None, description="A dataset on the Hugging Face Hub, e.g. HuggingFaceH4/MATH-500."
    )
    path: Path | None = Field(
        None,
        description="A local file (JSONL, JSON, parquet, CSV) or a directory written by "
        "datasets' save_to_disk (relative to the config file).",
    )
    config: str | None = Field(
        None, description="The Hub dataset's configuration (subset), e.g. main for openai/gsm8k."
    )
    split: str | None = Field(
        None, description="The split, e.g. test (null: the dataset's only split)."
    )
    revision: str | None = Field(
        None,
        description="A commit, tag or branch of the Hub dataset (null: its main branch; the "
        "commit used is recorded in run.json either way).",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"path": data} if looks_local(data) else {"name": data}
        return data

    @model_validator(mode="after")
    def _one_source(self) -> DatasetConfig:
        if (self.name is None) == (self.path is None):
            raise ValueError("give exactly one of name (a Hub dataset) or path (a local file)")
        if self.path is not None:
            hub_only = [k for k in ("config", "revision") if getattr(self, k) is not None]
            if hub_only:
                raise ValueError(
                    f"{' and '.join(hub_only)} apply to a Hub dataset (name), not to a local path"
                )
        if self.name is not None and not self.name.strip():
            raise ValueError("name is empty: give a Hub dataset such as HuggingFaceH4/MATH-500")
        return self

    def label(self) -> str:
        """The dataset in words (errors, ``presto validate``)."""
        if self.path is not None:
            return str(self.path) + (f" (split {self.split})" if self.split else "")
        parts = [p for p in (self.config, self.split and f"split {self.split}") if p]
        if self.revision:
            parts.append(f"revision {self.revision}")
        return f"{self.name}" + (f" ({', '.join(parts)})" if parts else "")


def looks_local(value: str) -> bool:
    """Whether a ``dataset`` string (or ``--dataset``) names a local path, not a Hub dataset."""
    return (
        value.startswith((".", "/", "~"))
        or value.lower().endswith(LOCAL_SUFFIXES)
        or Path(value).expanduser().exists()
    )


LETTERS = string.ascii_uppercase


class ChoicesConfig(StrictModel):
    """The options of a multiple-choice row, shown as lettered lines (``A) ...``) through the
    template's ``{choices}`` (or one by one as ``{A}``, ``{B}``, ...); the reference answer
    becomes the right option's letter."""

    fields: list[str] | None = Field(
        None,
        min_length=2,
        description="Columns holding one option each, e.g. GPQA's [Correct Answer, Incorrect "
        "Answer 1, Incorrect Answer 2, Incorrect Answer 3].",
    )
    field: str | None = Field(None, description="A column holding the list of options.")
    correct: int | None = Field(
        None,
        ge=0,
        description="With fields: the index (in fields) of the right option's column (GPQA: "
        "0). Otherwise the answer field says: an index, a letter or the option's text.",
    )
    shuffle: bool = Field(
        False,
        description="Shuffle each row's options (seeded by seed and the row's index: the same "
        "order on every run).",
    )
    seed: int = Field(0, ge=0, description="The options' shuffle seed.")
    format: str = Field(
        "{letter}) {text}",
        description="One option's line: {letter} and {text} (the lines are joined by newlines).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ChoicesConfig:
        if (self.fields is None) == (self.field is None):
            raise ValueError("give exactly one of fields (a column per option) or field (a list)")
        if self.fields is not None:
            if len(self.fields) > len(LETTERS):
                raise ValueError(f"at most {len(LETTERS)} options (A-Z)")
            if self.correct is not None and self.correct >= len(self.fields):
                raise ValueError(
                    f"correct is {self.correct}, outside fields (0..{len(self.fields) - 1})"
                )
        elif self.correct is not None:
            raise ValueError("correct applies to fields (a column per option)")
        if "{text}" not in self.format:
            raise ValueError("format needs {text} (and usually {letter}), e.g. '{letter}) {text}'")
        return self


class PromptsConfig(StrictModel):
    """Where the prompts come from: exactly one of ``texts``, ``token_ids``, ``file`` or
    ``dataset``; rows of a file or dataset may go through a ``template`` (with ``choices``), be
    shuffled (seeded) and cut to ``limit``."""

    texts: list[str] | None = Field(None, description="Inline prompts (text).")
    token_ids: list[list[int]] | None = Field(
        None, description="Inline prompts as token ids (the reference engine needs these)."
    )
    file: Path | None = Field(
        None,
        description="A file of rows: JSONL (one object per line), JSON, parquet or CSV "
        "(relative to the config file).",
    )
    dataset: DatasetConfig | None = Field(
        None,
        description="A Hugging Face dataset ({name, config, split, revision}; extra "
        "'datasets') or a local file or saved dataset ({path, split}).",
    )
    field: str = Field(
        "prompt",
        description="The row field holding the prompt: text, token ids, or a list of chat "
        "messages ({role, content}; with chat_template: true).",
    )
    answer_field: str = Field(
        "answer", description="The row field holding a prompt's reference answer (graded jobs)."
    )
    template: str | None = Field(
        None,
        description="The prompt made from each row's fields, e.g. '{problem} Please reason step "
        "by step, and put your final answer within \\boxed{}.' ({name}: a field; {choices}: "
        "the lettered options; {{ and }}: literal braces; {} stays as it is); applied before "
        "the chat template.",
    )
    choices: ChoicesConfig | None = Field(
        None,
        description="Multiple choice: the options' columns ({fields: [...], correct: 0}) or "
        "list column ({field: NAME}), shown as lettered lines; the answer becomes a letter.",
    )
    shuffle: bool = Field(
        False,
        description="Shuffle the rows (seeded by shuffle_seed) before limit: with limit, a "
        "seeded sample.",
    )
    shuffle_seed: int = Field(0, ge=0, description="The rows' shuffle seed.")
    answers: list[str | None] | None = Field(
        None, description="Reference answers of inline prompts, one per prompt (graded jobs)."
    )
    limit: int | None = Field(None, ge=1, description="Use only the first N prompts.")
    chat_template: bool = Field(
        False,
        description="Wrap each prompt as a user message and apply the model's chat template "
        "(via the engine's /tokenize with messages).",
    )
    system_prompt: str | None = Field(
        None, description="Optional system message (only with chat_template: true)."
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        # `prompts: ["a", "b"]` or `prompts: [[1, 2], [3]]`
        if isinstance(data, list):
            if data and all(isinstance(p, list) for p in data):
                return {"token_ids": data}
            return {"texts": data}
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> PromptsConfig:
        given = [
            k for k in ("texts", "token_ids", "file", "dataset") if getattr(self, k) is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of texts, token_ids, file or dataset "
                f"(got {', '.join(given) if given else 'none'})"
            )
        if self.file is None and self.dataset is None:
            row_only = [k for k in ("template", "choices") if getattr(self, k) is not None] + (
                ["shuffle"] if self.shuffle else []
            )
            if row_only:
                raise ValueError(f"{', '.join(row_only)} apply to the rows of a file or dataset")
        if self.texts is not None and not self.texts:
            raise ValueError("texts is empty: list at least one prompt")
        if self.token_ids is not None and (
            not self.token_ids or any(not p for p in self.token_ids)
        ):
            raise ValueError("token_ids must be a non-empty list of non-empty lists of ints")
        for i, ids in enumerate(self.token_ids or ()):
            if min(ids) < 0:
                raise ValueError(f"token_ids[{i}] holds {min(ids)}: token ids are >= 0")
        if self.system_prompt is not None and not self.chat_template:
            raise ValueError("system_prompt needs chat_template: true")
        return self
