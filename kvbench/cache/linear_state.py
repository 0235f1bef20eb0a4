"""A hybrid model's linear-attention layers inside kvbench's cache: transformers' own `LinearAttentionLayer`.

kvbench stores, scores and evicts K/V only. At a linear layer index (Gated-DeltaNet, kvbench.models.family.hybrid)
the `KVCache` holds a `LinearAttentionLayer` that the model's own layer fills through `Cache.update_conv_state` /
`update_recurrent_state` (lazily, at the first forward): its conv state (B, conv_dim, K) and recurrent state
(B, Hv, dk, dv), one per sequence whatever its length, never evicted. The attention layers are indexed apart
(`attention_layers`): their groups, budgets and windows are those of the attention layers only.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import LinearAttentionLayer

from kvbench.cache import band
from kvbench.cache.storage import form_groups


def attention_layers(num_layers: int, linear) -> list[int]:
    """The decoder layers that hold K/V (every layer but the linear ones)."""
    lin = set(linear or ())
    return [i for i in range(num_layers) if i not in lin]


def attention_groups(layer_devices, caps: list[int], budgets, windows, linear) -> list[tuple]:
    """`form_groups` over the attention layers only (a hybrid's linear layers hold no K/V and do not split a run of
    attention layers), with the model's layer indices; `caps` one per layer or one for all."""
    if not linear:
        return form_groups(layer_devices, caps, budgets, windows)
    attn = attention_layers(len(layer_devices), linear)
    pick = lambda xs: None if xs is None else [xs[i] for i in attn]  # noqa: E731
    groups = form_groups(pick(layer_devices), caps if len(caps) == 1 else pick(caps),
                         None if budgets is None else budgets[attn], pick(windows))
    return [(d, [attn[j] for j in ls], *rest) for d, ls, *rest in groups]


def build(layer_devices, caps, budgets, windows, bands, linear, rerotate: bool, make, shapes=None) -> tuple[dict, list, list]:
    """A cache's linear layers (`new_layers`), its groups of attention layers (`make(index, device, layers, capacity,
    budget row, window)` each; split where their bands or their `shapes` (per layer (H_kv, D), None: one for all)
    differ, kvbench.cache.band) and per model layer its (group, index in it), None for a linear layer."""
    runs = band.split_groups(attention_groups(layer_devices, caps, budgets, windows, linear), bands)
    runs = runs if shapes is None else split_shapes(runs, shapes)
    groups = [make(gi, *run) for gi, (run, _) in enumerate(runs)]
    if rerotate and len({tuple(g.budget.tolist()) for g in groups if g.budget is not None}) > 1:
        raise ValueError("policy.rerotate=true needs the same budget in every layer (rotary positions are shared)")
    return new_layers(linear), groups, band.where(groups, runs, len(layer_devices))


def split_shapes(runs: list[tuple], shapes: list) -> list[tuple]:
    """`split_groups`' runs split further where the layers' (H_kv, D) differ (Gemma 4: global layers have fewer,
    wider heads): a group's tensors have one shape."""
    out: list[tuple] = []
    for (dev, layers, cap, row, w), b in runs:
        for i, layer in enumerate(layers):
            if i and shapes[layer] == shapes[layers[i - 1]]:
                out[-1][0][1].append(layer)
            else:
                out.append(((dev, [layer], cap, row, w), b))
    return out


def new_layers(linear) -> dict[int, LinearAttentionLayer]:
    """A fresh, empty state for each linear layer (filled at the batch's first forward)."""
    return {i: LinearAttentionLayer() for i in linear or ()}


def released(linear: dict, layers: list) -> tuple[dict, list]:
    """A released cache's linear layers: fresh, empty ones in their place (their states freed)."""
    if not linear:
        return linear, layers
    fresh = new_layers(linear)
    return fresh, [fresh.get(i) or layer for i, layer in enumerate(layers)]


def nbytes(layers) -> int:
    """Bytes the linear layers' states hold now (conv and recurrent states of every sequence)."""
    return sum(t.numel() * t.element_size() for layer in layers for t in tensors(layer))


def tensors(layer: LinearAttentionLayer) -> list[torch.Tensor]:
    """The conv and recurrent states a linear layer holds (none before its first forward)."""
    return [t for t in [*layer.conv_states.values(), *layer.recurrent_states.values()] if t is not None]
