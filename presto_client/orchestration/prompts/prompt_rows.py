"""Rows to prompts: the prompt template, multiple-choice options, per-row chat messages and the
seeded shuffle (a sample with ``limit``), in that order of concern:

1. the rows are shuffled (``prompts.shuffle``, seeded by ``shuffle_seed``) and cut to ``limit``:
   a seeded sample of the dataset, the same on every run and machine;
2. each row becomes a prompt: its ``field`` (text, token ids, or a list of ``{role, content}``
   chat messages), or ``template`` filled with the row's fields (``{problem}``, ``{question}``,
   any column) and its options (``{choices}``: lettered lines; ``{A}``, ``{B}``, ...: one each);
3. the reference answer is the row's ``answer_field`` (with options: the right option's letter).

The system prompt and the model's chat template are applied afterwards, by the engine
(``chat_template: true``). Shuffles are keyed by sha256 of (seed, row index), not by a random
generator, so they do not change with Python or numpy versions, and a row keeps its place among
the others when rows are added. :func:`load_prompts` is the job's prompts, read from where its
config says.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from presto_client.errors import ConfigError
from presto_client.orchestration.config.dataset_config import LETTERS, ChoicesConfig, DatasetConfig
from presto_client.orchestration.planned import Prompt, PromptOrigin
from presto_client.orchestration.prompts.dataset_loader import LoadedRows, fields_of, load_rows

if TYPE_CHECKING:
    from presto_client.orchestration.config.dataset_config import PromptsConfig
    from presto_client.orchestration.config.schema import JobConfig

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
CHAT_ROLES = ("system", "user", "assistant")


def seeded_order(n: int, seed: int, salt: str = "") -> list[int]:
    """``range(n)`` in a seeded order: sorted by :func:`order_key`."""
    return sorted(range(n), key=partial(order_key, seed, salt))


def order_key(seed: int, salt: str, i: int) -> bytes:
    """Index ``i``'s place in the seeded order: sha256 of ``salt/seed/index`` (a function of
    ``i`` alone, so the first rows of the order are found without holding every row)."""
    return hashlib.sha256(f"{salt}/{seed}/{i}".encode()).digest()


def render_template(template: str, values: Mapping[str, Any], place: str) -> str:
    """``template`` with each ``{name}`` replaced by ``values[name]``; ``{{`` and ``}}`` are
    literal braces and ``{}`` stays as it is (``\\boxed{}`` needs no escaping). A name that is
    not a field is an error naming the row's fields."""

    def sub(m: re.Match[str]) -> str:
        whole = m.group(0)
        if whole == "{{":
            return "{"
        if whole == "}}":
            return "}"
        name = m.group(1)
        if name == "" or name.isspace():
            return whole
        if name not in values:
            raise ConfigError(
                f"{place}: prompts.template names {{{name}}}, which this row does not have "
                f"(fields: {', '.join(map(str, values))}); write literal braces as {{{{ and }}}}"
            )
        value = values[name]
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        # null, a list, a mapping or true/false would become "", "['a', 'b']", "True": a
        # prompt nobody wrote, graded all the same.
        kind = "null" if value is None else type(value).__name__
        raise ConfigError(
            f"{place}: prompts.template's {{{name}}} is {kind} in this row, not text or a number; "
            "fix the row (or leave it out of the file)"
        )

    text = _PLACEHOLDER.sub(sub, template)
    if not text.strip():
        raise ConfigError(f"{place}: prompts.template gives an empty prompt for this row")
    return text


def _letter_of(value: Any, options: Sequence[str], place: str) -> int:
    """The index of the right option from an answer field: an index, a letter or the text."""
    if isinstance(value, bool):
        value = None
    if isinstance(value, int) and 0 <= value < len(options):
        return value
    text = "" if value is None else str(value).strip()
    if len(text) == 1 and text.upper() in LETTERS[: len(options)]:
        return LETTERS.index(text.upper())
    if text.isdigit() and int(text) < len(options):
        return int(text)
    if text in options:
        return list(options).index(text)
    raise ConfigError(
        f"{place}: the answer {value!r} names none of the {len(options)} options (give an "
        "index, a letter or the option's text, or prompts.choices.correct)"
    )


def row_choices(
    row: Mapping[str, Any], cfg: ChoicesConfig, row_index: int, answer: Any, place: str
) -> tuple[list[str], str | None]:
    """The row's options in the order shown (shuffled when asked) and the right one's letter
    (``None`` when the row has no answer)."""
    if cfg.fields is not None:
        missing = [f for f in cfg.fields if f not in row]
        if missing:
            raise ConfigError(
                f"{place}: no field {', '.join(map(repr, missing))} for prompts.choices.fields "
                f"(has: {', '.join(map(str, row))})"
            )
        options = [str(row[f]) for f in cfg.fields]
    else:
        assert cfg.field is not None
        value = row.get(cfg.field)
        if not isinstance(value, list) or not value:
            raise ConfigError(
                f"{place}: prompts.choices.field {cfg.field!r} must hold a list of options "
                f"(got {type(value).__name__})"
            )
        if len(value) > len(LETTERS):
            raise ConfigError(f"{place}: {len(value)} options, more than A-Z")
        options = [str(v) for v in value]
    right: int | None
    if cfg.correct is not None:
        right = cfg.correct
    elif answer is None:
        right = None
    else:
        right = _letter_of(answer, options, place)
    order = (
        seeded_order(len(options), cfg.seed, f"choices/{row_index}")
        if cfg.shuffle
        else list(range(len(options)))
    )
    shown = [options[i] for i in order]
    letter = None if right is None else LETTERS[order.index(right)]
    return shown, letter


def _messages(value: Any) -> tuple[tuple[str, str], ...] | None:
    """A list of ``{role, content}`` chat messages as turns, or ``None`` if ``value`` is not
    one."""
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        return None
    return tuple((str(m["role"]), str(m["content"])) for m in value)


def _check_messages(
    turns: tuple[tuple[str, str], ...], pc: PromptsConfig, place: str
) -> tuple[tuple[str, str], ...]:
    if not pc.chat_template:
        raise ConfigError(
            f"{place}: field {pc.field!r} holds chat messages: set prompts.chat_template: true "
            "(they go through the model's chat template)"
        )
    bad = sorted({r for r, _ in turns if r not in CHAT_ROLES})
    if bad:
        raise ConfigError(
            f"{place}: chat messages with role(s) {', '.join(bad)}; roles are "
            f"{', '.join(CHAT_ROLES)}"
        )
    if turns[-1][0] != "user":
        raise ConfigError(
            f"{place}: the last chat message is the {turns[-1][0]}'s; a prompt ends with the "
            "user's turn"
        )
    if pc.system_prompt is not None and turns[0][0] != "system":
        turns = (("system", pc.system_prompt), *turns)
    return turns


def row_digest(row: Mapping[str, Any]) -> str:
    """A digest of a row's fields (every column; values as JSON, others as text)."""
    payload = json.dumps(row, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def select_rows(n: int, pc: PromptsConfig) -> list[int]:
    """The source rows used, in the job's order: shuffled (seeded) when asked, cut to
    ``limit``."""
    order = seeded_order(n, pc.shuffle_seed, "rows") if pc.shuffle else list(range(n))
    return order[: pc.limit] if pc.limit is not None else order


def rows_to_prompts(loaded: LoadedRows, pc: PromptsConfig) -> list[Prompt]:
    """The prompts of the rows ``pc`` selects (see the module's doc)."""
    rows = loaded.rows
    if not rows:
        raise ConfigError(f"{loaded.source}: no prompts in the file")
    prompts: list[Prompt] = []
    # (rows a loader sampled are the selection already, their source numbers beside them)
    order = select_rows(len(rows), pc) if loaded.index is None else range(len(rows))
    for j in order:
        row, place = rows[j], loaded.places[j]
        i = j if loaded.index is None else loaded.index[j]
        origin = PromptOrigin(loaded.identity, i, row_digest(row))
        raw_answer = row.get(pc.answer_field)
        answer = None if raw_answer is None else str(raw_answer)
        values: dict[str, Any] = dict(row)
        if pc.choices is not None:
            shown, letter = row_choices(row, pc.choices, i, raw_answer, place)
            lines = [
                pc.choices.format.replace("{letter}", LETTERS[j]).replace("{text}", text)
                for j, text in enumerate(shown)
            ]
            values = {**{LETTERS[j]: t for j, t in enumerate(shown)}, **values}
            values["choices"] = "\n".join(lines)
            answer = letter
        index = len(prompts)
        if pc.template is not None:
            text = render_template(pc.template, values, place)
            prompts.append(Prompt(index, text=text, answer=answer, origin=origin))
            continue
        if pc.field not in row:
            raise ConfigError(
                f"{place}: no field {pc.field!r} (has: {fields_of([row])}); set prompts.field "
                "to the field holding the prompt text (or give prompts.template)"
            )
        value = row[pc.field]
        turns = _messages(value)
        if turns is not None:
            turns = _check_messages(turns, pc, place)
            last_user = next(c for r, c in reversed(turns) if r == "user")
            prompts.append(
                Prompt(index, text=last_user, answer=answer, messages=turns, origin=origin)
            )
        elif (
            isinstance(value, list)
            and value
            and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
        ):
            prompts.append(Prompt(index, token_ids=tuple(value), answer=answer, origin=origin))
        elif isinstance(value, str):
            if not value.strip():
                raise ConfigError(
                    f"{place}: field {pc.field!r} is empty; every row needs a prompt (fix the "
                    "row, or leave it out of the file)"
                )
            if pc.choices is not None:
                value = f"{value}\n\n{values['choices']}"
            prompts.append(Prompt(index, text=value, answer=answer, origin=origin))
        else:
            raise ConfigError(
                f"{place}: field {pc.field!r} must be text, a list of token ids or a list of "
                "chat messages ({role, content})"
            )
    return prompts


def dataset_fingerprint(prompts: Sequence[Prompt]) -> dict[str, Any] | None:
    """The fingerprint's ``dataset`` entry: the source's name, config, split and revision (as
    asked; ``commit``: as resolved, and ``path``, are recorded but a resume is not refused on
    them alone), how many rows, a digest of the rows used (which, in which order, every column)
    and one of the reference answers. ``None`` for prompts that came from no dataset."""
    origins = [p.origin for p in prompts if p.origin is not None]
    if not origins:
        return None
    ident = origins[0].dataset
    rows = hashlib.sha256(json.dumps([[o.row, o.digest] for o in origins]).encode()).hexdigest()[
        :16
    ]
    answers = hashlib.sha256(json.dumps([p.answer for p in prompts]).encode()).hexdigest()[:16]
    return {
        "name": ident.name,
        "config": ident.config,
        "split": ident.split,
        "revision": ident.revision,
        "commit": ident.commit,
        "path": ident.path,
        "rows": len(origins),
        "digest": rows,
        "answers": answers,
    }


def load_prompts(cfg: JobConfig, *, network: bool = True) -> list[Prompt]:
    """The job's prompts, in order (a file or dataset is read here; errors name the file and
    line, or the dataset and row). ``network=False``: a Hugging Face dataset is not loaded
    (:class:`~presto_client.orchestration.prompts.dataset_loader.DatasetNotLoaded`)."""
    pc = cfg.prompts
    prompts: list[Prompt] = []
    if pc.token_ids is not None:
        prompts = [Prompt(i, token_ids=tuple(ids)) for i, ids in enumerate(pc.token_ids)]
    elif pc.texts is not None:
        prompts = [Prompt(i, text=t) for i, t in enumerate(pc.texts)]
    else:
        source = pc.dataset if pc.dataset is not None else DatasetConfig(path=pc.file)
        # (a limit is the file's first rows, read no further; shuffled, the rows first in the
        # seeded order, the others read and dropped: memory follows the rows used)
        first = sample = None
        if pc.limit is not None and pc.shuffle:
            sample = (pc.limit, partial(order_key, pc.shuffle_seed, "rows"))
        elif pc.limit is not None:
            first = pc.limit
        loaded = load_rows(source, network=network, first=first, sample=sample)
        prompts = rows_to_prompts(loaded, pc)
    if pc.answers is not None:
        if len(pc.answers) != len(prompts):
            raise ConfigError(
                f"prompts.answers: {len(pc.answers)} answer(s) for {len(prompts)} prompt(s); "
                "give one answer (or null) per prompt"
            )
        pairs = zip(prompts, pc.answers, strict=True)
        prompts = [replace(p, answer=a) for p, a in pairs]
    if pc.limit is not None and pc.file is None and pc.dataset is None:
        prompts = prompts[: pc.limit]  # (a file's or dataset's rows are cut when selected)
    if any(p.text is not None for p in prompts):
        where = pc.file or (pc.dataset.label() if pc.dataset else "prompts.texts")
        for i, e in enumerate(cfg.engines):
            if not e.takes_text:
                raise ConfigError(
                    f"engines[{i}] ({e.kind}) takes token-id prompts, but {where} holds text"
                )
    return prompts
