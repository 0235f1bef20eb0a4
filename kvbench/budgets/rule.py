"""Budget rules: how a (layer, sample)'s pairs are spread over its KV heads, and a batch's budget over its layers.

Two kinds, each one file per rule in this package, found by name like policies (`kvbench.registry.discover`):

* a head rule (`HeadRule`), chosen by the policy's knob `head_budget`: `uniform` (every KV head holds the
  layer's budget) or `adaptive` (AdaKV: the layer's pairs chosen by score across its heads). It says what the
  cache and the engine need to know: the most pairs one head may hold (`slots`: what the cache preallocates and
  the memory account charges), whether it needs a score to choose the counts (`needs_score`), whether the counts
  are chosen once, when the prompt is compressed (`once_only`: schedule=after_prefill), whether the heads of a
  (layer, sample) may hold different counts (`uneven`: a mask per KV head, no flash kernel, no re-rotation, each
  head its own pages in serving), whether the counts depend on the scores' values (`data_dependent`: the account
  charges a bound), and the counts themselves from the ranked scores (`counts`); a rule may set the budget the
  schedule evicts on and the protected newest pairs itself (`budgets`, `recent`: DMS's threshold and window);
* a layer rule (`LayerRule`), chosen by the policy's class (`Policy.layer_budget`): `uniform` (every layer the
  sample's budget) or `pyramid` (PyramidKV). It gives each layer its budget from the samples' (`budgets`) and says
  whether layers may differ (`varies`: a cache group per layer, each layer its own pages in serving).

A new rule is a file here defining a subclass with its own `name`; a policy then names it (`head_budget=<name>` or
`layer_budget: ClassVar[str] = "<name>"`). Rules are stateless: every method takes the policy whose knobs it reads.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import torch

from kvbench.errors import ConfigError


class HeadRule:
    """How a (layer, sample) keeping `pairs` per KV head on average spreads them over its heads."""

    name: ClassVar[str] = ""
    needs_score: ClassVar[bool] = False  # the counts come from the ranked scores of an eviction
    once_only: ClassVar[bool] = False  # the counts are chosen once, when the prompt is compressed (after_prefill)
    uneven: ClassVar[bool] = False  # heads of a (layer, sample) may hold different counts
    transient: ClassVar[int] = 0  # bytes per (layer, sample, head, pair) `counts` allocates beyond the ranked scores
    # the counts depend on the scores' values, not only on the pairs held (DMS's threshold): the cache and the memory
    # account hold a bound (`slots`), which the run's measured allocation stays at or under
    data_dependent: ClassVar[bool] = False
    fixed: ClassVar[bool] = False  # each head's budget is known from the model's config before any score (`head_budgets`)

    def validate(self, policy) -> None:
        """ConfigError naming `policy.head_budget` when the policy cannot run under this rule."""

    def slots(self, policy, pairs, heads: int | None):
        """The most pairs one KV head may hold when its layer keeps `pairs` per head on average (an int or a
        tensor); `heads`: the model's KV heads (None: unknown)."""
        return pairs

    def budgets(self, policy, lengths: list[int]) -> torch.Tensor | None:
        """(B,) the budgets the schedule evicts on when the rule sets them itself (threshold: its window), for prompts
        of these lengths; None: the policy's budget knobs'."""
        return None

    def recent(self, policy) -> int | None:
        """The newest pairs every eviction protects when the rule sets them (threshold: its window); None: the
        policy's `protect_recent`."""
        return None

    def head_budgets(self, policy, config, fetch: bool = True):
        """request -> (L, H) pairs each (layer, KV head) may hold, when the rule fixes them from the model's `config`
        before any score is read (DuoAttention's pattern): serving then evicts each head by its own budget under any
        schedule; None: the counts come from the scores at the one compression (`counts`), or, with `fetch=False`
        (the preflight), they need what is not there yet (the Hub, the weights)."""
        return None

    def counts(self, policy, ranked: torch.Tensor, keep: torch.Tensor) -> torch.Tensor | None:
        """(L, B', H) pairs each head keeps, from `ranked` (L, B', H, N) scores as the cache's eviction ranks them
        (protected +inf, empty slots -inf) and `keep` (B',) pairs per head on average; None: every head `keep`."""
        return None

    def extensions(self, policy) -> list[str]:
        """The run's `extensions` this rule adds (its departures from the published method)."""
        return []


class LayerRule:
    """Each layer's budget from the samples' budgets."""

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""  # how refusals name it (e.g. "PyramidKV")
    varies: ClassVar[bool] = False  # layers may hold different budgets

    def budgets(self, policy, per_sample: torch.Tensor, layers: int, lengths: list[int]) -> torch.Tensor:
        """(L, B) budget of each layer of each sample from the samples' budgets `per_sample` (B,) and the lengths of
        their prompts (the context's, query-agnostic), over `layers` compressed layers."""
        return per_sample[None, :].expand(layers, -1).clone()

    def validate(self, policy) -> None:
        if self.varies and policy.rerotate:
            raise ConfigError("policy.rerotate", f"needs the same budget in every layer (rotary positions are shared "
                              f"by all layers); {self.label or self.name}'s budgets differ by layer", policy.rerotate)

    def extensions(self, policy) -> list[str]:
        return []

    def describe(self, policy) -> str | None:
        """The record's `budgets` line when layers differ (None: the same budget in every layer)."""
        return None


@functools.cache
def _rules(base: type) -> dict[str, object]:
    """name -> an instance of every rule of this kind in kvbench.budgets."""
    import kvbench.budgets as package
    from kvbench.registry import discover

    return {name: cls() for name, cls in discover(package.__name__, package.__path__, base).items()}


def head_rules() -> dict[str, HeadRule]:
    return _rules(HeadRule)


def layer_rules() -> dict[str, LayerRule]:
    return _rules(LayerRule)


def head_rule(policy) -> HeadRule:
    """The policy's head rule (`policy.head_budget`); ConfigError naming the key for an unknown one."""
    rules = head_rules()
    if policy.head_budget not in rules:
        raise ConfigError("policy.head_budget", f"must be one of {', '.join(rules)}", policy.head_budget)
    return rules[policy.head_budget]


def layer_rule(policy) -> LayerRule:
    """The policy's layer rule (`policy.layer_budget`, its class's)."""
    return layer_rules()[getattr(policy, "layer_budget", "uniform")]
