"""search.max_batch (kvbench.search): doubling then bisection finds the boundary, a budget set between
two known footprints gives exactly the smaller batch, and an out-of-memory trial leaves no memory or
state behind (what follows it equals a fresh process's result)."""

from __future__ import annotations

import json
import subprocess
import sys
import weakref

import pytest
import torch
from hydra import compose, initialize_config_dir

from kvbench import memory, search
from kvbench import run as kvrun
from kvbench.attention import resolve_backend
from kvbench.cache import KVCache
from kvbench.config import CONF_DIR, DIVISORS_OF_960, build_policy, build_task
from kvbench.results import read_jsonl, read_records

TINY = ["model=tiny-llama", "task.n_samples=3", "task.context_tokens=40", "gen.max_new_tokens=4",
        "policy=batch_max", "policy.kv_size=32", "policy.evict_every=8"]
CANDIDATES = [1, 2, 3, 4, 6, 8, 12, 16]
TINY16 = [o if o != "task.n_samples=3" else "task.n_samples=16" for o in TINY]  # every candidate <= the samples


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _probe_footprints(cfg) -> dict[int, int]:
    """Accounted peak of the worst-case probe batch at every candidate batch size."""
    lm = kvrun.models.load_model(cfg)
    task = build_task(cfg)
    ids = [task.encode(lm.tokenizer, s.prompt) for s in task.samples(lm.tokenizer)]
    policy = build_policy(cfg)
    return {
        b: memory.account(lm.model, [len(x) for x in search.probe_prompts(ids, b)], policy,
                          max_new_tokens=cfg.gen.max_new_tokens,
                          attention=resolve_backend(cfg.gen.attention, lm.model, policy.needs.attention)).total
        for b in CANDIDATES
    }


# ------------------------------------------------------------------------------------- the algorithm
def _fake(limit: int):
    return lambda b: search.Trial(b, "ok" if b <= limit else "oom", peak_mem_bytes=b, accounted_mem_bytes=b)


@pytest.mark.parametrize("candidates", [DIVISORS_OF_960, CANDIDATES, list(range(1, 1001))], ids=["D", "list", "all"])
@pytest.mark.parametrize("limit", [0, 1, 5, 7, 40, 47, 100, 959, 5000])
def test_search_finds_the_boundary(candidates, limit):
    result = search.search(candidates, _fake(limit))
    fit = [c for c in candidates if c <= limit]
    assert result.max_batch_size == (fit[-1] if fit else None)
    assert result.first_oom_batch_size == next((c for c in candidates if c > limit), None)
    tried = [t.batch_size for t in result.trials]
    assert len(tried) == len(set(tried)) <= 2 * len(candidates).bit_length() + 1  # doubling + bisection
    first_oom = next((i for i, t in enumerate(result.trials) if t.status == "oom"), len(tried) - 1)
    grow = tried[: first_oom + 1]  # the doubling phase
    assert all(b >= 2 * a or b == candidates[-1] for a, b in zip(grow[:-1], grow[1:], strict=True))


# ------------------------------------------------------------------------------------- real probes
def test_budget_between_two_footprints_gives_the_smaller_batch(tmp_path):
    cfg = _compose(*TINY16, f"search.candidates={CANDIDATES}")
    fp = _probe_footprints(cfg)
    assert all(fp[a] < fp[b] for a, b in zip(CANDIDATES[:-1], CANDIDATES[1:], strict=True))
    budget = (fp[6] + fp[8]) / 2 / memory.GiB
    record = kvrun.run(_compose(*TINY16, f"search.candidates={CANDIDATES}", "search.max_batch=true",
                                 "search.only=true", f"memory.limit_gb={budget}", f"results_dir={tmp_path}"))
    s = record["search"]
    assert (record["status"], record["batch_size"], s["max_batch_size"], s["first_oom_batch_size"]) == ("ok", 6, 6, 8)
    for t in s["trials"]:
        assert t["accounted_mem_bytes"] == t["peak_mem_bytes"] == fp[t["batch_size"]]
        assert t["status"] == ("ok" if t["batch_size"] <= 6 else "oom") and t["leaked_bytes"] == 0
    assert [t["batch_size"] for t in s["trials"]] == [1, 2, 4, 8, 6]
    assert record["predictions_path"] is None and record["metrics"] == {}  # search.only: no evaluation
    assert read_records(tmp_path) == [json.loads(json.dumps(record, default=str))]


def test_a_budget_above_the_sequence_finds_no_smaller_batch_than_the_full_cache(tmp_path):
    """A window of 100,000 pairs never evicts these prompts (40-token contexts + 4 new): real probes under a
    budget between the full cache's b=6 and b=8 find a batch no smaller than the full cache's (preallocating
    100,000 slots per sample fitted none)."""
    full = [*(o for o in TINY16 if not o.startswith("policy")), "policy=full"]
    fp = _probe_footprints(_compose(*full, f"search.candidates={CANDIDATES}"))  # the full cache: 6 fits, 8 does not
    budget = (fp[6] + fp[8]) / 2 / memory.GiB
    rec = kvrun.run(_compose(*TINY16, "policy=window", "policy.kv_size=100000", f"search.candidates={CANDIDATES}",
                             "search.max_batch=true", "search.only=true", f"memory.limit_gb={budget}",
                             f"results_dir={tmp_path}"))
    assert rec["status"] == "ok" and rec["search"]["max_batch_size"] >= 6, (rec["error"], rec["search"])


def test_nothing_fits_is_an_oom_record(tmp_path):
    record = kvrun.run(_compose(*TINY, "search.max_batch=true", "search.only=true", f"results_dir={tmp_path}",
                                 f"memory.limit_gb={kvrun.models.load_model(_compose(*TINY)).weights_bytes * 1.001 / memory.GiB}"))
    assert record["status"] == "oom" and record["search"]["max_batch_size"] is None
    assert record["search"]["first_oom_batch_size"] == 1 and len(record["search"]["trials"]) == 1


# The CLI in a fresh interpreter (its record goes to its results_dir).
FRESH = "import json, sys; from kvbench import cli; cli.main(sys.argv[1:])"


def test_search_then_run_equals_a_fresh_process(tmp_path):
    """The run after a search with oom trials gives what a fresh process gives at that batch size."""
    cfg = _compose(*TINY, f"search.candidates={CANDIDATES}")
    fp = _probe_footprints(cfg)
    budget = (fp[2] + fp[3]) / 2 / memory.GiB
    searched = kvrun.run(_compose(*TINY, f"search.candidates={CANDIDATES}", "search.max_batch=true",
                                   f"memory.limit_gb={budget}", f"results_dir={tmp_path / 'a'}"))
    assert searched["batch_size"] == 2 and any(t["status"] == "oom" for t in searched["search"]["trials"])
    p = subprocess.run([sys.executable, "-c", FRESH, *TINY, "batch_size=2", f"memory.limit_gb={budget}",
                        f"results_dir={tmp_path / 'b'}"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    (fresh,) = read_records(tmp_path / "b")
    for key in ("status", "batch_size", "metrics", "generated_tokens", "peak_kv_bytes", "accounted_mem_bytes",
                "peak_mem_bytes"):
        assert searched[key] == fresh[key], key
    tokens = [[r["token_ids"] for r in read_jsonl(rec["predictions_path"])] for rec in (searched, fresh)]
    assert tokens[0] == tokens[1]


def _oom_mid_forward(monkeypatch, from_batch: int, hold: list):
    """Make every forward of a cache of >= `from_batch` samples raise CUDA's OutOfMemoryError, after the
    cache is allocated (as a real GPU would mid-prefill); weak references to those caches go in `hold`."""
    begin = KVCache.begin_forward

    def begin_or_oom(self, r, width):
        if self.batch_size_ >= from_batch:
            hold.append(weakref.ref(self))
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return begin(self, r, width)

    monkeypatch.setattr(KVCache, "begin_forward", begin_or_oom)


def test_oom_mid_forward_leaves_no_cache_behind(monkeypatch, no_gc):
    cfg = _compose(*TINY)
    lm, policy = kvrun.models.load_model(cfg), build_policy(cfg)
    ids = [list(range(40, 90)), list(range(10, 70))]
    fresh = search.probe(cfg, lm, policy, ids, 2, None)
    caches: list = []
    _oom_mid_forward(monkeypatch, 4, caches)
    trial = search.probe(cfg, lm, policy, ids, 4, None)
    assert trial.status == "oom" and trial.leaked_bytes == 0 and caches and caches[0]() is None
    assert search.probe(cfg, lm, policy, ids, 2, None) == fresh  # the next trial is unaffected
    assert lm.model.config._attn_implementation != "kvbench"  # the attention patch is undone


def test_a_leak_is_reported(monkeypatch, no_gc):
    """The level check can fail: a cache something still holds after an oom trial, its tensors not given
    back (the engine's release skipped, as before it existed), is reported."""
    cfg = _compose(*TINY)
    lm, policy = kvrun.models.load_model(cfg), build_policy(cfg)
    caches: list = []
    _oom_mid_forward(monkeypatch, 1, caches)
    monkeypatch.setattr(KVCache, "release", lambda self: None)
    held, begin = [], KVCache.begin_forward

    def hold_then_begin(self, r, width):
        held.append(self)
        return begin(self, r, width)

    monkeypatch.setattr(KVCache, "begin_forward", hold_then_begin)
    trial = search.probe(cfg, lm, policy, [list(range(40, 90))], 3, None)
    assert trial.status == "oom" and trial.leaked_bytes == held[0].allocated_bytes() > 0


def test_account_probes_give_the_same_verdicts_as_real_ones(tmp_path):
    """search.probe=account (CPU) decides every trial as the real probe does, without running it."""
    from hydra import compose, initialize_config_dir

    from kvbench.config import CONF_DIR
    from kvbench.run import run

    common = ["model=tiny-llama", "task.n_samples=32", "task.context_tokens=256", "gen.max_new_tokens=8",
              "policy=batch_max", "policy.kv_size=64", "policy.evict_every=16", "search.max_batch=true",
              "search.only=true", "search.candidates=[1,2,3,4,6,8,12,16,24,32]", "memory.limit_gb=0.0015",
              f"results_dir={tmp_path}"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        real = run(compose("config", overrides=common))["search"]
        acct = run(compose("config", overrides=[*common, "search.probe=account"]))["search"]
    assert real["first_oom_batch_size"] is not None and real["max_batch_size"] > 1  # the budget bites in the range
    assert [(t["batch_size"], t["status"]) for t in acct["trials"]] == [
        (t["batch_size"], t["status"]) for t in real["trials"]
    ]


def test_a_cpu_search_says_the_accounted_budget_decided(tmp_path):
    """Case 10: on CPU, search.probe=real runs each probe but the accounted budget decides: the record says so."""
    cfg = _compose(*TINY)
    budget = kvrun.models.load_model(cfg).weights_bytes * 1.001 / memory.GiB
    record = kvrun.run(_compose(*TINY, "search.max_batch=true", "search.only=true", f"results_dir={tmp_path}",
                                 f"memory.limit_gb={budget}"))
    s = record["search"]
    assert (s["decided_by"], s["probe"]) == ("accounted", "real") and s["wall_s"] >= 0
    assert record["batch_size"] == s["first_oom_batch_size"] == 1  # nothing fits: the batch that ran out
