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


@pytest.mark.parametrize("kind", ["random", "folder"])
def test_the_account_charges_the_scorer_the_run_holds(tiny_llama, tmp_path, kind):
    """The memory account charges the scorer's weights with the model's, from its config (the random one's width, a
    folder's config.json: 16 wide here), as the run holds them: the bytes of its tensors after a generation, cast to
    the model's dtype (float64). The planner's account, from a model without weights (meta), charges the same."""
    import torch

    from kvbench import memory
    from kvbench.artifacts.kvzap_scorer import KVzapScorer, save_scorer
    from kvbench.policies.kvzap import scorer_for

    model = tiny_llama.model
    cfg = model.config
    folder = None if kind == "random" else str(save_scorer(KVzapScorer(
        cfg.hidden_size, cfg.num_key_value_heads, cfg.num_hidden_layers, 16), tmp_path / "scorer"))
    policy = KVzap(kv_size=32, evict_every=8, scorer=folder)
    run_engine(tiny_llama, PROMPTS[:1], policy, 1, new=2)
    held = list(scorer_for(folder, "mlp", cfg).parameters())
    assert {p.dtype for p in held} == {model.dtype}
    measured = sum(p.untyped_storage().nbytes() for p in held)
    lengths = [len(PROMPTS[0])]
    acc = memory.account(model, lengths, policy, max_new_tokens=2).devices["cpu"]
    assert acc.weights - memory.ModelShape.of(model).weights["cpu"] == measured
    with torch.device("meta"):
        meta = type(model)(cfg).to(model.dtype)
    shape = memory.ModelShape.of(meta)
    planned = memory.account(shape, lengths, policy, max_new_tokens=2).devices["meta"]
    assert planned.weights - shape.weights["meta"] == measured
