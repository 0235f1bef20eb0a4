"""The evicting KV cache: preallocated, compacted per sample, shrunk by a policy between forwards.

Layout (per layer; layers on the same device are stacked into one "group" tensor so eviction is
vectorised over layers, heads and samples):

    keys, values   (L_g, B, H_kv, C + 1, D)   slots [0, n_b) hold sample b's kept pairs,
                                              in position order; slot C is a scratch slot
                                              that receives the pad tokens of a chunk
    pos            (L_g, B, H_kv, C + 1)      source position of each slot (int32)
    sum_w, last_w  (L_g, B, H_kv, C + 1)      attention statistics (float32), only when the
                                              policy needs them
    q              (L_g, B, H_q, W, D)        the newest W queries (RoPE applied), oldest first, only
                                              when the policy has a `query_window` W (SnapKV); their
                                              positions are `KVCache.qpos` (B, W) on the CPU, -1 = empty
    k_src, rot     (L_g, B, H_kv, C + 1[, D]) with re-rotation only: each key as it was written and the
                                              rotary position it was written at (int32)

Every KV head of a layer of sample b holds the same count n_b (heads keep *different* positions),
so the attention mask depends only on the sample and broadcasts over heads (SDPA with GQA stays
usable). Layers that share a device, a capacity and a budget row (`budgets`, (L, B): the pairs each
layer of each sample may hold) form one group with one count per sample, one write plan and one mask
per forward; with the same budget everywhere (every policy but PyramidKV) that is one group per
device, and with per-layer budgets each layer is its own group with its own capacity (its memory is
its own budget's, not the largest layer's). Pad tokens are never stored: a forward writes only each sample's real tokens, at slots
n_b .. n_b + r_b - 1. KV memory is fixed when the cache is built (`capacity` slots) and only
changes through `resize` (a decode-only policy drops to kv_size slots once it has compressed).

RoPE re-rotation (`rope_inv_freq` given, `policy.rerotate=true`): a pair's rotary position is its
slot, always. An eviction compacts the kept pairs to slots [0, keep) and sets each kept key to its
key *as written* (`k_src`, rotated by the model at its write slot `rot`) rotated by (new slot - rot),
in float32 and rounded once: a key is never rotated again from an already rounded rotation, so in
half precision the error does not compound over evictions (rotating the cached key itself lost 7.6%
in bfloat16 after 64 evictions, 58% after 512). The price is one more key-sized buffer. New tokens
are rotated at their slots, i.e. continue from the kept count. `pos` keeps the source positions (what
policies score by); `begin_forward` returns the rotary positions for the model's `position_ids`.

The engine drives it: `begin_forward(r, positions)` before each forward pass (computes write
slots and the mask once for all layers), `evict(rows, keep, policy)` between forward passes, and
`release()` when the batch ends (returns or raises): the tensors go at once, whatever still refers to
the cache object (a traceback's frames, an observer). The layer views refer to the cache weakly, so a
cache forms no reference cycle and is freed by reference counting alone, never waiting for the cyclic
collector; `KVCache.live()` lists the caches still alive without asking the collector.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import ClassVar

import torch
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.models.llama.modeling_llama import rotate_half

from kvbench.policies.base import Policy, ScoreStats
from kvbench.timing import SectionTimer

INF = float("inf")


@dataclass
class Step:
    """Per-forward state shared by all layers on one device (built by `KVCache.begin_forward`)."""

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


class _Group:
    """Stacked storage for consecutive layers on one device that share a capacity and budgets.

    n: (B,) pairs held per sample by every layer of the group (CPU); budget: (B,) their budgets or None.
    """

    def __init__(self, layers, batch, heads, capacity, head_dim, dtype, device, track, q_heads=0, window=0,
                 budget=None, rerotate=False):
        self.layers = list(layers)
        self.device = torch.device(device)
        self.capacity = capacity
        self.budget = budget
        self.n = torch.zeros(batch, dtype=torch.long)
        L, S = len(self.layers), capacity + 1
        self.k = torch.zeros(L, batch, heads, S, head_dim, dtype=dtype, device=self.device)
        self.v = torch.zeros_like(self.k)
        self.pos = torch.zeros(L, batch, heads, S, dtype=torch.int32, device=self.device)
        self.sum_w = torch.zeros(L, batch, heads, S, dtype=torch.float32, device=self.device) if track else None
        self.last_w = torch.zeros_like(self.sum_w) if track else None
        self.q = torch.zeros(L, batch, q_heads, window, head_dim, dtype=dtype, device=self.device) if window else None
        self.k_src = torch.zeros_like(self.k) if rerotate else None  # keys as written (re-rotation's source)
        self.rot = torch.zeros_like(self.pos) if rerotate else None  # the rotary position each was written at

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every per-slot tensor an eviction compacts (K/V-like ones have a last dimension D)."""
        t = {"k": self.k, "v": self.v, "pos": self.pos}
        if self.sum_w is not None:
            t.update(sum_w=self.sum_w, last_w=self.last_w)
        if self.k_src is not None:
            t.update(k_src=self.k_src, rot=self.rot)
        return t

    def nbytes(self) -> int:
        extra = [self.q] if self.q is not None else []
        return sum(x.numel() * x.element_size() for x in [*self.tensors().values(), *extra])


class _LayerView(CacheLayerMixin):
    """What transformers sees for one layer: `update` writes the chunk and returns the kept pairs."""

    is_sliding = False

    def __init__(self, cache: KVCache, layer_idx: int):
        super().__init__()
        self._cache = weakref.ref(cache)  # a strong reference would make a cycle: cache.layers -> view -> cache
        self.layer_idx = layer_idx
        self.is_initialized = True

    @property
    def cache(self) -> KVCache:
        cache = self._cache()
        if cache is None:
            raise RuntimeError("the KV cache of this layer view no longer exists")
        return cache

    def lazy_initialization(self, key_states, value_states) -> None:  # storage is preallocated
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        return self.cache.write(self.layer_idx, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.step_keys, 0

    def get_seq_length(self) -> int:
        return int(self.cache.group_of(self.layer_idx).n.max())

    def get_max_length(self) -> int:
        return self.cache.group_of(self.layer_idx).capacity


def layout(layer_devices, capacities: list[int], budgets: torch.Tensor | None) -> list[tuple]:
    """The cache's groups: [(device, layers, capacity, budget row (B,) or None)] of consecutive layers
    sharing all three (kvbench.memory's account builds the same list)."""
    L = len(layer_devices)
    caps = list(capacities) * L if len(capacities) == 1 else list(capacities)
    if len(caps) != L or (budgets is not None and budgets.shape[0] != L):
        raise ValueError("one capacity (or one for all) and one budget row per layer")
    runs: list[tuple] = []
    for layer, dev in enumerate(layer_devices):
        dev = torch.device(dev)
        row = None if budgets is None else budgets[layer]
        if runs and runs[-1][0] == dev and runs[-1][2] == caps[layer] and (
                row is None or torch.equal(runs[-1][3], row)):
            runs[-1][1].append(layer)
        else:
            runs.append((dev, [layer], caps[layer], row))
    return runs


class KVCache(Cache):
    """See the module docstring. `layer_devices[l]` is the device of decoder layer l."""

    _live: ClassVar[weakref.WeakSet] = weakref.WeakSet()  # every cache not yet freed (no gc needed to find them)

    def __init__(
        self,
        *,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int | list[int],
        dtype: torch.dtype,
        layer_devices: list[torch.device | str],
        track_attention: bool = False,
        gather_layers: int = 4,
        num_q_heads: int | None = None,
        query_window: int = 0,
        rope_inv_freq: torch.Tensor | None = None,
        budgets: torch.Tensor | None = None,
    ):
        self.batch_size_ = batch_size
        self.q_heads = num_q_heads or num_kv_heads
        self.query_window = query_window
        self.query_scale: float | None = None  # the attention's softmax scale, seen at the first forward
        self.rope_inv_freq = None if rope_inv_freq is None else rope_inv_freq.detach().float().cpu()  # (R/2,)
        self.heads, self.head_dim, self.dtype = num_kv_heads, head_dim, dtype
        self.track_attention = track_attention
        self.gather_layers = max(1, gather_layers)
        self.num_layers = len(layer_devices)
        self.budgets = None if budgets is None else budgets.to(torch.long).cpu()  # (L, B)
        caps = capacity if isinstance(capacity, (list, tuple)) else [capacity]
        self._groups: list[_Group] = []
        self._where: list[tuple[_Group, int]] = []
        for dev, layers, cap, row in layout(layer_devices, caps, self.budgets):
            g = _Group(layers, batch_size, num_kv_heads, cap, head_dim, dtype, dev, track_attention,
                       self.q_heads, query_window, budget=row, rerotate=self.rope_inv_freq is not None)
            g.index = len(self._groups)  # its position: its Step's key and its entry in the write plans
            self._groups.append(g)
            self._where += [(g, i) for i in range(len(layers))]
        if self.rope_inv_freq is not None and len({tuple(g.budget.tolist()) for g in self._groups
                                                   if g.budget is not None}) > 1:
            raise ValueError("policy.rerotate=true needs the same budget in every layer (rotary positions are shared)")
        # per-sample bookkeeping lives on the CPU: scheduling decisions never sync the device
        self.seen = torch.zeros(batch_size, dtype=torch.long)  # real tokens processed per sample
        self.qpos = torch.full((batch_size, query_window), -1, dtype=torch.long)  # positions of the kept queries
        self.peak_layer_pairs = 0  # max over time of sum over layers and samples of the pairs held
        self.evictions = 0
        self._step_cpu: dict | None = None
        self._steps: dict[int, Step] = {}
        self.step_keys = 0
        self.devices = list(dict.fromkeys(g.device for g in self._groups))
        self.timer = SectionTimer()  # "evict" (engine) and "attn_stats" (kvbench.attention) sections
        super().__init__(layers=[_LayerView(self, i) for i in range(self.num_layers)])
        KVCache._live.add(self)

    @classmethod
    def live(cls) -> list[KVCache]:
        """The caches still alive (referenced from somewhere), released or not."""
        return list(cls._live)

    def release(self) -> None:
        """Drop every tensor this cache owns (idempotent); counts and peaks stay readable."""
        self._groups, self._where, self._steps, self._step_cpu = [], [], {}, None

    # ------------------------------------------------------------------ groups
    @property
    def groups(self) -> list[_Group]:
        """The groups of layers that share counts and budgets (one per device unless budgets differ by layer)."""
        return self._groups

    def group_of(self, layer: int) -> _Group:
        return self._where[layer][0]

    @property
    def n(self) -> torch.Tensor:
        """(B,) pairs held per sample (the most over layers; every layer holds it unless budgets differ by layer)."""
        ns = [g.n for g in self._groups]
        return ns[0] if len(ns) == 1 else torch.stack(ns).max(dim=0).values

    @property
    def capacity(self) -> int:
        """The most slots per sample of any layer."""
        return max(g.capacity for g in self._groups)

    @property
    def layer_pair_bytes(self) -> int:
        """Bytes of one KV pair of one layer, all heads (K and V)."""
        return 2 * self.heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()

    @property
    def peak_kv_bytes(self) -> int:
        """Largest KV cache held at once (kept pairs, all layers, all samples)."""
        return self.peak_layer_pairs * self.layer_pair_bytes

    def allocated_bytes(self) -> int:
        """Bytes preallocated for the cache (K, V, positions and statistics, scratch slot included)."""
        return sum(g.nbytes() for g in self._groups)

    @staticmethod
    def nbytes_for(
        *, batch_size: int, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype,
        track_attention: bool, num_q_heads: int | None = None, query_window: int = 0, rerotate: bool = False,
    ) -> int:
        """What `allocated_bytes()` reports for such a cache, before building it (kvbench.memory's account).

        Built from the same `_Group` on the meta device, so the count cannot drift from the allocation.
        """
        g = _Group(range(num_layers), batch_size, num_kv_heads, capacity, head_dim, dtype, "meta", track_attention,
                   num_q_heads or num_kv_heads, query_window, rerotate=rerotate)
        return g.nbytes()

    def layer_keys(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions (B, H, C+1) and the count n (B,) of a layer, for tests and inspection."""
        g, i = self._where[layer]
        return g.pos[i], g.n

    def kept_positions(self, layer: int, sample: int) -> torch.Tensor:
        """(H_kv, n_b) positions currently kept by `sample` in `layer`."""
        g, i = self._where[layer]
        return g.pos[i, sample, :, : int(g.n[sample])].cpu()

    # ------------------------------------------------------------------ forward
    def begin_forward(self, r: torch.Tensor, width: int) -> torch.Tensor:
        """Prepare a forward over a (B, width) chunk where sample b's r_b real tokens are right-aligned.

        Returns the (B, width) position ids (true positions, 0 for pads; with re-rotation the slots,
        i.e. positions counted from the kept pairs). Must be called before each forward; the write
        slots and the mask are computed once here for all the layers of a group.
        """
        B, T = self.batch_size_, width
        r = r.to(torch.long)
        i = torch.arange(T)
        offset = (T - r)[:, None]  # first real index per sample
        real = i[None, :] >= offset  # (B, T)
        j = i[None, :] - offset  # index among the sample's new tokens
        positions = torch.where(real, self.seen[:, None] + j, torch.zeros_like(j))
        shared = dict(
            b_idx=torch.arange(B)[:, None].expand(B, T),
            positions=positions.to(torch.int32),
            real=real,
            all_real=bool(real.all()),
            active=r > 0,
            T=T,
        )
        if self.query_window:  # the newest W queries of (kept ++ this chunk's real ones), oldest first
            W = self.query_window
            e = torch.arange(W - 1, -1, -1)[None, :]  # (1, W) age of each entry: 0 = newest
            src = torch.where(e < r[:, None], W + T - 1 - e, W - 1 - (e - r[:, None]))  # (B, W) in cat(old, chunk)
            old = self.qpos.gather(1, src.clamp(0, W - 1))
            new = self.seen[:, None] + r[:, None] - 1 - e
            self.qpos = torch.where(e < r[:, None], new, torch.where(src >= 0, old, -1))
            shared["q_src"] = src.clamp(min=0)
        per_group = []
        held = 0
        for g in self._groups:
            n_old, n_new = g.n, g.n + r
            if int(n_new.max()) > g.capacity:
                raise RuntimeError(f"KV cache overflow: {int(n_new.max())} pairs > capacity {g.capacity}")
            n_keys = int(n_new.max())
            # mask: query i of sample b sees slot c iff c - i <= n_new_b - T (causal inside the chunk,
            # kept pairs before it); slot 0 always, so pad rows are never empty (they are discarded).
            uniform = bool((n_new == n_keys).all())
            causal = bool((n_old == 0).all() and (r == T).all()) and T > 1
            need_mask = not (causal or (T == 1 and uniform))
            per_group.append(dict(
                slot=torch.where(real, n_old[:, None] + j, torch.full_like(j, g.capacity)),
                thresh=(n_new - T) if need_mask else None,
                causal=causal,
                n_keys=n_keys,
                seqlens=n_new.to(torch.int32),
            ))
            g.n = n_new
            held += len(g.layers) * int(n_new.sum())
        self._step_cpu = dict(shared=shared, groups=per_group)
        self._steps = {}
        self.step_keys = max(c["n_keys"] for c in per_group)
        self.seen = self.seen + r
        self.peak_layer_pairs = max(self.peak_layer_pairs, held)
        if self.rope_inv_freq is not None:  # a pair's rotary position is its slot (one count for every layer)
            return torch.where(real, self._groups[0].n[:, None] - r[:, None] + j, torch.zeros_like(j))
        return positions

    def step_for(self, layer: int) -> Step:
        """The current forward's Step for `layer`'s group, on its device (built once per group per forward)."""
        return self._step(self._where[layer][0])

    def _step(self, g: _Group) -> Step:
        st = self._steps.get(g.index)
        if st is None:
            sh = self._step_cpu["shared"]
            c = self._step_cpu["groups"][g.index]
            device = g.device
            mask = None
            if c["thresh"] is not None:
                q = torch.arange(sh["T"], device=device)
                k = torch.arange(c["n_keys"], device=device)
                thresh = c["thresh"].to(device)
                mask = (k[None, None, :] - q[None, :, None]) <= thresh[:, None, None]  # (B, T, N)
                mask[:, :, 0] = True
                mask = mask[:, None]  # (B, 1, T, N)
            st = Step(
                b_idx=sh["b_idx"].to(device),
                slot=c["slot"].to(device),
                positions=sh["positions"].to(device),
                real=sh["real"].to(device),
                all_real=sh["all_real"],
                active=sh["active"].to(device),
                mask=mask,
                causal=c["causal"],
                n_keys=c["n_keys"],
                seqlens=c["seqlens"].to(device),
                q_src=sh["q_src"].to(device) if "q_src" in sh else None,
            )
            self._steps[g.index] = st
        return st

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a chunk's keys/values (B, H, T, D) of `layer`; return the kept pairs (B, H, N, D)."""
        g, i = self._where[layer]
        st = self._step(g)
        K, V = g.k[i], g.v[i]  # (B, H, C+1, D)
        K[st.b_idx, :, st.slot] = k.transpose(1, 2).to(K.dtype)  # (B, T, H, D) into the slots
        V[st.b_idx, :, st.slot] = v.transpose(1, 2).to(V.dtype)
        g.pos[i][st.b_idx, :, st.slot] = st.positions[..., None]
        if g.k_src is not None:  # re-rotation: the key as written, and its rotary position (its slot)
            g.k_src[i][st.b_idx, :, st.slot] = K[st.b_idx, :, st.slot]
            g.rot[i][st.b_idx, :, st.slot] = st.slot.to(torch.int32)[..., None]
        if g.sum_w is not None:
            g.sum_w[i][st.b_idx, :, st.slot] = 0.0
            g.last_w[i][st.b_idx, :, st.slot] = 0.0
        N = st.n_keys
        return K[:, :, :N], V[:, :, :N]

    def remember_queries(self, layer: int, query: torch.Tensor, scaling: float) -> None:
        """Keep the newest `query_window` real queries of `layer` (query (B, H_q, T, D), RoPE applied)."""
        g, i = self._where[layer]
        st = self._step(g)
        both = torch.cat([g.q[i], query.to(g.q.dtype)], dim=2)  # (B, H_q, W + T, D)
        idx = st.q_src[:, None, :, None].expand(-1, both.shape[1], -1, both.shape[3])
        g.q[i] = both.gather(2, idx)
        self.query_scale = scaling

    def accumulate(self, layer: int, w_sum: torch.Tensor, w_last: torch.Tensor) -> None:
        """Add a forward's attention statistics (B, H_kv, N) of `layer` (pads already excluded)."""
        g, i = self._where[layer]
        st = self._step(g)
        N = w_sum.shape[-1]
        g.sum_w[i][:, :, :N] += w_sum
        lw = g.last_w[i][:, :, :N]
        if st.all_real:  # every sample brought a query (always so while decoding)
            lw.copy_(w_last)
        else:  # samples with no token in this forward keep their newest query's row
            lw.copy_(torch.where(st.active[:, None, None], w_last, lw))

    # ------------------------------------------------------------------ eviction
    def evict(self, rows: torch.Tensor, keep, policy: Policy, group: _Group | None = None) -> None:
        """Keep the `keep` highest-scored pairs of every (layer, head) of the samples in `rows`.

        rows: (B,) bool on the CPU; keep: an int, or (B,) per sample (per-sample budgets); group: the
        group of layers to evict from (None: every group). Protected pairs (the first `protect_first`
        positions and the last `protect_recent` ones) score +inf; on equal scores the older pair goes
        first. Kept pairs are gathered back to slots [0, keep) in position order.
        """
        if not bool(rows.any()):
            return
        keep = torch.as_tensor(keep, dtype=torch.long).expand(self.batch_size_)
        for g in self._groups if group is None else [group]:
            n_rows, k_rows = g.n[rows], keep[rows]
            if bool((n_rows <= k_rows).any()):
                raise RuntimeError("evict called on a sample that does not hold more than `keep` pairs")
            if policy.keeps_newest and self.rope_inv_freq is None:  # re-rotation moves keys: the generic path
                self._keep_newest(g, rows, keep, policy.protect_first)
            else:
                budget = keep + policy.evict_every if g.budget is None else g.budget  # (B,): what the rows may hold
                self._keep_top_scored(g, rows, n_rows, k_rows, policy.recent_pairs(budget)[rows], policy)
            g.n = torch.where(rows, keep, g.n)
        self.evictions += 1

    def _keep_newest(self, g: _Group, rows: torch.Tensor, keep: torch.Tensor, sinks: int) -> None:
        """Keep slots [0, sinks) and the newest `keep - sinks` slots of every row, by slicing.

        The same pairs the generic path keeps for a score that is the position (slots are in position
        order, the first `sinks` positions are the first slots), with no score, sort or gather: rows that
        hold the same count c (and keep the same number) move slots [c - recent, c) to [sinks, keep) in one
        copy per tensor (K/V `gather_layers` layers at a time when source and target overlap, as the
        generic gather does).
        """
        pairs = torch.stack([g.n[rows], keep[rows]], dim=1)
        for c, k in torch.unique(pairs, dim=0).tolist():  # usually one (count, keep): all rows full; no device sync
            recent = k - sinks
            part = rows & (g.n == c) & (keep == k)
            every = bool(part.all())
            overlap = c - recent < k  # source and target slots overlap: copy through a temporary
            sel = slice(None) if every else part.nonzero()[:, 0].to(g.device)
            for x in g.tensors().values():  # (L, B, H, C+1[, D])
                step = self.gather_layers if x.dim() == 5 else len(g.layers)
                for l0 in range(0, len(g.layers), step):
                    src = x[l0 : l0 + step, sel, :, c - recent : c]  # a copy already when sel indexes rows
                    x[l0 : l0 + step, sel, :, sinks:k] = src.clone() if every and overlap else src

    def _keep_top_scored(self, g: _Group, rows: torch.Tensor, n_rows: torch.Tensor, k_rows: torch.Tensor,
                         recent: torch.Tensor, policy: Policy) -> None:
        """The generic eviction: score, stable sort, gather the kept pairs back in position order.

        recent: (B',) the newest pairs each row protects (`policy.recent_pairs` of its budget).

        Rows may keep different counts (k_rows, per-sample budgets): the K = max(k_rows) best are taken,
        the lowest K - k_b of them dropped for row b, and slots k_b .. K - 1 of that row receive copies
        that lie past its count (never read, overwritten by the next writes).
        """
        N = int(n_rows.max())
        K = int(k_rows.max())
        ragged = bool((k_rows != K).any())
        all_rows = bool(rows.all())
        last = self.seen[rows] - 1
        dev = g.device
        sel = slice(None) if all_rows else rows.nonzero()[:, 0].to(dev)
        t = {name: x[:, sel, :, :N] for name, x in g.tensors().items() if x.dim() == 4}  # (L, B', H, N) each
        last_d = last.to(dev)[None, :, None, None]
        stats = ScoreStats(
            pos=t["pos"], last=last_d, sum_w=t.get("sum_w"), last_w=t.get("last_w"),
            n=n_rows.to(dev)[None, :, None, None], layers=torch.tensor(g.layers, device=dev)[:, None, None, None],
            keys=g.k[:, sel, :, :N] if policy.needs_keys else None,
            queries=g.q[:, sel] if policy.query_window else None,
            query_pos=self.qpos[rows].to(dev)[None, :, None, :] if policy.query_window else None,
            scale=self.query_scale,
        )
        score = policy.score(stats).float()  # (L, B', H, N)
        pos = t["pos"]
        protected = (pos < policy.protect_first) | (pos > last_d - recent.to(dev)[None, :, None, None])
        valid = torch.arange(N, device=dev) < n_rows.to(dev)[None, :, None, None]
        score = score.masked_fill(protected, INF).masked_fill(~valid, -INF)
        # stable sort: ties keep position order, so the newer of equal pairs ranks higher
        order = torch.sort(score, dim=-1, stable=True).indices[..., N - K :]  # (L, B', H, K) the K best
        if ragged:  # row b keeps its k_b best: the K - k_b lowest of the K go past the end, then clamp
            drop = torch.arange(K, device=dev) < (K - k_rows).to(dev)[None, :, None, None]
            order = order.masked_fill(drop, N)
        kept = torch.sort(order, dim=-1).values  # (L, B', H, K) slots in position order
        if ragged:
            kept = kept.clamp_(max=N - 1)
        for name, x in t.items():
            g.tensors()[name][:, sel, :, :K] = x.gather(-1, kept)
        D = self.head_dim
        for l0 in range(0, len(g.layers), self.gather_layers):
            l1 = min(l0 + self.gather_layers, len(g.layers))
            idx = kept[l0:l1, ..., None].expand(-1, -1, -1, -1, D)
            if g.k_src is None:
                for x in (g.k, g.v):
                    y = x[l0:l1, sel, :, :N].gather(3, idx)  # (l, B', H, K, D)
                    x[l0:l1, sel, :, :K] = y
                    del y  # not alive while the next tensor is gathered
                continue
            for x in (g.k_src, g.v):  # re-rotation: compact the written keys, then rotate them afresh
                y = x[l0:l1, sel, :, :N].gather(3, idx)
                x[l0:l1, sel, :, :K] = y
                del y
            src = g.k_src[l0:l1, sel, :, :K]  # (l, B', H, K, D) (a copy when sel indexes rows)
            delta = torch.arange(K, device=dev) - g.rot[l0:l1, sel, :, :K]  # rotary: written slot -> new slot
            g.k[l0:l1, sel, :, :K] = self._rotate(src, delta)
            del src, delta
        if g.q is not None and self.rope_inv_freq is not None:  # kept queries follow the newest pairs
            shift = (k_rows - n_rows).to(dev)[None, :, None, None]  # (1, B', 1, 1): slot shift of the newest
            g.q[:, sel] = self._rotate(g.q[:, sel], shift.expand(-1, -1, g.q.shape[2], g.q.shape[3]))

    def _rotate(self, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """Keys k (..., D) with RoPE at position p, rotated by `delta` (...,) to position p + delta.

        RoPE is a rotation per pair of dimensions (i, i + R/2) by angle p * inv_freq[i], and rotations
        compose: R(p + delta) = R(delta) R(p). Computed in float32 (float64 for float64 keys) and
        rounded to the keys' dtype once; dimensions past R (partial rotary) are left alone.
        """
        inv = self.rope_inv_freq.to(k.device)
        R = 2 * inv.shape[0]
        acc = torch.promote_types(k.dtype, torch.float32)
        freqs = delta[..., None].to(acc) * inv.to(acc)  # (..., R/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        del freqs
        cos, sin = emb.cos(), emb.sin()
        del emb
        kr = k[..., :R].to(acc)
        rotated = rotate_half(kr)  # transformers' own; before `kr * cos`, so its temporaries never coexist with it
        out = (kr * cos).addcmul_(rotated, sin).to(k.dtype)
        return out if R == k.shape[-1] else torch.cat((out, k[..., R:]), dim=-1)

    def resize(self, capacity: int, group: _Group | None = None) -> None:
        """Reallocate a group (None: every group) to `capacity` slots (must hold every sample's pairs),
        freeing the rest."""
        for g in self._groups if group is None else [group]:
            if int(g.n.max()) > capacity:
                raise RuntimeError("resize below the pairs held")
            if capacity == g.capacity:
                continue
            keep = int(g.n.max())
            for name, x in list(g.tensors().items()):
                shape = list(x.shape)
                shape[3] = capacity + 1
                y = torch.zeros(shape, dtype=x.dtype, device=x.device)
                y[:, :, :, :keep] = x[:, :, :, :keep]
                setattr(g, name, y)
                del x
            g.capacity = capacity
