"""A request's state in the serving engine.

The token sequence is prompt + output. `num_computed` tokens of it have their KV computed since
the request was (re)admitted; the next forward feeds `seq[num_computed : num_computed + k]`, and a
chunk that reaches the end of the sequence yields the next token (prefill and decode are the same
rule; after a preemption the output so far is recomputed too, in chunks that stop where the first run evicted:
kvbench.serve.block_evict's `BlockRule.span`).

Its KV lives in pages, each `block_size` slots of one (layer, KV head), so each (layer, KV head) has
its own block table and count: `held[l, h]` pairs, logical slot s of (l, h) in page
`pages[l, h, s // block_size]`, offset `s % block_size`. Every written token goes to every (l, h);
eviction removes whole pages from a table (which close up), so `held <= num_computed`, and heads with
smaller budgets hold fewer pages. `budget[l, h]`: the pairs (l, h) may hold (None: never evicts),
set at admission from the request's own prompt (kvbench.serve.budgets).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Request:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    arrival: float = 0.0  # seconds on the engine's clock
    output: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens of prompt + output whose KV was computed since (re)admission
    pages: torch.Tensor | None = None  # (L, H, W) page ids; entries past a head's blocks are stale
    held: torch.Tensor | None = None  # (L, H) KV pairs each (layer, KV head) holds (<= num_computed)
    budget: torch.Tensor | None = None  # (L, H) pairs each (layer, KV head) may hold; None: no eviction
    recent: torch.Tensor | None = None  # (L, H) newest pairs never evicted (the policy's recent area)
    compressed: bool = False  # schedule=after_prefill: the one compression has happened
    finished: bool = False
    first_token_at: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    recomputed_tokens: int = 0  # computed tokens thrown away by preemptions
    evicted_blocks: int = 0  # pages evicted, in blocks (a block: one page in every layer and KV head)

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def remaining(self) -> int:
        """Tokens to feed before the next token can be sampled."""
        return self.seq_len - self.num_computed

    @property
    def in_prefill(self) -> bool:
        """Still computing the prompt (the decode_only schedule does not evict yet)."""
        return self.num_computed < len(self.prompt)

    @property
    def n_slots(self) -> int:
        """The most pairs any (layer, KV head) holds (all hold the same under one budget per request)."""
        return 0 if self.held is None else int(self.held.max())

    def tokens(self, k: int) -> list[int]:
        """The next k tokens to feed."""
        return (self.prompt + self.output)[self.num_computed : self.num_computed + k]
