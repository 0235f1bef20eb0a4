"""A quantized group (`gen.kv_cache_dtype=int8|int4`): a `Group` whose keys and values live in a `QuantKV`.

The group keeps everything else of `Group` (positions, attention statistics, kept queries, counts `n`) per
slot as before; only K/V change: they are stored quantized (KIVI's rule, kvbench.quant: per-channel keys,
per-token values, the newest pairs in a full-precision window) and read back dequantized, one layer at a
time, for attention (`write` returns the layer's held pairs dequantized, as `Group.write` returns its
slots). A policy that scores keys or values reads them dequantized (`held`), as do its observe step (the new
pairs, `written`) and a scoring pass (a layer's pairs, `layer_pairs`): scores and a policy's own statistics are
computed on the dequantized pairs, as attention sees them. Eviction keeps the chosen logical slots of the store
(kvbench.quant.qkeep: values gathered exactly, changed key blocks re-quantized), so the evicted pairs'
bytes go at once; re-rotation is refused (kvbench.quant.qconfig: it needs keys as written).

Counts: `layout_forward` moves the group's `n` to the counts after the forward before any layer writes; the
store's own `n` is what it held before the forward (`_held`, read at layer 0) while a layer is appended, and
the new counts while it is read; an eviction sets both.
"""

from __future__ import annotations

import torch

from kvbench.cache.storage import Group
from kvbench.cache.storage import nbytes_for as plain_nbytes_for
from kvbench.quant.nibbles import packed_width
from kvbench.quant.qconfig import KVQuant
from kvbench.quant.qsplit import quantized_count
from kvbench.quant.qstore import QuantKV


class QuantGroup(Group):
    """A group of layers whose K/V are a `QuantKV` store (capacity C pairs per row; no scratch slot: pads are
    never appended)."""

    def __init__(self, *args, quant: KVQuant, **kwargs):
        self.quant = quant
        if kwargs.get("rerotate"):
            raise ValueError("re-rotation needs the keys as written: a quantized cache does not hold them")
        super().__init__(*args, **kwargs)

    def _pairs(self, L, batch, heads, S, head_dim, dtype):
        q = self.quant
        self.store = QuantKV(L, batch, heads, S - 1, head_dim, dtype, self.device, bits=q.bits, group=q.group,
                             residual=q.residual)
        self._held = self.store.n
        return None, None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The per-slot tensors an eviction compacts by gathering (positions, statistics): K/V are the store's."""
        return {k: x for k, x in super().tensors().items() if k not in ("k", "v")}

    def nbytes(self) -> int:
        return super().nbytes() + self.store.nbytes()

    def held_bytes(self) -> int:
        """Bytes of what the rows hold now: their quantized pairs' codes and scales, their windows' pairs."""
        s, n = self.store, self.n
        q = quantized_count(n, s.group, s.residual)
        L, _, H, _, D = s.rk.shape
        e = s.rk.element_size()
        per_pair = 2 * packed_width(D, self.quant.bits) + 2 * (D // s.group) * e  # codes, values' scale + zero
        total = int(q.sum()) * per_pair + int(q.sum()) // s.group * 2 * D * e + int((n - q).sum()) * 2 * D * e
        return L * H * total

    def write(self, i: int, st, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the chunk's real tokens (right-aligned in k, v (B, H, T, D)) of layer i; return its held pairs
        dequantized (B, H, N, D), N = st.n_keys."""
        s = self.store
        if i == 0:  # the forward's first layer: what the store held before it
            self._held = s.n
        s.n = self._held
        s.write(i, k, v, self.n - self._held)
        s.n = self.n
        self.write_slots(i, st)
        return s.read(i)

    def written(self, i: int, st, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The new pairs (B, H, T, D) as attention read them: dequantized from `key`/`value` (B, H, N, D), the
        held pairs `write` returned (pads, written nowhere, read the last slot: the observe step masks them)."""
        slot = st.slot.clamp(max=key.shape[2] - 1)  # (B, T)
        return key[st.b_idx, :, slot].transpose(1, 2), value[st.b_idx, :, slot].transpose(1, 2)

    def layer_pairs(self, i: int, N: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.store.read(i)  # (B, H, n.max(), D) dequantized
        return k[:, :, :N], v[:, :, :N]

    def held(self, name: str, rows: torch.Tensor, sel, N: int) -> torch.Tensor:
        j = 0 if name == "k" else 1
        return torch.stack([self.store.read(i, rows)[j][:, :, :N] for i in range(len(self.layers))])

    def keep(self, rows: torch.Tensor, kept: torch.Tensor, keep: torch.Tensor) -> None:
        """Rows (B,) bool keep the slots `kept` (L, B', H, K) (position order), `keep` (B,) pairs each."""
        self.store.keep(rows, kept, keep)
        self._held = self.store.n

    def resize(self, capacity: int) -> None:
        """Reallocate to `capacity` pairs: the positions and statistics as `Group`'s, the store's slots copied (a
        row of n <= capacity pairs needs no more than the new store's quantized and window slots)."""
        old = self.store
        if capacity == self.capacity:
            return
        super().resize(capacity)
        L, B, H, _, D = old.rk.shape
        q = self.quant
        new = QuantKV(L, B, H, capacity, D, old.dtype, self.device, bits=q.bits, group=q.group, residual=q.residual)
        for name, y in new.tensors().items():
            x = old.tensors()[name]
            m = min(x.shape[3], y.shape[3])
            y[:, :, :, :m] = x[:, :, :, :m]
        new.n = old.n
        self.store, self._held = new, new.n


def nbytes_for(*, quant: KVQuant | None = None, **kwargs) -> int:
    """`kvbench.cache.storage.nbytes_for`, and with `quant` a quantized group's (built on the meta device too)."""
    if quant is None:
        return plain_nbytes_for(**kwargs)
    a = dict(num_q_heads=None, query_window=0, rerotate=False, window=None, own=None) | kwargs
    return QuantGroup(range(a["num_layers"]), a["batch_size"], a["num_kv_heads"], a["capacity"], a["head_dim"],
                      a["dtype"], "meta", a["track_attention"], a["num_q_heads"] or a["num_kv_heads"],
                      a["query_window"], rerotate=a["rerotate"], sliding=a["window"], own=a["own"],
                      quant=quant).nbytes()
