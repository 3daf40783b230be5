"""A plain aligned text table, cut into blocks of columns where it is wider than a terminal."""

from __future__ import annotations

from collections.abc import Sequence

MAX_TABLE_WIDTH = 100
"""A terminal table's widest line: wider tables are cut into blocks of columns."""


def render_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], max_width: int = MAX_TABLE_WIDTH
) -> str:
    """A plain aligned text table (first column left-aligned, the rest right-aligned). A header
    cell may span lines (``"trans/\\ncall"``): the header then takes as many, bottom-aligned, and
    the column is as wide as its longest line. A table wider than ``max_width`` is printed as
    blocks of its columns, one under the other, each repeating the first column (as wide tables
    are in a terminal: arms as columns grow with every arm compared)."""
    widths = _column_widths(header, rows)
    blocks: list[list[int]] = [[]]
    used = widths[0]
    for i in range(1, len(widths)):
        if blocks[-1] and used + 2 + widths[i] > max_width:
            blocks.append([])
            used = widths[0]
        blocks[-1].append(i)
        used += 2 + widths[i]
    return "\n\n".join(
        _render_block([header[j] for j in (0, *cols)], [[r[j] for j in (0, *cols)] for r in rows])
        for cols in blocks
    )


def _column_widths(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    widths = [max(len(line) for line in h.split("\n")) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    return widths


def _render_block(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    heads = [h.split("\n") for h in header]
    depth = max((len(h) for h in heads), default=1)
    heads = [[""] * (depth - len(h)) + h for h in heads]
    widths = _column_widths(header, rows)

    def line(cells: Sequence[str]) -> str:
        parts = [c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cells)]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    head_lines = [line([h[d] for h in heads]) for d in range(depth)]
    return "\n".join([*head_lines, rule, *(line(r) for r in rows)])
