"""Statistics a reviewer needs next to a score: bootstrap intervals, paired differences, agreement.

Pure functions over per-sample values (no model, no files), shared by the runner (the record's
`<metric>_ci`) and kvbench-report (paired differences to the full cache, agreement, lengths).

- `bootstrap_ci`: the 95% percentile bootstrap interval of a mean over samples: `n_boot` = 2,000
  resamples of the n samples with replacement, drawn from a fixed seed (numpy's PCG64, seed 0), so
  the same scores always give the same interval.
- `paired_diff`: the mean of a - b over the samples both runs scored (matched by dataset `index`)
  and the bootstrap interval of that mean. Pairing removes the between-sample variance both runs
  share (a hard article is hard for every policy), so the interval is far tighter than comparing two
  independent intervals. `distinguishable` says whether an interval excludes 0.
- `prefix_agreement`: the share of generated tokens equal to the reference's up to the first
  divergence (common prefix / the longer output); `exact_match`: the whole outputs are equal.
- `output_length`: generated tokens before the first EOS and before the first stop string (the
  tokens the scored text needs); `length_summary`: their mean, median and max.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence

import numpy as np

N_BOOT = 2000
SEED = 0
LEVEL = 0.95


def resample_indices(n: int, n_boot: int = N_BOOT, seed: int = SEED) -> np.ndarray:
    """(n_boot, n) sample indices drawn with replacement: the resamples every interval uses."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def bootstrap_ci(values: Sequence[float], n_boot: int = N_BOOT, seed: int = SEED,
                 level: float = LEVEL) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of `values`; None for no values."""
    x = np.asarray(values, dtype=np.float64)  # (n,)
    if x.size == 0:
        return None
    means = x[resample_indices(x.size, n_boot, seed)].mean(axis=1)  # (n_boot,)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def paired(a: Mapping[int, float], b: Mapping[int, float]) -> list[int]:
    """The sample indices both runs have, sorted."""
    return sorted(set(a) & set(b))


def paired_diff(a: Mapping[int, float], b: Mapping[int, float], **kw) -> dict | None:
    """Mean of a[i] - b[i] over the common indices i, its bootstrap interval and n; None if none."""
    common = paired(a, b)
    if not common:
        return None
    d = [a[i] - b[i] for i in common]
    return {"mean": float(np.mean(d)), "ci": bootstrap_ci(d, **kw), "n": len(common)}


def distinguishable(ci: Sequence[float] | None) -> bool | None:
    """Whether an interval excludes 0 (None when there is no interval)."""
    if ci is None:
        return None
    return bool(ci[0] > 0 or ci[1] < 0)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def prefix_agreement(a: Sequence[int], b: Sequence[int]) -> float:
    """Share of tokens equal up to the first divergence: common prefix / the longer output (1 if both empty)."""
    longest = max(len(a), len(b))
    return 1.0 if longest == 0 else common_prefix(a, b) / longest


def exact_match(a: Sequence[int], b: Sequence[int]) -> float:
    return float(list(a) == list(b))


def agreement(run: Mapping[int, Sequence[int]], ref: Mapping[int, Sequence[int]], **kw) -> dict | None:
    """Per-sample agreement of `run`'s generated ids with `ref`'s (matched by index), averaged with intervals."""
    common = paired(run, ref)
    if not common:
        return None
    prefix = [prefix_agreement(run[i], ref[i]) for i in common]
    exact = [exact_match(run[i], ref[i]) for i in common]
    return {"prefix": float(np.mean(prefix)), "prefix_ci": bootstrap_ci(prefix, **kw),
            "exact": float(np.mean(exact)), "exact_ci": bootstrap_ci(exact, **kw), "n": len(common)}


def output_length(ids: Sequence[int], eos: set[int], text_of: Callable[[Sequence[int]], str] | None = None) -> int:
    """Tokens before the first EOS; with `text_of` (ids -> the scored text: decoded and cut at the
    task's stop strings), the fewest leading tokens whose text covers the whole scored text, so the
    tokens of the first stop string are not counted (a token holding both the scored text's last
    character and the stop string's first is). Binary search: once a prefix covers the scored text,
    every longer one does."""
    upto = next((i for i, t in enumerate(ids) if t in eos), len(ids))
    if text_of is None or upto == 0:
        return upto
    target = text_of(ids[:upto])
    lo, hi = 0, upto  # text_of(ids[:hi]) starts with target
    while lo < hi:
        mid = (lo + hi) // 2
        if text_of(ids[:mid]).startswith(target):
            hi = mid
        else:
            lo = mid + 1
    return hi


def length_summary(lengths: Sequence[int]) -> dict | None:
    """Mean, median, min and max of per-sample output lengths (tokens)."""
    if not lengths:
        return None
    return {"mean": round(statistics.fmean(lengths), 2), "median": statistics.median(lengths),
            "min": min(lengths), "max": max(lengths), "n": len(lengths)}


def metric_intervals(scores: Sequence[Mapping[str, float]], **kw) -> dict[str, list[float]]:
    """`<metric>_ci` -> [lo, hi] for every metric of the per-sample score dicts (additive record fields).

    The resamples index positions, so callers pass the scores in dataset-index order (the runner and
    kvbench.compare do): the same run then always gets the same interval."""
    keys = scores[0].keys() if scores else []
    out = {}
    for k in keys:
        ci = bootstrap_ci([s[k] for s in scores], **kw)
        if ci is not None:
            out[f"{k}_ci"] = [round(ci[0], 6), round(ci[1], 6)]
    return out
