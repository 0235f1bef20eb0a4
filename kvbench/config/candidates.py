"""The batch sizes `search.max_batch=true` may try: `search.candidates`, capped by `search.max` and the data.

Pure arithmetic on the config (no model, no memory): the search itself (kvbench.search) walks this sorted
list by doubling then bisection, and kvbench-plan plans over the same list. The paper's grid is the divisors
of 960 (every batch size that splits its 960 samples evenly); `all` is every size up to 100,000; an explicit
list is taken as given (sorted, duplicates dropped). A batch larger than the task's sample count never runs,
so candidates above it become the sample count itself.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from kvbench.errors import ConfigError

DIVISORS_OF_960 = [d for d in range(1, 961) if 960 % d == 0]


def search_candidates(cfg: DictConfig) -> list[int]:
    """The sorted candidate batch sizes of `cfg`; ConfigError naming `search.candidates` or `search.max`."""
    c = cfg.search.candidates
    if isinstance(c, str):
        if c == "divisors_of_960":
            values = list(DIVISORS_OF_960)
        elif c == "all":
            values = list(range(1, 100_001))
        else:
            raise ConfigError("search.candidates", "must be divisors_of_960, all, or a list of batch sizes", c)
    else:
        values = list(OmegaConf.to_container(c) if not isinstance(c, list) else c)
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
            raise ConfigError("search.candidates", "must be a non-empty list of positive integers", c)
        values = sorted(set(values))
    if cfg.search.max is not None:
        values = [v for v in values if v <= cfg.search.max]
        if not values:
            raise ConfigError("search.max", "leaves no candidate batch size", cfg.search.max)
    n = cfg.task.get("n_samples")
    if isinstance(n, int) and n > 0:  # a batch larger than the data never runs: capped at the sample count
        values = sorted({min(v, n) for v in values})
    return values
