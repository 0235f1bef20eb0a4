"""The matrix's oracle (tests/matrix.py `refusal`, from the docs) agrees with the preflight, which needs no model.

For every combination of the product the two must say the same: the oracle expects a run and the preflight
accepts, or the oracle expects a refusal and the preflight's one line names one of the keys it gives. So the
pairwise cover (tests/project/test_config_matrix.py) can pick any combination, whatever the registry holds.

- the whole product, 82,944 combinations over the recorded policies (`-m product`, `make test-product`: a few
  minutes on 2 cores), also recomputes the record's counts (tests/data/matrix_product.json, docs/matrix.md);
- by default: a seeded sample of the product, every combination of the newest policy (one the record has not
  seen, else the last that joined it), the record's counts against the oracle's, and a throwaway policy (a copy
  of Knorm registered for the test, with its config in Hydra's ConfigStore) in the pairwise cover;
- the shortcuts tests/matrix_preflight.py takes answer as `kvbench.cli.preflight` does, line for line.
"""

from __future__ import annotations

import random

import pytest
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from kvbench import cli, policies
from kvbench.conf import load_option
from tests.matrix import POLICIES, argv, pairwise, product, refusal, write_mirror
from tests.matrix_preflight import SAMPLE, Preflight, Throwaway, counts, disagreements, newest, recorded


@pytest.fixture(scope="module")
def preflight(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    return Preflight(write_mirror(root / "data"), root / "results")


def agree(preflight: Preflight, combos) -> None:
    wrong = disagreements(preflight.answers(combos))
    assert not wrong, f"{len(wrong)} disagree, e.g.:\n" + "\n".join(wrong[:10])


def test_the_shortcuts_answer_as_the_cli(preflight):
    """Composed once and changed in place, instantiated once per node: the same line as the CLI's preflight."""
    rng, every = random.Random(1), product()
    combos = rng.sample([c for c in every if refusal(c) is None], 8) + rng.sample(
        [c for c in every if refusal(c) is not None], 16)
    got = preflight.answers(combos)
    for c in combos:
        try:
            cli.preflight(argv(c, preflight.data_dir, preflight.results_dir))
            line = None
        except Exception as e:  # as kvbench.cli.checked prints it
            line = cli._message(e)
        assert got[c] == line, c.id


def test_a_seeded_sample_of_the_product_agrees(preflight):
    agree(preflight, random.Random(0).sample(product(), SAMPLE))


@pytest.mark.parametrize("policy", newest())
def test_every_combination_of_the_newest_policy_agrees(policy, preflight):
    agree(preflight, product((policy,)))


def test_the_record_counts_are_the_oracles():
    """The preflight's counts recorded by the whole pass are the oracle's, policy by policy."""
    rec = recorded()
    known = tuple(p for p in rec["policies"] if p in POLICIES)
    assert known == tuple(rec["policies"]), "a recorded policy left the registry: python -m tests.matrix_preflight"
    assert counts({c: refusal(c) is not None for c in product(known)}, known) == {k: rec[k] for k in (
        "policies", "by_policy", "combinations", "refused", "accepted")}


@pytest.fixture
def throwaway(monkeypatch):
    """Throwaway (a Knorm copy) in the registry, its config where Hydra finds `policy=zz_knorm_copy`."""
    name = Throwaway.name
    node = OmegaConf.to_container(load_option("policy", "knorm"))
    node["_target_"] = f"{Throwaway.__module__}.{Throwaway.__qualname__}"
    monkeypatch.setitem(policies._REGISTRY, name, Throwaway)
    store = ConfigStore.instance()
    store.store(group="policy", name=name, node=node)
    yield name
    del store.repo["policy"][f"{name}.yaml"]


def test_a_new_policy_joins_the_cover_and_the_cover_agrees(throwaway, preflight):
    """A newcomer's first policy (a copy of Knorm under a new name) shifts the pairwise cover; wherever it lands,
    the preflight answers as the oracle expects."""
    every = tuple(policies.registry())
    assert throwaway in every and throwaway not in POLICIES
    cover = pairwise(policies=every)
    assert cover != pairwise() and {c.policy for c in cover if refusal(c) is None} == set(every)
    agree(preflight, cover)


@pytest.mark.product
def test_the_whole_product_agrees_and_gives_the_recorded_counts(preflight):
    rec = recorded()
    answers = preflight.answers(product(tuple(rec["policies"])))
    wrong = disagreements(answers)
    assert not wrong, f"{len(wrong)} disagree, e.g.:\n" + "\n".join(wrong[:10])
    got = counts({c: line is not None for c, line in answers.items()}, rec["policies"])
    assert got == {k: rec[k] for k in got}
