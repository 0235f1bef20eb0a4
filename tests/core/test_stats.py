"""kvbench.stats against direct computations: bootstrap intervals, paired differences, agreement, lengths."""

import statistics

import numpy as np
import pytest

from kvbench import stats


def direct_ci(values, idx):
    """The percentile interval written out: loop over the resamples, mean each, take the 2.5/97.5% quantiles."""
    means = sorted(sum(values[j] for j in row) / len(row) for row in idx.tolist())
    return tuple(np.quantile(means, [0.025, 0.975]))


def test_bootstrap_ci_is_the_percentile_interval_of_resampled_means():
    values = [0.1, 0.0, 0.3, 0.25, 0.05, 0.2, 0.0, 0.4, 0.15, 0.1]
    idx = stats.resample_indices(len(values))
    assert idx.shape == (2000, 10) and idx.min() >= 0 and idx.max() == 9
    lo, hi = stats.bootstrap_ci(values)
    assert (lo, hi) == pytest.approx(direct_ci(values, idx), abs=1e-12)
    assert lo < statistics.fmean(values) < hi
    assert stats.bootstrap_ci(values) == (lo, hi)  # fixed seed: the same interval every time
    assert stats.bootstrap_ci(values, seed=1) != (lo, hi)


def test_bootstrap_ci_matches_the_normal_interval_on_many_samples():
    x = np.random.default_rng(5).normal(0.3, 0.1, size=2000)
    lo, hi = stats.bootstrap_ci(x)
    half = 1.96 * x.std(ddof=1) / np.sqrt(x.size)
    assert lo == pytest.approx(x.mean() - half, abs=0.15 * half) and hi == pytest.approx(x.mean() + half, abs=0.15 * half)


def test_degenerate_inputs():
    assert stats.bootstrap_ci([]) is None
    assert stats.bootstrap_ci([0.5]) == (0.5, 0.5)
    assert stats.bootstrap_ci([1.0, 1.0, 1.0]) == (1.0, 1.0)
    assert stats.paired_diff({1: 0.1}, {2: 0.2}) is None
    assert stats.distinguishable(None) is None


def test_paired_difference_matches_by_index_and_is_tighter_than_unpaired():
    rng = np.random.default_rng(0)
    hardness = rng.uniform(0, 0.4, size=30)  # shared by both runs: pairing removes it
    fkv = {i: float(h + 0.02) for i, h in enumerate(hardness)}
    run = {i: float(h + 0.02 - 0.01 + rng.normal(0, 0.002)) for i, h in enumerate(hardness)}
    run[99] = 5.0  # a sample FKV did not score: left out
    shuffled = dict(reversed(list(run.items())))  # order in the files does not matter
    d = stats.paired_diff(shuffled, fkv)
    diffs = [run[i] - fkv[i] for i in range(30)]
    assert d["n"] == 30 and d["mean"] == pytest.approx(statistics.fmean(diffs))
    assert d["ci"] == pytest.approx(direct_ci(diffs, stats.resample_indices(30)), abs=1e-12)
    assert stats.distinguishable(d["ci"]) is True  # about -0.01 with tiny noise
    a, b = stats.bootstrap_ci([run[i] for i in range(30)]), stats.bootstrap_ci(list(fkv.values()))
    assert a[0] < b[1] and b[0] < a[1]  # the unpaired intervals overlap: they could not tell
    noise = {i: float(fkv[i] + rng.normal(0, 0.01)) for i in range(30)}
    assert stats.distinguishable(stats.paired_diff(noise, fkv)["ci"]) is False


def test_agreement_with_known_token_sequences():
    ref = {0: [5, 6, 7, 8], 1: [1, 2, 3, 4], 2: [9, 9], 3: [4, 4, 4, 4], 7: [1]}
    run = {0: [5, 6, 7, 8],  # identical: 1.0, exact
           1: [1, 2, 0, 4],  # diverges at token 2: 2/4 (a later re-convergence does not count)
           2: [9, 9, 3, 3],  # longer than the reference (it stopped, this did not): 2/4
           3: [0, 4, 4, 4]}  # first token differs: 0
    assert [stats.prefix_agreement(run[i], ref[i]) for i in range(4)] == [1.0, 0.5, 0.5, 0.0]
    assert stats.prefix_agreement([], []) == 1.0 and stats.prefix_agreement([], [3]) == 0.0
    a = stats.agreement(run, ref)
    assert a["n"] == 4 and a["prefix"] == pytest.approx(0.5) and a["exact"] == pytest.approx(0.25)
    assert a["prefix_ci"] == pytest.approx(direct_ci([1.0, 0.5, 0.5, 0.0], stats.resample_indices(4)))
    assert a["exact_ci"][0] >= 0.0 and a["exact_ci"][1] <= 1.0


def test_output_length_stops_at_eos_and_at_the_stop_string():
    text = {1: "Hello", 2: " world", 3: "\n", 4: "Art", 6: "icle:", 5: " more", 7: " Article:", 8: " "}

    def text_of(ids):
        s = "".join(text[i] for i in ids).lstrip()
        j = s.find("Article:")
        return s if j < 0 else s[:j]

    assert stats.output_length([1, 2, 9, 3], eos={9}) == 2  # EOS at 2
    assert stats.output_length([1, 2, 3, 4, 6, 5], eos={9}) == 6  # no stop strings given
    assert stats.output_length([1, 2, 3, 4, 6, 5], eos={9}, text_of=text_of) == 3  # "Art" + "icle:" is the stop
    assert stats.output_length([1, 2, 7, 5], eos={9}, text_of=text_of) == 3  # " Article:" holds the scored " "
    assert stats.output_length([1, 2, 8, 8, 5], eos={9}, text_of=text_of) == 5  # no stop string: every token
    assert stats.output_length([1, 2, 5, 9, 3, 4, 6], eos={9}, text_of=text_of) == 3  # EOS first (ignore_eos output)
    assert stats.output_length([9, 1], eos={9}, text_of=text_of) == 0
    assert stats.length_summary([2, 4, 9]) == {"mean": 5.0, "median": 4, "min": 2, "max": 9, "n": 3}
    assert stats.length_summary([]) is None


def test_metric_intervals_cover_every_metric():
    scores = [{"rouge2": 0.1, "rouge1": 0.3}, {"rouge2": 0.0, "rouge1": 0.2}, {"rouge2": 0.2, "rouge1": 0.4}]
    ci = stats.metric_intervals(scores)
    assert set(ci) == {"rouge2_ci", "rouge1_ci"}
    assert ci["rouge2_ci"] == pytest.approx(list(stats.bootstrap_ci([0.1, 0.0, 0.2])), abs=1e-6)
