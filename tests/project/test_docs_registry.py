"""The docs' tables of policies, tasks, models and families are generated from the code (docs/hooks/tables.py, an
mkdocs hook), so a new policy, task, model config or family needs no docs edit: these tests call the hook's
rendering directly (no site build) and check that each table covers its registry, that its pages carry it, that a
policy added to the registry appears with nothing else edited, and a few facts against independent sources (the
papers' published settings, the models' published architectures). No page may hand-list a whole registry, and every
`policy=`/`task=`/`model=`/`experiment=` name a page mentions must exist.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from omegaconf import OmegaConf

from kvbench.conf import load_option, options
from kvbench.models.family import FAMILIES
from kvbench.policies import Policy, registry
from kvbench.tasks import TASKS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OWNERS = {"policies": "policies.md", "policy-settings": "policies.md", "policy-departures": "policies.md",
          "tasks": "tasks.md", "models": "models.md", "families": "models.md"}


def _hook():
    spec = importlib.util.spec_from_file_location("kvbench_docs_tables", ROOT / "docs" / "hooks" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tables = _hook()


def rows(markdown: str) -> dict[str, list[str]]:
    """First cell -> the other cells, for each body row of a generated markdown table."""
    out = {}
    for line in markdown.splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        out[cells[0]] = cells[1:]
    return out


def names(cell: str) -> list[str]:
    return re.findall(r"`([\w-]+)`", cell)


def test_every_policy_and_task_has_a_config_and_a_class():
    assert options("policy") == sorted(registry())
    assert options("task") == sorted(TASKS)
    for name, cls in TASKS.items():
        assert load_option("task", name)["_target_"] == f"{cls.__module__}.{cls.__name__}"


@pytest.mark.parametrize("name", sorted(registry()))
def test_every_policy_says_what_it_keeps_and_cites_its_paper(name):
    """Its own `summary` (not a parent's) and a `paper` that is None or (citation, https link)."""
    cls = registry()[name]
    assert vars(cls).get("summary"), f"{cls.__name__}: set `summary`, the line the docs' policy table shows"
    assert cls.paper is None or (len(cls.paper) == 2 and cls.paper[1].startswith("https://")), cls.paper


def test_the_pages_carry_the_generated_tables_and_every_marker_renders():
    for table, page in OWNERS.items():
        assert f"<!-- kvbench:table {table} -->" in (ROOT / "docs" / page).read_text(), f"{page}: the {table} table"
    for page in sorted((ROOT / "docs").glob("*.md")):
        out = tables.expand(page.read_text(encoding="utf-8"), page.name)
        assert "<!-- kvbench:" not in out, page.name
    with pytest.raises(ValueError, match="index.md: kvbench:table nope: no such table"):
        tables.expand("<!-- kvbench:table nope -->", "index.md")


def test_no_page_lists_a_whole_registry_by_hand():
    """A line naming every policy (or task, or model config) is a hand list the next one makes stale: the pages
    generate the lists (`<!-- kvbench:names GROUP -->`) or link to the page that does."""
    for page in PAGES:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for group in ("policy", "task", "model"):
                listed = set(names(line)) & set(options(group))
                assert listed != set(options(group)), f"{page.name}:{n} lists every {group} by hand"


def test_every_named_option_exists():
    """`policy=X`, `task=X`, `model=X`, `experiment=X` on any page (sweeps `a,b` included) name shipped configs."""
    groups = {g: set(options(g)) for g in ("policy", "task", "model", "experiment")}
    for page in [*PAGES, *sorted((ROOT / "results").glob("*/README.md"))]:
        text = page.read_text()
        for m in re.finditer(r"\b(policy|task|model|experiment)=([\w,-]+)", text):
            values = m[2].split(",")
            after = text[m.end():m.end() + 1]
            if after == "=":  # `model=a,policy=h2o`: the last part is the next key
                values = values[:-1]
            for name in values:
                if after in ("*", "<", ".", "{") and name == values[-1]:  # `paper_*`, `mini_<task>`, `paper_...`: a pattern
                    assert any(o.startswith(name) for o in groups[m[1]]), f"{page.relative_to(ROOT)}: {m[1]}={name}*: none"
                elif name and not name.isupper():  # NAME: a placeholder
                    assert name in groups[m[1]], f"{page.relative_to(ROOT)}: {m[1]}={name} is no config"


def test_readme_highlights_are_registered():
    """README cannot run the hook: its policy bullets, and the task and model names of its "Tasks and models",
    must be registered ones (a subset: a new one needs no README edit)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Policies"):text.index("## Tasks and models")]
    bullets = [n for ln in section.splitlines() if ln.startswith(("- ", "  ")) for n in names(ln)]
    assert bullets and set(bullets) <= set(registry()), set(bullets) - set(registry())
    section = text[text.index("## Tasks and models"):text.index("## Results in this repository")]
    mentioned = [m.split("=")[-1] for m in re.findall(r"`([\w=-]+)`", section) if "." not in m and m[-1] != "="]
    assert mentioned and set(mentioned) <= set(options("task")) | set(options("model")), mentioned


def test_policy_tables_cover_the_registry_and_state_the_published_settings():
    listed, settings = rows(tables.policies()), rows(tables.policy_settings())
    assert sorted(names(" ".join(listed))) == sorted(registry()) == sorted(names(" ".join(settings)))
    # independent side: the papers (Batch-Max's Algorithm 1 and 2, H2O and TOVA one pair per step)
    assert settings["`batch_max`"][0] == "kv 1024, p 64, prefill_and_decode"
    assert settings["`extreme_decode`"][0] == "kv 2, p 1, decode_only"
    assert settings["`h2o`"][2] == settings["`tova`"][2] == "decode_only, p 1"
    assert "`window` 64, `kernel` 5, `pooling` avg" in settings["`snapkv`"][1]  # SnapKV's code and kvpress
    assert "arxiv.org/abs/2412.05693" in listed["`batch_max`"][1] and listed["`full`"][1] == "-"
    departures = rows(tables.policy_departures())
    assert departures["`full`"] == ["none"] and "published: never" in departures["`snapkv`"][0]


@dataclass
class ValueNorm(Policy):
    """A throwaway policy, as a newcomer adds one: its class and its config, nothing else."""

    alpha: float = 0.5
    name: ClassVar[str] = "value_norm"
    summary: ClassVar[str] = "values with the largest L1 norm"
    paper: ClassVar[tuple[str, str]] = ("Someone et al., 2026", "https://example.org/value-norm")
    published_schedule: ClassVar[str] = "after_prefill"


def test_a_new_policy_appears_in_the_docs_with_no_docs_edit(monkeypatch):
    import kvbench.policies

    cfg = OmegaConf.merge(load_option("policy", "knorm"), {"_target_": "x.ValueNorm", "kv_size": 128, "alpha": 0.5})
    monkeypatch.setitem(kvbench.policies._REGISTRY, "value_norm", ValueNorm)
    monkeypatch.setattr(tables, "_policy_config", lambda n: cfg if n == "value_norm" else load_option("policy", n))
    page = tables.expand((ROOT / "docs" / "policies.md").read_text(), "policies.md")
    assert "| `value_norm` | values with the largest L1 norm | [Someone et al., 2026](https://example.org/value-norm) |" in page
    assert "| `value_norm` | kv 128, p 64, decode_only | `alpha` 0.5 | after_prefill |" in page
    assert "| `value_norm` | evicts again whenever the cache is full while decoding (published: never) |" in page


def test_task_table_covers_every_task_with_its_metric():
    table = rows(tables.tasks())
    found = [n for cell in table for n in names(cell)]
    assert sorted(found) == sorted(TASKS), set(TASKS) ^ set(found)
    metric = {n: cells[2] for cell, cells in table.items() for n in names(cell)}
    assert metric["cnndm"] == metric["narrativeqa"] == "ROUGE-2" and metric["gsm8k"] == metric["passkey"] == "accuracy"
    assert metric["niah_single_1"] == "RULER score"  # string_match_all, as the report names it
    assert "`openai/gsm8k` main test" in table["`gsm8k`"][1]


def test_models_table_covers_every_config_with_its_architecture():
    """Every `model=` config; the published architectures (GQA 32/8 Llama-3.1-8B, Gemma-3-4b's 5 local : 1 global
    layers of 1024, gpt-oss-20b's sinks) as kvbench reads them from the shipped configs."""
    table = rows(tables.models())
    assert sorted(names(" ".join(table))) == options("model")
    assert table["`llama31-8b`"][2].startswith("GQA 32/8, 32 layers") and "llama3 RoPE" in table["`llama31-8b`"][2]
    assert "29 of 34 layers windowed (W=1024)" in table["`gemma3-4b`"][2]
    assert "learned attention sinks" in table["`gpt-oss-20b`"][2] and table["`gpt-oss-20b`"][1] == "`gpt_oss`"
    assert all(cells[3].startswith("shipped") for cells in table.values() if "Hub checkpoint" in cells[0])
    assert table["`tiny-llama`"][3] == "built in code"


def test_families_table_names_every_accepted_family_each_checked_in_the_family_matrix():
    """Every family the adapter accepts (kvbench.models.family.FAMILIES), each with a tiny model the family matrix
    runs (tests/models/test_family.py)."""
    table = rows(tables.families())
    assert {n for cell in table for n in names(cell)} == set(FAMILIES)
    assert all(cells[1] != "-" for cells in table.values()), table
    assert "learned sinks" in table["`gpt_oss`"][0] and "soft-capping" in table["`gemma2`"][0]
    assert "`smollm2-135m`" in table["`llama`"][2] or "not readable" in rows(tables.models())["`smollm2-135m`"][3]
