"""KVzap (arXiv 2601.07891; kvpress's KVzapPress): a small learned scorer per layer predicts each pair's (log
KVzip+) importance from the hidden state entering the layer's attention at the pair's own position.

The score is computed ONCE per pair, when it arrives (the observe step, kvbench.policies.needs: every prefill
chunk and decode step), stored with the pair (`needs.pair_state`, compacted with it in the static cache, kept in
its page in serve mode) and never recomputed; an eviction keeps each head's best (`compression_ratio` /
`kv_size`: per-head topk, kvpress's `kvzap_mlp_head`; `head_budget=adaptive`: AdaKV, `kvzap_mlp_layer`), or by
threshold (`head_budget=threshold` with `threshold`, a log-score: DMS, kvpress's leaderboard `kvzap_mlp` /
`kvzap_linear` = DMSPress(KVzapPress)): a pair out of the newest `sliding_window` (128) scoring below it goes, the
kept share depends on the data (kvbench.budgets.threshold_heads). Scores at arrival make it well defined under
every schedule. The scorer (kvbench.artifacts.kvzap_scorer): `scorer` = a
local folder or a Hub id in kvpress's layout; None = the Hub's `nvidia/KVzap-<model_type>-<model name>` (a model
with no name, kvbench's tiny random ones: a random scorer); "tiny" = a random scorer shaped for the model (tests,
smoke runs: its scores mean nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.artifacts.kvzap_scorer import (
    TINY_WIDTH,
    hub_id,
    is_random,
    load_scorer,
    module_params,
    scorer_width,
    tiny_scorer,
)
from kvbench.errors import ConfigError
from kvbench.policies.policy import AFTER_PREFILL, Needs, Policy, ScoreContext

_LOADED: dict = {}  # (source, model, its shape) -> scorer, loaded once per process


def scorer_for(source: str | None, model_type: str, config):
    """The scorer for a model `config` (the attention module's): loaded once."""
    key = (source, model_type, getattr(config, "name_or_path", ""), config.hidden_size, config.num_hidden_layers,
           getattr(config, "num_key_value_heads", None) or config.num_attention_heads)  # the scorer outputs H_kv
    if key not in _LOADED:
        if is_random(source, getattr(config, "name_or_path", "")):  # none is published for a nameless model
            _LOADED[key] = tiny_scorer(config, hidden_dim=None if model_type == "linear" else TINY_WIDTH)
        else:
            _LOADED[key] = load_scorer(source or hub_id(model_type, config.name_or_path), config)
    return _LOADED[key]


@dataclass
class KVzap(Policy):
    kv_size: int | None = 256
    evict_every: int = 64
    schedule: str = AFTER_PREFILL
    model_type: str = "mlp"  # mlp | linear
    scorer: str | None = None  # local folder or Hub id; None: nvidia/KVzap-<model_type>-<model>; "tiny": random
    threshold: float | None = None  # head_budget=threshold: evict pairs scoring below it (a log-score), DMS's rule
    sliding_window: int = 128  # head_budget=threshold: the newest pairs never evicted (DMS's window)
    name: ClassVar[str] = "kvzap"
    no_loglikelihood: ClassVar[str | None] = "its observe step (scores at arrival) runs in generation only"
    label: ClassVar[str] = "KVzap"
    summary: ClassVar[str] = "a learned per-layer scorer of each pair's hidden state, scored once at arrival"
    paper: ClassVar[tuple[str, str]] = ("Jegou et al., 2026", "https://arxiv.org/abs/2601.07891")
    published_schedule: ClassVar[str] = AFTER_PREFILL
    needs: ClassVar[Needs] = Needs(hidden=True, pair_state=("score",))

    def validate(self) -> None:
        if self.threshold is not None and self.head_budget != "threshold":
            raise ConfigError("policy.threshold", "is DMS's rule: set policy.head_budget=threshold with it (or null "
                              "it for a budget)", self.threshold)
        super().validate()

    @property
    def evicts(self) -> bool:
        return super().evicts or self.threshold is not None  # the threshold replaces the budget

    def describe(self, gqa: bool = False, paged: bool = False) -> dict:
        d = super().describe(gqa, paged)
        if self.scorer == "tiny":
            d["extensions"].append("scorer=tiny: a random scorer (its scores mean nothing)")
        return d

    def observe(self, obs) -> dict:
        s = scorer_for(self.scorer, self.model_type, obs.module.config)
        return {"score": s.score(obs.layer, obs.hidden)}  # (B, H_kv, T) in the hidden states' dtype

    def observe_bytes(self, *, rows, tokens, q_heads, kv_heads, head_dim, hidden, elem) -> int:
        # the MLP's activations (its width: 512 in kvpress's training, never wider than the model here) and output
        return rows * tokens * (min(512, hidden) + 2 * kv_heads) * elem

    def weight_bytes(self, *, layers: int, hidden: int, kv_heads: int, elem: int, model: str) -> int:
        # the scorer's modules of those layers, cast to the hidden states' dtype when they score (KVzapScorer.score);
        # its width from its config.json, no weights read
        return layers * module_params(hidden, kv_heads, scorer_width(self.scorer, self.model_type, model)) * elem

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        return ctx.pair["score"]  # (L, B, H_kv, N), as stored at arrival
