"""A wrapper policy (ChunkKV, CriticalKV) over an inner one: a registered policy whose score the wrapper reads.

`Wrapper` is their common base: the knobs (`inner`, `inner_args`, once after prefill), the refusals (other
schedules, adaptive head budgets, and the inner policy's own: its `whole_prompt` rule, e.g. Compactor's, and its
`check_model`), and what the wrapper hands to the inner policy (`Wraps`). `build_inner` checks
`policy.inner` / `policy.inner_args` and makes the inner policy (schedule after_prefill, its own knobs at their
defaults unless given); `raised_score` is its score with the pairs it protects (SnapKV's observation window,
sinks) raised to the layer's largest score + 1, as kvpress's SnapKVPress gives its window (and its
ExpectedAttentionPress its sinks).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from kvbench.errors import ConfigError
from kvbench.policies.policy import AFTER_PREFILL, Policy, ScoreContext


def build_inner(policy, not_inner: tuple[str, ...], who: str) -> Policy:
    """The inner policy of `policy` (a wrapper named `who`), or ConfigError naming the key."""
    from kvbench.policies import registry

    policies = registry()
    if policy.inner not in policies or policy.inner in not_inner:
        raise ConfigError("policy.inner", "must name a registered policy with a score, one of "
                          f"{', '.join(p for p in policies if p not in not_inner)}", policy.inner)
    cls = policies[policy.inner]
    if cls.layer_budget != "uniform":
        raise ConfigError("policy.inner", f"{who}'s budget is the same in every layer: the inner policy cannot "
                          f"bring its own layer budgets ({cls.layer_budget})", policy.inner)
    if not isinstance(policy.inner_args, Mapping):
        raise ConfigError("policy.inner_args", "must be a mapping of the inner policy's knobs", policy.inner_args)
    policy.inner_args = dict(policy.inner_args)
    try:
        return cls(**{**policy.inner_args, "schedule": AFTER_PREFILL})
    except TypeError as e:
        raise ConfigError("policy.inner_args", f"not {policy.inner}'s knobs ({e})", policy.inner_args) from None


def raised_score(inner: Policy, stats: ScoreContext) -> tuple[torch.Tensor, torch.Tensor]:
    """((L, B, H, N) float32 inner score, the pairs it protects raised to the layer's largest real score + 1;
    (1, B, 1, N) bool real slots)."""
    g = inner.score(stats).float()  # (L, B, H, N)
    N = g.shape[-1]
    real = torch.arange(N, device=g.device) < stats.n  # (1, B, 1, N)
    recent = inner.protect_recent or 0
    held = (stats.pos < inner.protect_first) | (stats.pos > stats.last - recent)  # the inner's protected pairs
    top = g.masked_fill(~real, float("-inf")).amax(dim=(2, 3), keepdim=True)  # (L, B, 1, 1)
    return torch.where(held & real, top + 1.0, g), real  # kvpress: F.pad(scores, ..., value=scores.max().item() + 1)


class Wraps:
    """What a wrapper hands to its inner policy (`self._inner`, made by `build_inner`): its knobs read through
    (policy.window: SnapKV's), what it reads (`needs`), its observe step (ExpectedAttention's statistics) and its
    scoring passes (KVzip's)."""

    def __getattr__(self, name: str):
        inner = self.__dict__.get("_inner")
        if inner is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(inner, name)

    @property
    def needs(self):
        return self._inner.needs

    def observe(self, obs):
        return self._inner.observe(obs)

    def observe_bytes(self, **shape: int) -> int:
        return self._inner.observe_bytes(**shape)

    def weight_bytes(self, **shape) -> int:
        return self._inner.weight_bytes(**shape)

    def prepare(self, tokenizer, model=None) -> None:
        self._inner.prepare(tokenizer, model)

    def scoring_passes(self, context: list[int]) -> list:
        return self._inner.scoring_passes(context)

    def pass_width(self, length: int) -> int:
        return self._inner.pass_width(length)

    def pass_bytes(self, **shape: int) -> int:
        return self._inner.pass_bytes(**shape)

    def pass_scores(self, ctx):
        return self._inner.pass_scores(ctx)


@dataclass
class Wrapper(Wraps, Policy):
    """A policy over `inner`'s score, defined once on the whole prompt (kvpress's protocol), every KV head the same
    budget. A subclass names what it cannot wrap (`not_inner`) and why it is once only (`after_prefill_only`) and
    uniform over heads (`uniform_heads_only`), for the refusals."""

    kv_size: int | None = 256
    schedule: str = AFTER_PREFILL
    inner: str = "snapkv"  # the registered policy whose score the wrapper reads
    inner_args: dict = field(default_factory=dict)  # the inner policy's own knobs (its defaults otherwise)
    abstract: ClassVar[bool] = True
    not_inner: ClassVar[tuple[str, ...]] = ()

    def validate(self) -> None:
        self._inner = build_inner(self, self.not_inner, self.label)
        why = self._inner.whole_prompt  # the inner's declarations bind the wrapper: its score is the inner's
        if why is not None and type(self).whole_prompt is None:
            self.whole_prompt = f"{why} (policy.inner={self.inner})"  # this instance's: gen.prefill_chunk, serve
        super().validate()

    def check_model(self, config) -> None:
        """The inner policy's check of the model (the preflight's, from its config alone)."""
        self._inner.check_model(config)

    def inner_score_bytes(self, **shape: int) -> int:
        """The inner score's transient (`score_bytes`'s keywords)."""
        return self._inner.score_bytes(**shape)
