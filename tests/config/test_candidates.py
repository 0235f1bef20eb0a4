"""kvbench.config.candidates: the batch sizes the search may try, from search.* and the sample count."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from kvbench.config.candidates import DIVISORS_OF_960, search_candidates
from kvbench.errors import ConfigError


def _cfg(candidates="divisors_of_960", max=None, n_samples=None):
    return OmegaConf.create({"search": {"candidates": candidates, "max": max}, "task": {"n_samples": n_samples}})


def test_the_papers_grid():
    assert DIVISORS_OF_960[:8] == [1, 2, 3, 4, 5, 6, 8, 10] and DIVISORS_OF_960[-1] == 960 and len(DIVISORS_OF_960) == 28
    assert search_candidates(_cfg()) == DIVISORS_OF_960


def test_caps():
    assert search_candidates(_cfg(max=10)) == [1, 2, 3, 4, 5, 6, 8, 10]
    assert search_candidates(_cfg(n_samples=7)) == [1, 2, 3, 4, 5, 6, 7]  # above the data: the sample count
    assert search_candidates(_cfg("all", max=5)) == [1, 2, 3, 4, 5]
    assert search_candidates(_cfg([8, 2, 8, 33], n_samples=20)) == [2, 8, 20]


@pytest.mark.parametrize("candidates,max,key", [
    ("primes", None, "search.candidates"), ([], None, "search.candidates"), ([0, 2], None, "search.candidates"),
    ([True], None, "search.candidates"), ([4, 8], 2, "search.max"),
])
def test_refusals_name_the_key(candidates, max, key):
    with pytest.raises(ConfigError) as e:
        search_candidates(_cfg(candidates, max))
    assert e.value.key == key
