"""What kvbench knows about a model family, read from its config alone (no weights): the model adapter.

Every part that needs model knowledge reads it here: the cache geometry (query and KV heads, GQA derived
once, head size), each layer's attention kind (full, or a sliding window of W tokens), learned attention
sinks, logit soft-capping, which RoPE kinds are not a plain rotation, and which families kvbench runs.

* `table`: the accepted families (`FAMILIES`, where each reads its windows), their features, and the reason
  each known family kvbench cannot run is refused (`REFUSED`);
* `adapter`: one model's attention (`ModelKinds`), the refusal of a model or of a policy on it;
* `rope`: its RoPE kind, whether re-rotation composes with it, the length past which it changes.

A family not in `FAMILIES`, or a config using a feature kvbench does not implement (chunked or
bidirectional attention, an unknown layer type), is refused by `refusal` with one line naming the family
and why, before any weight loads (kvbench.config.preflight, the loaders, and `kvbench.generate`).
"""

from kvbench.models.family.adapter import (
    ModelKinds,
    check,
    check_policy,
    effective_windows,
    kinds,
    refusal,
    split_windows,
)
from kvbench.models.family.rope import (
    NOT_A_ROTATION,
    check_length_rope,
    rope_kind,
    rope_length_limit,
    rope_problem,
)
from kvbench.models.family.table import (
    FAMILIES,
    GLOBAL,
    HYBRID,
    LAYER_KINDS,
    LAYER_TYPES,
    NONE,
    REFUSED,
    SINKS,
    SOFTCAP,
    family_of,
    nope_layers,
    text_config,
)

__all__ = ["FAMILIES", "GLOBAL", "HYBRID", "LAYER_KINDS", "LAYER_TYPES", "NONE", "NOT_A_ROTATION", "REFUSED", "SINKS", "SOFTCAP",
           "ModelKinds", "check", "check_length_rope", "check_policy", "effective_windows", "family_of", "split_windows", "kinds",
           "nope_layers", "refusal", "rope_kind", "rope_length_limit", "rope_problem", "text_config"]
