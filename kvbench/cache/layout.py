"""One forward's layout: which slot each token is written to, what each query may see, its positions.

A forward processes a (B, T) chunk in which sample b's r_b real tokens are right-aligned (pads to
their left: `right_aligned`). `layout_forward` computes, on the CPU and once for all the layers of a
group, where each real token is written (slots n_b .. n_b + r_b - 1; pads go to the scratch slot C),
and the mask: query i of sample b sees slot c iff c <= n_before_b + j_i (j_i its index among the
sample's new tokens; causal inside the chunk, every kept pair before it), slot 0 always, so a pad row
is never empty (pad rows are discarded). In a windowed group (W) the slots hold consecutive positions,
so the window is a band on slots: query i also needs c > n_before_b + j_i - W (its own token and the
W - 1 before it, transformers' `sliding_window_overlay`). `upload` moves every group's layout of one device there
in one non-blocking copy (`to_device`: no stream sync) and `step` makes a group's `Step` of it, the object
attention and writes read. The serving engine lays out its packed forwards the same way
(`kvbench.serve.pool.Layout` uses `right_aligned`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Step:
    """Per-forward state shared by all layers of one group, on its device."""

    b_idx: torch.Tensor  # (B, T) sample index of each chunk token
    slot: torch.Tensor  # (B, T) slot each token is written to (C = scratch for pads)
    positions: torch.Tensor  # (B, T) int32 true positions (0 for pads)
    real: torch.Tensor  # (B, T) bool: token is a real (non-pad) query
    all_real: bool  # no pad query in this forward (known on the CPU: no device sync to test it)
    active: torch.Tensor  # (B,) bool: sample has at least one real token in this chunk
    mask: torch.Tensor | None  # (B, 1, T, N) bool, None when not needed
    causal: bool  # use SDPA's is_causal instead of a mask
    n_keys: int  # N = max count after the write
    seqlens: torch.Tensor  # (B,) int32 count per sample after the write (flash-attn's cache_seqlens)
    q_src: torch.Tensor | None = None  # (B, W) source of each kept query in cat(kept queries, chunk)
    window: int | None = None  # the group's sliding window (the mask is a band; flash gets window_size)
    longest: int = 0  # the most tokens a sample has processed after this forward


def right_aligned(r: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(real, j), both (R, width): whether each column holds a real token of row b (its r_b tokens are the
    last r_b columns) and the token's index among the row's new tokens (negative for pads)."""
    j = torch.arange(width, device="cpu")[None, :] - (width - r.to(torch.long))[:, None]
    return j >= 0, j


def layout_forward(groups, seen: torch.Tensor, r: torch.Tensor, width: int) -> tuple[dict, list[dict]]:
    """The CPU layout of one forward: what every group shares and each group's own (its counts advance).

    groups: the cache's groups (their `n` are updated to the counts after the write); seen (B,): real
    tokens processed per sample before this forward.
    """
    B, T = len(seen), width
    r = r.to(torch.long)
    real, j = right_aligned(r, T)
    positions = torch.where(real, seen[:, None] + j, torch.zeros_like(j))
    shared = dict(b_idx=torch.arange(B, device="cpu")[:, None].expand(B, T), positions=positions.to(torch.int32), real=real,
                  all_real=bool(real.all()), active=r > 0, T=T, j=j, longest=int((seen + r).max()))
    per_group = []
    for g in groups:
        n_old, n_new = g.n, g.n + r
        n_keys = int(n_new.max())
        if n_keys > g.capacity:
            raise RuntimeError(f"KV cache overflow: {n_keys} pairs > capacity {g.capacity}")
        uniform = bool((n_new == n_keys).all())
        causal = bool((n_old == 0).all() and (r == T).all()) and T > 1
        need_mask = not (causal or (T == 1 and uniform))
        band = g.sliding is not None and n_keys > g.sliding  # some query has a key outside its window
        if band:
            need_mask, causal = True, False
        per_group.append(dict(
            slot=torch.where(real, n_old[:, None] + j, torch.full_like(j, g.capacity)),
            thresh=(n_new - T) if need_mask else None,  # slot c visible to chunk row i iff c - i <= thresh
            causal=causal,
            n_keys=n_keys,
            seqlens=n_new.to(torch.int32),
            window=g.sliding if band else None,
            flash_window=g.sliding,
        ))
        g.n = n_new
    return shared, per_group


def visible(thresh: torch.Tensor, T: int, N: int, window: int | None) -> torch.Tensor:
    """(B, T, N) bool: chunk row i of sample b sees slot c iff c - i <= thresh_b (and c - i > thresh_b - W in a band).

    The mask is the one (B, T, N) tensor allocated (what the memory account charges): the comparison writes bools
    straight from (B, T) and (N,) vectors, and the band is cut in place. A slot c is out of row i's window iff
    slot c + W is visible to it, so the band is M[c] xor M[c + W]; the blocks of W slots are cut left to right,
    each before the block it reads is (at most 1 + T / W blocks: a windowed group holds W - 1 + T slots).
    """
    last = torch.arange(T, device=thresh.device)[None, :] + thresh[:, None]  # (B, T): the last slot each row sees
    mask = torch.arange(N, device=thresh.device) <= last[:, :, None]  # (B, T, N)
    if window is not None:
        for c in range(0, N - window, window):
            w = min(window, N - window - c)
            mask[..., c : c + w] ^= mask[..., c + window : c + window + w]
    return mask


def to_device(parts: dict[str, torch.Tensor | None], device: torch.device,
              pack: bool | None = None) -> dict[str, torch.Tensor | None]:
    """Host tensors (integer or bool) moved to `device` in ONE copy that never waits for the device.

    A blocking host-to-device copy waits for every kernel queued before it (a stream sync on CUDA); this one
    packs the parts into one int64 buffer, pinned on CUDA, copied with non_blocking=True, and unpacks views
    on the device: the number of copies per forward does not grow with the groups of layers or the policy.
    On the CPU (`pack` defaults to False there) each part is its own no-op non-blocking `.to`.
    """
    device = torch.device(device)
    if not (device.type != "cpu" if pack is None else pack):
        return {k: None if x is None else x.to(device, non_blocking=True) for k, x in parts.items()}
    keys = [k for k, x in parts.items() if x is not None]
    flat = torch.cat([parts[k].reshape(-1).to(torch.long) for k in keys]) if keys else torch.zeros(0, dtype=torch.long, device="cpu")
    if device.type == "cuda":
        flat = flat.pin_memory()  # the caching host allocator keeps it alive until the copy has run
    flat = flat.to(device, non_blocking=True)
    out, o = dict.fromkeys(parts), 0
    for k in keys:
        x = parts[k]
        out[k] = flat[o : o + x.numel()].view(x.shape).to(x.dtype)
        o += x.numel()
    return out


def upload(shared: dict, mine: list[dict], device: torch.device) -> dict:
    """One forward's index tensors for every group on `device` (`mine`: those groups' layouts), in one copy."""
    parts = {k: shared.get(k) for k in ("positions", "real", "active", "q_src")}
    for i, m in enumerate(mine):
        parts.update({f"slot{i}": m["slot"], f"seqlens{i}": m["seqlens"], f"thresh{i}": m["thresh"]})
    return to_device(parts, device)


def device_steps(forward_layout: tuple, groups, device: torch.device) -> dict[int, Step]:
    """The Steps of every group on `device` ({group index: Step}), from one `upload`."""
    shared, per_group = forward_layout
    mine = [g for g in groups if g.device == device]
    dev = upload(shared, [per_group[g.index] for g in mine], device)
    return {g.index: step(shared, per_group[g.index], device, dev, i) for i, g in enumerate(mine)}


def step(shared: dict, mine: dict, device: torch.device, dev: dict | None = None, i: int = 0) -> Step:
    """A group's layout (`layout_forward`'s shared and own parts) on its device; `dev`: `upload`'s tensors, the
    group's own at index i (made here when not given)."""
    if dev is None:
        dev, i = upload(shared, [mine], device), 0
    B, T = shared["real"].shape
    mask = None
    if mine["thresh"] is not None:
        mask = visible(dev[f"thresh{i}"], shared["T"], mine["n_keys"], mine["window"])
        if mine["window"] is not None:
            mask[:, :, 0] |= ~dev["real"]  # pad rows see slot 0 (never empty; discarded)
        else:
            mask[:, :, 0] = True
        mask = mask[:, None]  # (B, 1, T, N)
    return Step(
        b_idx=torch.arange(B, device=device)[:, None].expand(B, T),
        slot=dev[f"slot{i}"],
        positions=dev["positions"],
        real=dev["real"],
        all_real=shared["all_real"],
        active=dev["active"],
        mask=mask,
        causal=mine["causal"],
        n_keys=mine["n_keys"],
        seqlens=dev[f"seqlens{i}"],
        q_src=dev["q_src"],
        window=mine["flash_window"],
        longest=shared["longest"],
    )
