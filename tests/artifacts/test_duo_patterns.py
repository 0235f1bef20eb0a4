"""DuoAttention head patterns: the published layout read from tmp_path, kvpress's streaming rule, and the
on-the-fly calibration against kvpress 0.5.5's own numbers on the tiny model (fixture duo_attention.json)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from kvbench.artifacts.duo_calibration import calibrate, head_scores
from kvbench.artifacts.duo_patterns import check_shape, published_pattern, retrieval_heads, streaming_heads
from kvbench.errors import ConfigError
from tests import kvpress_tiny as T

FIXTURE = json.loads((Path(__file__).parents[1] / "data/kvpress_methods/duo_attention.json").read_text())


def write_pattern(folder: Path, rows: list[list[float]], sink=2, recent=4) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"sink_size": sink, "recent_size": recent, "lr": 0.02}))
    (folder / "full_attention_heads.tsv").write_text("\n".join("\t".join(map(str, r)) for r in rows) + "\n")
    return folder


def test_published_layout_clipped(tmp_path):
    p = published_pattern(str(write_pattern(tmp_path / "p", [[0.2, 1.7], [-0.3, 0.9], [0.5, 0.1]])))
    assert (p.sink_size, p.recent_size) == (2, 4)
    np.testing.assert_array_equal(p.scores, [[0.2, 1.0], [0.0, 0.9], [0.5, 0.1]])
    keep, sink, recent = retrieval_heads(p, 0.5)
    assert keep.dtype == torch.bool and keep.tolist() == [[False, True], [False, True], [True, False]]
    assert (sink, recent) == (2, 4)


def test_streaming_rule():
    scores = np.array([[0.2, 1.0], [0.0, 0.9], [0.5, 0.1]])
    assert streaming_heads(scores, 0.5).tolist() == [[True, False], [True, False], [False, True]]  # round(3.0)
    assert streaming_heads(scores, 0.25).sum() == 2  # round(1.5) = 2 (half to even)
    four = np.array([[0.4, 0.3], [0.2, 0.1]])
    assert streaming_heads(four, 0.625).tolist() == [[False, False], [True, True]]  # round(2.5) = 2, not 3
    assert streaming_heads(four, 0.875).sum() == 4  # round(3.5) = 4
    assert not streaming_heads(scores, 0.0).any()
    with pytest.raises(ConfigError):
        streaming_heads(scores, 1.5)


def test_bad_patterns(tmp_path):
    (tmp_path / "e").mkdir()
    with pytest.raises(ConfigError, match="full_attention_heads.tsv|config.json"):
        published_pattern(str(tmp_path / "e"))
    with pytest.raises(ConfigError, match="no published pattern"):
        published_pattern("someone/unknown-model")
    p = published_pattern(str(write_pattern(tmp_path / "p", [[0.1, 0.2, 0.3]])))
    with pytest.raises(ConfigError, match="not the model's") as e:
        check_shape(p, T.tiny_model().config)
    assert "\n" not in str(e.value)
    bad = write_pattern(tmp_path / "b", [[0.1]])
    (bad / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a DuoAttention pattern"):
        published_pattern(str(bad))


def test_on_the_fly_matches_kvpress():
    model = T.tiny_model()
    assert T.weights_sum(model) == pytest.approx(FIXTURE["weights_sum"], rel=1e-12)
    seqs = [T.CharTokenizer().encode(t) for t in FIXTURE["texts"]]
    got = head_scores(model, seqs, q_len=FIXTURE["q_len"])
    np.testing.assert_allclose(got, FIXTURE["head_scores"], rtol=1e-6, atol=1e-7)
    assert streaming_heads(got, FIXTURE["ratio"]).tolist() == FIXTURE["streaming_mask"]
    pat = calibrate(model, seqs, q_len=FIXTURE["q_len"])
    assert (pat.sink_size, pat.recent_size) == (128, 256) and pat.scores.shape == (2, 2)


def test_on_the_fly_depends_on_text_and_position():
    """The query sits at q_len - 1: another q_len or other text changes the scores (the rule is not constant)."""
    model = T.tiny_model()
    seqs = [T.CharTokenizer().encode(t) for t in T.CALIBRATION]
    a = head_scores(model, seqs, q_len=16)
    assert not np.allclose(a, head_scores(model, seqs, q_len=8))
    assert not np.allclose(a, head_scores(model, seqs[:1], q_len=16))
    with pytest.raises(ConfigError):
        head_scores(model, [[]])
    assert torch.is_tensor(streaming_heads(a, 0.5))


def test_on_the_fly_bfloat16_close():
    """A bf16 model gives the float32 ranking's scores to bf16 rounding (softmax in float32 as kvpress)."""
    seqs = [T.CharTokenizer().encode(t) for t in T.CALIBRATION]
    ref = head_scores(T.tiny_model(), seqs, q_len=16)
    got = head_scores(T.tiny_model(torch.bfloat16), seqs, q_len=16)
    np.testing.assert_allclose(got, ref, atol=2e-3)
    assert streaming_heads(got, 0.5).tolist() == streaming_heads(ref, 0.5).tolist()


@pytest.mark.parametrize("arch", ["qwen3", "olmo2"])
def test_on_the_fly_query_norms(arch):
    """Per-head norms (Qwen3) and whole-projection norms (OLMo2) are both applied: scores differ without them."""
    from kvbench.models.tiny import build_tiny

    model = build_tiny("t", arch=arch, device="cpu").model
    seqs = [list(range(10, 30)), list(range(40, 52))]
    a = head_scores(model, seqs, q_len=16)
    assert a.shape == (model.config.num_hidden_layers, model.config.num_key_value_heads)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.mul_(3.0)
    assert not np.allclose(a, head_scores(model, seqs, q_len=16))


def test_on_the_fly_refuses_fused_projections():
    from kvbench.models.tiny import build_tiny

    with pytest.raises(ConfigError, match="q_proj"):
        head_scores(build_tiny("t", arch="phi3", device="cpu").model, [[1, 2, 3]], q_len=8)


def test_published_fetch_urls(monkeypatch):
    """A known model id is fetched from the duo-attention repository at kvpress's URL; no answer: one line."""
    import urllib.error

    from kvbench.artifacts import duo_patterns as P

    base = "https://raw.githubusercontent.com/mit-han-lab/duo-attention/refs/heads/main/attn_patterns/" \
        "Meta-Llama-3.1-8B-Instruct/lr=0.02-reg=0.05-ctx=1000_128000-multi_passkey10/"
    served = {base + "config.json": '{"sink_size": 64, "recent_size": 256}',
              base + "full_attention_heads.tsv": "0.5\t1.5\n0.25\t-1\n"}
    monkeypatch.setattr(P, "_get", lambda url, timeout: served[url])
    p = published_pattern("meta-llama/Meta-Llama-3.1-8B-Instruct")
    assert (p.sink_size, p.recent_size) == (64, 256) and p.scores.tolist() == [[0.5, 1.0], [0.25, 0.0]]

    def down(url, timeout):
        raise urllib.error.URLError("no route")

    monkeypatch.setattr(P, "_get", down)
    with pytest.raises(ConfigError, match="could not fetch"):
        published_pattern("mistralai/Mistral-7B-Instruct-v0.3")


def test_a_hybrid_s_linear_layers_are_left_out_of_the_ranking():
    """round(L x H x ratio) counts the attention layers' heads only: a linear-attention row (no KV heads) is never
    streaming and takes no share (kvpress's rule over the attention layers' table)."""
    scores = np.array([[0.0, 0.0], [0.5, 0.1], [0.2, 0.3]])  # row 0: a linear-attention layer
    assert streaming_heads(scores, 0.5, skip=(0,)).tolist() == [[False, False], [False, True], [True, False]]
    assert streaming_heads(scores, 0.5).tolist() == [[True, True], [False, True], [False, False]]  # the defect


@pytest.mark.parametrize("arch", ["qwen3.5", "qwen3-next"])
def test_on_the_fly_on_a_hybrid_scores_its_attention_layers(arch):
    """Calibration reads each attention layer's own pre-RoPE query (Qwen3.5's q_proj also holds the output gate) and
    partial RoPE; a linear-attention layer scores 0 and is not ranked (it crashed reading `self_attn`)."""
    from kvbench.models import family
    from kvbench.models.tiny import build_tiny

    model = build_tiny("t", arch=arch, device="cpu").model
    k = family.kinds(model.config)
    a = head_scores(model, [list(range(10, 30)), list(range(40, 52))], q_len=16)
    assert a.shape == (2, 2) and not a[list(k.linear)].any() and (a[k.full_layers] > 0).all()
    streaming = streaming_heads(a, 0.5, skip=k.linear)
    assert not streaming[list(k.linear)].any() and streaming[k.full_layers].sum() == 1
