"""One truth per fact: what the pages state about the code agrees with the code.

The lists the pages show (models, families, policies, tasks) are generated from the registries
(tests/project/test_docs_registry.py); this file checks the facts that are written by hand:

- docs/matrix.md's "Refused, and why": every row has an example here, and each example is refused with the key
  the row names: by the matrix oracle (tests/matrix.py, which agrees with the CLI's preflight on the whole product:
  tests/project/test_matrix_preflight.py) for a combination of the matrix's axes, else by the preflight itself.
  A row the code does not refuse, or a refusal without its row, fails.
- one `model=` config per checkpoint and precision (a second name for the same weights says nothing new);
- one label per policy in the report's tables (`kvbench.report.rows.METHODS`).
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from kvbench.conf import load_option, options
from kvbench.errors import ConfigError
from kvbench.policies import registry
from kvbench.report.rows import METHODS
from tests.matrix import Combo, violations, write_mirror

ROOT = Path(__file__).resolve().parents[2]
BASE = Combo("h2o", "decode_only", "kv_size", "run", "policy", "auto", False, "tiny-llama", 1, "float32")
SERVE = replace(BASE, mode="serve")
TINY = ["model=tiny-llama"]
# matrix.md's rows (their first cell) -> a combination of the matrix's axes, or a command line (`{data}`, `{bad}`: a
# mirror, one with a row missing a column; `{file}`: a file where a folder should be), and the key of "that key"
REFUSED = {
    "`policy=full` with `kv_ratio` or `compression_ratio`": replace(BASE, policy="full", budget="kv_ratio"),
    "`policy=full policy.rerotate=true`": replace(BASE, policy="full", rerotate=True),
    "`policy=extreme_decode` with `schedule` other than `decode_only`":
        replace(BASE, policy="extreme_decode", schedule="after_prefill"),
    "`policy=extreme_decode` with a per-prompt budget": replace(BASE, policy="extreme_decode", budget="kv_ratio"),
    "`policy=lagkv`, `chunkkv`, `critical` or `compactor` with `schedule` other than `after_prefill`":
        replace(BASE, policy="compactor"),
    "`policy=compactor` serving a prompt longer than `serve.max_tokens_per_step`, or with `gen.prefill_chunk`":
        replace(SERVE, policy="compactor", schedule="after_prefill"),  # the matrix's prompts: up to 273 tokens
    "`policy=chunkkv` or `critical` over `policy.inner=compactor` with `gen.prefill_chunk`, or serving a prompt "
    "longer than `serve.max_tokens_per_step`": [*TINY, "policy=critical", "policy.inner=compactor", "gen.prefill_chunk=64"],
    "`policy=chunkkv` or `critical` with `policy.head_budget=adaptive`":
        replace(BASE, policy="critical", schedule="after_prefill", head_budget="adaptive"),
    "`policy=duo_attention` with `kv_size` or `kv_ratio`, with `head_budget` other than `pattern`, with "
    "`rerotate=true`, or in `mode=serve_limits`":
        replace(BASE, policy="duo_attention", schedule="after_prefill"),
    "serving `policy=duo_attention` under a schedule that evicts while running, with a streaming head's window "
    "(sink + recent) below its start blocks + one block":
        replace(SERVE, policy="duo_attention", schedule="prefill_and_decode", budget="compression_ratio"),
    "`policy=pyramidkv policy.rerotate=true`": replace(BASE, policy="pyramidkv", rerotate=True),
    "`policy=snapkv` / `pyramidkv` whose window does not fit `kv_size - evict_every`":
        [*TINY, "policy=snapkv", "policy.kv_size=128", "policy.window=96"],
    "serving with `batch_size` other than 1": replace(SERVE, batch=3),
    "serving with `gen.attention` `eager`, `fused` or `flash`": replace(SERVE, attention="eager"),
    "serving with `gen.prefill_chunk` or `gen.warmup`": [*TINY, "mode=serve", "policy=full", "gen.prefill_chunk=64"],
    "serving with `schedule=after_prefill policy.rerotate=true`": replace(SERVE, schedule="after_prefill", rerotate=True),
    "serving, under a schedule that evicts while decoding, with a budget (`kv_size`, or the per-prompt one a "
    "request's prompt gives, per layer for PyramidKV) below its start blocks + recent pairs + one block":
        replace(SERVE, policy="pyramidkv", schedule="prefill_and_decode", budget="kv_ratio"),
    "serving, `after_prefill`, with a budget (as above) below what the one compression leaves: the start blocks, "
    "the recent pairs and the partial block between them that whole-block eviction cannot take":
        replace(SERVE, policy="pyramidkv", schedule="after_prefill", budget="kv_ratio"),
    "serving, under a schedule that evicts while decoding, with a `kv_size` that is no whole number of blocks "
    "(`extreme_decode`'s kv 2)": replace(SERVE, policy="extreme_decode"),
    "`serve.eviction=openvino` outside serving, or with a policy other than `h2o`": replace(BASE, eviction="openvino"),
    "`serve.eviction=openvino` with `policy.kv_size`, `protect_*`, `schedule` or `serve.block_score` changed":
        replace(SERVE, eviction="openvino", schedule="after_prefill"),
    "a pool that can never hold a request (`serve.num_blocks`)": [*TINY, "mode=serve", "policy=full",
                                                                  "serve.num_blocks=1"],
    "`mode=serve_limits serve.num_blocks=null`": [*TINY, "mode=serve_limits", "policy=h2o", "serve.num_blocks=null"],
    "`task.max_input_tokens` below a prompt's fixed part": [*TINY, "task=gsm8k", "data.dir={data}", "task.n_shot=0",
                                                            "task.n_samples=3", "task.max_input_tokens=8"],
    "a prompt + `gen.max_new_tokens` past the positions the model's config declares":
        [*TINY, "task=passkey", "gen.max_new_tokens=100000000"],  # the tiny models take 8192
    "a prompt alone past them": [*TINY, "task=passkey", "task.context_tokens=9000"],
    "a RULER `task.context_length` past them": [*TINY, "task=niah_single_1", "task.context_length=9000"],
    "a data row with a missing column or a wrong type": [*TINY, "task=gsm8k", "data.dir={bad}", "task.n_shot=0",
                                                         "task.n_samples=3"],
    "a Hub model not cached while the Hub is unreachable": ["model=phi35-mini", "device=cpu"],
    "a results folder or `runs.jsonl` that cannot be written": [*TINY, "results_dir={file}"],
    "`plan.*` values `kvbench-plan` refuses": [*TINY, "plan.gpus=-1"],
    "`policy.rerotate=true` on a model whose RoPE is not a plain rotation":
        [*TINY, "model.arch=glm4", "policy=h2o", "policy.rerotate=true"],
    "`policy.head_budget=adaptive` with `full`, `window`, `streaming_llm` or `extreme_decode`":
        replace(BASE, policy="window", schedule="after_prefill", head_budget="adaptive"),
    "`policy.head_budget=adaptive` with a schedule other than `after_prefill`, or `rerotate`":
        replace(BASE, policy="snapkv", head_budget="adaptive"),
    "`gen.kv_cache_dtype` `int8` or `int4` in `mode=serve_limits`": replace(SERVE, kv_cache="int4", mode="serve_limits"),
    "`gen.kv_cache_dtype` `int8` or `int4` in `mode=serve` without `serve.max_running`":
        [*TINY, "mode=serve", "batch_size=1", "gen.kv_cache_dtype=int4", "gen.kv_quant_group=16"],
    "`gen.kv_cache_dtype` `int8` or `int4` in `mode=serve` with `gen.kv_quant_group` other than `serve.block_size`":
        [*TINY, "mode=serve", "batch_size=1", "gen.kv_cache_dtype=int4", "gen.kv_quant_group=8",
         "serve.max_running=2"],
    "`gen.kv_cache_dtype` `int8` or `int4` with `policy.rerotate=true`": replace(BASE, kv_cache="int8", rerotate=True),
    "`gen.kv_cache_dtype` `int8` or `int4` with `gen.attention=flash`":
        [*TINY, "gen.kv_cache_dtype=int4", "gen.kv_quant_group=16", "gen.attention=flash"],
    "`gen.kv_quant_group` that does not divide the model's head size (each layer kind's: Gemma 4's sliding and "
    "global layers differ)": [*TINY, "gen.kv_cache_dtype=int8"],
    "`gen.kv_quant_group` or `gen.kv_quant_residual` away from its default with `gen.kv_cache_dtype=auto` (a single "
    "run; a sweep ignores it there)": [*TINY, "gen.kv_quant_residual=16"],
    "`policy.head_budget=adaptive`, `global`, `layerwise` (KVzip's default and its other ranking) or `threshold` "
    "with `mode=serve_limits`":
        replace(BASE, policy="snapkv", schedule="after_prefill", mode="serve_limits", head_budget="adaptive"),
    "`policy.head_budget=threshold` with a policy whose score is not stored at arrival (all but `kvzap`), or without "
    "`policy.threshold`; `policy.threshold` without it": [*TINY, "policy=snapkv", "policy.head_budget=threshold"],
    "`policy.head_budget=threshold` with `kv_ratio`, `compression_ratio`, `protect_recent` or `rerotate`":
        [*TINY, "policy=kvzap", "policy.head_budget=threshold", "policy.threshold=-5", "policy.compression_ratio=0.5"],
    "`policy.head_budget=threshold` in `mode=serve` with a schedule other than `after_prefill`":
        [*TINY, "mode=serve", "policy=kvzap", "policy.head_budget=threshold", "policy.threshold=-5",
         "policy.schedule=decode_only"],
}
THAT_KEY = {"`policy=full` with `kv_ratio` or `compression_ratio`": "policy.kv_ratio",
            "`policy=extreme_decode` with a per-prompt budget": "policy.kv_ratio",
            "serving with `gen.prefill_chunk` or `gen.warmup`": "gen.prefill_chunk",
            "serving, under a schedule that evicts while decoding, with a budget (`kv_size`, or the per-prompt one a "
            "request's prompt gives, per layer for PyramidKV) below its start blocks + recent pairs + one block":
                "policy.kv_ratio",
            "serving, `after_prefill`, with a budget (as above) below what the one compression leaves: the start blocks, "
            "the recent pairs and the partial block between them that whole-block eviction cannot take":
                "policy.kv_ratio",
            "`serve.eviction=openvino` with `policy.kv_size`, `protect_*`, `schedule` or `serve.block_score` changed":
                "policy.schedule",
            "`plan.*` values `kvbench-plan` refuses": "plan.gpus",
            "`gen.kv_quant_group` or `gen.kv_quant_residual` away from its default with `gen.kv_cache_dtype=auto` (a "
            "single run; a sweep ignores it there)": "gen.kv_quant_residual",
            "`policy.head_budget=threshold` with `kv_ratio`, `compression_ratio`, `protect_recent` or `rerotate`":
                "policy.compression_ratio",
            "`policy=duo_attention` with `kv_size` or `kv_ratio`, with `head_budget` other than `pattern`, with "
            "`rerotate=true`, or in `mode=serve_limits`":
                "policy.kv_size"}


def refusal_rows() -> dict[str, str]:
    """matrix.md's "Refused, and why" table: combination -> the key its line names."""
    text = (ROOT / "docs" / "matrix.md").read_text()
    section = text[text.index("## Refused, and why"):].split("\n## ")[0]
    rows = [[c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            for line in section.splitlines() if line.startswith("| ") and not line.startswith("| combination")]
    return {r[0].replace("\\|", "|"): r[1] for r in rows}


def test_every_refusal_row_has_an_example_and_every_example_a_row():
    rows = set(refusal_rows())
    assert rows == set(REFUSED), {"rows without an example": rows - set(REFUSED),
                                  "examples without a row": set(REFUSED) - rows}


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("refusals")
    bad = write_mirror(root / "bad")
    with gzip.open(bad / "gsm8k" / "test.jsonl.gz", "at") as f:
        f.write(json.dumps({"question": "How much?"}) + "\n")  # no `answer`
    (root / "file").write_text("a file, not a folder")
    return {"data": str(write_mirror(root / "mirror")), "bad": str(bad), "file": str(root / "file"),
            "results": str(root / "out")}


@pytest.mark.parametrize("row", sorted(REFUSED))
def test_each_documented_refusal_is_refused_with_the_key_it_names(row, places, monkeypatch):
    from kvbench import cli

    named = refusal_rows()[row]
    key = THAT_KEY[row] if named == "that key" else re.match(r"`([\w.]+)`", named)[1]
    example = REFUSED[row]
    if isinstance(example, Combo):
        found = violations(example)
        assert found, f"{row}: the matrix oracle runs {example} (the preflight agrees with it): the row is false"
        assert len(found) == 1 and key in found[0], f"{row}: {example} breaks {found}, not one rule naming {key}"
        return
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the Hub unreachable: a model not cached is refused, never fetched
    argv = [a.format(**places) for a in example]
    argv += [] if any(a.startswith("results_dir=") for a in argv) else [f"results_dir={places['results']}"]
    with pytest.raises(ConfigError) as refused:
        cli.preflight(argv)
    assert refused.value.key == key, f"{row}: {argv} is refused with {refused.value.key}, the row names {key}"


def test_the_examples_catch_a_false_row():
    """The row this page carried while serve mode already ran adaptive head budgets: the oracle runs its example."""
    serve_adaptive = replace(SERVE, policy="snapkv", schedule="after_prefill", head_budget="adaptive")
    assert violations(serve_adaptive) == []


def test_one_model_config_per_checkpoint_and_precision():
    seen: dict[tuple, str] = {}
    for name in options("model"):
        cfg = load_option("model", name)
        weights = cfg.get("pretrained") or cfg.get("gguf_file")
        if weights is None:  # built in code (tiny models): their architecture is what differs
            continue
        key = (weights, cfg.get("revision"), str(cfg.get("dtype")))
        assert key not in seen, f"model={name} loads what model={seen[key]} loads ({key}): one name per model"
        seen[key] = name


def test_every_policy_has_one_label_in_the_report():
    assert set(METHODS) == set(registry()), set(registry()) ^ set(METHODS)
    shared = {label: sorted(n for n, x in METHODS.items() if x == label) for label in METHODS.values()}
    shared = {label: names for label, names in shared.items() if len(names) > 1}  # a policy copied, its label left
    assert not shared, "give each policy its own `label` (the report's name for it): " + "; ".join(
        f"{' and '.join(names)} share {label!r}" for label, names in shared.items())
    assert METHODS["full"] == "FKV" and METHODS["extreme_decode"] == "ED" and METHODS["batch_max"] == "BM"
