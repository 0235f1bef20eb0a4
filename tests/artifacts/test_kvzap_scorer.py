"""KVzap's scorer: the Hub layout written in tmp_path loads back identically; bad folders fail in one line."""

import json

import pytest
import torch

from kvbench.artifacts.kvzap_scorer import hub_id, load_scorer, save_scorer, tiny_scorer
from kvbench.errors import ConfigError
from kvbench.models.tiny import tiny_config


@pytest.fixture
def cfg():
    return tiny_config("llama")


@pytest.mark.parametrize("hidden_dim", [None, 8])
def test_round_trip_same_scores(tmp_path, cfg, hidden_dim):
    scorer = tiny_scorer(cfg, hidden_dim=hidden_dim)
    save_scorer(scorer, tmp_path / "s")
    back = load_scorer(str(tmp_path / "s"), cfg)
    h = torch.randn(2, 5, cfg.hidden_size)  # (B, T, hidden)
    for layer in range(cfg.num_hidden_layers):
        s = back.score(layer, h)
        assert s.shape == (2, cfg.num_key_value_heads, 5)  # (B, H_kv, T)
        torch.testing.assert_close(s, scorer.score(layer, h), rtol=0, atol=0)
    assert back.score(0, h).dtype == torch.float32 and back.score(0, h.bfloat16()).dtype == torch.bfloat16


def test_kvpress_parameter_names(cfg):
    mlp, lin = tiny_scorer(cfg, 8).state_dict(), tiny_scorer(cfg, None).state_dict()
    assert set(mlp) == {f"layers.{i}.{j}.{p}" for i in range(cfg.num_hidden_layers) for j in (0, 2)
                        for p in ("weight", "bias")}
    assert set(lin) == {f"layers.{i}.{p}" for i in range(cfg.num_hidden_layers) for p in ("weight", "bias")}


def test_mlp_rule_by_hand(cfg):
    """score = W2 gelu(W1 h + b1) + b2 per layer, transposed to (B, H_kv, T)."""
    s = tiny_scorer(cfg, 8)
    h = torch.randn(1, 3, cfg.hidden_size)
    w1, b1, w2, b2 = (s.state_dict()[f"layers.1.{k}"] for k in ("0.weight", "0.bias", "2.weight", "2.bias"))
    want = (torch.nn.functional.gelu(h @ w1.T + b1) @ w2.T + b2).transpose(1, 2)
    torch.testing.assert_close(s.score(1, h), want)


def test_hub_id():
    assert hub_id("mlp", "Qwen/Qwen3-8B") == "nvidia/KVzap-mlp-Qwen3-8B"
    with pytest.raises(ConfigError, match="linear"):
        hub_id("deep", "Qwen/Qwen3-8B")


def test_bad_inputs_one_line(tmp_path, cfg):
    with pytest.raises(ConfigError, match="config.json"):
        (tmp_path / "empty").mkdir()
        load_scorer(str(tmp_path / "empty"), cfg)
    save_scorer(tiny_scorer(cfg, 8), tmp_path / "s")
    other = tiny_config("llama", layers=3)
    with pytest.raises(ConfigError, match="n_modules") as e:
        load_scorer(str(tmp_path / "s"), other)
    assert "\n" not in str(e.value)
    c = json.loads((tmp_path / "s" / "config.json").read_text())
    (tmp_path / "s" / "config.json").write_text(json.dumps({**c, "hidden_dim": 16}))
    with pytest.raises(ConfigError, match="weights do not match"):
        load_scorer(str(tmp_path / "s"), cfg)
    with pytest.raises(ConfigError, match="cannot be reached"):  # HF_HUB_OFFLINE=1 in the suite
        load_scorer("nvidia/KVzap-mlp-nonexistent-offline", cfg)


def test_hub_id_goes_to_snapshot_download(tmp_path, cfg, monkeypatch):
    """A Hub id is fetched with huggingface_hub (config + safetensors only) and loaded from where it lands."""
    import huggingface_hub

    save_scorer(tiny_scorer(cfg, None), tmp_path / "snap")
    calls = []

    def fake(repo_id, allow_patterns, local_files_only):
        calls.append((repo_id, allow_patterns, local_files_only))
        return str(tmp_path / "snap")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    s = load_scorer(hub_id("linear", "meta-llama/Llama-3.1-8B-Instruct"), cfg)
    assert calls == [("nvidia/KVzap-linear-Llama-3.1-8B-Instruct", ["config.json", "*.safetensors"], True)]
    assert s.hidden_dim is None and len(s.layers) == cfg.num_hidden_layers


def test_param_bytes():
    from kvbench.artifacts.kvzap_scorer import KVzapScorer

    s = KVzapScorer(4096, 8, 32, 512)
    assert s.param_bytes(torch.bfloat16) == 2 * 32 * (4096 * 512 + 512 + 512 * 8 + 8)
    assert KVzapScorer(6, 2, 3).param_bytes(torch.float32) == 4 * 3 * (6 * 2 + 2)
