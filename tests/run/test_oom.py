"""Out-of-memory by kind: an accounted (CPU budget) oom is final for skip_existing, a measured one
(an allocator's, e.g. CUDA's) is retried once; and a run's identity uses the resolved device kind, so
a GPU sweep never skips what a CPU run recorded in the same directory (records written before still
match on CPU)."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir

from kvbench import memory, search
from kvbench import run as kvrun
from kvbench.config import CONF_DIR, build_policy, build_task, config_hash, identity, record_hash
from kvbench.errors import OutOfMemory
from kvbench.results import append_record, finished, read_records

TINY = ["model=tiny-llama", "task.n_samples=2", "task.context_tokens=32", "gen.max_new_tokens=2", "batch_size=2"]


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


# ------------------------------------------------------------------------------------- finished()
def _rec(i, status, kind=None, h="h"):
    r = {"run_id": str(i), "config_hash": h, "status": status}
    if kind is not None:
        r["oom_kind"] = kind
    return r


@pytest.mark.parametrize(
    "history, expected",
    [
        ([], None),
        ([("error", None)], None),
        ([("ok", None)], "0"),
        ([("oom", "accounted")], "0"),
        ([("oom", None)], "0"),  # written before oom_kind existed: accounted
        ([("oom", "measured")], None),  # retried once
        ([("oom", "measured"), ("oom", "measured")], "1"),  # the second is final
        ([("oom", "measured"), ("error", None), ("oom", "measured")], "2"),
        ([("oom", "measured"), ("ok", None)], "1"),
        ([("ok", None), ("oom", "measured")], "0"),  # a later measured oom does not hide an ok
        ([("oom", "measured"), ("oom", "accounted")], "1"),
    ],
)
def test_finished_by_kind(tmp_path, history, expected):
    for i, (status, kind) in enumerate(history):
        append_record(tmp_path, _rec(i, status, kind))
    append_record(tmp_path, _rec(99, "ok", h="other"))  # another identity never counts
    got = finished(tmp_path, "h")
    assert (got["run_id"] if got else None) == expected


def test_oom_kind_of_exceptions():
    acc = memory.account(memory.ModelShape(
        hidden=8, intermediate=8, vocab=8, q_heads=1, kv_heads=1, head_dim=8, dtype=torch.float32, mlp_buffers=3,
        fused_qkv=False, weights={"cpu": 1}, layers={"cpu": 1}), [4], build_policy(_compose(*TINY)),
        max_new_tokens=1)
    assert memory.oom_kind(memory.MemoryLimitExceeded("over", acc)) == "accounted"
    assert memory.oom_kind(torch.cuda.OutOfMemoryError("CUDA out of memory")) == "measured"
    assert memory.oom_kind(RuntimeError("DefaultCPUAllocator: can't allocate memory")) == "measured"
    assert memory.oom_kind(OutOfMemory("search", kind="accounted")) == "accounted"
    assert memory.oom_kind(OutOfMemory("unknown")) == "measured"  # not known: the retried side


# ------------------------------------------------------------------------------------- identity
def test_identity_uses_the_resolved_device_kind(monkeypatch):
    auto, cpu = _compose(*TINY), _compose(*TINY, "device=cpu")
    assert identity(auto)["device"] == "cpu" and config_hash(auto) == config_hash(cpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the same command on a GPU machine
    gpu, cuda = config_hash(auto), config_hash(_compose(*TINY, "device=cuda"))
    assert identity(auto)["device"] == "cuda" and gpu == cuda == config_hash(_compose(*TINY, "device=cuda:1"))
    assert gpu != config_hash(cpu)


def test_a_gpu_sweep_does_not_skip_cpu_records(tmp_path, monkeypatch):
    rec = kvrun.run(_compose(*TINY, f"results_dir={tmp_path}"))
    assert rec["status"] == "ok" and rec["oom_kind"] is None and rec["device"] == "cpu"
    assert record_hash(rec) == rec["config_hash"] == config_hash(_compose(*TINY))
    assert finished(tmp_path, rec["config_hash"])["run_id"] == rec["run_id"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert finished(tmp_path, config_hash(_compose(*TINY))) is None


def test_records_from_before_the_resolved_hash_still_match(tmp_path):
    """A CPU record written when device=auto was hashed as "auto" is found by the same run now."""
    rec = json.loads(json.dumps(kvrun.record.new_record(_compose(*TINY), build_policy(_compose(*TINY)),
                                                  build_task(_compose(*TINY))), default=str))
    assert rec["config"]["device"] == "auto"
    rec.update(status="ok", config_hash="0123456789abcdef")  # an old hash: not what config_hash gives now
    append_record(tmp_path, rec)
    assert finished(tmp_path, config_hash(_compose(*TINY)))["run_id"] == rec["run_id"]
    assert finished(tmp_path, config_hash(_compose(*TINY, "seed=1"))) is None


# ------------------------------------------------------------------------------------- runs
def test_measured_oom_is_retried_once_accounted_is_final(tmp_path, monkeypatch):
    args = [*TINY, f"results_dir={tmp_path}", "skip_existing=true"]
    execute, calls = kvrun.static.execute, []

    def cuda_oom(*a, **k):
        calls.append(1)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    monkeypatch.setattr(kvrun.static, "execute", cuda_oom)
    first = kvrun.run(_compose(*args))
    second = kvrun.run(_compose(*args))  # retried
    third = kvrun.run(_compose(*args))  # final: the second measured oom
    assert (first["status"], first["oom_kind"], second["oom_kind"]) == ("oom", "measured", "measured")
    assert len(calls) == 2 and third["run_id"] == second["run_id"] and len(read_records(tmp_path)) == 2

    monkeypatch.setattr(kvrun.static, "execute", execute)
    small = [*args, "seed=3", f"memory.limit_gb={kvrun.models.load_model(_compose(*TINY)).weights_bytes * 1.01 / memory.GiB}"]
    acc = kvrun.run(_compose(*small))
    again = kvrun.run(_compose(*small))
    assert (acc["status"], acc["oom_kind"]) == ("oom", "accounted") and again["run_id"] == acc["run_id"]


def test_search_records_the_kind_of_its_oom_trials(tmp_path, monkeypatch):
    budget = kvrun.models.load_model(_compose(*TINY)).weights_bytes * 1.001 / memory.GiB
    rec = kvrun.run(_compose(*TINY, "batch_size=1", "search.max_batch=true", "search.only=true",
                              f"memory.limit_gb={budget}", f"results_dir={tmp_path}"))
    assert rec["status"] == "oom" and rec["oom_kind"] == "accounted"
    assert [t["oom_kind"] for t in rec["search"]["trials"]] == ["accounted"]

    def cuda_oom(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(search.engine, "generate", cuda_oom)
    rec = kvrun.run(_compose(*TINY, "batch_size=1", "search.max_batch=true", "search.only=true",
                              "memory.limit_gb=100", f"results_dir={tmp_path}"))
    assert rec["status"] == "oom" and rec["oom_kind"] == "measured"
    assert [t["oom_kind"] for t in rec["search"]["trials"]] == ["measured"]
