"""`KVCache`: the facade transformers and the engine see, over the rooms of kvbench.cache.

It is a transformers `Cache` whose per-layer views write each chunk into preallocated storage
(kvbench.cache.storage) and return the kept pairs; the engine drives it: `begin_forward(r, width)` before
each forward (kvbench.cache.layout: write slots and masks, once for all layers of a group), `evict(rows,
keep, policy)` between forwards (kvbench.cache.evict), `release()` when the batch ends (returns or
raises): the tensors go at once, whatever still refers to the cache object. The layer views refer to the
cache weakly, so a cache forms no reference cycle and is freed by reference counting alone;
`KVCache.live()` lists the caches still alive without asking the cyclic collector.
"""

from __future__ import annotations

import functools
import weakref
from functools import partial
from typing import ClassVar

import torch
from transformers.cache_utils import Cache

from kvbench.attention.static_step import StaticStep
from kvbench.budgets import Budgets
from kvbench.cache import band, heads, linear_state, query_window
from kvbench.cache import evict as eviction
from kvbench.cache.layout import Step, device_steps, layout_forward
from kvbench.cache.qgroup import QuantGroup, nbytes_for
from kvbench.cache.sink import LayerSink
from kvbench.cache.storage import Group
from kvbench.cache.views import LayerView
from kvbench.policies.policy import Policy
from kvbench.timing import SectionTimer


def group_maker(cache: KVCache, shapes: list[tuple[int, int]], quant):
    """(group index, device, its layers, capacity, budget row, window) -> the cache's `Group` for those layers (a
    `QuantGroup` with `quant`), of its first layer's (H_kv, D) shape."""
    kind = Group if quant is None else partial(QuantGroup, quant=quant)
    own, rerotate = cache.observer and cache.observer.policy.needs, cache.rope_inv_freq is not None
    return lambda gi, dev, layers, cap, row, w: kind(
        layers, cache.batch_size_, shapes[layers[0]][0], cap, shapes[layers[0]][1], cache.dtype, dev,
        cache.track_attention, cache.q_heads, cache.query_window, budget=row, own=own, rerotate=rerotate, index=gi,
        sliding=w)


class KVCache(Cache):
    """The evicting KV cache of one batch (kvbench.cache). `layer_devices[l]` is decoder layer l's device;
    `budgets` the pairs layer l of sample b may hold (kvbench.budgets.Budgets, or its (L, B) tensor);
    `rope_inv_freq`: re-rotate kept keys; `quant`: K/V stored quantized (kvbench.quant.qconfig.KVQuant,
    kvbench.cache.qgroup), None: in `dtype`."""

    _live: ClassVar[weakref.WeakSet] = weakref.WeakSet()  # every cache not yet freed (no gc needed to find them)

    def __init__(self, *, batch_size: int, num_kv_heads: int, head_dim: int, capacity: int | list[int],
                 dtype: torch.dtype, layer_devices: list[torch.device | str], track_attention: bool = False,
                 gather_layers: int = 4, num_q_heads: int | None = None, query_window: int = 0,
                 rope_inv_freq: torch.Tensor | None = None, budgets: torch.Tensor | None = None, windows=None,
                 bands=None, linear=(), quant=None, observer=None):
        self.batch_size_, self.dtype, self.query_window = batch_size, dtype, query_window
        L = len(layer_devices)  # `num_kv_heads`, `head_dim`: one for all layers, or one per layer (Gemma 4)
        shapes = [(h, d) for h, d in zip(*(list(x) if isinstance(x, (list, tuple)) else [x] * L
                                          for x in (num_kv_heads, head_dim)), strict=True)]
        self.shapes = None if len(set(shapes)) == 1 else shapes
        self.heads, self.head_dim = shapes[0]  # (the widest group's shape is its own: `Group.k`)
        self.q_heads = num_q_heads or self.heads
        self.rope_inv_freq = None if rope_inv_freq is None else rope_inv_freq.detach().float().cpu()  # (R/2,)
        self.track_attention, self.gather_layers = track_attention, max(1, gather_layers)
        self.num_layers, self.observer = len(layer_devices), observer  # a policy's observe step, its own state (sink.Observing)
        self.room = budgets if isinstance(budgets, Budgets) else None  # kvbench.budgets: (L, B, H) counts
        layer = budgets.layer if isinstance(budgets, Budgets) else budgets
        self.budgets = None if layer is None else layer.to(torch.long).cpu()  # (L, B)
        self.linear, self._groups, self._where = linear_state.build(  # layer -> (group, index in it); a hybrid's apart
            layer_devices, list(capacity) if isinstance(capacity, (list, tuple)) else [capacity], self.budgets, windows,
            bands, linear, self.rope_inv_freq is not None, group_maker(self, shapes, quant), self.shapes)
        self.seen = torch.zeros(batch_size, dtype=torch.long, device="cpu")  # real tokens processed per sample (CPU)
        self.qpos = torch.full((batch_size, query_window), -1, dtype=torch.long, device="cpu")  # positions of the kept queries
        self.peak_layer_pairs = 0  # max over time of sum over layers and samples of the pairs held
        self.peak_kv_bytes = 0  # largest KV held at once (kept pairs, all layers and samples; K and V: `held_bytes`)
        self.evictions = self.step_keys = 0
        self._layout, self._steps = None, {}  # this forward's CPU layout (shared, per group), its Steps by group
        self.devices = list(dict.fromkeys(g.device for g in self._groups))
        self.timer = SectionTimer()  # "evict" (engine) and "attn_stats" (kvbench.attention) sections
        super().__init__(layers=[self.linear.get(i) or LayerView(self, i) for i in range(self.num_layers)])
        KVCache._live.add(self)

    @classmethod
    def live(cls) -> list[KVCache]:
        """The caches still alive (referenced from somewhere), released or not."""
        return list(cls._live)

    def release(self) -> None:
        """Drop every tensor this cache owns (idempotent); counts and peaks stay readable."""
        self._groups, self._where, self._steps, self._layout = [], [], {}, None
        self.linear, self.layers = linear_state.released(self.linear, self.layers)  # a hybrid's states go too

    # ------------------------------------------------------------------ sizes and contents
    @property
    def groups(self) -> list[Group]:
        """The groups of layers that share counts and budgets (one per device unless budgets differ by layer)."""
        return self._groups

    def group_of(self, layer: int) -> Group:
        return self._where[layer][0]

    @property
    def n(self) -> torch.Tensor:
        """(B,) pairs held per sample (the most over layers; every layer holds it unless budgets differ by layer)."""
        ns = [g.n for g in self._groups]
        return ns[0] if len(ns) == 1 else torch.stack(ns).max(dim=0).values

    @property
    def capacity(self) -> int:
        return max(g.capacity for g in self._groups)  # the most slots per sample of any layer

    def allocated_bytes(self) -> int:
        """Bytes preallocated for the cache (K, V, positions, statistics, scratch slot; a hybrid's linear states)."""
        return sum(g.nbytes() for g in self._groups) + linear_state.nbytes(self.linear.values())

    nbytes_for = staticmethod(nbytes_for)  # what `allocated_bytes()` reports for such a cache, before building it

    def kept_positions(self, layer: int, sample: int) -> torch.Tensor:
        """(H_kv, n_b) positions currently kept by `sample` in `layer` (-1: a head's hole, adaptive head budgets)."""
        g, i = self._where[layer]
        pos = g.pos[i, sample, :, : int(g.n[sample])]
        return pos.cpu() if g.head_n is None else heads.holes_as(pos, g, i, sample, -1).cpu()

    # ------------------------------------------------------------------ one forward
    def begin_forward(self, r: torch.Tensor, width: int) -> torch.Tensor:
        """Prepare a forward over a (B, width) chunk where sample b's r_b real tokens are right-aligned.

        Returns the (B, width) position ids (true positions, 0 for pads; with re-rotation the slots, i.e.
        positions counted from the kept pairs). Must be called before each forward.
        """
        shared, per_group = layout_forward(self._groups, self.seen, r, width)
        if self.query_window:  # the newest W queries of (kept ++ this chunk's real ones), oldest first
            self.qpos, shared["q_src"] = query_window.advance(self.qpos, self.seen, r, width)
        self._layout, self._steps = (shared, per_group), {}
        self.step_keys = max(c["n_keys"] for c in per_group)
        self.seen = self.seen + r
        held = sum(len(g.layers) * int(g.n.sum()) for g in self._groups)
        self.peak_layer_pairs = max(self.peak_layer_pairs, held)
        self.peak_kv_bytes = max(self.peak_kv_bytes, sum(g.held_bytes() for g in self._groups))
        if self.rope_inv_freq is not None:  # a pair's rotary position is its slot (one count for every layer)
            return torch.where(shared["real"], self._groups[0].n[:, None] - r[:, None] + shared["j"],
                               torch.zeros_like(shared["j"]))
        return shared["positions"].long()

    def step_for(self, layer: int) -> Step:
        """The current forward's Step for `layer`'s group, on its device (built once per group per forward)."""
        g, i = self._where[layer]
        if g.index not in self._steps:  # every group on its device at once: one copy per device per forward
            self._steps.update(device_steps(self._layout, self._groups, g.device))
        if g.head_n is None:
            return self._steps[g.index]
        if (g.index, i) not in self._steps:  # adaptive head budgets: each layer masks its heads' holes
            self._steps[(g.index, i)] = heads.layer_step(self._steps[g.index], g, i)
        return self._steps[(g.index, i)]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a chunk's keys/values (B, H, T, D) of `layer`; return the kept pairs (B, H, N, D)."""
        g, i = self._where[layer]
        return g.write(i, self.step_for(layer), k, v)

    def sink(self, layer: int) -> LayerSink:
        """Where `layer`'s attention puts the policy's statistics this forward (kvbench.cache.sink)."""
        sink = self._steps.get(("sink", layer))
        if sink is None:
            g, i = self._where[layer]
            sink = self._steps[("sink", layer)] = LayerSink(g, i, self.step_for(layer), self.observer)
        return sink

    def attention_step(self, backend: str, score_chunk: int) -> StaticStep:
        """The object attention receives for every forward over this cache (kvbench.attention.static_step)."""
        band.check_backend(self._groups, backend)  # attention sees a band group's window mask (kvbench.cache.band)
        return StaticStep(layout=functools.partial(band.layout, self), sink=self.sink, backend=backend, score_chunk=score_chunk,
                          timer=self.timer)

    # ------------------------------------------------------------------ between forwards
    def evict(self, rows: torch.Tensor, keep, policy: Policy, group: Group | None = None) -> None:
        """Keep the `keep` (an int, or (B,) per sample) best pairs of every (layer, head) of the samples in
        `rows` ((B,) bool, CPU), in `group` (None: every full-attention group); kvbench.cache.evict says how."""
        if not bool(rows.any()):
            return
        keep = torch.as_tensor(keep, dtype=torch.long, device="cpu").expand(self.batch_size_)
        for g in [g for g in self._groups if g.sliding is None] if group is None else [group]:  # never a window
            c = eviction.evict(g, rows, keep, policy, seen=self.seen, qpos=self.qpos, scale=g.scale,
                               inv_freq=self.rope_inv_freq, gather_layers=self.gather_layers, observer=self.observer)
            if c is not None and self.room is not None:  # the heads' counts an adaptive eviction chose
                self.room.set_heads(g.layers, rows, c)
        self.evictions += 1

    def resize(self, capacity: int, group: Group | None = None) -> None:
        """Reallocate a group (None: every group) to `capacity` slots, freeing the rest."""
        for g in self._groups if group is None else [group]:
            g.resize(capacity)
