"""Budget arithmetic of a policy: how many pairs a (layer, sample, KV head) may hold, what an eviction keeps,
how many slots the cache preallocates. Pure functions of the policy's knobs (duck-typed: this module never
imports kvbench.policies), read through `kvbench.budgets.Budgets` by the cache, the schedule and the memory
account.

Budgets: `kv_size` pairs per (layer, sample); or per sample, `kv_ratio` (ceil(ratio x its prompt length))
or `compression_ratio` (kvpress's kept count, int(prompt length x (1 - compression_ratio))): samples of
one batch then hold different budgets. A budget is never below `min_budget` (evict_every + the protected
pairs + 1: an eviction must leave a choice; 1 under after_prefill, which keeps exactly the budget).
A policy may give layers different budgets (`layer_budgets`, PyramidKV: a rule in its own file, spanning the
layers the policy compresses); `recent_pairs` says how many of the newest pairs a budget protects
(`protect_recent=None`: half of it, H2O). The slots the cache preallocates (`capacities`) are what each sample's
budget needs, never more than the sample can hold (its prompt + new tokens).

Head budgets (`head_budget`): `uniform`, every KV head of a layer holds the layer's budget; `adaptive`
(AdaKV, kvbench.budgets.adakv): a layer keeps its budget x heads pairs chosen by score across its heads, each
head at least `head_floor` of the budget, so one head may hold up to `head_slots` pairs: the slots the cache
preallocates and the memory account charges.
"""

from __future__ import annotations

import math

import torch

from kvbench.errors import ConfigError

AFTER_PREFILL = "after_prefill"  # compress the prompt once, right after prefill, then keep every generated token
SCHEDULES = ("prefill_and_decode", "decode_only", AFTER_PREFILL)
HEAD_BUDGETS = ("uniform", "adaptive")


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate(policy) -> None:
    """Check (and normalise) the budget knobs of `policy`: ConfigError naming the key on bad input."""
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
    if once(policy):  # one compression to exactly the budget: the protected pairs must fit it
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
    """`head_budget` and `head_floor`; adaptive needs a score that is not the position."""
    hb, floor = policy.head_budget, policy.head_floor
    if hb not in HEAD_BUDGETS:
        raise ConfigError("policy.head_budget", f"must be one of {', '.join(HEAD_BUDGETS)}", hb)
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not (0 <= floor <= 1):
        raise ConfigError("policy.head_floor", "must be the share of a head's budget it keeps at least, in [0, 1]",
                          floor)
    policy.head_floor = float(floor)
    if hb == "adaptive" and policy.keeps_newest:
        raise ConfigError("policy.head_budget", f"{policy.name} keeps the newest pairs by position: adaptive head "
                          "budgets need a score that differs by head", hb)
    if hb == "adaptive" and not once(policy):
        raise ConfigError("policy.head_budget", "adaptive head budgets are chosen once, when the prompt is "
                          "compressed after prefill (AdaKV's protocol): use policy.schedule=after_prefill", hb)
    if hb == "adaptive" and policy.rerotate:
        raise ConfigError("policy.head_budget", "adaptive head budgets give heads different counts; "
                          "policy.rerotate needs one count (rotary positions are shared)", hb)


def evicts(policy) -> bool:
    return policy.kv_size is not None or policy.kv_ratio is not None or policy.compression_ratio is not None


def once(policy) -> bool:
    """schedule=after_prefill: one compression of the prompt, at the first decode step, to the budget."""
    return policy.schedule == AFTER_PREFILL


def keep(policy, budget):
    """Pairs a sample keeps (per head, on average over heads) after an eviction under `budget`: |kv| - p
    (Algorithm 1), or the budget itself under after_prefill (one compression to exactly the budget)."""
    return budget if once(policy) else budget - policy.evict_every


def min_budget(policy) -> int:
    """The smallest budget an eviction can honour: evict_every pairs go, the protected ones and one more stay
    (after_prefill keeps exactly the budget: 1). `protect_recent=None` (H2O: half the budget protected):
    ceil(k / 2) beyond the protected half, p + the sinks + 1."""
    if once(policy):
        return 1
    if policy.protect_recent is None:
        return 2 * (policy.evict_every + policy.protect_first) + 1
    return policy.evict_every + policy.protect_first + policy.protect_recent + 1


def recent_pairs(policy, budgets: torch.Tensor) -> torch.Tensor:
    """The newest pairs protected in samples holding these budgets (same shape): `protect_recent`, or half the
    budget when it is None (H2O)."""
    if policy.protect_recent is None:
        return budgets // 2
    return torch.full_like(budgets, policy.protect_recent)


def sample_budgets(policy, lengths: list[int]) -> torch.Tensor:
    """(B,) pairs each sample may hold: kv_size, or ceil(kv_ratio x its prompt length), or int(its prompt
    length x (1 - compression_ratio)), at least min_budget."""
    if policy.kv_ratio is not None:
        want = [math.ceil(policy.kv_ratio * s) for s in lengths]
    elif policy.compression_ratio is not None:
        want = [int(s * (1 - policy.compression_ratio)) for s in lengths]
    else:
        return torch.full((len(lengths),), policy.kv_size, dtype=torch.long, device="cpu")
    least = policy.min_budget
    return torch.tensor([max(least, k) for k in want], dtype=torch.long, device="cpu")


def layer_budgets(policy, lengths: list[int], layers: int, compressed: list[int] | None = None) -> torch.Tensor | None:
    """(L, B) pairs layer l of sample b may hold (per head, on average); None for the full cache. The policy's
    own `layer_budgets` rule when it has one (PyramidKV), else the sample's budget in every layer. `compressed`:
    the layers the policy compresses (None: all; windowed layers hold their window, kvbench.models.family): the
    rule spans those alone (PyramidKV's pyramid over them, so their mean is the nominal budget); the others
    carry the sample's budget, never read."""
    if not evicts(policy):
        return None
    per_sample = sample_budgets(policy, lengths)  # (B,)
    if compressed is None:
        return policy.layer_budgets(per_sample, layers, lengths)
    out = per_sample[None, :].expand(layers, -1).clone()  # (L, B)
    if compressed:
        out[list(compressed)] = policy.layer_budgets(per_sample, len(compressed), lengths)
    return out


def head_slots(policy, pairs, heads: int | None):
    """The most pairs one KV head may hold when its layer keeps `pairs` per head on average (an int or a tensor):
    `pairs` under uniform budgets; under adaptive ones every other head at its floor, int(pairs x head_floor)
    (kvpress's `n_safe`), so heads x pairs - (heads - 1) x floor. `heads=None`: the model's count is unknown,
    no bound but the pairs held before the eviction (the caller's capacity)."""
    if policy.head_budget != "adaptive":
        return pairs
    if heads is None:
        raise ValueError("head_budget=adaptive: the slots a head may hold depend on the KV heads (pass heads=)")
    if isinstance(pairs, torch.Tensor):
        floor = (pairs.double() * policy.head_floor).floor().long()
    else:
        floor = int(pairs * policy.head_floor)
    return heads * pairs - (heads - 1) * floor


def decode_capacity(policy, budget, max_new_tokens: int, heads: int | None = None):
    """Slots a layer needs once the prompt is compressed to `budget` (an int or a tensor): the budget, or under
    after_prefill the budget and every generated token; the largest head's count under adaptive head budgets."""
    if once(policy):
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


def head_extensions(policy) -> list[str]:
    """The run's `extensions` under adaptive head budgets: the rule and how kvbench departs from it."""
    return [f"head_budget=adaptive: AdaKV's allocation (kvpress's AdaKVPress): a layer keeps budget x KV heads "
            f"pairs chosen by score across its heads, each head at least int(budget x {policy.head_floor:g}) "
            "(head_floor, kvpress's alpha_safeguard); the cache holds each head's pairs packed, its memory sized "
            "by the largest head (kvpress keeps every pair and masks the evicted keys)"]
