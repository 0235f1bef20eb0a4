"""A group of layers' quantized KV pairs: what the evicting cache needs of them (append, read, keep a subset).

Per store (L layers x B rows x H_kv heads, capacity C pairs per row; C_q, C_r from kvbench.quant.qsplit):

    kc, vc   (L, B, H, C_q, D * bits / 8)  uint8 codes of keys / values, one row per token (4 bits: two a byte)
    ks, kz   (L, B, H, C_q / G, D)         keys' scale and zero point: per channel, per block of G tokens
    vs, vz   (L, B, H, C_q, D / G)         values' scale and zero point: per token, per G channels
    rk, rv   (L, B, H, C_r, D)             the full-precision residual window (model dtype)

`n` (B,) on the CPU counts the pairs each row holds in every layer and head (as the cache's `Group.n`); row b's
logical slot s < q(n_b) is quantized slot s, slot s >= q(n_b) is residual slot s - q(n_b). A read gives the
logical slots in order, dequantized: (B, H, N, D), N = max n, what attention and the policies' scores see.
Appending goes through the window (kvbench.quant.qappend); eviction keeps given logical slots
(kvbench.quant.qkeep, where what it does to a per-channel key block is said and measured).
"""

from __future__ import annotations

import torch

from kvbench.quant import qappend, qkeep
from kvbench.quant.kivi import Rule
from kvbench.quant.qsplit import capacities, quantized_count
from kvbench.quant.qtake import take


class QuantKV:
    """Quantized keys (per channel) and values (per token) with a full-precision window of the newest pairs."""

    def __init__(self, layers: int, batch: int, heads: int, capacity: int, head_dim: int, dtype: torch.dtype,
                 device, *, bits: int, group: int, residual: int):
        if head_dim % group:
            raise ValueError(f"values are grouped per token over {group} channels: head_dim {head_dim} is not a multiple")
        self.key_rule, self.value_rule = Rule(bits, group, "channel"), Rule(bits, group, "token")
        self.group, self.residual, self.capacity, self.dtype = group, residual, capacity, dtype
        self.device = torch.device(device)
        self.n = torch.zeros(batch, dtype=torch.long, device="cpu")
        cq, cr = capacities(capacity, group, residual)
        lead = (layers, batch, heads)

        def zeros(*shape, dt=dtype):
            return torch.zeros(*lead, *shape, dtype=dt, device=self.device)

        width = head_dim * bits // 8
        self.kc, self.vc = zeros(cq, width, dt=torch.uint8), zeros(cq, width, dt=torch.uint8)
        self.ks, self.kz = zeros(cq // group, head_dim), zeros(cq // group, head_dim)
        self.vs, self.vz = zeros(cq, head_dim // group), zeros(cq, head_dim // group)
        self.rk, self.rv = zeros(cr, head_dim), zeros(cr, head_dim)

    @property
    def q(self) -> torch.Tensor:
        """(B,) pairs each row holds quantized (CPU)."""
        return quantized_count(self.n, self.group, self.residual)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in ("kc", "ks", "kz", "vc", "vs", "vz", "rk", "rv")}

    def nbytes(self) -> int:
        return sum(x.numel() * x.element_size() for x in self.tensors().values())

    def read(self, i: int, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's held pairs, dequantized, in logical slot order: keys and values (B', H, N, D) in the store's
        dtype, N = the rows' largest count (slots past a row's count hold junk); `rows` (B,) bool, default all."""
        sel = slice(None) if rows is None else self._index(rows)
        n = self.n if rows is None else self.n[rows]
        q = quantized_count(n, self.group, self.residual)
        N, Q, G = int(n.max()), int(q.max()), self.group
        k = self.key_rule.dequantize(self.kc[i, sel, :, :Q], self.ks[i, sel, :, : Q // G], self.kz[i, sel, :, : Q // G])
        v = self.value_rule.dequantize(self.vc[i, sel, :, :Q], self.vs[i, sel, :, :Q], self.vz[i, sel, :, :Q])
        if bool((q == Q).all()):  # every row as many quantized: the window follows at once
            return (torch.cat([k, self.rk[i, sel, :, : N - Q]], dim=2), torch.cat([v, self.rv[i, sel, :, : N - Q]], dim=2))
        j = torch.arange(N)[None, :]
        src = torch.where(j < q[:, None], j, Q + j - q[:, None]).clamp(max=Q + self.rk.shape[3] - 1)  # (B', N)
        src = src.to(self.device)[:, None, :]  # (B', 1, N) each logical slot's place in cat(quantized, window)
        return (take(torch.cat([k, self.rk[i, sel]], dim=2), src),  # (B', H, Q + C_r, D) -> (B', H, N, D)
                take(torch.cat([v, self.rv[i, sel]], dim=2), src))

    def write(self, i: int, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor) -> None:
        """Append to layer i each row's r_b (B,) newest tokens of k, v (B, H, T, D) (right-aligned: pads first).
        Counts move in `advance`, once every layer of the forward is written."""
        qappend.write(self, i, k, v, r)

    def advance(self, r: torch.Tensor) -> None:
        if bool((self.n + r > self.capacity).any()):
            raise RuntimeError(f"quantized KV overflow: {int((self.n + r).max())} pairs > capacity {self.capacity}")
        self.n = self.n + r

    def append(self, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor) -> None:
        """Every layer's chunk (L, B, H, T, D) at once, then `advance`."""
        if bool((self.n + r > self.capacity).any()):
            raise RuntimeError(f"quantized KV overflow: {int((self.n + r).max())} pairs > capacity {self.capacity}")
        for i in range(self.kc.shape[0]):
            self.write(i, k[i], v[i], r)
        self.advance(r)

    def keep(self, rows: torch.Tensor, kept: torch.Tensor, keep: torch.Tensor) -> None:
        """Rows (B,) bool keep the logical slots `kept` (L, B', H, K) (position order, as kvbench.cache.evict's
        `select` gives them), `keep` (B,) pairs each (a row keeping k_b < K has copies past k_b)."""
        qkeep.keep(self, rows, kept, keep)

    def _index(self, rows: torch.Tensor) -> torch.Tensor:
        return rows.nonzero()[:, 0].to(self.device)
