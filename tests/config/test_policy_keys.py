"""Sweeps that compare policies run as written (issue 37).

A policy key applies only to the policies of a sweep that use it: `full` ignores every budget and
schedule key, a policy ignores another's knob (`policy.window` for h2o). An ignored key is reset to the
policy's own default, named in the record's `ignored_keys` and kept out of its identity, so `full` runs
once whatever kv sizes the sweep holds; a key no policy of the sweep uses is still refused up front.
The three sweeps of the issue run to records on the tiny model, and the report compares them in one table.
"""

from __future__ import annotations

import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import get_class

from kvbench import cli
from kvbench import run as kvrun
from kvbench.config import CONF_DIR, config_hash
from kvbench.report import tables
from kvbench.results import read_records
from tests.conftest import assert_one_line_exit_2

# passkey prompts of ~600 tokens on the tiny model: above every budget below (512 is a real eviction)
TINY = ["model=tiny-llama", "task.n_samples=2", "task.context_tokens=600", "gen.max_new_tokens=2", "batch_size=2",
        "hydra/job_logging=none", "hydra/hydra_logging=none"]
SWEEPS = (  # the issue's three sweeps (the window sweep first: its h2o job is h2o at its defaults), then the docs'
    ["policy=h2o,snapkv", "policy.window=16"],
    ["policy=full,h2o", "policy.kv_size=128,256,512"],
    ["policy=full,h2o", "policy.schedule=after_prefill", "policy.compression_ratio=0.5"],
    ["policy=full,window,batch_max", "policy.kv_size=256"],
)


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.fixture(autouse=True)
def argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["kvbench"])


def test_the_issues_sweeps_run_full_once_and_report_one_table(tmp_path, monkeypatch):
    executed = []
    execute = kvrun.static.execute
    monkeypatch.setattr(kvrun.static, "execute", lambda cfg, *a, **k: executed.append(get_class(cfg.policy._target_).name)
                        or execute(cfg, *a, **k))
    common = [*TINY, f"results_dir={tmp_path}", f"hydra.sweep.dir={tmp_path / 'hydra'}"]
    for sweep in SWEEPS:
        cli.main(["-m", *sweep, *common])
    recs = read_records(tmp_path)
    assert all(r["status"] == "ok" for r in recs), [r["error"] for r in recs]
    got = sorted(((r["policy"], r["kv_size"], r["compression_ratio"], r["schedule"], tuple(r["ignored_keys"]))
                  for r in recs), key=str)
    assert got == sorted([
        ("h2o", 256, None, "decode_only", ("policy.window",)),  # sweep 1: h2o has no window
        ("snapkv", 256, None, "decode_only", ()),
        ("full", None, None, None, ("policy.kv_size",)),  # sweep 2: once, for all three kv sizes
        ("h2o", 128, None, "decode_only", ()),  # h2o at 256 is sweep 1's (the window ignored): skipped
        ("h2o", 512, None, "decode_only", ()),
        ("h2o", None, 0.5, "after_prefill", ()),  # sweep 3: full is sweep 2's
        ("window", 256, None, "prefill_and_decode", ()),  # sweep 4: full again sweep 2's
        ("batch_max", 256, None, "prefill_and_decode", ()),
    ], key=str)
    assert sorted(executed) == sorted(r["policy"] for r in recs)  # nothing ran twice, the skipped never ran
    snap = next(r for r in recs if r["policy"] == "snapkv")
    h2o = next(r for r in recs if r["policy"] == "h2o" and r["kv_size"] == 256)
    assert snap["config"]["policy"]["window"] == 16 and "window" not in h2o["config"]["policy"]
    full = next(r for r in recs if r["policy"] == "full")
    assert full["config"]["policy"]["kv_size"] is None
    # the identities: those of the single runs without the ignored keys
    single = [*TINY[:5], f"results_dir={tmp_path}"]
    assert full["config_hash"] == config_hash(_compose(*single, "policy=full"))
    assert h2o["config_hash"] == config_hash(_compose(*single, "policy=h2o"))
    assert snap["config_hash"] == config_hash(_compose(*single, "policy=snapkv", "policy.window=16"))

    (table,) = tables(recs, 0.96, tmp_path)  # one setting: one table, the one FKV row in it
    methods = sorted((r.method, r.cells()[2]) for r in table.runs)
    assert methods == sorted([("FKV", "-"), ("H2O", "128"), ("H2O", "256"), ("H2O", "512"),
                              ("H2O (after_prefill)", "cr=0.5"), ("SnapKV", "256"), ("Window", "256"), ("BM", "256")])
    assert table.fkv is not None and table.fkv.run_id == full["run_id"]
    assert set(table.vs_fkv) == {r["run_id"] for r in recs} - {full["run_id"]}  # each paired with that FKV


def test_full_joins_the_table_of_each_setting(tmp_path):
    """Two settings (task.n_shot differs) each get the full run of their own setting, once."""
    recs = []
    for shot in (0, 1):
        for pol, kv in (("full", None), ("h2o", 128), ("h2o", 256)):
            cfg = _compose(*TINY[:5], f"policy={pol}", f"policy.kv_size={kv if kv else 'null'}", f"task.n_shot={shot}",
                           f"results_dir={tmp_path}")
            cfg.task.n_shot = shot
            recs.append({"run_id": f"{pol}{kv}{shot}", "config_hash": config_hash(cfg), "status": "ok", "mode": "run",
                         "policy": pol, "kv_size": kv, "schedule": None if pol == "full" else "decode_only",
                         "model": "tiny-llama", "task": "passkey", "n_samples": 2, "max_new_tokens": 2,
                         "batch_size": 2, "metrics": {"accuracy": 1.0}, "throughput_tok_s": 1.0,
                         "device": "cpu", "config": _container(cfg)})
    out = tables(recs, 0.96)
    assert len(out) == 2
    for t in out:
        assert [r.method for r in t.runs].count("FKV") == 1 and sorted(r.kv or 0 for r in t.runs) == [0, 128, 256]
        assert t.fkv.run_id.endswith(str(t.records[0][1]["config"]["task"]["n_shot"]))


def _container(cfg):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


REFUSED = {
    # a key no policy of the sweep uses: a typo stays an error
    "-m policy=h2o,snapkv policy.windw=16": "policy.windw=16: no policy of this sweep uses it (h2o, snapkv)",
    "-m policy=full policy.kv_size=128,256": "policy.kv_size=128,256: no policy of this sweep uses it (full)",
    "-m policy=full,h2o policy.kernel=3": "policy.kernel=3: no policy of this sweep uses it (full, h2o)",
    "-m policy=extreme_decode,full policy.kv_ratio=0.5": "policy.kv_ratio=0.5",
    # a policy that uses the key still refuses a bad value
    "-m policy=full,h2o policy.kv_size=0": "policy.kv_size=0: must be a positive integer",
    "-m policy=full,pyramidkv policy.rerotate=true": "policy.rerotate=True",
    # a single run applies what it is given: an inapplicable key is refused, as before
    "policy=full policy.kv_size=128": "policy.kv_size=128: policy=full keeps every pair",
    "policy=full policy.compression_ratio=0.5": "policy.compression_ratio=0.5: policy=full keeps every pair",
    "policy=h2o policy.window=16": "Key 'window' is not in struct",
    # Hydra prints one job's config: not a sweep's
    "-m policy=full,h2o --cfg job": "--cfg: prints the config of one run",
}


@pytest.mark.parametrize("args", list(REFUSED), ids=list(REFUSED))
def test_refused_before_anything_loads(args, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(kvrun.models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    assert_one_line_exit_2(cli.main, [*args.split(), *TINY, f"results_dir={tmp_path}"], capsys, REFUSED[args])
    assert not (tmp_path / "runs.jsonl").exists()


def test_a_knob_some_policy_lacks_is_forced_for_hydra_only(tmp_path):
    argv = ["-m", "policy=h2o,snapkv", "policy.window=16", "policy.kv_size=128", *TINY, f"results_dir={tmp_path}"]
    hydra_argv, jobs = cli.compose_jobs(argv)
    assert hydra_argv == [a if a != "policy.window=16" else "++policy.window=16" for a in argv]
    assert [(c.policy._target_.rsplit(".")[-1], ignored) for _, c, ignored in jobs] == [
        ("H2O", ["policy.window"]), ("SnapKV", [])]
    assert [c.policy.kv_size for _, c, _ in jobs] == [128, 128]
    assert cli.preflight(argv) == hydra_argv  # and every job passes the preflight


def test_a_single_run_of_full_ignores_its_inert_keys_and_keeps_its_identity(tmp_path, monkeypatch):
    """Keys full's config has and never uses (schedule, evict_every, protection), accepted by a single run as
    before, are reset and listed: the run is `policy=full`'s."""
    args = [*TINY[:5], "policy=full", "policy.schedule=decode_only", "policy.evict_every=8", f"results_dir={tmp_path}"]
    monkeypatch.setattr(kvrun.static, "execute", lambda cfg, record, *a, **k: record.update(status="ok") or [])
    rec = kvrun.run(_compose(*args))
    assert rec["ignored_keys"] == ["policy.evict_every", "policy.schedule"]
    assert rec["config_hash"] == config_hash(_compose(*TINY[:5], "policy=full", f"results_dir={tmp_path}"))
