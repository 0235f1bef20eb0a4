"""kvbench.run.record: the stamp every record starts with, a run's record and a plan's record (the schema),
written out field by field here so a field lost or renamed in the builder fails."""

from __future__ import annotations

import re

from hydra import compose, initialize_config_dir

from kvbench.config import CONF_DIR, build_policy, build_task
from kvbench.run.record import git_sha, new_record, plan_record, stamp

TINY = ["model=tiny-llama", "device=cpu", "task.n_samples=2", "task.context_tokens=32"]

RUN_FIELDS = [
    "run_id", "config_hash", "started_at", "kvbench_version", "git_sha", "status", "error", "oom_kind", "experiment",
    "mode", "model", "weights", "task", "query_aware", "policy", "kv_size", "kv_ratio", "compression_ratio",
    "kv_budget", "evict_every", "schedule", "batch_size", "n_samples", "max_new_tokens", "seed", "device", "metrics",
    "throughput_tok_s", "prefill_s", "decode_s", "wall_s", "evict_s", "attn_stats_s", "score_pass_s",
    "generated_tokens",
    "output_tokens", "peak_kv_bytes", "decode_kv_bytes_mean", "decode_kv_bytes_peak", "kv_kept_share", "peak_mem_bytes",
    "peak_mem_bytes_per_device", "peak_reserved_bytes_per_device",
    "accounted_mem_bytes", "accounted_mem_bytes_per_device", "search", "attention", "model_family",
    "state_bytes_per_sequence", "compressed_layers", "extensions", "ignored_keys", "notes", "logger", "prompts",
    "config", "predictions_path",
    "scores_path",
]
PLAN_FIELDS = ["run_id", "config_hash", "started_at", "kvbench_version", "git_sha", "mode", "status", "error",
               "experiment", "model", "task", "n_samples", "max_new_tokens", "seed", "device", "plan", "config"]
HASH = "[0-9a-f]{16,64}"


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=[*TINY, *overrides])


def test_a_runs_record_has_every_field_in_order_before_it_runs():
    cfg = _cfg("policy=batch_max", "policy.kv_size=32", "policy.evict_every=8", "batch_size=2")
    rec = new_record(cfg, build_policy(cfg), build_task(cfg))
    assert list(rec) == RUN_FIELDS
    assert rec["status"] == "error" and rec["metrics"] == {} and rec["throughput_tok_s"] is None  # until it runs
    assert (rec["policy"], rec["kv_size"], rec["evict_every"], rec["batch_size"]) == ("batch_max", 32, 8, 2)
    assert re.fullmatch(rf"\d{{8}}-\d{{6}}-{rec['config_hash'][:8]}-[0-9a-f]{{4}}", rec["run_id"])


def test_serve_records_no_batch_size_nor_evict_every():
    cfg = _cfg("mode=serve", "policy=batch_max", "policy.kv_size=32", "policy.evict_every=8")
    rec = new_record(cfg, build_policy(cfg), build_task(cfg))
    assert rec["batch_size"] is None and rec["evict_every"] is None and rec["mode"] == "serve"


def test_a_plan_record_never_shares_a_runs_identity():
    cfg = _cfg("memory.limit_gb=1")
    run, plan = stamp(cfg), plan_record(cfg, task="passkey", n_samples=3, device="CPU", plan={"rows": []})
    assert list(plan) == PLAN_FIELDS and (plan["mode"], plan["status"], plan["error"]) == ("plan", "ok", None)
    assert re.fullmatch(HASH, run["config_hash"]) and plan["config_hash"] == f"plan-{run['config_hash']}"
    assert re.fullmatch(rf"\d{{8}}-\d{{6}}-plan-{run['config_hash'][:8]}-[0-9a-f]{{4}}", plan["run_id"])
    assert (plan["task"], plan["n_samples"], plan["device"], plan["plan"]) == ("passkey", 3, "CPU", {"rows": []})


def test_two_records_of_one_config_have_two_run_ids_and_one_hash():
    cfg = _cfg()
    a, b = stamp(cfg), stamp(cfg)
    assert a["config_hash"] == b["config_hash"] and a["run_id"] != b["run_id"]


def test_git_sha_is_a_full_commit_in_a_checkout():
    assert re.fullmatch("[0-9a-f]{40}", git_sha() or "")
