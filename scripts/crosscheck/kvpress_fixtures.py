"""kvpress's own scores and kept pairs on a tiny model, as JSON fixtures for tests/test_reference_methods.py.

Runs in kvpress's venv (kvpress 0.5.5), never imports kvbench: the tiny model, its tokenizer and the KVzap
scorer come from tests/kvpress_tiny.py, rebuilt identically in kvbench's venv. For each case: one prefill of
the 40-token prompt under the press (batch 1, float32, SDPA), as kvpress compresses; recorded per layer: the
score the press ranks (`scores`, (H_kv, 40)), the global score table of KVzip/KVgrad (`score_val`), and the
prompt positions each (layer, KV head) keeps (`kept`, read from what the press did, as kvpress_methods.py
reads it). DuoAttention: the on-the-fly head scores and streaming mask (its calibration on 3 short texts).

    .venv-kvpress/bin/python scripts/crosscheck/kvpress_fixtures.py tests/data/kvpress_methods
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kvpress_methods import Capture  # noqa: E402  (this folder)

from tests import kvpress_tiny as T  # noqa: E402

RATIO = 0.5
NEW = 6  # tokens decoded after the compression
CASES = {  # name -> (press class, arguments; an inner press as (class, arguments) under "press")
    "expected_attention": ("ExpectedAttentionPress", {}),
    "adakv_expected_attention": ("AdaKVPress", dict(press=("ExpectedAttentionPress", dict(epsilon=1e-2)))),
    "lagkv": ("LagKVPress", dict(lag_size=8)),
    "leverage": ("LeverageScorePress", {}),
    "non_causal_attention": ("NonCausalAttnPress", dict(chunk_size=16)),
    "compactor": ("CompactorPress", dict(chunk_size=16)),
    "kvzap_mlp_head": ("KVzapPress", dict(model_type="mlp")),
    "kvzap_linear_dms": ("DMSPress", dict(press=("KVzapPress", dict(model_type="linear")), threshold=0.0,
                                          sliding_window_size=8)),
    "critical_expected_attention": ("CriticalKVPress", dict(press=("ExpectedAttentionPress", dict(use_vnorm=False)))),
    "chunkkv_expected_attention": ("ChunkKVPress", dict(press=("ExpectedAttentionPress", {}), chunk_length=12)),
    # the leaderboard's kvzap_mlp_layer, where AdaKV's safeguard decides a head's count (ratio 0.75, alpha 0.5)
    "adakv_kvzap_mlp": ("AdaKVPress", dict(press=("KVzapPress", dict(model_type="mlp")), alpha_safeguard=0.5,
                                           ratio=0.75)),
    "kvzip": ("KVzipPress", dict(chunk_size=16)),
    "kvzip_plus": ("KVzipPress", dict(chunk_size=16, kvzip_plus_normalization=True)),
    "kvzip_layerwise": ("KVzipPress", dict(chunk_size=16, layerwise=True)),
    "kvgrad": ("KVgradPress", dict(chunk_size=16)),
}
SKETCH_SEED = 3  # torch's global generator, seeded just before the prefill (Compactor, leverage)


def build(kvpress, cls: str, kw: dict, ratio: float):
    kw = dict(kw)
    inner = kw.pop("press", None)
    if cls == "DMSPress":
        press = kvpress.DMSPress(press=getattr(kvpress, inner[0])(**inner[1]), **kw)
    elif inner is not None:
        press = getattr(kvpress, cls)(press=getattr(kvpress, inner[0])(compression_ratio=ratio, **inner[1]), **kw)
    else:
        press = getattr(kvpress, cls)(compression_ratio=ratio, **kw)
    scorer = getattr(press, "press", press)
    if type(scorer).__name__ == "KVzapPress":
        from kvpress.presses.kvzap_press import KVzapConfig, KVzapModel

        cfg, sd = T.kvzap_weights(scorer.model_type)
        zap = KVzapModel(KVzapConfig(**cfg))
        zap.load_state_dict(sd)
        scorer.kvzap_model_name, scorer.kvzap_model = "local", zap.eval()
        scorer.post_init_from_model = lambda model: None
    return press


def prefill_and_decode(model, press, ids: list[int]) -> list[int]:
    """The prompt prefilled under the press, then NEW greedy tokens at the positions after it (kvpress's
    protocol, as kvpress_side.py runs it)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.inference_mode():
        with press(model):
            logits = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True).logits[0, -1]
        out = [int(logits.argmax())]
        for i in range(NEW - 1):
            logits = model(input_ids=torch.tensor([[out[-1]]]), past_key_values=cache,
                           position_ids=torch.tensor([[len(ids) + i]])).logits[0, -1]
            out.append(int(logits.argmax()))
    return out


def run(kvpress, model, name: str) -> dict:
    cls, kw = CASES[name]
    kw = dict(kw)
    ratio = kw.pop("ratio", RATIO)
    press = build(kvpress, cls, kw, ratio)
    cap = Capture(kvpress, press)
    ids = T.prompt_ids()
    cfg = model.config
    torch.manual_seed(SKETCH_SEED)
    tokens = prefill_and_decode(model, press, ids)
    layers = range(cfg.num_hidden_layers)
    out = {"press": name, "class": cls, "args": {k: v for k, v in kw.items() if k != "press"},
           "inner": kw.get("press"), "ratio": ratio, "ids": ids, "sketch_seed": SKETCH_SEED,
           "weights_sum": T.weights_sum(model), "tokens": tokens,
           "kept": [cap.kept(model, layer, len(ids), cfg.num_key_value_heads) for layer in layers]}
    if cap.scores:
        out["scores"] = [cap.scores[layer][0].tolist() for layer in layers]
    if cap.score_val is not None:
        out["score_val"] = cap.score_val[:, 0].tolist()  # (L, H_kv, ctx) before the sinks are raised
    return out


def duo(kvpress, model, tok) -> dict:
    """DuoAttention's on-the-fly head scores on CALIBRATION (3 texts, q_len 16) and its streaming mask."""
    import pandas as pd
    from kvpress.presses import duo_attention_press as d

    d.load_dataset = lambda *a, **k: SimpleNamespace(to_pandas=lambda: pd.DataFrame({"chapter": T.CALIBRATION}))
    scores = d.duo_attention_on_the_fly.__wrapped__(model, num_samples=3, q_len=16)
    press = kvpress.DuoAttentionPress(head_compression_ratio=RATIO)
    press.load_attention_pattern = lambda m: (2, 4, scores)  # the published patterns' format: sink, recent, scores
    cap = Capture(kvpress, press)
    ids = T.prompt_ids()
    tokens = prefill_and_decode(model, press, ids)  # post_init_from_model reads the pattern above
    cfg = model.config
    return {"press": "duo_attention", "num_samples": 3, "q_len": 16, "ratio": RATIO, "texts": T.CALIBRATION,
            "weights_sum": T.weights_sum(model), "head_scores": scores.tolist(), "sink_size": 2, "recent_size": 4,
            "streaming_mask": press.streaming_mask.tolist(), "ids": ids, "tokens": tokens,
            "kept": [cap.kept(model, layer, len(ids), cfg.num_key_value_heads) for layer in range(cfg.num_hidden_layers)]}


def main() -> None:
    import kvpress
    from kvpress.presses import duo_attention_press, kvzip_press

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    tok = T.CharTokenizer()
    kvzip_press.AutoTokenizer = duo_attention_press.AutoTokenizer = SimpleNamespace(from_pretrained=lambda *a: tok)
    model = T.tiny_model()
    versions = {"kvpress": importlib.metadata.version("kvpress"), "transformers": __import__("transformers").__version__, "torch": torch.__version__}
    for name in CASES:
        rec = run(kvpress, model, name)
        (out / f"{name}.json").write_text(json.dumps({**rec, "versions": versions}) + "\n")
        print(name, flush=True)
    (out / "duo_attention.json").write_text(json.dumps({**duo(kvpress, model, tok), "versions": versions}) + "\n")


if __name__ == "__main__":
    main()
