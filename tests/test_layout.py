"""The package's shape (issue 22): imports go one way (no module-level import cycle anywhere in kvbench), the
runner does not import serve's internals nor serve the runner, and the cache's rooms stay small."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "kvbench"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Module -> the kvbench modules it imports, at module level or inside a function (a lazy import that
    closes a circle is still a circle)."""
    names = {module_name(p) for p in PKG.rglob("*.py")}
    graph = {}
    for p in PKG.rglob("*.py"):
        me, deps = module_name(p), set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvbench"):
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    deps.add(full if full in names else node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("kvbench")}
        graph[me] = {d for d in deps if d in names and d != me}
    return graph


def test_no_import_cycle():
    graph = imports()
    done, path = set(), []

    def visit(m):
        if m in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(m):] + [m]))
        if m in done:
            return
        path.append(m)
        for d in graph.get(m, ()):
            if d != "kvbench" and not m.startswith(d + "."):  # a module may import its own package's __init__
                visit(d)
        path.pop()
        done.add(m)

    for m in graph:
        visit(m)


def test_serve_and_runner_do_not_reach_into_each_other():
    graph = imports()
    assert not any(d == "kvbench.runner" for m, deps in graph.items() if m.startswith("kvbench.serve") for d in deps)
    assert not any(d.startswith("kvbench.engine") for m, deps in graph.items() if m.startswith("kvbench.serve")
                   for d in deps)


def test_the_cache_rooms_are_small():
    for p in (PKG / "cache").glob("*.py"):
        assert len(p.read_text().splitlines()) <= 210, p
    tree = ast.parse((PKG / "cache" / "kvcache.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KVCache"]
    assert cls.end_lineno - cls.lineno + 1 <= 150
