"""A request's state in the serving engine.

The token sequence is prompt + output. `num_computed` tokens of it have their KV computed since
the request was (re)admitted; the next forward feeds `seq[num_computed : num_computed + k]`, and a
chunk that reaches the end of the sequence yields the next token (prefill and decode are the same
rule; after a preemption the output so far is recomputed as if it were prompt). `n_slots` KV pairs
are held: logical slot s lives in physical block `blocks[s // block_size]`, offset `s % block_size`;
eviction removes whole blocks from the table, so `n_slots <= num_computed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Request:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    arrival: float = 0.0  # seconds on the engine's clock
    output: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens of prompt + output whose KV was computed since (re)admission
    n_slots: int = 0  # KV pairs held (<= num_computed after evictions)
    blocks: list[int] = field(default_factory=list)  # block table: logical block -> physical block id
    finished: bool = False
    first_token_at: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    recomputed_tokens: int = 0  # computed tokens thrown away by preemptions
    evicted_blocks: int = 0

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

    def tokens(self, k: int) -> list[int]:
        """The next k tokens to feed."""
        return (self.prompt + self.output)[self.num_computed : self.num_computed + k]
