"""No function or method of the packages (``presto_client/`` and ``backends/``, the embedded
engine included) runs past 100 lines, docstring included (``end_lineno - lineno + 1`` of its
``def``).

Why 100: past about a hundred lines a function no longer holds one step of the work but several,
each with its own locals and its own reason to change, and a reader cannot keep it in view at
once; those were cut at their seams (a run's summary per arm: work, speedups, equivalence; a
request's validation per field; a job's engines, identities, chain specs, cache counters). A
tighter figure would start cutting what reads best whole: a flat table (the CLI's argument
parser, the embedded server's metrics text) or one sequence of steps read top to bottom.

Why classes get no line limit: a class is a concept; its size is governed by the module limit
(``test_module_size.py``). A line count on classes would push the cut issue 35 names, one class
spread over files through mixins, rather than a cut by concept.
"""

from __future__ import annotations

import ast

from tests.support.layout import ROOT, source_files

MAX_FUNCTION_LINES = 100


def test_no_function_is_over_100_lines() -> None:
    long = []
    for path in source_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    long.append(f"{where} {node.name}: {lines} lines")
    assert not long, "cut by concept:\n" + "\n".join(long)
