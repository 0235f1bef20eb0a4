"""KVzap (kvbench.policies.kvzap): a pair's score is its layer's scorer of its own input hidden state, computed at
arrival and kept with it. After prefill it keeps kvpress's pairs and decodes its tokens (`kvzap_mlp_head`, the
scorer loaded from a folder in the Hub's layout); under decode_only with a chunked prefill every eviction keeps
what the brute-force rule (tests/reference_methods.kvzap over every recorded hidden state) keeps."""

from __future__ import annotations

import json

import pytest

from kvbench.policies.kvzap import KVzap
from tests import kvpress_tiny as T
from tests.policies.test_expected_attention import run, tiny
from tests.policies.test_reference_methods import fixture
from tests.policies.test_scored import PROMPTS, assert_traces_match, reference, run_engine, spec_of


def scorer_folder(tmp_path, kind: str):
    from safetensors.torch import save_file

    cfg, sd = T.kvzap_weights(kind)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kvzap", **cfg}))
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    return str(tmp_path)


def test_after_prefill_keeps_kvpress_pairs_and_tokens(tmp_path):
    fx = fixture("kvzap_mlp_head")
    policy = KVzap(kv_size=None, compression_ratio=fx["ratio"], schedule="after_prefill",
                   scorer=scorer_folder(tmp_path, "mlp"))
    tokens, kept = run(tiny(), [fx["ids"]], policy, len(fx["tokens"]))
    for layer, (got, want, scores) in enumerate(zip(kept[0], fx["kept"], fx["scores"], strict=True)):
        for h, (g, w, sc) in enumerate(zip(got, want, scores, strict=True)):
            # kvpress's scores tie exactly here (a saturated scorer): its topk keeps the older pair, kvbench the newer
            swapped = {round(sc[p], 5) for p in set(g) ^ set(w)}
            assert len(g) == len(w) and len(swapped) <= 1, (layer, h, sorted(set(g) ^ set(w)))
    assert tokens[0] == fx["tokens"]


@pytest.mark.parametrize("schedule", ["decode_only", "prefill_and_decode"])
def test_scores_at_arrival_under_every_schedule(tiny_llama, schedule):
    policy = KVzap(kv_size=32, evict_every=8, schedule=schedule)  # a nameless tiny model: the random scorer
    refs = [reference("llama", tuple(p), spec_of(policy)) for p in PROMPTS]
    assert_traces_match(refs, *run_engine(tiny_llama, PROMPTS, policy, 4, prefill_chunk=16)[:3])
    assert refs[0].evictions  # it did evict
