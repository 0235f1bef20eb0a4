"""Budget arithmetic of a policy's knobs: how many pairs a (layer, sample, KV head) may hold, what an eviction keeps,
how many slots the cache preallocates. Pure functions of the policy's knobs (duck-typed: this module never imports
kvbench.policies), read through `kvbench.budgets` by the cache, the schedule, the memory account and serve mode.

Budgets: `kv_size` pairs per (layer, sample); or per sample, `kv_ratio` (ceil(ratio x its prompt length))
or `compression_ratio` (kvpress's kept count, int(prompt length x (1 - compression_ratio))): samples of
one batch then hold different budgets. A budget is never below `min_budget` (evict_every + the protected
pairs + 1: an eviction must leave a choice; 1 under after_prefill, which keeps exactly the budget).
The policy's layer rule (kvbench.budgets.rule: uniform, or PyramidKV's pyramid) gives layers their budgets
(`layer_budgets`, spanning the layers the policy compresses); `recent_pairs` says how many of the newest pairs a
budget protects (`protect_recent=None`: half of it, H2O). The slots the cache preallocates (`capacities`) are what
each sample's budget needs, never more than the sample can hold (its prompt + new tokens), the largest head's under
the policy's head rule (`head_budget`: uniform, or AdaKV's adaptive split).
"""

from __future__ import annotations

import math

import torch

from kvbench.budgets.rule import head_rule, layer_rule
from kvbench.errors import ConfigError

AFTER_PREFILL = "after_prefill"  # compress the prompt once, right after prefill, then keep every generated token
SCHEDULES = ("prefill_and_decode", "decode_only", AFTER_PREFILL)


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate(policy) -> None:
    """Check (and normalise) the budget knobs of `policy`: ConfigError naming the key on bad input; then its layer
    rule's checks. First what the policy declares it refuses (`after_prefill_only`, `uniform_heads_only`)."""
    if policy.after_prefill_only and policy.schedule != AFTER_PREFILL:
        raise ConfigError("policy.schedule", f"{policy.name} {policy.after_prefill_only}: use "
                          "policy.schedule=after_prefill", policy.schedule)
    if policy.uniform_heads_only and policy.head_budget != "uniform":
        raise ConfigError("policy.head_budget", f"{policy.name} {policy.uniform_heads_only}", policy.head_budget)
    _validate_knobs(policy)
    layer_rule(policy).validate(policy)


def _validate_knobs(policy) -> None:
    p = "policy"
    if policy.kv_ratio is not None:
        r = policy.kv_ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not (0 < r <= 1):
            raise ConfigError(f"{p}.kv_ratio", "must be a share of the prompt in (0, 1], or null", r)
        policy.kv_ratio = float(r)
        policy.kv_size = None  # the budget is per prompt: kv_ratio replaces kv_size
    if policy.compression_ratio is not None:
        cr = policy.compression_ratio
        if isinstance(cr, bool) or not isinstance(cr, (int, float)) or not (0 <= cr < 1):
            raise ConfigError(f"{p}.compression_ratio", "must be the share of the prompt evicted, in [0, 1), or "
                              "null", cr)
        if policy.kv_ratio is not None:
            raise ConfigError(f"{p}.compression_ratio", "and policy.kv_ratio both give a budget per prompt: "
                              "set one", cr)
        policy.compression_ratio = float(cr)
        policy.kv_size = None  # the budget is per prompt: compression_ratio replaces kv_size
    if policy.kv_size is not None and (not is_int(policy.kv_size) or policy.kv_size <= 0):
        raise ConfigError(f"{p}.kv_size", "must be a positive integer", policy.kv_size)
    if not is_int(policy.evict_every) or policy.evict_every <= 0:
        raise ConfigError(f"{p}.evict_every", "must be a positive integer", policy.evict_every)
    if policy.schedule not in SCHEDULES:
        raise ConfigError(f"{p}.schedule", f"must be one of {', '.join(SCHEDULES)}", policy.schedule)
    if not isinstance(policy.rerotate, bool):
        raise ConfigError(f"{p}.rerotate", "must be true or false", policy.rerotate)
    validate_heads(policy)
    for key in ("protect_first", "protect_recent"):
        v = getattr(policy, key)
        if not is_int(v) or v < 0:
            raise ConfigError(f"{p}.{key}", "must be a non-negative integer", v)
    k, guard = policy.kv_size, policy.protect_first + policy.protect_recent
    if k is None:
        return
    if policy.once:  # one compression to exactly the budget: the protected pairs must fit it
        if guard > k:
            raise ConfigError(f"{p}.protect_recent", f"protect_first + protect_recent = {guard} must not exceed "
                              f"kv_size = {k}", policy.protect_recent)
        return
    if policy.evict_every >= k:
        raise ConfigError(f"{p}.evict_every", f"must be smaller than policy.kv_size={k} (an eviction must leave "
                          "pairs)", policy.evict_every)
    if guard > k - policy.evict_every:
        raise ConfigError(f"{p}.protect_recent", f"protect_first + protect_recent = {guard} must not exceed "
                          f"kv_size - evict_every = {k - policy.evict_every}", policy.protect_recent)


def validate_heads(policy) -> None:
    """`head_budget` (a head rule's name, kvbench.budgets.rule) and `head_floor`; then the rule's own checks."""
    floor = policy.head_floor
    rule = head_rule(policy)  # ConfigError naming policy.head_budget for an unknown rule
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not (0 <= floor <= 1):
        raise ConfigError("policy.head_floor", "must be the share of a head's budget it keeps at least, in [0, 1]",
                          floor)
    policy.head_floor = float(floor)
    rule.validate(policy)


def keep(policy, budget):
    """Pairs a sample keeps (per head, on average over heads) after an eviction under `budget`: |kv| - p
    (Algorithm 1), or the budget itself under after_prefill (one compression to exactly the budget)."""
    return budget if policy.once else budget - policy.evict_every


def min_budget(policy) -> int:
    """The smallest budget an eviction can honour: evict_every pairs go, the protected ones and one more stay
    (after_prefill keeps exactly the budget: 1). `protect_recent=None` (H2O: half the budget protected):
    ceil(k / 2) beyond the protected half, p + the sinks + 1."""
    if policy.once:
        return 1
    if policy.protect_recent is None:
        return 2 * (policy.evict_every + policy.protect_first) + 1
    return policy.evict_every + policy.protect_first + policy.protect_recent + 1


def recent_pairs(policy, budgets: torch.Tensor) -> torch.Tensor:
    """The newest pairs protected in samples holding these budgets (same shape): `protect_recent`, or half the
    budget when it is None (H2O)."""
    if policy.protect_recent is None:
        return budgets // 2
    w = head_rule(policy).recent(policy)  # a rule's own window (threshold: DMS's)
    return torch.full_like(budgets, policy.protect_recent if w is None else w)


def sample_budgets(policy, lengths: list[int]) -> torch.Tensor:
    """(B,) pairs each sample may hold: kv_size, or ceil(kv_ratio x its prompt length), or int(its prompt
    length x (1 - compression_ratio)), at least min_budget; or the head rule's own (`HeadRule.budgets`)."""
    if (own := head_rule(policy).budgets(policy, lengths)) is not None:
        return own
    if policy.kv_ratio is not None:
        want = [math.ceil(policy.kv_ratio * s) for s in lengths]
    elif policy.compression_ratio is not None:
        want = [int(s * (1 - policy.compression_ratio)) for s in lengths]
    elif policy.kv_size is None:  # no budget knob (DuoAttention: its layer rule alone sets the budgets): the prompt
        return torch.tensor(lengths, dtype=torch.long, device="cpu")
    else:
        return torch.full((len(lengths),), policy.kv_size, dtype=torch.long, device="cpu")
    least = min_budget(policy)
    return torch.tensor([max(least, k) for k in want], dtype=torch.long, device="cpu")


def layer_budgets(policy, lengths: list[int], layers: int, compressed: list[int] | None = None) -> torch.Tensor | None:
    """(L, B) pairs layer l of sample b may hold (per head, on average); None for the full cache: the policy's layer
    rule (kvbench.budgets.rule) over the samples' budgets. `compressed`: the layers the policy compresses (None: all;
    windowed layers hold their window, kvbench.models.family): the rule spans those alone (PyramidKV's pyramid over
    them, so their mean is the nominal budget); the others carry the sample's budget, never read."""
    if not policy.evicts:
        return None
    per_sample = sample_budgets(policy, lengths)  # (B,)
    rule = layer_rule(policy)
    if compressed is None:
        return rule.budgets(policy, per_sample, layers, lengths)
    out = per_sample[None, :].expand(layers, -1).clone()  # (L, B)
    if compressed:
        out[list(compressed)] = rule.budgets(policy, per_sample, len(compressed), lengths)
    return out


def head_slots(policy, pairs, heads: int | None):
    """The most pairs one KV head may hold when its layer keeps `pairs` per head on average (the head rule's)."""
    return head_rule(policy).slots(policy, pairs, heads)


def decode_capacity(policy, budget, max_new_tokens: int, heads: int | None = None):
    """Slots a layer needs once the prompt is compressed to `budget` (an int or a tensor): the budget, or under
    after_prefill the budget and every generated token; the largest head's count under adaptive head budgets."""
    if policy.once:
        return head_slots(policy, budget, heads) + max_new_tokens
    k = keep(policy, budget)
    return head_slots(policy, k, heads) + (budget - k)  # kept after an eviction, then p more come


def capacities(policy, lengths: list[int], max_new_tokens: int, budgets: torch.Tensor | None,
               heads: int | None = None) -> list[int]:
    """Slots to preallocate per layer (all samples alike: the cache is one tensor per group of layers);
    budgets: the (L, B) `layer_budgets`. A sample needs its budget's `decode_capacity` (and its whole prompt
    first unless the policy evicts in prefill), never more than it can hold: its prompt + max_new_tokens (a
    budget above that never evicts, and costs what the full cache does). A layer's capacity is the most over
    its samples."""
    whole = torch.tensor(lengths, dtype=torch.long, device="cpu") + max_new_tokens  # (B,) a sample's every token
    if budgets is None:
        return [int(whole.max())]
    need = decode_capacity(policy, budgets.to(torch.long).cpu(), max_new_tokens, heads)  # (L, B)
    if not policy.evicts_in_prefill:
        need = torch.maximum(need, whole[None] - max_new_tokens)  # the whole prompt first
    return torch.minimum(need, whole[None]).max(dim=1).values.tolist()  # (L,)
