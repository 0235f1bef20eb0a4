"""mkdocs hook: the committed results/ write-ups and their figures, served with the docs.

A page links to a write-up and shows a figure by its path in the repository (`../results/mini/README.md`,
`![...](../results/throughput_vs_batch.png)`), so the Markdown reads right on its own too (a clone, a forge's file
view). mkdocs serves docs/ only: this hook adds every Markdown file and PNG under results/ to the site under
`write-ups/` (results/mini/README.md is the page write-ups/mini/), and rewrites the links: a page's `../results/`
to `write-ups/`, a write-up's `../../docs/` back to the pages. A figure is one file, in results/, never a copy.
tests/project/test_docs_pages.py checks that every image a page shows exists and every figure is shown.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
SITE_DIR = "write-ups"  # not results/: docs/results.md is the page /results/
SERVED = (".md", ".png")


def served() -> list[Path]:
    """The files under results/ the site carries: the write-ups, the tables they link and the figures."""
    return sorted(p for p in RESULTS.rglob("*") if p.suffix in SERVED and p.is_file())


def site_path(path: Path) -> str:
    return f"{SITE_DIR}/{path.relative_to(RESULTS).as_posix()}"


def rewrite(markdown: str, src_uri: str) -> str:
    """A page's links into results/ (a write-up's links into docs/) as the site lays them out."""
    if src_uri.startswith(f"{SITE_DIR}/"):
        return re.sub(r"\]\(((?:\.\./)+)docs/", r"](\1", markdown)
    depth = src_uri.count("/")  # docs/a.md links ../results/, docs/x/a.md ../../results/
    return re.sub(r"\]\(" + re.escape("../" * (depth + 1)) + r"results/", "](" + "../" * depth + f"{SITE_DIR}/",
                  markdown)


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import (
        File,  # here, not at the top: the tests import this module without mkdocs
    )

    for path in served():
        files.append(File.generated(config, site_path(path), abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    return rewrite(markdown, page.file.src_uri)
