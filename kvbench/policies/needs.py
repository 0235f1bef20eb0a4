"""What a policy's score reads: its declaration, from which the engine keeps (and the memory account charges) it.

A policy declares `needs` (a class-level `Needs`, or a property where a field sets a size, e.g. SnapKV's
window); the static cache (kvbench.cache), the paged pool (kvbench.serve) and the account (kvbench.memory)
read the same declaration, so a policy that declares nothing pays nothing. What the score then receives is a
`kvbench.policies.base.ScoreContext`.

attention: running per-pair attention statistics (sum_w, last_w), collected inside attention
keys:      the cached keys (RoPE applied)
values:    the cached values
queries:   the newest W queries processed (RoPE applied), with their positions and the softmax scale
passes:    scoring passes: extra forwards over token sequences built from each row's context, run at the
           compression point (`Policy.scoring_passes`, `Policy.pass_scores`; kvbench.engine.passes), whose per-pair
           statistic the score reads as `ScoreContext.own`
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Needs:
    attention: bool = False
    keys: bool = False
    values: bool = False
    queries: int = 0
    passes: bool = False

    @property
    def any(self) -> bool:
        """Whether the score reads anything besides positions and counts."""
        return self.attention or self.keys or self.values or self.queries > 0 or self.passes
