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
JSON per press.

    .venv-kvpress/bin/python scripts/crosscheck/kvpress_side.py MODEL_DIR WORK_DIR
"""

from __future__ import annotations

import contextlib
import json
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
}


def main() -> None:
    import kvpress
    import transformers
    from kvpress.utils import compute_n_kept
    from transformers import AutoModelForCausalLM, DynamicCache

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
            if needs_eager != eager:
                continue
            for ratio in [0.0] if cls is None else spec["ratios"]:
                path = out_dir / f"{name}-{ratio}.json"
                if path.exists():
                    continue
                t0 = time.perf_counter()
                press = getattr(kvpress, cls)(compression_ratio=ratio, **kw) if cls else None
                scores: dict[int, torch.Tensor] = {}
                if press is not None:
                    score = press.score

                    def captured(module, *a, _score=score, _scores=scores, **k):
                        s = _score(module, *a, **k)
                        _scores[module.layer_idx] = s.detach().clone()
                        return s

                    press.score = captured
                rows = []
                for ids in spec["ids"]:
                    scores.clear()
                    x = torch.tensor([ids])
                    cache = DynamicCache()
                    with torch.inference_mode():
                        with press(model) if press is not None else contextlib.nullcontext():
                            logits = model(input_ids=x, past_key_values=cache, use_cache=True).logits[0, -1]
                        kept, tied, gap = [], [], []
                        for layer in sorted(scores):  # empty for the control
                            s = scores[layer][0]  # (H_kv, k_len)
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


if __name__ == "__main__":
    main()
