"""The actions before a forward, as the batch's plan (kvbench.batch_plan) gives them: window trims, then the
policy's evictions and a compressed prompt's resize, group by group of layers. Nothing is decided here: which
rows evict, down to what, and when a group shrinks are the plan's; the cache does the eviction itself."""

from __future__ import annotations

from kvbench.batch_plan import EVICT, RESIZE, TRIM, Step
from kvbench.cache import KVCache
from kvbench.cache.evict import trim_window
from kvbench.policies.policy import Policy


def execute(cache: KVCache, step: Step, policy: Policy, observer) -> None:
    """Run `step.before` on the cache: trims (windowed groups keep their window, whatever the policy), then, in the
    timed eviction section, the evictions and resizes; the observer sees the cache after them."""
    groups = cache.groups
    for a in step.before:
        if a.kind == TRIM:
            trim_window(groups[a.group], a.rows, a.keep, cache.gather_layers)
    if not step.evicts:
        return
    with cache.timer("evict", cache.devices):
        for a in step.before:
            if a.kind == EVICT:
                cache.evict(a.rows, a.keep, policy, group=groups[a.group])
            elif a.kind == RESIZE:  # a fit: what the rows hold + the tokens to come (a data-dependent rule's counts)
                g = groups[a.group]
                cache.resize(a.capacity if a.fit is None else min(a.capacity, int(g.n.max()) + a.fit), group=g)
                if policy.once and a.fit is None:  # the one compression is done: what only scores read goes
                    g.settle()  # (the account drops it at the same planned resize: kvbench.memory.accounting)
    if observer:
        observer("evict", cache)
