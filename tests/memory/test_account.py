"""The accounted memory model (kvbench.memory): it matches the tensor bytes a batch really allocates
on CPU, it is exact for the cache and linear in batch size and kv_size, a budget refuses what does not
fit (an "oom" record that does not stop a sweep), a budget below the weights is bad input, and bad
memory/search overrides fail before any model loads."""

from __future__ import annotations

import sys

import pytest
import torch
from hydra import compose, initialize_config_dir
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from kvbench import cli, engine, memory
from kvbench import run as kvrun
from kvbench.attention import kv_attention
from kvbench.cache import KVCache
from kvbench.config import CONF_DIR, build_policy, build_task
from kvbench.engine import generate_batch
from kvbench.errors import OutOfMemory
from kvbench.policies import (
    H2O,
    TOVA,
    BatchMax,
    ExpectedAttention,
    ExtremeDecode,
    Full,
    KeyDiff,
    Knorm,
    PyramidKV,
    Random,
    SnapKV,
    Window,
)
from kvbench.results import read_records
from tests.conftest import random_prompts

SMOLLM2 = memory.ModelShape(  # SmolLM2-135M's numbers: the account needs no weights
    hidden=576, intermediate=1536, vocab=49152, q_heads=9, kv_heads=3, head_dim=64, dtype=torch.float32,
    mlp_buffers=3, fused_qkv=False, weights={"cpu": 538_090_408}, layers={"cpu": 30},
)


class AllocatedBytes:
    """Peak bytes the CPU allocator holds inside the block above what it held at its start: every allocation, those
    inside an operator's kernel too (SDPA's float copy of a bool mask, the CPU flash kernel's blocks), which a
    `TorchDispatchMode` does not see under `torch.inference_mode` (it sees the composite operator, not what it
    allocates). Read from the profiler's allocator events, in the order they happened."""

    def __enter__(self):
        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profile.__enter__()
        return self

    def __exit__(self, *exc):
        self._profile.__exit__(*exc)
        events = [e for e in self._profile.profiler.kineto_results.events()
                  if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]
        now = self.peak = 0
        for e in sorted(events, key=lambda e: e.start_ns()):
            now += e.nbytes()
            self.peak = max(self.peak, now)


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


# ------------------------------------------------------------------------------------- the account
@pytest.mark.parametrize("track", [False, True])
@pytest.mark.parametrize("batch,layers,capacity", [(1, 1, 1), (3, 2, 17), (5, 30, 256)])
@pytest.mark.parametrize("window", [0, 5])
def test_cache_bytes_are_the_allocation(batch, layers, capacity, track, window):
    geo = dict(batch_size=batch, num_kv_heads=3, head_dim=8, capacity=capacity, dtype=torch.float16, num_q_heads=9,
               query_window=window)  # window: the queries SnapKV's score needs
    cache = KVCache(**geo, layer_devices=["cpu"] * layers, track_attention=track)
    assert KVCache.nbytes_for(**geo, num_layers=layers, track_attention=track) == cache.allocated_bytes()
    assert (cache.allocated_bytes() > KVCache.nbytes_for(**{**geo, "query_window": 0}, num_layers=layers,
                                                          track_attention=track)) == (window > 0)


CASES = [  # (policy, prompt lengths, prefill_chunk): full and chunked prefill, P&D, decode-only, scored
    (Full(), (90, 70, 40), None),
    (Full(), (90, 70, 40), 16),
    (BatchMax(kv_size=32, evict_every=8), (90, 70, 40), None),
    (BatchMax(kv_size=32, evict_every=8), (90, 90, 90, 90), 32),
    (Window(kv_size=32, evict_every=8), (90, 70, 40), None),
    (ExtremeDecode(kv_size=2), (90, 70, 40), None),
    (H2O(kv_size=24), (90, 70), None),
    (Knorm(kv_size=32, evict_every=8), (90, 70, 40), None),
    (KeyDiff(kv_size=32, evict_every=8, schedule="prefill_and_decode"), (90, 70, 40), None),
    (Random(kv_size=32, evict_every=8), (90, 70), None),
    (SnapKV(kv_size=32, evict_every=8, window=8), (90, 70, 40), None),
    (SnapKV(kv_size=32, evict_every=8, window=16, protect_recent=4, schedule="prefill_and_decode"), (90, 70, 40), 8),
    (TOVA(kv_size=24), (90, 70), None),
    (BatchMax(kv_size=32, evict_every=8, rerotate=True), (90, 70, 40), None),
    (SnapKV(kv_size=32, evict_every=8, window=8, rerotate=True), (90, 70, 40), None),
    # budgets per sample (kv_ratio: ragged keeps) and per layer (PyramidKV: a group per layer)
    (BatchMax(kv_ratio=0.5, evict_every=8), (90, 70, 40), None),
    (H2O(kv_ratio=0.4, evict_every=2), (90, 70, 40), None),
    (PyramidKV(kv_size=32, evict_every=4, window=4), (90, 70, 40), None),
    (PyramidKV(kv_ratio=0.5, evict_every=4, window=4, schedule="prefill_and_decode"), (90, 70, 40), None),
]


@pytest.mark.parametrize("attention", ["sdpa", "eager", "fused"])
@pytest.mark.parametrize("policy,lengths,chunk", CASES, ids=lambda x: getattr(x, "name", str(x)))
def test_account_matches_the_bytes_really_allocated(tiny, policy, lengths, chunk, attention):
    """Accounted cache + transient vs the peak of the tensor storages the batch creates (within -1% / +15%),
    under each attention backend (eager: transformers' materialised probabilities, fused: one set per chunk)."""
    ids = random_prompts(lengths, seed=3)
    acc = memory.account(
        tiny.model, list(lengths), policy, max_new_tokens=6, prefill_chunk=chunk, attention=attention
    ).devices["cpu"]
    with kv_attention(tiny.model), AllocatedBytes() as measured:
        generate_batch(tiny.model, ids, policy, max_new_tokens=6, prefill_chunk=chunk, attention=attention)
    accounted = acc.kv_cache + acc.transient
    assert 0.99 * measured.peak <= accounted <= 1.15 * measured.peak, (accounted, measured.peak)
    assert acc.weights == tiny.weights_bytes  # parameters and buffers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("policy", [ExtremeDecode(kv_size=2), BatchMax(kv_size=64, evict_every=16)])
def test_eager_attention_transient_is_measured_per_element(dtype, policy):
    """The eager term on a larger prompt, where the (B, Hq, T, N) probabilities dominate the peak: in
    float32 2 such tensors are alive (logits and their scaled / masked copy, or logits and softmax), in
    bfloat16 10 bytes per element (logits + softmax's float32 copy + its output), in float64 20 (logits,
    float32 softmax, the cast back); the account must stay within the same tolerance."""
    from kvbench.models import build_tiny

    lm = build_tiny("tiny-llama", arch="llama", dtype=str(dtype).split(".")[1], device="cpu", layers=1)
    lengths = (300, 260)
    ids = random_prompts(lengths, seed=5)
    acc = memory.account(lm.model, list(lengths), policy, max_new_tokens=2, attention="eager").devices["cpu"]
    sdpa = memory.account(lm.model, list(lengths), policy, max_new_tokens=2, attention="sdpa").devices["cpu"]
    with kv_attention(lm.model), AllocatedBytes() as measured:
        generate_batch(lm.model, ids, policy, max_new_tokens=2, attention="eager")
    accounted = acc.kv_cache + acc.transient
    assert 0.99 * measured.peak <= accounted <= 1.15 * measured.peak, (accounted, measured.peak)
    if policy.name == "extreme_decode":  # the whole prompt at once: eager's T^2 term is the peak, sdpa has none
        assert acc.transient > 2 * sdpa.transient, (acc.transient, sdpa.transient)


def test_account_backend_names(tiny_llama):
    """auto resolves per device like the engine (CPU: fused for a scored policy, else sdpa); fused without
    statistics is sdpa; bad names fail."""
    args = (tiny_llama.model, [60, 50], Full())
    kw = dict(max_new_tokens=3)
    assert memory.account(*args, **kw, attention="auto") == memory.account(*args, **kw)
    scored = (tiny_llama.model, [60, 50], BatchMax(kv_size=32, evict_every=8, schedule="decode_only"))  # whole prompts
    assert memory.account(*scored, **kw, attention="auto") == memory.account(*scored, **kw, attention="fused")
    assert memory.account(*scored, **kw, attention="fused") != memory.account(*scored, **kw, attention="sdpa")
    assert memory.account(*args, **kw, attention="fused") == memory.account(*args, **kw, attention="sdpa")
    assert memory.account(*args, **kw, attention="eager").total > memory.account(*args, **kw).total
    with pytest.raises(ValueError, match="attention must be one of"):
        memory.account(*args, **kw, attention="math")


@pytest.mark.parametrize("policy", [Full(), BatchMax(kv_size=256), ExtremeDecode(kv_size=2), Window(kv_size=256)])
@pytest.mark.parametrize("shape", ["tiny", "smollm2"])
def test_accounted_peak_is_linear_in_batch_size(tiny_llama, policy, shape):
    s = memory.ModelShape.of(tiny_llama.model) if shape == "tiny" else SMOLLM2
    totals = [memory.account(s, [1500] * b, policy, max_new_tokens=128).total for b in range(1, 7)]
    steps = [b - a for a, b in zip(totals[:-1], totals[1:], strict=True)]
    assert steps[0] > 0 and len(set(steps)) == 1, steps


@pytest.mark.parametrize("policy", [BatchMax, Window])
@pytest.mark.parametrize("shape", ["tiny", "smollm2"])
def test_accounted_peak_is_linear_in_kv_size(tiny_llama, policy, shape):
    """The cache is exactly linear in kv_size, and so is the whole peak once kv-sized buffers dominate
    the transient (past the CPU attention kernel's 512-key blocks and the MLP's kv-free buffers)."""
    s = memory.ModelShape.of(tiny_llama.model) if shape == "tiny" else SMOLLM2
    sizes, B, L = (768, 1024, 1280, 1536), 4, sum(s.layers.values())
    accs = [memory.account(s, [2000] * B, policy(kv_size=k), max_new_tokens=128).devices["cpu"] for k in sizes]
    slot = B * L * s.kv_heads * (2 * s.head_dim * s.elem + 4 + (8 if policy.needs.attention else 0))  # K, V, pos, stats
    assert [a.kv_cache for a in accs] == [(k + 1) * slot for k in sizes]
    steps = [b.total - a.total for a, b in zip(accs[:-1], accs[1:], strict=True)]
    assert len(set(steps)) == 1 and steps[0] > 256 * slot, steps


def test_batch_max_fits_far_more_than_decode_only_on_the_same_budget():
    """At CNN/DM-like lengths the account gives the paper's ordering: BM(256) per sample << ED(2) <= full."""
    per_sample = {
        name: memory.account(SMOLLM2, [1500] * 8, pol, max_new_tokens=128).total - SMOLLM2.weights["cpu"]
        for name, pol in [("bm", BatchMax(kv_size=256)), ("ed", ExtremeDecode(kv_size=2)), ("full", Full())]
    }
    assert 4 * per_sample["bm"] < per_sample["ed"] <= per_sample["full"], per_sample


# ------------------------------------------------------------------------------------- the budget
def test_budget_refuses_over_and_admits_under(tiny_llama):
    acc = memory.account(tiny_llama.model, [50, 40], Full(), max_new_tokens=4)
    memory.MemoryLimit((acc.total + 1) / memory.GiB).admit(acc)
    with pytest.raises(memory.MemoryLimitExceeded, match="exceeds memory.limit_gb") as e:
        memory.MemoryLimit((acc.total - 1) / memory.GiB).admit(acc)
    assert isinstance(e.value, OutOfMemory) and memory.is_oom(e.value) and e.value.account is acc


def test_refused_batch_allocates_nothing(tiny_llama):
    """The account is checked before the cache exists: a refused generate leaves no KV cache alive."""
    before = memory.memory_level([])
    with pytest.raises(memory.MemoryLimitExceeded):
        engine.generate(tiny_llama.model, tiny_llama.tokenizer, random_prompts((40, 30)), Full(), 2,
                        max_new_tokens=4, memory_limit=memory.MemoryLimit(1e-6))
    assert memory.memory_level([]) == before


TINY = ["model=tiny-llama", "task.n_samples=4", "task.context_tokens=32", "gen.max_new_tokens=3"]


def _footprint(cfg, batch_size: int) -> int:
    """The accounted peak of the first batch of `batch_size` samples of the run `cfg` describes."""
    lm = kvrun.models.load_model(cfg)
    task = build_task(cfg)
    ids = [task.encode(lm.tokenizer, s.prompt) for s in task.samples(lm.tokenizer)][:batch_size]
    policy = build_policy(cfg)
    return memory.account(lm.model, [len(x) for x in ids], policy, max_new_tokens=cfg.gen.max_new_tokens).total


def test_oom_run_is_an_oom_record_and_the_sweep_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["kvbench"])
    cfg = _compose(*TINY)
    b1, b4 = _footprint(cfg, 1), _footprint(cfg, 4)
    budget = (b1 + b4) / 2 / memory.GiB
    cli.main(["-m", *TINY, "batch_size=1,4", f"memory.limit_gb={budget}", f"results_dir={tmp_path}",
              f"hydra.sweep.dir={tmp_path / 'hydra'}"])
    ok, oom = read_records(tmp_path)
    assert (ok["batch_size"], ok["status"], ok["accounted_mem_bytes"]) == (1, "ok", b1)
    assert ok["peak_mem_bytes"] == b1 and ok["peak_mem_bytes_per_device"] == {"cpu": b1}
    assert (oom["batch_size"], oom["status"], oom["accounted_mem_bytes"]) == (4, "oom", b4)
    assert "exceeds memory.limit_gb" in oom["error"] and oom["predictions_path"] is None


def test_budget_below_the_weights_is_one_line_exit_2_and_no_record(tmp_path, capsys):
    weights = kvrun.models.load_model(_compose(*TINY)).weights_bytes
    with pytest.raises(SystemExit) as e:
        cli.main([*TINY, f"memory.limit_gb={weights / 2 / memory.GiB}", f"results_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err
    assert err.startswith("kvbench: error: memory.limit_gb=") and "the model alone does not fit" in err
    assert read_records(tmp_path) == []


# ------------------------------------------------------------------------------------- bad input
BAD = {
    "memory.budget_gb=1": "memory.budget_gb: was renamed memory.limit_gb",  # the old key, named with the new one
    "memory.limit_gb=0": "memory.limit_gb",
    "memory.limit_gb=-2": "memory.limit_gb",
    "memory.limit_gb=lots": "memory.limit_gb",
    "memory.limit_gb=inf": "memory.limit_gb",
    "memory.limit_gb=nan": "memory.limit_gb",
    "search.max_batch=true search.candidates=[]": "search.candidates",
    "search.max_batch=true search.candidates=[4,-2]": "search.candidates",
    "search.max_batch=true search.candidates=[1.5]": "search.candidates",
    "search.max_batch=true search.candidates=some": "search.candidates",
    "search.max_batch=true search.max=0": "search.max",
    "search.max_batch=true search.decode_steps=0": "search.decode_steps",
    "search.only=true": "search.only",
    "device=cpu search.max_batch=true": "memory.limit_gb",  # on CPU nothing would ever refuse a batch
    "search.max_batch=true batch_size=8": "batch_size",
}


@pytest.mark.parametrize("args", list(BAD), ids=list(BAD))
def test_bad_memory_and_search_input_fails_before_loading(args, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(kvrun.models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as e:
        cli.main(args.split() + [f"results_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and BAD[args] in err, err


# ------------------------------------------------------------------------------------- throughput
def test_warmup_batch_is_run_but_not_counted(tiny_llama):
    prompts, calls = random_prompts((30, 20, 25, 18)), []
    plain = engine.generate(tiny_llama.model, tiny_llama.tokenizer, prompts, Full(), 2, max_new_tokens=5, eos_token_ids=[])
    warm = engine.generate(tiny_llama.model, tiny_llama.tokenizer, prompts, Full(), 2, max_new_tokens=5, eos_token_ids=[],
                           warmup=True, observer=lambda event, cache: calls.append(cache.batch_size_))
    assert warm.token_ids == plain.token_ids and warm.batches == plain.batches == 2
    assert warm.generated_tokens == plain.generated_tokens == 4 * 5
    assert len(calls) == 3 * (1 + 4)  # three batches ran (warm-up + two), each 1 prefill + 4 decode forwards


@pytest.mark.parametrize("schedule", ["after_prefill", "decode_only"])
@pytest.mark.parametrize("policy", [SnapKV(kv_size=32, window=8, evict_every=8), H2O(kv_size=32, evict_every=8),
                                    ExpectedAttention(compression_ratio=0.5)], ids=lambda p: p.name)
def test_after_prefill_gives_back_what_only_scores_read(tiny_llama, policy, schedule):
    """A score's inputs (SnapKV's query window, H2O's attention statistics, ExpectedAttention's query
    statistics) are read at evictions only: after_prefill's one compression is their last reader, so the cache
    gives them back there; the other schedules keep them (every eviction while decoding reads them)."""
    from dataclasses import replace

    if schedule != "after_prefill" and policy.after_prefill_only:
        pytest.skip("defined after prefill only")
    policy = replace(policy, schedule=schedule)
    held = []  # after each forward and eviction: does every group still hold its scores' inputs?

    def readers(g):
        return [g.q is not None, g.sum_w is not None, bool(g.rows) or bool(g.own)]

    generate_batch(tiny_llama.model, random_prompts((90, 70), seed=3), policy, max_new_tokens=6,
                   observer=lambda kind, cache: held.append((kind, [readers(g) for g in cache.groups])))
    kinds = [k for k, _ in held]
    first = held[0][1]
    assert any(any(r) for r in first)  # the policy reads some
    assert "evict" in kinds and all(h == first for _, h in held[: kinds.index("evict")])  # until the compression
    after = [h for _, h in held[kinds.index("evict"):]]
    assert all(h == first for h in after) if schedule != "after_prefill" else all(
        not any(any(r) for r in h) for h in after)
