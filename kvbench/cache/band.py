"""Windowed layers a policy compresses: a budget below a layer's sliding window W (kvbench.models.family's
`split_windows`) makes the layer the policy's, and its window still bounds what a query sees.

Such a group (`band` W) is stored, scored and evicted like a full-attention group, so its slots no longer hold
consecutive positions and the window cannot be a band on slots (kvbench.cache.layout). Instead each layer's mask
also requires the key's own position inside the query's window (`band_step`: q_pos - k_pos < W, transformers'
`sliding_window_overlay`), per KV head since heads keep different positions: (B, H_kv, T, N). An eviction ranks
the pairs no later query can see (position <= the next query's - W) below every visible one (`out_of_window`),
so the window bounds what the layer keeps. The flash backend applies windows on slots only: refused for these
groups.
"""

from __future__ import annotations

import dataclasses

import torch

from kvbench.attention.unsupported import UnsupportedBackend

LOWEST = torch.finfo(torch.float32).min  # below every visible pair's rank, above an empty slot's -inf


def split_groups(runs: list[tuple], bands: list[int | None] | None) -> list[tuple]:
    """`form_groups`' runs split where the layers' bands differ: [(run, band W or None)]."""
    out: list[tuple] = []
    for dev, layers, cap, row, w in runs:
        start = len(out)
        for layer in layers:
            b = None if bands is None else bands[layer]
            if len(out) > start and out[-1][1] == b:
                out[-1][0][1].append(layer)
            else:
                out.append(((dev, [layer], cap, row, w), b))
    return out


def where(groups, runs: list[tuple], num_layers: int) -> list:
    """Each group's band set from its run; per model layer its (group, index in it), None for a linear layer."""
    out: list = [None] * num_layers
    for g, (_, b) in zip(groups, runs, strict=True):
        g.band = b  # a compressed windowed group: its window masks by position
        for i, layer in enumerate(g.layers):
            out[layer] = (g, i)
    return out


def check_backend(groups, backend: str) -> None:
    """The flash backend applies a window on slots: refused where a band group needs it by position."""
    if backend == "flash" and any(g.band for g in groups):
        raise UnsupportedBackend(backend, "windowed layers compressed by the policy mask their window by position")


def layout(cache, layer: int):
    """`cache.step_for(layer)` as attention sees it, after the layer's write: a band group masks each query's
    window (built once per layer and forward)."""
    g, i = cache._where[layer]
    if not g.band:
        return cache.step_for(layer)
    if ("band", layer) not in cache._steps:
        cache._steps[("band", layer)] = band_step(cache.step_for(layer), g, i)
    return cache._steps[("band", layer)]


def band_step(step, g, i: int):
    """Layer i of band group `g` this forward: the group's Step with each key outside its query's window masked.
    Built after the layer's write (the chunk's positions are in `g.pos`)."""
    N, T = step.n_keys, step.real.shape[1]
    pos = g.pos[i][:, :, :N]  # (B, H, N) position of each held pair (this chunk's included)
    inside = pos[:, :, None, :] > step.positions[:, None, :, None] - g.band  # (B, H, T, N)
    if step.mask is not None:
        base = step.mask  # (B, 1 or H, T, N)
    elif step.causal:
        base = (torch.arange(N, device=g.device)[None, :] <= torch.arange(T, device=g.device)[:, None])[None, None]
    else:  # one uniform decode token: every held slot
        base = torch.ones(1, 1, T, N, dtype=torch.bool, device=g.device)
    mask = base & inside
    mask[..., 0] |= ~step.real[:, None, :]  # a pad row sees slot 0 (never empty; discarded)
    return dataclasses.replace(step, mask=mask, causal=False, window=g.band)


def out_of_window(ranked: torch.Tensor, pos: torch.Tensor, last: torch.Tensor, band: int) -> torch.Tensor:
    """`ranked` (L, B', H, N) with the pairs no later query sees (pos <= last + 1 - W) ranked last of the held."""
    gone = (pos <= last + 1 - band) & (ranked > -float("inf"))
    return ranked.masked_fill(gone, LOWEST)
