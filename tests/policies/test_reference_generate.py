"""tests/reference_generate.py, the methods' after_prefill generation, against kvpress 0.5.5 on the tiny
model of tests/kvpress_tiny.py: each rule of METHODS keeps the pairs kvpress kept (the fixtures of
tests/data/kvpress_methods/), and the greedy tokens decoded after the compression are kvpress's (6 tokens:
kvpress masks the evicted keys, the reference drops them; kept pairs keep their positions)."""

from __future__ import annotations

import pytest

from tests import kvpress_tiny as T
from tests import reference_generate as G
from tests.policies.test_reference_methods import fixture, prefilled


def zap(kind: str) -> dict:
    cfg, sd = T.kvzap_weights(kind)
    return dict(cfg=cfg, sd=sd)


CASES = {  # fixture -> (method of METHODS, its parameters)
    "expected_attention": ("expected_attention", {}),
    "adakv_expected_attention": ("adakv_expected_attention", {}),
    "adakv_kvzap_mlp": ("adakv_kvzap", dict(alpha=0.5, **zap("mlp"))),
    "critical_expected_attention": ("critical_expected_attention", {}),
    "chunkkv_expected_attention": ("chunkkv_expected_attention", dict(chunk_length=12)),
    "lagkv": ("lagkv", dict(lag=8)),
    "leverage": ("leverage", dict(seed=3)),
    "non_causal_attention": ("non_causal_attention", dict(chunk=16)),
    "compactor": ("compactor", dict(seed=3, chunk=16)),
    "kvzap_mlp_head": ("kvzap", zap("mlp")),
    "kvzap_linear_dms": ("kvzap_dms", dict(window=8, **zap("linear"))),
    "kvzip": ("kvzip", dict(chunk=16)),
    "kvzip_plus": ("kvzip_plus", dict(chunk=16)),
    "kvzip_layerwise": ("kvzip", dict(chunk=16, layerwise=True)),
    "kvgrad": ("kvgrad", dict(chunk=16)),
    "duo_attention": ("duo_attention", dict(sink=2, recent=4)),
}
TIES = {"lagkv"}  # its rank scores tie at the budget's boundary: kvpress's topk chose; decode from its choice


@pytest.mark.parametrize("name", list(CASES))
def test_method_keeps_kvpress_pairs_and_generates_its_tokens(name):
    fx = fixture(name)
    method, params = CASES[name]
    if method == "duo_attention":
        params = dict(params, head_scores=fx["head_scores"])
    setting = fx["args"]["threshold"] if method == "kvzap_dms" else fx["ratio"]
    ref = prefilled()[0]
    tokens, kept = G.generate(ref, fx["ids"], len(fx["tokens"]), method, setting, T.CharTokenizer(),
                              keep=fx["kept"] if name in TIES else None, **params)
    if name not in TIES:
        assert kept == fx["kept"]
    assert tokens == fx["tokens"]


def test_the_full_cache_generates_other_tokens():
    """The guard: without compression the reference decodes tokens no compressed fixture shows for all."""
    fx = fixture("kvzip")
    tokens, _ = G.generate(prefilled()[0], fx["ids"], len(fx["tokens"]), None)
    assert tokens != fx["tokens"]
