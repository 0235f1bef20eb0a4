"""The cache's storage: one group of layers' preallocated tensors, and how layers form groups.

Per group (consecutive layers on one device that share a capacity and a budget row):

    k, v           (L_g, B, H_kv, C + 1, D)   slots [0, n_b) hold sample b's kept pairs, in position
                                              order; slot C is a scratch slot for a chunk's pad tokens
    pos            (L_g, B, H_kv, C + 1)      source position of each slot (int32)
    sum_w, last_w  (L_g, B, H_kv, C + 1)      attention statistics (float32), scored policies only
    q              (L_g, B, H_q, W, D)        the newest W queries (RoPE applied), oldest first, for a
                                              policy with a `query_window` W (SnapKV)
    k_src, rot     (L_g, B, H_kv, C + 1[, D]) re-rotation only: each key as written and the rotary
                                              position it was written at (int32)
    own:<name>     (L_g, B, H_kv, C + 1)      a policy's own per-pair statistics (float32, needs.pair_state)
    rows[name]     (L_g, B, *shape)           a policy's own row state (float32, needs.row_state)

`n` (B,) on the CPU counts the pairs each sample holds in every layer of the group: scheduling
decisions never sync the device. A group of sliding-window layers (`sliding` W, kvbench.models.family)
holds only its window plus the chunk being written, as transformers' sliding cache does: capacity
W - 1 + the widest forward (`layer_capacities`), trimmed to its newest W - 1 pairs before a forward that
would overflow it (so its slots always hold consecutive positions); no policy evicts from it. Memory changes only through `resize` (decode_only gives the prompt's
slots back once it has compressed).
"""

from __future__ import annotations

from functools import lru_cache

import torch


class Group:
    """Stacked storage for consecutive layers on one device that share a capacity and budgets.

    n: (B,) pairs held per sample by every layer of the group (CPU); budget: (B,) their budgets or None.
    `index`: the group's position in its cache (its Step's key).
    """

    def __init__(self, layers, batch, heads, capacity, head_dim, dtype, device, track, q_heads=0, window=0,
                 budget=None, rerotate=False, index=0, sliding: int | None = None, own=None):
        self.layers = list(layers)
        self.index = index
        self.sliding = sliding  # the layers' sliding window W (None: full attention, the policy's to compress)
        self.settled = False  # after_prefill, compressed: no score reads the group again (`settle`)
        self.band: int | None = None  # the window of a windowed group the policy compresses (kvbench.cache.band)
        if sliding is not None:  # a windowed group is never scored nor compressed by a policy: no statistics
            if rerotate:
                raise ValueError("policy.rerotate=true needs full attention in every layer")
            track, window = False, 0
        self.device = torch.device(device)
        self.capacity = capacity
        self.budget = budget
        self.n = torch.zeros(batch, dtype=torch.long, device="cpu")
        self.head_n = self.gap_end = None  # adaptive head budgets: each head's count and its hole (cache.heads)
        self.excess = torch.zeros(batch, dtype=torch.long, device="cpu")  # (B,) n - the heads' average (CPU)
        L, S = len(self.layers), capacity + 1
        self.store = None  # a quantized cache's pairs in place of k and v (kvbench.cache.qgroup)
        self.k, self.v = self._pairs(L, batch, heads, S, head_dim, dtype)
        self.pos = torch.zeros(L, batch, heads, S, dtype=torch.int32, device=self.device)
        self.sum_w = torch.zeros(L, batch, heads, S, dtype=torch.float32, device=self.device) if track else None
        self.last_w = torch.zeros_like(self.sum_w) if track else None
        self.q = torch.zeros(L, batch, q_heads, window, head_dim, dtype=dtype, device=self.device) if window else None
        self.scale: float | None = None  # the attention's softmax scale, seen by the first forward that kept queries
        self.k_src = torch.zeros_like(self.k) if rerotate else None  # keys as written (re-rotation's source)
        self.rot = torch.zeros_like(self.pos) if rerotate else None  # the rotary position each was written at
        # a policy's own state (`own`: its Needs, kvbench.policies.needs: pair_state, row_state)
        pair, rows = ((), {}) if own is None or sliding is not None else (own.pair_state, own.row_shapes(q_heads, heads, head_dim))
        self.own = {f"own:{n}": torch.zeros(L, batch, heads, S, dtype=torch.float32, device=self.device) for n in pair}
        self.rows = {n: torch.zeros(L, batch, *shape, dtype=torch.float32, device=self.device)
                     for n, shape in rows.items()}

    def _pairs(self, L, batch, heads, S, head_dim, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.zeros(L, batch, heads, S, head_dim, dtype=dtype, device=self.device)
        return k, torch.zeros_like(k)

    def held(self, name: str, rows: torch.Tensor, sel, N: int) -> torch.Tensor:
        """Every layer's held keys (`name` "k") or values ("v") of the rows (B,) bool (`sel` indexes them on the
        device), slots [0, N): (L, B', H, N, D), what a policy's score reads."""
        return getattr(self, name)[:, sel, :, :N]

    def layer_pairs(self, i: int, N: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's keys and values of slots [0, N), every row: (B, H, N, D) each (a scoring pass reads them)."""
        return self.k[i][:, :, :N], self.v[i][:, :, :N]

    def held_bytes(self) -> int:
        """Bytes of the K/V pairs the rows hold now (every layer, head; K and V), in the cache's dtype."""
        return len(self.layers) * int(self.n.sum()) * 2 * self.k.shape[2] * self.k.shape[4] * self.k.element_size()

    @property
    def load(self) -> torch.Tensor:
        """(B,) pairs held per head, on average over the heads (the budget's count; `n` is the largest head's)."""
        return self.n - self.excess

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every per-slot tensor an eviction compacts (K/V-like ones have a last dimension D)."""
        t = {"k": self.k, "v": self.v, "pos": self.pos}
        if self.sum_w is not None:
            t.update(sum_w=self.sum_w, last_w=self.last_w)
        if self.k_src is not None:
            t.update(k_src=self.k_src, rot=self.rot)
        return {**t, **self.own}

    def nbytes(self) -> int:
        extra = ([self.q] if self.q is not None else []) + list(self.rows.values())
        return sum(x.numel() * x.element_size() for x in [*self.tensors().values(), *extra])

    def write(self, i: int, st, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a chunk's keys/values (B, H, T, D) of the group's layer i at the Step's slots; return the
        kept pairs (B, H, N, D)."""
        K, V = self.k[i], self.v[i]  # (B, H, C+1, D)
        K[st.b_idx, :, st.slot] = k.transpose(1, 2).to(K.dtype)  # (B, T, H, D) into the slots
        V[st.b_idx, :, st.slot] = v.transpose(1, 2).to(V.dtype)
        if self.k_src is not None:  # re-rotation: the key as written, and its rotary position (its slot)
            self.k_src[i][st.b_idx, :, st.slot] = K[st.b_idx, :, st.slot]
            self.rot[i][st.b_idx, :, st.slot] = st.slot.to(torch.int32)[..., None]
        self.write_slots(i, st)
        N = st.n_keys
        return K[:, :, :N], V[:, :, :N]

    def written(self, i: int, st, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This forward's new pairs of layer i as written (B, H, T, D) each (pads: the scratch slot); `key`/`value`
        (B, H, N, D) are what `write` returned (a quantized group reads them there)."""
        return self.k[i][st.b_idx, :, st.slot].transpose(1, 2), self.v[i][st.b_idx, :, st.slot].transpose(1, 2)

    def write_slots(self, i: int, st) -> None:
        """The written slots' positions, and their statistics zeroed, in layer i."""
        self.pos[i][st.b_idx, :, st.slot] = st.positions[..., None]
        if self.sum_w is not None:
            self.sum_w[i][st.b_idx, :, st.slot] = 0.0
            self.last_w[i][st.b_idx, :, st.slot] = 0.0

    def settle(self) -> None:
        """after_prefill's one compression is done: what only a score reads (attention statistics, the query
        window, a policy's own observations) is read no more, so it goes; the pairs and positions stay."""
        self.sum_w = self.last_w = self.q = None
        self.own, self.rows, self.settled = {}, {}, True

    def resize(self, capacity: int) -> None:
        """Reallocate to `capacity` slots (must hold every sample's pairs), freeing the rest."""
        if int(self.n.max()) > capacity:
            raise RuntimeError("resize below the pairs held")
        if capacity == self.capacity:
            return
        keep = int(self.n.max())
        for name, x in list(self.tensors().items()):
            shape = list(x.shape)
            shape[3] = capacity + 1
            y = torch.zeros(shape, dtype=x.dtype, device=x.device)
            y[:, :, :, :keep] = x[:, :, :, :keep]
            if name in self.own:
                self.own[name] = y
            else:
                setattr(self, name, y)
            del x
        self.capacity = capacity


def layer_capacities(capacities: list[int], windows, lengths: list[int], max_new_tokens: int,
                     widest: int) -> list[int]:
    """Slots per layer: the policy's `capacities` (one for all, or one per layer) for full-attention layers;
    a windowed layer holds its window W - 1 + the widest forward, never more than the whole sequence."""
    L = len(windows)
    caps = list(capacities) * L if len(capacities) == 1 else list(capacities)
    whole = max(lengths) + max_new_tokens
    return [c if w is None else min(whole, w - 1 + widest) for c, w in zip(caps, windows, strict=True)]


def form_groups(layer_devices, capacities: list[int], budgets: torch.Tensor | None, windows=None) -> list[tuple]:
    """The cache's groups: [(device, layers, capacity, budget row (B,) or None, window W or None)] of consecutive
    layers sharing all four (kvbench.memory's account builds the same list). Windowed layers have no budget row."""
    L = len(layer_devices)
    caps = list(capacities) * L if len(capacities) == 1 else list(capacities)
    windows = [None] * L if windows is None else list(windows)
    if len(caps) != L or len(windows) != L or (budgets is not None and budgets.shape[0] != L):
        raise ValueError("one capacity (or one for all), one window and one budget row per layer")
    runs: list[tuple] = []
    for layer, dev in enumerate(layer_devices):
        dev = torch.device(dev)
        w = windows[layer]
        row = None if budgets is None or w is not None else budgets[layer]
        last = runs[-1] if runs else None
        if last and last[0] == dev and last[2] == caps[layer] and last[4] == w and (
                (row is None and last[3] is None) or (row is not None and last[3] is not None and torch.equal(last[3], row))):
            last[1].append(layer)
        else:
            runs.append((dev, [layer], caps[layer], row, w))
    return runs


@lru_cache(maxsize=4096)  # the account asks the same shapes many times (a search, every forward)
def nbytes_for(*, batch_size: int, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int,
               dtype: torch.dtype, track_attention: bool, num_q_heads: int | None = None, query_window: int = 0,
               rerotate: bool = False, window: int | None = None, own=None) -> int:
    """What `allocated_bytes()` reports for such a cache (a group of it with `window`), before building it
    (kvbench.memory's account): built from the same `Group` on the meta device, so the count cannot drift."""
    return Group(range(num_layers), batch_size, num_kv_heads, capacity, head_dim, dtype, "meta", track_attention,
                 num_q_heads or num_kv_heads, query_window, rerotate=rerotate, sliding=window, own=own).nbytes()
