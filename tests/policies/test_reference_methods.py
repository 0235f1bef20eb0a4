"""The brute-force references of tests/reference_methods.py, reference_select.py and reference_passes.py
against kvpress 0.5.5's own presses: fixtures made by scripts/crosscheck/kvpress_fixtures.py in kvpress's venv
(tests/data/kvpress_methods/*.json: the scores each press ranks and the pairs it kept, on a tiny model and a
40-token prompt that tests/kvpress_tiny.py rebuilds here identically).

The reference runs in float64 on the same (float32-drawn) weights, token by token with its own cache; kvpress
ran in float32, whole prompt at once: scores agree to float32 rounding, kept sets exactly (or, where the
reference's scores tie at the budget's boundary, as one of the choices topk could make).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from tests import kvpress_tiny as T
from tests import reference as R
from tests import reference_methods as M
from tests import reference_passes as P
from tests import reference_select as S

FIX = Path(__file__).resolve().parents[1] / "data" / "kvpress_methods"


def fixture(name: str) -> dict:
    return json.loads((FIX / f"{name}.json").read_text())


@functools.cache
def prefilled():
    """(reference model, its cache after the prompt, hidden states seen per layer), in float64."""
    model = T.tiny_model(torch.float64)
    ref = R.ReferenceModel(model)
    ref.hidden = [[] for _ in ref.layers]
    cache = ref.new_cache()
    for pos, tok in enumerate(T.prompt_ids()):
        ref.step(tok, pos, cache)
    hidden, ref.hidden = ref.hidden, None
    return ref, cache, hidden, T.weights_sum(model)


def close(got, want, rtol=1e-4, atol=1e-6):
    g, w = torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64)
    assert g.shape == w.shape, (g.shape, w.shape)
    assert torch.allclose(g, w, rtol=rtol, atol=atol), f"largest difference {float((g - w).abs().max()):.3g}"


def valid_topk(scores: list[float], kept: list[int]) -> None:
    """`kept` is a set of len(kept) best scores: every pair above the boundary in, every pair below out."""
    edge = sorted(scores, reverse=True)[len(kept) - 1]
    assert {i for i, s in enumerate(scores) if s > edge} <= set(kept) <= {i for i, s in enumerate(scores) if s >= edge}


def sketches(seed: int) -> list[torch.Tensor]:
    """The leverage sketch kvpress drew for each layer: torch's global generator seeded before the prefill,
    one (1, H_kv, D, 48) draw per layer in layer order."""
    torch.manual_seed(seed)
    return [torch.randn(1, 2, 8, 48)[0] for _ in range(2)]


def scores_of(name: str, fx: dict, layer: int):
    ref, cache, hidden, _ = prefilled()
    heads, seen = cache[layer], hidden[layer]
    if name in ("expected_attention", "adakv_expected_attention", "critical_expected_attention",
                "chunkkv_expected_attention"):
        inner = M.expected_attention(ref, layer, heads, seen, epsilon=1e-2 if name.startswith("adakv") else 0.0,
                                     use_vnorm=not name.startswith("critical"))
        return M.critical(ref, layer, heads, inner, fx["ratio"]) if name.startswith("critical") else inner
    if name == "lagkv":
        return M.lagkv(ref, heads, lag=8)
    if name == "leverage":
        return M.leverage(ref, layer, heads, seen, sketches(fx["sketch_seed"])[layer])
    if name == "non_causal_attention":
        return M.non_causal_attention(ref, layer, heads, seen, chunk=16)
    if name == "compactor":
        return M.compactor(ref, layer, heads, seen, sketches(fx["sketch_seed"])[layer], fx["ratio"], chunk=16)
    cfg, sd = T.kvzap_weights("mlp" if "mlp" in name else "linear")
    return M.kvzap(cfg, sd, layer, heads, seen)


RANKED = ["expected_attention", "adakv_expected_attention", "adakv_kvzap_mlp", "lagkv", "leverage", "non_causal_attention", "compactor",
          "kvzap_mlp_head", "kvzap_linear_dms", "critical_expected_attention"]


@pytest.mark.parametrize("name", RANKED)
def test_scores_and_kept_pairs_are_kvpress(name):
    fx = fixture(name)
    assert fx["weights_sum"] == prefilled()[3], "the tiny model is not the one the fixture was made on"
    for layer, (want, kept) in enumerate(zip(fx["scores"], fx["kept"], strict=True)):
        got = scores_of(name, fx, layer)
        close(got, want)
        if name.startswith("adakv"):
            assert S.adakv(got, fx["ratio"], fx["args"].get("alpha_safeguard", 0.2)) == kept
        elif name == "kvzap_linear_dms":
            assert S.dms(got, fx["args"]["threshold"], fx["args"]["sliding_window_size"]) == kept
        else:
            for s, k in zip(got, kept, strict=True):
                assert len(k) == S.n_kept(len(s), fx["ratio"])
                valid_topk(s, k)


def test_chunkkv_keeps_kvpress_chunks():
    fx = fixture("chunkkv_expected_attention")
    for layer, kept in enumerate(fx["kept"]):
        got = S.chunkkv(scores_of("chunkkv_expected_attention", fx, layer), fx["ratio"], fx["args"]["chunk_length"])
        assert got == kept


@pytest.mark.parametrize("name", ["kvzip", "kvzip_plus", "kvzip_layerwise", "kvgrad"])
def test_reconstruction_scores_and_kept_pairs_are_kvpress(name):
    fx = fixture(name)
    ref, cache, _, total = prefilled()
    assert fx["weights_sum"] == total
    table = P.kvzip_table(ref, cache, T.CharTokenizer(), fx["ids"], chunk=fx["args"]["chunk_size"],
                          plus=fx["args"].get("kvzip_plus_normalization", False), grad=name == "kvgrad")
    close(table, fx["score_val"], rtol=1e-3 if name == "kvgrad" else 1e-4)
    assert S.kvzip(table, fx["ratio"], layerwise=fx["args"].get("layerwise", False)) == fx["kept"]


def test_duo_attention_head_scores_mask_and_kept_pairs_are_kvpress():
    fx = fixture("duo_attention")
    ref, _, _, total = prefilled()
    assert fx["weights_sum"] == total
    tok = T.CharTokenizer()
    close(P.duo_head_scores(ref, [tok.encode(t) for t in fx["texts"]], fx["q_len"]), fx["head_scores"])
    mask = S.duo_streaming(fx["head_scores"], fx["ratio"])
    assert mask == fx["streaming_mask"]
    n = len(fx["ids"])
    assert [S.duo_kept(n, row, fx["sink_size"], fx["recent_size"]) for row in mask] == fx["kept"]
