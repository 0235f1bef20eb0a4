"""What the docs say to a reader: what was measured on what hardware, never how the project is run.

The pages a user reads (README.md, docs/*.md, the results write-ups they link to) and the docstrings the API page
shows (docs/api.md's `::: object` entries, with the public members mkdocstrings lists) must not carry notes for
the people building kvbench: issue numbers, sessions, how GPUs are lent, rebases, "the issue asked for". A page
may say that something was not run on a GPU; it says so about the measurement, not about the team.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "results" / "README.md",
         *sorted((ROOT / "results").glob("*/README.md"))]
DEVELOPMENT_NOTES = {
    r"\bissues? #?\d+": "an issue number",
    r"\bthe issue\b": "the issue tracker",
    r"\bsessions?\b": "a work session",
    r"\blent\b|\blending\b": "how GPUs are lent",
    r"\brebas(e|ed|ing)\b": "a rebase",
    r"\bworktrees?\b": "a worktree",
    r"\bmain at `?[0-9a-f]{7}": "a commit of the main branch",
    r"\bbefore the fix\b": "a fix's history",
}


def notes(text: str) -> list[str]:
    """`why: the sentence` for each development note in `text`."""
    flat = " ".join(text.split())
    return [f"{why}: ...{flat[max(0, m.start() - 60):m.end() + 40]}..." for pattern, why in DEVELOPMENT_NOTES.items()
            for m in re.finditer(pattern, flat, re.I)]


def api_objects() -> list[str]:
    return re.findall(r"^::: ([\w.]+)", (ROOT / "docs" / "api.md").read_text(), re.M)


def resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError:  # `package.module.Class.method`
        return getattr(resolve(module), name)


def shown_docstrings(obj) -> list[str]:
    """The object's docstring and, for a class, those of the public members it defines (what the page shows)."""
    docs = [inspect.getdoc(obj) or ""]
    if inspect.isclass(obj):
        for name, member in vars(obj).items():
            if not name.startswith("_"):
                docs.append(inspect.getdoc(getattr(member, "fget", member)) or "" if callable(member)
                            or isinstance(member, property) else "")
    return docs


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_have_no_development_notes(page):
    found = notes(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(ROOT)} talks about how kvbench is developed:\n" + "\n".join(found)


def test_api_page_docstrings_have_no_development_notes():
    objects = api_objects()
    assert len(objects) >= 5, objects  # the page's format changed: this test would check nothing
    found = [f"{dotted}: {n}" for dotted in objects for doc in shown_docstrings(resolve(dotted)) for n in notes(doc)]
    assert not found, "docstrings on the API page talk about how kvbench is developed:\n" + "\n".join(found)


def test_the_check_finds_what_it_looks_for():
    """Each pattern catches the sentences that made it necessary, and not the plain use of the words."""
    caught = ["The issue asked for 1k/2k/4k tokens", "its name before issue 35", "no GPU has been lent to this work",
              "the branch's commits before it was rebased onto main", "available to this project's sessions",
              "(main at `78a1e24`)", "Written before issues 21-25"]
    assert all(notes(s) for s in caught), [s for s in caught if not notes(s)]
    assert not notes("a GPU run of the protocol is not recorded; the lens of a test; the issued command")
