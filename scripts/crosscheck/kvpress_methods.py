"""kvpress's side of `make crosscheck` for the presses of cases.py (kvpress's venv; never imports kvbench).

Builds each press offline (cases.py says what replaces the Hub: DuoAttention's calibration texts, a random
KVzap scorer in the Hub's layout, the sketch's seed), runs it on every prompt as kvpress_side.py runs the
others (prefill under the press, greedy decoding of `new_tokens` tokens, EOS ignored, batch 1), and reads the
kept prompt positions of every (layer, KV head) from what the press really did: the masked keys of a press
that masks (AdaKV, KVzip, KVgrad, DuoAttention, DMS), else the keys the press's `compress` returned, matched
to the keys it was given. `tied`/`gap` as in kvpress_side.py where a ranking decided: per head for the ranked
score (topk or AdaKV), globally for KVzip/KVgrad's score_val, at the threshold for DMS; no gap for ChunkKV
(its ranking is over chunks) nor DuoAttention (no score).
"""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import cases
import torch

MASKING = ("AdaKVPress", "KVzipPress", "KVgradPress", "DuoAttentionPress", "DMSPress")


def calibration_texts(work: Path) -> list[str]:
    """DuoAttention's calibration texts: the first cases.DUO_TEXTS CNN/DM validation articles, kept in WORK."""
    path = work / "calibration.json"
    if not path.exists():
        src = Path(os.environ.get("DATA_DIR", "../shared/data")) / "cnn_dailymail" / "validation.jsonl.gz"
        with gzip.open(src, "rt") as f:
            texts = [json.loads(line)["article"] for _, line in zip(range(cases.DUO_TEXTS), f, strict=False)]
        path.write_text(json.dumps(texts))
    return json.loads(path.read_text())


def kvzap_scorer(work: Path, model):
    """A random KVzap MLP scorer for `model`, saved once in the Hub's layout (WORK/kvzap-mlp) and read back."""
    from kvpress.presses.kvzap_press import KVzapConfig, KVzapModel

    path = work / "kvzap-mlp"
    if not (path / "config.json").exists():
        cfg = model.config
        torch.manual_seed(cases.KVZAP_SEED)
        scorer = KVzapModel(KVzapConfig(input_dim=cfg.hidden_size, output_dim=cfg.num_key_value_heads,
                                        n_modules=cfg.num_hidden_layers, hidden_dim=cases.KVZAP_HIDDEN))
        with torch.no_grad():
            for mlp in scorer.layers:
                mlp[2].weight.mul_(cases.KVZAP_GAIN)
                mlp[2].bias.fill_(cases.KVZAP_BIAS)
        scorer.save_pretrained(path)
    return KVzapModel.from_pretrained(path).eval()


def setup(kvpress, model, work: Path, names: list[str]) -> dict:
    """Replace the Hub downloads of the presses `names` need by local data (DuoAttention's calibration, a
    KVzap scorer); returns what their runs need and the record keeps."""
    import pandas as pd
    from kvpress.presses import duo_attention_press as duo

    state = {"name_or_path": model.config.name_or_path}
    if any("kvzap" in n for n in names):
        state["kvzap"] = kvzap_scorer(work, model)
    if not any(cases.PRESSES[n][0] == "DuoAttentionPress" for n in names):
        return state
    texts = calibration_texts(work)

    class Local:  # what duo_attention_on_the_fly reads from load_dataset("kmfoda/booksum")
        def to_pandas(self):
            return pd.DataFrame({"chapter": texts})

    duo.load_dataset = lambda *a, **k: Local()
    state["duo_head_scores"] = duo.duo_attention_on_the_fly(model).tolist()  # kvpress caches it for the press
    return state


def make(kvpress, name: str, value: float, state: dict):
    """The press of cases.PRESSES at a compression ratio (a threshold for DMS, heads' share for DuoAttention)."""
    cls, kw = cases.PRESSES[name]
    kw = dict(kw)
    inner = kw.pop("press", None)
    if cls == "DuoAttentionPress":
        return kvpress.DuoAttentionPress(head_compression_ratio=value, **kw)
    if cls == "DMSPress":
        press = kvpress.DMSPress(press=getattr(kvpress, inner[0])(**inner[1]), threshold=value, **kw)
    elif inner is not None:
        press = getattr(kvpress, cls)(press=getattr(kvpress, inner[0])(compression_ratio=value, **inner[1]), **kw)
    else:
        press = getattr(kvpress, cls)(compression_ratio=value, **kw)
    scorer = getattr(press, "press", press)
    if type(scorer).__name__ == "KVzapPress":  # the local scorer: post_init_from_model then loads nothing
        scorer.kvzap_model_name = f"nvidia/KVzap-mlp-{state['name_or_path'].split('/')[-1]}"
        scorer.kvzap_model = state["kvzap"]
    return press


class Capture:
    """Wraps a press's methods to record, per layer, the ranked scores and the keys before/after `compress`."""

    def __init__(self, kvpress, press):
        self.press, self.cls = press, type(press).__name__
        self.scores, self.keys, self.score_val = {}, {}, None
        ranked = press if isinstance(press, kvpress.ScorerPress) else getattr(press, "press", None)
        if self.cls in ("ChunkKVPress", "DuoAttentionPress") or not isinstance(ranked, kvpress.ScorerPress):
            ranked = None
        if ranked is not None:
            score = ranked.score

            def captured(module, *a, **k):
                s = score(module, *a, **k)
                self.scores[module.layer_idx] = s.detach().clone()
                return s

            ranked.score = captured
        if hasattr(press, "compress_post"):  # KVzip, KVgrad: the global score table before the eviction
            post = press.compress_post

            def captured_post(model):
                self.score_val = press.score_val.detach().clone()
                return post(model)

            press.compress_post = captured_post
        elif self.cls not in MASKING:
            compress = press.compress

            def captured_compress(module, hidden_states, keys, values, attentions, kwargs):
                out = compress(module, hidden_states, keys, values, attentions, kwargs)
                self.keys[module.layer_idx] = (keys.detach().clone(), out[0].detach().clone())
                return out

            press.compress = captured_compress

    def clear(self):
        self.scores.clear()
        self.keys.clear()
        self.score_val = None

    def kept(self, model, layer: int, k_len: int, heads: int) -> list[list[int]]:
        """The prompt positions (layer, head) holds after the prefill."""
        if self.cls in MASKING:
            m = getattr(model.model.layers[layer].self_attn, "masked_key_indices", None)
            if m is None:
                return [list(range(k_len)) for _ in range(heads)]
            gone = [set(m[2][m[1] == h].tolist()) for h in range(heads)]
            return [[i for i in range(k_len) if i not in g] for g in gone]
        if layer not in self.keys:
            return [list(range(k_len)) for _ in range(heads)]
        before, after = self.keys[layer]
        out = []
        for h in range(heads):
            index = {}
            for i, row in enumerate(before[0, h]):
                index.setdefault(row.numpy().tobytes(), []).append(i)
            out.append(sorted(index[row.numpy().tobytes()].pop(0) for row in after[0, h]))
        return out

    def boundary(self, layer: int, kept: list[list[int]], threshold: float | None) -> tuple[list, list | None]:
        """Per head: whether the kept count's boundary fell among equal scores, and the relative gap there."""
        heads = len(kept)
        if self.score_val is not None:  # KVzip/KVgrad: one ranking over every layer and head, sinks first
            sv = self.score_val.clone()
            n_sink = self.press.n_sink
            sv[..., :n_sink] = sv.amax() + 1.0
            n_pruned = int(sv.numel() * self.press.compression_ratio)
            flat = sv.reshape(-1).sort().values
            lo, hi = flat[n_pruned - 1], flat[n_pruned]
            s = sv[layer, 0]
            tie = bool(lo == hi)
            gap = float((hi - lo) / hi.abs().clamp(min=1e-30))
            return [tie and bool((s[h] == lo).any()) for h in range(heads)], [gap] * heads
        if layer not in self.scores:
            return [False] * heads, (None if self.cls in ("ChunkKVPress",) else [1.0] * heads)
        s = self.scores[layer][0].float()  # (H_kv, k_len)
        if threshold is not None:  # DMS: the pairs out of the window, against the threshold
            w = self.press.sliding_window_size
            s = s[:, : max(0, s.shape[-1] - w)]
            if s.numel() == 0:
                return [False] * heads, [1.0] * heads
            d = (s - threshold).abs().amin(dim=-1) / abs(threshold)
            return [bool(x == 0) for x in d], d.tolist()
        tied, gap = [], []
        for h in range(heads):
            t, n = torch.sort(s[h], descending=True).values, len(kept[h])
            tied.append(bool(0 < n < len(t) and t[n - 1] == t[n]))
            gap.append(float((t[n - 1] - t[n]) / t[n - 1].abs().clamp(min=1e-30)) if 0 < n < len(t) else 1.0)
        return tied, gap


def run(kvpress, model, spec: dict, name: str, value: float, state: dict) -> dict:
    """One press at one setting over every prompt: the record kvpress_side.py writes."""
    t0 = time.perf_counter()
    press = make(kvpress, name, value, state)
    cap = Capture(kvpress, press)
    cfg = model.config
    layers, heads = cfg.num_hidden_layers, cfg.num_key_value_heads
    threshold = value if cap.cls == "DMSPress" else None
    rows = []
    for ids in spec["ids"]:
        cap.clear()
        torch.manual_seed(cases.SKETCH_SEED)  # Compactor's sketch: the same draws on every run
        x = torch.tensor([ids])
        from transformers import DynamicCache

        cache = DynamicCache()
        with torch.inference_mode():
            with press(model):
                logits = model(input_ids=x, past_key_values=cache, use_cache=True).logits[0, -1]
            kept = [cap.kept(model, layer, len(ids), heads) for layer in range(layers)]
            bounds = [cap.boundary(layer, kept[layer], threshold) for layer in range(layers)]
            tok = logits.argmax()
            gen = [int(tok)]
            for i in range(spec["new_tokens"] - 1):
                logits = model(input_ids=tok[None, None], past_key_values=cache,
                               position_ids=torch.tensor([[len(ids) + i]])).logits[0, -1]
                tok = logits.argmax()
                gen.append(int(tok))
        gap = None if any(b[1] is None for b in bounds) else [b[1] for b in bounds]
        rows.append({"tokens": gen, "kept": kept, "tied": [b[0] for b in bounds], "gap": gap})
    extras = {"duo_head_scores": state["duo_head_scores"]} if cap.cls == "DuoAttentionPress" else {}
    if type(getattr(press, "press", press)).__name__ == "CompactorPress":  # AdaKV over it too
        extras["sketch_seed"] = cases.SKETCH_SEED
    return {"press": name, "ratio": value, "rows": rows, "extras": extras,
            "seconds": round(time.perf_counter() - t0, 1)}
