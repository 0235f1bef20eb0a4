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
    (("int8", 512), {"head_dim": [512, 256, 512]}, "gen.kv_quant_group=512: values are grouped per token over G "
     "channels: G must divide the model's head_dims 256 and 512 (its layers differ)"),  # Gemma 4 31B
])
def test_refusals_are_one_line(args, kwargs, line):
    with pytest.raises(ConfigError) as e:
        check_kv_cache(*args, **kwargs)
    assert str(e.value) == line and "\n" not in str(e.value)


def test_gemma4_s_group_must_divide_every_layer_kind_s_head_size(capsys, tmp_path, monkeypatch):
    """Gemma 4's sliding layers have head_dim 16 and its global ones 32 (tiny; 256 and 512 in Gemma 4 31B): the
    preflight checks the group against both, before any weight is built (issue 58: against the global layers' only,
    then the store raised after loading); a group dividing both runs to a true record."""
    import transformers

    from kvbench.cli import main
    from kvbench.models.family import kinds
    from kvbench.models.tiny import tiny_config
    from kvbench.quant.qconfig import head_dims
    from tests.conftest import assert_one_line_exit_2
    from tests.models.test_family_policies import policy_record

    assert head_dims(kinds(tiny_config("gemma4"))) == [16, 32] and head_dims(kinds(tiny_config("llama"))) == [16]
    argv = ["model=tiny-llama", "model.arch=gemma4", "policy=h2o", "policy.kv_size=24", "task.n_samples=1",
            "gen.kv_cache_dtype=int8", f"results_dir={tmp_path}"]
    with monkeypatch.context() as m:
        m.setattr(transformers.AutoModelForCausalLM, "from_config",
                  lambda *a, **k: (_ for _ in ()).throw(AssertionError("weights were built")))
        assert_one_line_exit_2(main, argv, capsys, "gen.kv_quant_group=32: values are grouped per token over G "
                               "channels: G must divide the model's head_dims 16 and 32 (its layers differ)")
    for dtype in ("int8", "int4"):
        rec = policy_record("gemma4", "h2o", tmp_path, f"gen.kv_cache_dtype={dtype}", "gen.kv_quant_group=16",
                            "gen.kv_quant_residual=0", "task.context_tokens=80")
        assert rec["status"] == "ok", rec["error"]
