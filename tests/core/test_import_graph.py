"""No import circle inside ``presto_client/`` and ``backends/``: every import counts, lazy ones
and those under ``TYPE_CHECKING`` too (a circle hidden in a function is still a circle)."""

from __future__ import annotations

import ast

from tests.support.layout import module_name, source_files


def _graph() -> dict[str, set[str]]:
    files = {module_name(f): f for f in source_files()}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                # `from pkg import mod` imports the module pkg.mod when there is one
                names = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                ]
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != module and not module.startswith(name + "."):
                    # (a module importing its own package's __init__ is how Python loads it)
                    graph[module].add(name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_graph_sees_lazy_imports() -> None:
    graph = _graph()
    # the embedded server's launcher reads the model's cache inside a function
    assert "presto_client.embedded.model" in graph["presto_client.child_servers.embedded"]
