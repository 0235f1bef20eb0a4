"""The kvpress side of `make crosscheck`: runs in its own virtualenv (.venv-kvpress: kvpress 0.5.5 and the
transformers it pins), never imports kvbench.

For each press and compression ratio, each prompt of `ids.json` (token ids rendered by kvbench_side.py) is
prefilled under the press (kvpress compresses each layer's cache at the end of the prefill forward) and
then decoded greedily for `new_tokens` tokens, EOS ignored, batch 1, positions continuing from the prompt's
length (as kvpress's pipeline does). The kept prompt positions of every (layer, KV head) are read from the
press's own scores: the same `topk` of the same scores its `compress` takes, and whether the budget's
boundary falls among equal scores (`tied`: then which pairs topk keeps is unspecified, so a kept set that
differs there is no difference of rule), and the relative gap between the last kept and the first dropped
score (`gap`: two pairs that close can swap under float32 rounding of another summation order). Writes one
JSON per press. The presses of cases.py (scored from values, hidden states, a second pass over the context,
calibrated head patterns) run through kvpress_methods.py, at cases.RATIOS, when CROSSCHECK_PRESSES names them
(kvbench's side has no counterpart for them yet, so a plain `make crosscheck` leaves them out).

    .venv-kvpress/bin/python scripts/crosscheck/kvpress_side.py MODEL_DIR WORK_DIR
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch

PRESSES = {  # name -> (press class, its arguments, needs eager attention); "none": no press (the control)
    "none": (None, {}, False),
    "streaming_llm": ("StreamingLLMPress", dict(n_sink=4), False),
    "snapkv": ("SnapKVPress", dict(window_size=64, kernel_size=5), False),
    "pyramidkv": ("PyramidKVPress", dict(window_size=64, kernel_size=5, beta=20), False),
    "knorm": ("KnormPress", {}, False),
    "keydiff": ("KeyDiffPress", {}, False),
    "tova": ("TOVAPress", {}, False),
    "observed_attention": ("ObservedAttentionPress", {}, True),
    # AdaKV's head-adaptive budgets over SnapKV's scores (the AdaKV paper's Ada-SnapKV), kvpress's safeguard 0.2
    "adakv": ("AdaKVPress", dict(press=("SnapKVPress", dict(window_size=64, kernel_size=5)), alpha_safeguard=0.2),
              False),
}
# `CROSSCHECK_PRESSES=adakv CROSSCHECK_RATIOS=0.5`: run only those presses and ratios (both sides read them)
ONLY = [p for p in os.environ.get("CROSSCHECK_PRESSES", "").split(",") if p]
ONLY_RATIOS = [float(r) for r in os.environ.get("CROSSCHECK_RATIOS", "").split(",") if r]


def make_press(kvpress, cls: str, ratio: float, kw: dict):
    """The press for a ratio; a wrapper press (AdaKV) gets its inner press built with the ratio."""
    inner = kw.get("press")
    if inner is not None:
        return getattr(kvpress, cls)(**{**kw, "press": getattr(kvpress, inner[0])(compression_ratio=ratio, **inner[1])})
    return getattr(kvpress, cls)(compression_ratio=ratio, **kw)


def masked_counts(model, layers: int, heads: int, k_len: int) -> list[list[int]] | None:
    """Per (layer, KV head), the pairs an AdaKV-style press kept (k_len less its masked keys), or None."""
    out = []
    for layer in range(layers):
        m = getattr(model.model.layers[layer].self_attn, "masked_key_indices", None)
        if m is None:
            return None
        out.append([k_len - int((m[1] == h).sum()) for h in range(heads)])
    return out


def main() -> None:
    import kvpress
    import transformers
    from kvpress.utils import compute_n_kept
    from transformers import AutoModelForCausalLM, DynamicCache

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: the converted model, its tokenizer
    import cases
    import kvpress_methods

    model_dir, work = Path(sys.argv[1]), Path(sys.argv[2])
    spec = json.loads((work / "ids.json").read_text())
    torch.set_num_threads(1)
    out_dir = work / "kvpress"
    out_dir.mkdir(parents=True, exist_ok=True)
    versions = {"kvpress": kvpress.__version__ if hasattr(kvpress, "__version__") else "0.5.5",
                "transformers": transformers.__version__, "torch": torch.__version__}
    (out_dir / "versions.json").write_text(json.dumps(versions))
    for eager in (False, True):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                     attn_implementation="eager" if eager else "sdpa").eval()
        for name, (cls, kw, needs_eager) in PRESSES.items():
            if needs_eager != eager or (ONLY and name not in ONLY):
                continue
            for ratio in [0.0] if cls is None else [r for r in spec["ratios"] if not ONLY_RATIOS or r in ONLY_RATIOS]:
                path = out_dir / f"{name}-{ratio}.json"
                if path.exists():
                    continue
                t0 = time.perf_counter()
                press = make_press(kvpress, cls, ratio, kw) if cls else None
                scores: dict[int, torch.Tensor] = {}
                if press is not None:
                    scorer = getattr(press, "press", press)  # a wrapper's inner press scores
                    score = scorer.score

                    def captured(module, *a, _score=score, _scores=scores, **k):
                        s = _score(module, *a, **k)
                        _scores[module.layer_idx] = s.detach().clone()
                        return s

                    scorer.score = captured
                rows = []
                for ids in spec["ids"]:
                    scores.clear()
                    x = torch.tensor([ids])
                    cache = DynamicCache()
                    with torch.inference_mode():
                        with press(model) if press is not None else contextlib.nullcontext():
                            logits = model(input_ids=x, past_key_values=cache, use_cache=True).logits[0, -1]
                        kept, tied, gap = [], [], []
                        heads_n = masked_counts(model, model.config.num_hidden_layers,
                                                model.config.num_key_value_heads, len(ids)) if press else None
                        for layer in sorted(scores):  # empty for the control
                            s = scores[layer][0]  # (H_kv, k_len)
                            if heads_n is not None:  # AdaKV: each head its own count, its masked keys dropped
                                m = model.model.layers[layer].self_attn.masked_key_indices
                                gone = [set(m[2][m[1] == h].tolist()) for h in range(len(s))]
                                kept.append([[i for i in range(s.shape[-1]) if i not in g] for g in gone])
                                top = [torch.sort(s[h], descending=True).values for h in range(len(s))]
                                ns = heads_n[layer]
                                tied.append([bool(n < len(t) and t[n - 1] == t[n]) for t, n in zip(top, ns, strict=True)])
                                gap.append([float((t[n - 1] - t[n]) / t[n - 1].abs().clamp(min=1e-30)) if n < len(t)
                                            else 1.0 for t, n in zip(top, ns, strict=True)])
                                continue
                            if hasattr(press, "get_layer_budget"):
                                n = press.get_layer_budget(model.model.layers[layer].self_attn, s.shape[-1])
                            else:
                                n = compute_n_kept(s.shape[-1], ratio)
                            kept.append(torch.sort(s.topk(n, dim=-1).indices, dim=-1).values.tolist())
                            if n == s.shape[-1]:  # nothing dropped
                                tied.append([False] * len(s))
                                gap.append([1.0] * len(s))
                                continue
                            # the n-th and (n+1)-th best scores equal: which of them topk keeps is unspecified;
                            # their relative gap: another summation order (kvbench's) may swap pairs this close
                            top = s.topk(n + 1, dim=-1).values
                            tied.append((top[:, n - 1] == top[:, n]).tolist())
                            gap.append(((top[:, n - 1] - top[:, n]) / top[:, n - 1].abs().clamp(min=1e-30)).tolist())
                        if not scores:  # the control keeps every pair
                            layers, heads = model.config.num_hidden_layers, model.config.num_key_value_heads
                            kept = [[list(range(len(ids)))] * heads] * layers
                            tied, gap = [[False] * heads] * layers, [[1.0] * heads] * layers
                        tok = logits.argmax()
                        gen = [int(tok)]
                        pos = len(ids)
                        for i in range(spec["new_tokens"] - 1):
                            logits = model(input_ids=tok[None, None], past_key_values=cache,
                                           position_ids=torch.tensor([[pos + i]])).logits[0, -1]
                            tok = logits.argmax()
                            gen.append(int(tok))
                    rows.append({"tokens": gen, "kept": kept, "tied": tied, "gap": gap})
                path.write_text(json.dumps({"press": name, "ratio": ratio, "rows": rows,
                                            "seconds": round(time.perf_counter() - t0, 1)}))
                print(f"kvpress {name} {ratio}: {time.perf_counter() - t0:.0f} s", flush=True)
        if not eager:  # the presses of cases.py run with SDPA (those that mask keys refuse eager)
            jobs = [(n, v) for n in cases.PRESSES if n in ONLY
                    for v in cases.settings(n) if (not ONLY_RATIOS or v in ONLY_RATIOS)
                    and not (out_dir / f"{n}-{v}.json").exists()]
            jobs.sort(key=lambda j: cases.settings(j[0]).index(j[1]) != 1)  # every press's middle setting first
            state = kvpress_methods.setup(kvpress, model, work, sorted({n for n, _ in jobs}))
            for name, value in jobs:
                rec = kvpress_methods.run(kvpress, model, spec, name, value, state)
                (out_dir / f"{name}-{value}.json").write_text(json.dumps(rec))
                print(f"kvpress {name} {value}: {rec['seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
