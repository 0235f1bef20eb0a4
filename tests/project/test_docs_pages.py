"""The site as a reader meets it: the home page's first screen, the figures on the pages that discuss them, every
image there, and tables and code that fit the column.

The figures live in results/ (one file each, never a copy in docs/); docs/hooks/results.py serves them, and the
write-ups beside them, under `write-ups/`. Layout is checked on the Markdown, without a browser: a code line longer
than CODE_CHARS, or a table whose columns cannot shrink below TABLE_PX (each column at least Material's minimum
header width, else its longest unbreakable word), would be cut or scroll at 1400 px (the content column is about
860 px there, docs/stylesheets/extra.css). Console output (```` ```console {.wrap} ````) wraps instead.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS, RESULTS = ROOT / "docs", ROOT / "results"
PAGES = sorted(DOCS.glob("*.md"))
WRITE_UPS = sorted(RESULTS.rglob("*.md"))  # served by the hook, README.md or not
CODE_CHARS, TABLE_PX, CHAR_PX, CELL_PX, MIN_COLUMN_PX = 95, 860, 7, 20, 70
# The figures each page discusses (README's headline figure: wherever README shows it, reproducing.md too).
FIGURES = {
    "reproducing.md": ["mini/plots/smollm2-135m_cnndm_n24_new128_accuracy_vs_throughput.png",
                       "mini/plots/smollm2-135m_cnndm_n24_new128_max_batch_size.png"],
    "policies.md": ["baselines/plots/passkey.png", "baselines/plots/cnndm.png"],
    "benchmarks.md": ["throughput_vs_batch.png"],
    "serving.md": ["serve/goodput/goodput.png", "serve/utilisation.png"],
    "long-context.md": ["needle_cpu/plots/needle_grid.png"],
    "results.md": ["example_cnndm/plots/smollm2-135m_cnndm_n16_new32_accuracy_vs_throughput.png",
                   "mini/plots/smollm2-135m_cnndm_n24_new128_agreement_vs_kv.png"],
}
# results/ figures no page shows, and why (a new figure must be shown, or listed here with its reason)
NOT_SHOWN = {
    "serve/serve_plots/*.png": "one run's pool utilisation each (a record's plot_path); utilisation.png draws them all",
    "needle_cpu/plots/needle_smollm2_135m_*.png": "one policy's heatmap each; needle_grid.png shows them side by side",
}


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


results_hook = _load("kvbench_docs_results", DOCS / "hooks" / "results.py")
tables_hook = _load("kvbench_docs_tables_pages", DOCS / "hooks" / "tables.py")


def images(page: Path) -> list[Path]:
    """The files a page's Markdown images point at (resolved as a reader of the file would)."""
    targets = re.findall(r"!\[[^\]]*\]\(([^)\s]+)", page.read_text(encoding="utf-8"))
    return [(page.parent / t).resolve() for t in targets if "://" not in t]


def rendered(page: Path) -> str:
    """A page's Markdown as mkdocs renders it: generated tables in, snippets (`--8<-- "path:a:b"`) included."""
    def include(m: re.Match) -> str:
        path, *span = m[1].split(":")
        lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
        start = int(span[0]) if span and span[0] else 1
        end = int(span[1]) if len(span) > 1 and span[1] else len(lines)
        return "\n".join(lines[start - 1:end])

    text = page.read_text(encoding="utf-8")
    if page.parent == DOCS:
        text = tables_hook.expand(text, page.name)
    return re.sub(r'^--8<-- "([^"]+)"$', include, text, flags=re.M)


def shown() -> set[Path]:
    return {p for page in [*PAGES, *WRITE_UPS] for p in images(page)}


# ------------------------------------------------------------------------------------------------ figures
@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES, *WRITE_UPS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_image_a_page_shows_exists(page):
    missing = [str(p) for p in images(page) if not p.is_file()]
    assert not missing, f"{page.relative_to(ROOT)} shows images that do not exist: {missing}"


def test_every_results_figure_is_shown_or_said_why_not():
    exempt = {p for pattern in NOT_SHOWN for p in RESULTS.glob(pattern)}
    assert all(list(RESULTS.glob(pattern)) for pattern in NOT_SHOWN), "a NOT_SHOWN entry matches nothing: remove it"
    figures = set(RESULTS.rglob("*.png"))
    hidden = sorted(str(p.relative_to(ROOT)) for p in figures - shown() - exempt)
    assert not hidden, f"figures no page shows (show them, or say why in NOT_SHOWN): {hidden}"
    assert not (exempt & shown()), "a figure in NOT_SHOWN is shown: remove it from NOT_SHOWN"


def test_the_figures_each_page_discusses_are_on_it():
    headline = [p for p in images(ROOT / "README.md") if p.is_relative_to(RESULTS)]
    assert headline and set(headline) <= set(images(DOCS / "reproducing.md")), "README's figure: not on its page"
    for page, figures in FIGURES.items():
        missing = [f for f in figures if RESULTS / f not in images(DOCS / page)]
        assert not missing, f"{page} discusses figures it does not show: {missing}"


def test_figures_are_not_copied_into_docs():
    copies = [str(p.relative_to(ROOT)) for p in DOCS.rglob("*") if p.suffix in (".png", ".jpg", ".svg")]
    assert not copies, f"figures belong in results/ (served by docs/hooks/results.py), not copied: {copies}"


def test_the_hook_serves_the_write_ups_and_rewrites_their_links():
    served = {results_hook.site_path(p) for p in results_hook.served()}
    assert {f"write-ups/{f}" for fs in FIGURES.values() for f in fs} <= served
    assert results_hook.rewrite("![a](../results/x/y.png) [b](../results/x/README.md)", "policies.md") == (
        "![a](write-ups/x/y.png) [b](write-ups/x/README.md)")
    assert results_hook.rewrite("[the method](../../docs/method.md)", "write-ups/mini/README.md") == (
        "[the method](../../method.md)")
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    flat = yaml.safe_dump(nav)
    readmes = [RESULTS / "README.md", *sorted(RESULTS.glob("*/README.md"))]
    missing = [str(p.relative_to(ROOT)) for p in readmes if results_hook.site_path(p) not in flat]
    assert not missing, f"write-ups missing from mkdocs.yml's nav: {missing}"


# ------------------------------------------------------------------------------------------------ home page
def test_the_home_page_says_what_kvbench_is_gives_the_two_commands_and_where_to_go():
    text = (DOCS / "index.md").read_text()
    first_screen = text[:text.index("## Where to go")]
    assert "KV-cache eviction" in first_screen and "```bash" in first_screen
    assert "make demo" in first_screen and "make test" in first_screen
    where = text[text.index("## Where to go"):].split("\n\n## ")[0]
    linked = set(re.findall(r"\]\(([\w-]+\.md)", where))
    pages = {p.name for p in PAGES} - {"index.md"}
    assert pages <= linked, f"the Where to go table leaves out: {sorted(pages - linked)}"


# ------------------------------------------------------------------------------------------------ layout
def code_blocks(text: str):
    """(info string, first line number, lines) of every fenced block."""
    for m in re.finditer(r"^```([^\n]*)\n(.*?)^```", text, re.S | re.M):
        yield m[1], text[:m.start(2)].count("\n") + 1, m[2].splitlines()


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES, *WRITE_UPS], ids=lambda p: str(p.relative_to(ROOT)))
def test_code_lines_fit_the_column(page):
    long = [f"{page.relative_to(ROOT)}:{start + i}: {len(line)} characters"
            for info, start, lines in code_blocks(page.read_text(encoding="utf-8")) if ".wrap" not in info
            for i, line in enumerate(lines) if len(line) > CODE_CHARS]
    assert not long, ("code lines wider than the column (a comment on the line above, `\\` continuations, or "
                      "```console {.wrap} for output):\n" + "\n".join(long))


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Each table's rows of cells (the delimiter row left out)."""
    found, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
            continue
        if len(current) >= 2 and re.fullmatch(r"\|[\s:|-]+\|", current[1]):
            found.append([[c.strip() for c in re.split(r"(?<!\\)\|", r.strip().strip("|"))]
                          for r in current if not re.fullmatch(r"\|[\s:|-]+\|", r)])
        current = []
    return found


def narrowest_px(table: list[list[str]]) -> int:
    """The least width the browser can give the table: per column its longest unbreakable word (text breaks at
    spaces, `<wbr>` and after hyphens; a code span never, docs/stylesheets/extra.css), but no column below Material's
    minimum."""
    def words(cell: str) -> list[str]:
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell).replace("\\|", "|").replace("<wbr>", " ")
        code = re.findall(r"`([^`]+)`", text)
        prose = re.sub(r"`[^`]+`", " ", text)
        return [*code, *(w for token in prose.split() for w in re.findall(r"[^-]*-?", token) if w)]

    columns = max(len(r) for r in table)
    longest = [max((len(w) for r in table if i < len(r) for w in words(r[i])), default=0) for i in range(columns)]
    return sum(max(MIN_COLUMN_PX, n * CHAR_PX + CELL_PX) for n in longest)


@pytest.mark.parametrize("page", [*PAGES, *WRITE_UPS], ids=lambda p: str(p.relative_to(ROOT)))
def test_tables_fit_the_column(page):
    wide = [f"{page.relative_to(ROOT)}: {len(t[0])} columns, at least {narrowest_px(t)} px: | {' | '.join(t[0])} |"
            for t in markdown_tables(rendered(page)) if narrowest_px(t) > TABLE_PX]
    assert not wide, "tables wider than the column (fewer columns, split, or transposed):\n" + "\n".join(wide)


@pytest.mark.parametrize("page", [*PAGES, *WRITE_UPS], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_escaped_pipe_inside_code_in_a_table(page):
    """mkdocs shows `a\\|b` in a table's code span with its backslash (a forge's view drops it): list the values."""
    found = [line[:80] for line in rendered(page).splitlines()
             if line.startswith("|") and re.search(r"`[^`]*\\\|[^`]*`", line)]
    assert not found, f"{page.relative_to(ROOT)}: " + "; ".join(found)


def test_the_layout_checks_catch_what_overflowed():
    """The tables and code lines that overflowed at 1400 px in a browser fail these checks."""
    serve_vs_static = [["requests", "static tok/s", "serve tok/s", "serve / static", "same tokens", "linear",
                        "attention", "model rest", "kv_io", "loop", "outside linear + attention", "serving overhead"]]
    assert narrowest_px(serve_vs_static) > TABLE_PX
    ruler_command = ("kvbench task=niah_single_1 task.context_length=2048 task.query_aware=false policy=snapkv "
                     "policy.schedule=after_prefill policy.compression_ratio=0.5  # RULER, kvpress's protocol")
    assert len(ruler_command) > CODE_CHARS
    assert narrowest_px([["`model=`", "weights", "family", "attention", "config"]]) < TABLE_PX
