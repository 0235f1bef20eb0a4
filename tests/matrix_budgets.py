"""The matrix oracle's arithmetic of a serving request's budget, written from the docs, not from kvbench's code.

docs/serving.md ("Checks and refusals") and docs/matrix.md ("Refused, and why"): under a schedule that evicts
while a request runs, serve mode
refuses a `policy.kv_size` that is no whole number of blocks, and a budget, `kv_size` or a request's own
per-prompt one, below its start blocks (`protect_first` rounded up to blocks) + its recent pairs + one block:
the request could never feed a token. Under `after_prefill` the one compression evicts whole blocks past the
start blocks and older than the recent pairs: a budget below what they leave is refused (it could not reach it).

The budgets (docs/policies.md, "Budgets" and "pyramidkv"): `kv_ratio` gives a prompt of q tokens ceil(ratio x q)
pairs, `compression_ratio` int(q x (1 - ratio)); no budget is below `min_budget`, p + the protected pairs + 1
(`protect_recent=null`: half the budget, H2O, or the window, SnapKV), or 1 under `after_prefill`. PyramidKV (the policy with `beta`) gives
each layer its own: m = the per-layer budget (kvpress's q x (1 - ratio), unrounded), min = m / beta,
max = 2m - min, max capped at q - window (then min = 2m - max); unless q >= max >= min >= window, every layer
keeps the per-prompt budget, else layer l keeps round(max - l (max - min) / (L - 1)), each at least `min_budget`.
`keys` is the policy's config as the combination runs it (its own file, the command line's `policy.*`, a preset).
"""

from __future__ import annotations

import math


def recent(keys: dict, budget: int) -> int:
    """The newest pairs a budget protects: `protect_recent`, or when null the window (SnapKV) or half (H2O)."""
    if keys["protect_recent"] is not None:
        return keys["protect_recent"]
    return keys["window"] if "window" in keys else budget // 2


def min_budget(keys: dict) -> int:
    """p + the protected pairs + 1 (half the budget protected: b - b // 2 >= p + sinks + 1); 1 under after_prefill
    (one compression to exactly the budget)."""
    if keys["schedule"] == "after_prefill":
        return 1
    p = keys["evict_every"] or keys["kv_size"] - 1  # extreme_decode: p is always kv_size - 1
    if keys["protect_recent"] is None and "window" not in keys:
        return 2 * (p + keys["protect_first"]) + 1
    return p + keys["protect_first"] + recent(keys, 0) + 1


def layer_budgets(keys: dict, kind: str, prompt: int, layers: int) -> list[int]:
    """The budget of each layer for a prompt of `prompt` tokens under the per-prompt budget `kind`."""
    ratio = keys[kind]
    m = math.ceil(ratio * prompt) if kind == "kv_ratio" else prompt * (1 - ratio)
    floor = min_budget(keys)
    sample = max(floor, m if kind == "kv_ratio" else int(m))
    if "beta" not in keys:
        return [sample] * layers
    assert keys.get("budget_rule", "published") == "published", keys  # the docs' rule (window_plus: not on the axes)
    w, lo = keys["window"], m / keys["beta"]
    hi = 2 * m - lo
    if hi >= prompt - w:
        hi = prompt - w
        lo = 2 * m - hi
    if not (prompt >= hi >= lo >= w):
        return [sample] * layers
    step = (hi - lo) / (layers - 1) if layers > 1 else 0.0
    return [max(floor, round(hi - layer * step)) for layer in range(layers)]


def kept_once(prompt: int, budget: int, start: int, recent: int, block: int) -> int:
    """Pairs left by after_prefill's one compression of a `prompt`-token request: the fewest whole blocks that
    reach the budget, among the full blocks past the `start` pairs and older than the `recent` newest."""
    evictable = max(0, (prompt - recent) // block - start // block)
    return prompt - min(max(0, -(-(prompt - budget) // block)), evictable) * block


def refused_key(keys: dict, kind: str, prompts: tuple[int, ...], layers: int, block: int) -> str | None:
    """The key serve mode refuses this budget with (module docstring), or None. `kind`: kv_size, kv_ratio or
    compression_ratio."""
    start = -(-keys["protect_first"] // block) * block
    if keys["schedule"] == "after_prefill":  # one compression: whole blocks between the start and recent areas
        budgets = [(q, [keys["kv_size"]] * layers if kind == "kv_size" else layer_budgets(keys, kind, q, layers))
                   for q in prompts]
        small = any(kept_once(q, b, start, recent(keys, b), block) > b for q, bs in budgets for b in bs)
        return f"policy.{kind}" if small else None
    if kind == "kv_size":
        kv = keys["kv_size"]
        if kv % block:
            return "serve.block_size"  # counted in whole blocks first
        return "policy.kv_size" if kv < start + recent(keys, kv) + block else None
    small = any(b < start + recent(keys, b) + block for q in prompts for b in layer_budgets(keys, kind, q, layers))
    return f"policy.{kind}" if small else None
