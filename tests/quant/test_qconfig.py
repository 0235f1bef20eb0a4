"""gen.kv_cache_dtype and its knobs: what is accepted, and each refusal as the one line a user sees."""

from __future__ import annotations

import pytest

from kvbench.errors import ConfigError
from kvbench.quant.qconfig import KVQuant, check_kv_cache


def test_accepted():
    assert check_kv_cache() is None
    assert check_kv_cache("auto", attention="flash", rerotate=True) is None  # nothing quantized: nothing refused
    assert check_kv_cache("int4", 32, 0, attention="sdpa", head_dim=64) == KVQuant(4, 32, 0)
    assert check_kv_cache("int8", 64, 128, attention="fused", head_dim=128) == KVQuant(8, 64, 128)


@pytest.mark.parametrize("args, kwargs, line", [
    (("fp8",), {}, "gen.kv_cache_dtype=fp8: must be one of auto, int8, int4"),
    (("int4", 0), {}, "gen.kv_quant_group=0: must be a positive integer"),
    (("int4", True), {}, "gen.kv_quant_group=True: must be a positive integer"),
    (("int4", 32, -1), {}, "gen.kv_quant_residual=-1: must be an integer >= 0"),
    (("auto", 32, 1.5), {}, "gen.kv_quant_residual=1.5: must be an integer >= 0"),
    (("int4",), {"attention": "flash"},
     "gen.attention=flash: flash-attn reads a full-precision cache; with gen.kv_cache_dtype=int4 use sdpa, fused or eager"),
    (("int8",), {"rerotate": True}, "policy.rerotate=True: re-rotation rebuilds keys from their full-precision "
     "copies, which a quantized cache (gen.kv_cache_dtype=int8) does not hold"),
    (("int4", 48), {"head_dim": 64},
     "gen.kv_quant_group=48: values are grouped per token over G channels: G must divide the model's head_dim 64"),
    (("int4", 1), {"head_dim": 63}, "gen.kv_cache_dtype=int4: int4 packs two codes a byte: the model's head_dim 63 is odd"),
])
def test_refusals_are_one_line(args, kwargs, line):
    with pytest.raises(ConfigError) as e:
        check_kv_cache(*args, **kwargs)
    assert str(e.value) == line and "\n" not in str(e.value)
