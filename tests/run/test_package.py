"""The shape of kvbench/run/ and kvbench/capacity/ (issue 35): small modules, small classes, imports one way
(serve never reaches the run, the run never reaches the capacity plan, which builds its record through
the run's record module only)."""

from __future__ import annotations

import ast

import pytest

from tests.project.test_layout import PKG, imports

ROOMS = [p for room in ("run", "capacity") for p in sorted((PKG / room).glob("*.py"))]


@pytest.mark.parametrize("path", ROOMS, ids=[f"{p.parent.name}/{p.name}" for p in ROOMS])
def test_modules_and_classes_are_small(path):
    text = path.read_text()
    assert len(text.splitlines()) <= 250
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno - node.lineno + 1 <= 150, node.name
    assert ast.get_docstring(ast.parse(text)), "a module says what it is for"


def test_imports_go_one_way():
    graph = imports()
    run = {m: d for m, d in graph.items() if m == "kvbench.run" or m.startswith("kvbench.run.")}
    assert run and not any(x.startswith("kvbench.capacity") for deps in run.values() for x in deps)
    assert not any(x == "kvbench.run" or x.startswith("kvbench.run.") for m, deps in graph.items()
                   if m.startswith("kvbench.serve") for x in deps)
    capacity = {x for m, deps in graph.items() if m.startswith("kvbench.capacity") for x in deps}
    assert {x for x in capacity if x.startswith("kvbench.run")} == {"kvbench.run.record"}
