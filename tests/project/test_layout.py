"""The package's shape (issues 22, 35): imports go one way (no module-level import cycle anywhere in kvbench), the
runner does not import serve's internals nor serve the runner, and the rooms stay small: no module of kvbench over
MAX_LINES lines, no class over MAX_CLASS_LINES (the cache's rooms under tighter limits).

KNOWN_OVER lists the modules and classes over the limits when the limits were set (issue 35), while they are being
split; the test fails for an unlisted offender, and for a listed one that is no longer over (or no longer exists),
so the list only shrinks."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "kvbench"


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


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (module -> modules it imports) as a path, or None."""
    done, path = set(), []

    def visit(m):
        if m in path:
            return path[path.index(m):] + [m]
        if m in done:
            return None
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if d != "kvbench" and not m.startswith(d + "."):  # a module may import its own package's __init__
                found = visit(d)
                if found:
                    return found
        path.pop()
        done.add(m)
        return None

    return next((c for m in sorted(graph) if (c := visit(m))), None)


def test_no_import_cycle():
    cycle = find_cycle(imports())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_sees_a_circle():
    assert find_cycle({"kvbench.a": {"kvbench.b"}, "kvbench.b": {"kvbench.c"}, "kvbench.c": {"kvbench.a"}}) == [
        "kvbench.a", "kvbench.b", "kvbench.c", "kvbench.a"]
    assert find_cycle({"kvbench.p.m": {"kvbench.p"}, "kvbench.p": {"kvbench.p.m"}}) is None  # its own package


def test_serve_and_runner_do_not_reach_into_each_other():
    graph = imports()
    assert not any(d == "kvbench.run" or d.startswith("kvbench.run.") for m, deps in graph.items() if m.startswith("kvbench.serve") for d in deps)
    assert not any(d.startswith("kvbench.engine") for m, deps in graph.items() if m.startswith("kvbench.serve")
                   for d in deps)


def test_the_cache_rooms_are_small():
    for p in (PKG / "cache").glob("*.py"):
        assert len(p.read_text().splitlines()) <= 210, p
    tree = ast.parse((PKG / "cache" / "kvcache.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KVCache"]
    assert cls.end_lineno - cls.lineno + 1 <= 150


MAX_LINES, MAX_CLASS_LINES = 250, 150
KNOWN_OVER: dict[str, int] = {}  # path relative to kvbench/ (a class: "path::Class") -> its size when listed (empty: keep it so)


def sizes() -> dict[str, int]:
    """Every module's line count and every class's (nested ones too), keyed as in KNOWN_OVER."""
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel, text = p.relative_to(PKG).as_posix(), p.read_text()
        out[rel] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                out[f"{rel}::{node.name}"] = node.end_lineno - node.lineno + 1
    return out


def over_limits(found: dict[str, int]) -> dict[str, int]:
    return {k: n for k, n in found.items() if n > (MAX_CLASS_LINES if "::" in k else MAX_LINES)}


def test_no_module_or_class_over_the_limits():
    over = over_limits(sizes())
    new = {k: n for k, n in over.items() if k not in KNOWN_OVER}
    assert not new, f"over {MAX_LINES} lines a module / {MAX_CLASS_LINES} a class: {new} (split it)"
    shrunk = sorted(k for k in KNOWN_OVER if k not in over)
    assert not shrunk, f"no longer over the limits: remove {shrunk} from KNOWN_OVER"


def test_the_limits_see_an_offender():
    """The check itself: a module and a class one line over are found, one at the limit is not."""
    assert over_limits({"a.py": MAX_LINES + 1, "b.py": MAX_LINES, "a.py::C": MAX_CLASS_LINES + 1,
                        "a.py::D": MAX_CLASS_LINES}) == {"a.py": MAX_LINES + 1, "a.py::C": MAX_CLASS_LINES + 1}


def test_module_names_are_unique():
    """One meaning per name (issue 42): no two modules of kvbench share a file name (`__init__`/`__main__` aside),
    so `scoring`, `select` or `passes` names one module, wherever it is imported."""
    from collections import Counter

    names = Counter(p.name for p in PKG.rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not [n for n, c in names.items() if c > 1], sorted(n for n, c in names.items() if c > 1)


def test_package_docstrings_name_modules_that_exist():
    """A package docstring's list of its rooms (`    name.py   what it does`) names only modules that exist, and
    every module of the package that has such a list (stale lists: a renamed module left under its old name)."""
    import re

    for init in PKG.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        heads = re.findall(r"^ {4}(\w+\.py(?:, \w+\.py)*)\s", doc, re.M)  # `a.py, b.py   what they do`
        listed = {name for head in heads for name in head.split(", ")}
        if not listed:
            continue
        here = {p.name for p in init.parent.glob("*.py")} - {"__init__.py", "__main__.py"}
        assert listed <= here, f"{init.relative_to(PKG.parent)} names missing modules: {sorted(listed - here)}"
        assert here <= listed, f"{init.relative_to(PKG.parent)} does not name: {sorted(here - listed)}"
