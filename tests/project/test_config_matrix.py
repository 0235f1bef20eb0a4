"""Every accepted configuration runs to a true record; every other is refused before the model loads.

The combinations come from tests/matrix.py: all pairs of the documented options (a seeded pairwise
cover, about 100 combinations) in the default run, the whole product with KVBENCH_MATRIX=full
(`make test-matrix`, outside CI). Each runs on tiny random models over a 3-row GSM8K mirror whose
prompts differ in length (161-273 tokens: a batch of 3 is left-padded), 6 new tokens, EOS ignored.

A refused combination must stop in the CLI with exit code 2 and one line naming a key of the documented
rule it breaks, with no model loaded. An accepted one runs, and its record is checked against spies on
what really ran (not against the code that wrote it):
- the attention function that ran (kvbench's backends, or serve mode's paged SDPA / fused) is `attention`;
- no forward held more pairs than its budget (per group of layers and sample; serve: per request), and
  the budgets the cache held are `kv_budget`'s (kind, min, max, per layer); evicting policies evicted;
- serve mode: no (layer, KV head) of a request held more than its own budget (after_prefill: its budget and
  the tokens generated since), `kv_budget` is the budgets the requests got; `peak_kv_bytes` is the most
  pages in use during a step times a page's K/V bytes;
- one prediction per sample, every token generated; `mode`, `batch_size`, `evict_every`, `schedule`,
  `kv_size`, `kv_ratio` as applied (null where not applied);
- a static run's cache stores K/V in the bits gen.kv_cache_dtype asks for (a quantized store) or in the model's dtype;
- `extensions` name every departure from the published method and nothing that was not applied
  (tests/matrix.py's table of departures);
- the W&B run (a stand-in `wandb` module) carries the same identity and summary, budgets and serving
  metrics included.

A sweep over every policy with keys only some of them use (tests/matrix.py's SWEEPS) composes, passes the
preflight, and gives each job its policy's own config with exactly the keys it uses; the others are named
as ignored.
"""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch
from hydra import compose, initialize_config_dir

from kvbench import attention as static_attention
from kvbench import cli
from kvbench import run as kvrun
from kvbench.budgets import head_rule
from kvbench.cache import KVCache
from kvbench.conf import load_option
from kvbench.config import CONF_DIR, prepare
from kvbench.engine import Batch as _Batch
from kvbench.policies import registry
from kvbench.results import read_jsonl, read_records
from kvbench.serve import paged_attention as paged_attention
from kvbench.serve.model_runner import ModelRunner
from kvbench.serve.scheduler import Scheduler
from tests.conftest import assert_one_line_exit_2
from tests.matrix import (
    BLOCK,
    COMPRESSION_RATIO,
    EVICT_EVERY,
    HEAD_PATTERN,
    KV_ABOVE,
    KV_RATIO,
    KV_SIZE,
    NEW_TOKENS,
    PROMPT_TOKENS,
    SAMPLES,
    SWEEPS,
    Combo,
    argv,
    expected_extensions,
    named,
    pairwise,
    product,
    refusal,
    uses,
    write_mirror,
)

FULL = os.environ.get("KVBENCH_MATRIX") == "full"
COMBOS = product() if FULL else pairwise(seed=0)
GEOMETRY = {"tiny-llama": (2, 2, 16), "tiny-phi3": (2, 4, 16)}  # (layers, KV heads, head dim): tests/conftest's models
ELEM = {"float32": 4, "bfloat16": 2}


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    return write_mirror(tmp_path_factory.mktemp("data"))


class Spy:
    """What really ran, seen from outside the code that writes the record."""

    def __init__(self, combo: Combo):
        self.combo = combo
        self.backends: set[str] = set()
        self.over: list[str] = []  # budget violations
        self.oversized: list[str] = []  # cache groups with more slots than the full cache's
        self.budget_rows: list[tuple[int, ...]] = []  # every (B,) budget row a cache group held
        self.per_layer = False
        self.evictions = 0
        self.serve_steps = 0
        self.most_pages = 0
        self.serve_budgets: list[torch.Tensor] = []  # each admitted request's (L, H) budgets
        self.head_tables: list[torch.Tensor] = []  # a head pattern's (L, B) means over each layer's heads (static)
        self.quant_bits: set[int | None] = set()  # the bits of every static cache group's K/V (None: the model's dtype)

    def install(self, mp: pytest.MonkeyPatch) -> None:
        for kernel in (static_attention.sdpa, static_attention.flash, static_attention.eager, static_attention.fused):
            name = kernel.__name__.rsplit(".", 1)[-1]
            mp.setattr(kernel, f"{name}_attention", self.tap(getattr(kernel, f"{name}_attention"), name))
        mp.setattr(paged_attention, "fused_attention", self.tap(paged_attention.fused_attention, "paged_fused"))
        sdpa = self.tap(torch.nn.functional.scaled_dot_product_attention, "paged_sdpa")
        mp.setattr(paged_attention, "F", types.SimpleNamespace(scaled_dot_product_attention=sdpa))
        mp.setattr(_Batch, "__init__", self.batch_init(_Batch.__init__))
        mp.setattr(KVCache, "begin_forward", self.begin_forward(KVCache.begin_forward))
        mp.setattr(KVCache, "evict", self.evict(KVCache.evict))
        mp.setattr(ModelRunner, "step", self.step(ModelRunner.step))
        mp.setattr(Scheduler, "schedule", self.schedule(Scheduler.schedule))

    def tap(self, fn, name):
        def wrapped(*a, **k):
            self.backends.add(name)
            return fn(*a, **k)
        return wrapped

    def batch_init(self, init):
        def wrapped(batch, model, ids, policy, *a, **k):
            init(batch, model, ids, policy, *a, **k)
            whole = max(len(x) for x in ids) + (a[0] if a else k["max_new_tokens"])  # the full cache's slots
            self.oversized += [f"layers {g.layers}: {g.capacity} slots > {whole}" for g in batch.cache.groups
                               if g.capacity > whole]
            batch.cache.spy_lengths = torch.tensor([len(x) for x in ids])
            batch.cache.spy_prefill = policy.evicts_in_prefill
            batch.cache.spy_once = policy.once
            self.quant_bits |= {None if g.store is None else g.store.key_rule.bits for g in batch.cache.groups}
            rule = head_rule(policy)
            if rule.fixed and policy.evicts:  # what each head may hold, by the rule serve mode budgets requests by
                per = rule.head_budgets(policy, model.config)
                new = a[0] if a else k["max_new_tokens"]
                self.head_tables.append(torch.stack([per(types.SimpleNamespace(prompt=x, max_new_tokens=new)).float()
                                                     .mean(1) for x in ids], dim=1))
        return wrapped

    def begin_forward(self, fn):
        def wrapped(cache, r, width):
            out = fn(cache, r, width)
            decoding = cache.seen > cache.spy_lengths  # rows whose forward brings a generated token
            rows = {tuple(g.budget.tolist()) for g in cache.groups if g.budget is not None}
            self.per_layer |= len(rows) > 1
            self.budget_rows += list(rows)
            for g in cache.groups:
                if g.budget is None:
                    continue
                checked = decoding | cache.spy_prefill  # decode_only holds the whole prompt until it decodes
                # after_prefill: the prompt within its budget, then every generated token kept
                limit = g.budget + (cache.seen - cache.spy_lengths).clamp(min=0) if cache.spy_once else g.budget
                over = (g.load > limit) & checked  # adaptive head budgets: the heads' average (n: the largest)
                if bool(over.any()):
                    self.over.append(f"layers {g.layers}: held {g.n.tolist()} > budget {g.budget.tolist()}")
            return out
        return wrapped

    def evict(self, fn):
        def wrapped(cache, *a, **k):
            self.evictions += 1
            return fn(cache, *a, **k)
        return wrapped

    def step(self, fn):
        def wrapped(runner_, scheduled):
            pol = runner_.policy
            self.serve_steps += 1
            for s in scheduled:
                r = s.req
                if r.budget is None:
                    continue
                if not any(b is r.budget for b in self.serve_budgets):
                    self.serve_budgets.append(r.budget)
                decoded = r.num_computed - len(r.prompt)  # tokens generated and written so far
                limit = r.budget + max(0, decoded) if pol.once else r.budget
                if (pol.evicts_in_prefill or decoded >= 0) and bool((r.held + s.num_tokens > limit + (
                        s.num_tokens if pol.once else 0)).any()):
                    self.over.append(f"request {r.rid}: {r.held.tolist()} + {s.num_tokens} > {limit.tolist()}")
            return fn(runner_, scheduled)
        return wrapped

    def schedule(self, fn):
        def wrapped(sched):
            plan = fn(sched)
            self.most_pages = max(self.most_pages, sched.bm.num_used)
            return plan
        return wrapped


class FakeWandb:
    """A stand-in `wandb` module: what kvbench's logger hands to W&B."""

    def __init__(self):
        self.runs = []
        self.module = types.ModuleType("wandb")
        self.module.init = self.init
        self.module.finish = lambda *a, **k: None
        self.module.Settings = lambda **k: k
        self.module.Table = lambda **k: k

    def init(self, **kw):
        run = types.SimpleNamespace(kw=kw, summary={}, logged=[])
        run.log = run.logged.append
        self.runs.append(run)
        return run


@pytest.mark.parametrize("combo", COMBOS, ids=[c.id for c in COMBOS])
def test_refused_up_front_or_a_true_record(combo, mirror, tmp_path, monkeypatch, capsys):
    args = argv(combo, mirror, tmp_path)
    keys = refusal(combo)
    if keys is not None:
        monkeypatch.setattr(kvrun.models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
        err = assert_one_line_exit_2(cli.main, args, capsys, "")
        assert named(err) in keys, (keys, err)
        assert not (tmp_path / "runs.jsonl").exists()
        return
    cli.preflight(args)  # the CLI's preflight accepts it (no model needed)
    if combo.mode == "serve_limits":
        monkeypatch.setattr(kvrun.models, "load_model", lambda *a, **k: pytest.fail("serve_limits loaded a model"))
    spy, fake = Spy(combo), FakeWandb()
    spy.install(monkeypatch)
    monkeypatch.setitem(sys.modules, "wandb", fake.module)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=args)
    rec = kvrun.run(cfg)
    assert rec["status"] == "ok", rec["error"]
    check_record(combo, rec, spy)
    if combo.mode != "serve_limits":
        check_wandb(combo, rec, fake)
    (stored,) = read_records(tmp_path)
    assert stored["run_id"] == rec["run_id"] and stored["extensions"] == rec["extensions"]


def check_limits(c: Combo, rec: dict, spy: Spy) -> None:
    """mode=serve_limits: counts only, no forward; its two checks as the pool and the rule give them."""
    assert spy.backends == set() and rec["attention"] is None and rec["predictions_path"] is None
    lim = rec["serve_limits"]
    longest = lim["longest_generation"]
    assert longest["prompt_tokens"] == max(PROMPT_TOKENS)
    if not c.evicts or (c.holds_whole and c.schedule == "after_prefill"):  # the pool (256 x 16 slots) less the
        # prompt, + 1: the newest token is never cached (a budget above the prompt compresses nothing)
        assert (longest["tokens"], longest["capped"]) == (256 * 16 - longest["prompt_tokens"] + 1, False)
    elif c.schedule == "after_prefill":  # the prompt compressed once, to at most its budget in whole blocks, then
        slots, got = 256 * 16, longest["tokens"]  # every token kept: the pool less what the prompt kept, + 1
        assert longest["capped"] is False
        if not c.per_prompt and c.policy != "chunkkv":  # ChunkKV: whole chunks of each prompt, like a per-prompt one
            assert slots - KV_SIZE + 1 <= got <= slots - KV_SIZE + BLOCK, got
        else:
            assert slots - longest["prompt_tokens"] + 1 < got <= slots, got
    else:  # eviction keeps a request within its budget: unbounded, stopped at serve.limit_cap
        assert (longest["tokens"], longest["capped"]) == (16384, True)
    fill = lim["fewest_sequences_to_fill"]  # 6 new tokens: requests finish before 256 blocks fill, at any count
    assert fill["sequences"] is None and 0 < fill["most_blocks"] < 256, fill
    need, never = expected_extensions(c)
    for s in need:
        assert any(s in e for e in rec["extensions"]), (s, rec["extensions"])


def check_record(c: Combo, rec: dict, spy: Spy) -> None:
    assert rec["mode"] == c.mode
    if c.mode == "serve_limits":
        return check_limits(c, rec, spy)
    serve = c.mode == "serve"
    # after_prefill's one compression settles the cache: the fused backend then decodes with plain SDPA (no statistics)
    settles = rec["attention"] == "fused" and c.schedule == "after_prefill" and c.evicts and not serve
    assert rec["attention"] in spy.backends <= {rec["attention"], *(["sdpa"] if settles else [])}, (
        spy.backends, rec["attention"])
    assert not spy.over, spy.over[:3]
    assert not spy.oversized, spy.oversized[:3]  # no cache larger than the full cache's for the same prompts
    assert any("holds every sequence whole" in n for n in rec["notes"]) == (c.holds_whole and not serve)
    rows = read_jsonl(rec["predictions_path"])
    assert sorted(r["index"] for r in rows) == list(range(SAMPLES))  # one prediction per sample
    assert all(len(r["token_ids"]) == NEW_TOKENS for r in rows) and rec["generated_tokens"] == SAMPLES * NEW_TOKENS
    assert rec["policy"] == c.policy and rec["model"] == c.model and rec["task"] == "gsm8k"
    assert rec["batch_size"] == (None if serve else c.batch)
    ratio = c.per_prompt and c.evicts  # a per-prompt budget
    assert rec["kv_ratio"] == (KV_RATIO if ratio and c.budget == "kv_ratio" else None)
    assert rec["compression_ratio"] == (COMPRESSION_RATIO if ratio and c.budget == "compression_ratio" else None)
    kv = 672 if c.preset else 2 if c.policy == "extreme_decode" else KV_ABOVE if c.holds_whole else KV_SIZE
    assert rec["kv_size"] == (None if ratio or not c.evicts else kv)
    p = 1 if c.policy == "extreme_decode" else EVICT_EVERY
    assert rec["evict_every"] == (p if c.evicts and not serve and c.schedule != "after_prefill" else None)
    assert rec["schedule"] == (c.schedule if c.evicts else None)
    # a single run of full takes the schedule it never uses: reset to its default, listed (docs: Sweeps)
    assert rec["ignored_keys"] == (["policy.schedule"] if not c.evicts and c.schedule != "prefill_and_decode" else [])
    assert rec["config"]["policy"]["schedule"] == (c.schedule if c.evicts else "prefill_and_decode")
    by = c.budget if c.per_prompt else "kv_size"
    if not c.evicts:
        assert rec["kv_budget"] is None and spy.evictions == 0
    elif serve:
        got = [b.float().mean(1) for b in spy.serve_budgets]  # (L,) each request's layer budgets
        per_layer = any(bool((b != b[:1]).any()) for b in got)
        # PyramidKV's layers differ; once compressed, a head pattern's (DuoAttention) mean over each layer's heads,
        # and a ranking over the whole (layer, KV head) table's (head_budget=global: KVzip's default)
        ranked = c.head_budget == "uniform" and getattr(registry()[c.policy], "head_budget", None) == "global"
        assert not per_layer or c.policy == "pyramidkv" or c.policy in HEAD_PATTERN or ranked
        assert rec["kv_budget"] == {"by": by, "min": min(int(b.min()) for b in got),
                                    "max": max(int(b.max()) for b in got), "per_layer": per_layer}
        if ranked and not c.per_prompt:  # the table keeps L x H x kv_size pairs, its layers competing
            assert {float(b.mean()) for b in got} == {rec["kv_size"]}
        elif not c.per_prompt and c.policy != "chunkkv":  # ChunkKV: whole chunks of each prompt (at most kv_size)
            assert {int(b.min()) for b in got} == {int(b.max()) for b in got} == {rec["kv_size"]}
        evicted = rec["serve"]["evicted_blocks"]  # 512 (kv_size_above) or 672 (openvino) pairs hold these prompts
        assert (evicted == 0) if c.holds_whole else (evicted > 0 or c.preset)
    else:
        held = [b for row in spy.budget_rows for b in row]
        assert (spy.evictions == 0) if c.holds_whole else (spy.evictions > 0)
        if c.policy in HEAD_PATTERN:  # each layer's heads' mean (a retrieval head: the whole sequence), as served
            t = spy.head_tables
            assert rec["kv_budget"] == {"by": by, "min": min(int(x.min()) for x in t), "max": max(int(x.max()) for x in t),
                                        "per_layer": any(bool((x != x[:1]).any()) for x in t)}
        else:
            assert rec["kv_budget"] == {"by": by, "min": min(held), "max": max(held), "per_layer": spy.per_layer}
        assert not spy.per_layer or c.policy == "pyramidkv"  # PyramidKV's may still be one budget (its fallback)
    if not serve:  # the cache the run built stores K/V as gen.kv_cache_dtype says
        assert spy.quant_bits == {None if c.kv_cache == "auto" else int(c.kv_cache[3:])}, spy.quant_bits
    if serve:
        dim = GEOMETRY[c.model][2]
        page_kv = 2 * BLOCK * dim * ELEM[c.dtype]  # K and V of one page: block_size slots of one (layer, KV head)
        assert rec["peak_kv_bytes"] == spy.most_pages * page_kv > 0
        assert spy.serve_steps > 0 and rec["serve"]["completed"] == SAMPLES
    need, never = expected_extensions(c)
    ext = rec["extensions"]
    for s in need:
        assert any(s in e for e in ext), (s, ext)
    for s in never:
        assert not any(s in e for e in ext), (s, ext)


def check_wandb(c: Combo, rec: dict, fake: FakeWandb) -> None:
    (run,) = fake.runs
    ident = run.kw["config"]["kvbench"]
    for key in ("run_id", "config_hash", "mode", "policy", "kv_size", "kv_ratio", "compression_ratio", "evict_every", "schedule",
                "batch_size", "attention", "extensions", "ignored_keys", "model", "weights"):
        assert ident[key] == rec[key], key
    assert ident["mode"] == c.mode and run.kw["config"]["mode"] == c.mode  # the resolved config too
    s = run.summary
    assert s["status"] == "ok" and s["throughput_tok_s"] == rec["throughput_tok_s"]
    assert s["accuracy"] == rec["metrics"]["accuracy"]
    if rec["kv_budget"]:
        assert (s["kv_budget/min"], s["kv_budget/max"], s["kv_budget/per_layer"]) == (
            rec["kv_budget"]["min"], rec["kv_budget"]["max"], rec["kv_budget"]["per_layer"])
    if c.mode == "serve":
        sv = rec["serve"]
        assert s["serve/output_tok_s"] == sv["output_tok_s"] and s["serve/preemptions"] == sv["preemptions"]
        assert s["serve/ttft_s/p90"] == sv["ttft_s"]["p90"] and s["serve/pool_util_max"] == sv["pool_util_max"] > 0
        assert run.kw["name"].endswith("/serve")
    else:
        assert not any(k.startswith("serve/") for k in s)


def test_the_cover_holds_every_pair_and_each_refusal_rule():
    """The default run's combinations: every pair of values that can run together runs together; every
    pair that cannot is refused at least once; every documented refusal key appears alone somewhere."""
    from dataclasses import fields
    from itertools import combinations

    from tests.matrix import AXES

    def _pairs(c):  # its pairs of axis values, counted here apart from the cover's own bookkeeping
        return set(combinations([(f.name, getattr(c, f.name)) for f in fields(c) if f.name in AXES], 2))

    runs = [c for c in COMBOS if refusal(c) is None]
    every = product()
    feasible = set().union(*(_pairs(c) for c in every if refusal(c) is None))
    assert feasible <= set().union(*(_pairs(c) for c in runs))
    refused = set().union(*(_pairs(c) for c in COMBOS if refusal(c) is not None))
    assert set().union(*(_pairs(c) for c in every)) - feasible <= refused
    assert {v for c in runs for v in (c.policy,)} == set(AXES["policy"])
    singles = {refusal(c) for c in COMBOS if refusal(c) is not None and len(refusal(c)) == 1}
    assert {("batch_size",), ("gen.attention",), ("policy.kv_ratio",), ("policy.compression_ratio",),
            ("policy.rerotate",), ("policy.schedule",), ("serve.block_size",)} <= singles
    assert len(COMBOS) <= 200 or FULL  # 192 with KVgrad (the default run's cost: a refused one exits in the CLI)


@pytest.mark.parametrize("name", list(SWEEPS))
def test_a_sweep_over_the_policies_applies_each_key_where_it_is_used(name, tmp_path):
    from omegaconf import OmegaConf

    policies, keys = SWEEPS[name]
    value = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in keys.items()}
    args = ["-m", f"policy={','.join(policies)}", *(f"policy.{k}={v}" for k, v in value.items()), "model=tiny-llama",
            "task.n_samples=2", "task.context_tokens=96", f"results_dir={tmp_path}"]
    _, jobs = cli.compose_jobs(args)  # the sweep composes (the preflight's first step)
    assert len(jobs) == len(policies)
    for policy, (_, cfg, ignored) in zip(policies, jobs, strict=True):
        prepare(cfg)  # and every job is accepted
        own = OmegaConf.to_container(load_option("policy", policy))
        want = {**own, **{k: v for k, v in keys.items() if uses(policy, k)}}
        assert OmegaConf.to_container(cfg.policy) == want, policy
        assert ignored == sorted(f"policy.{k}" for k in keys if not uses(policy, k)), policy
