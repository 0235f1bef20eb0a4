"""CUDA's contracts enforced on the CPU: what would fail on a GPU fails here (issue 32).

* flash-attn: a pure-torch stand-in for `flash_attn_with_kvcache` with the library's checks (tests/flash_standin.py)
  runs kvbench's static and serve flash paths in bfloat16, against SDPA; detection falls back when the
  module imports but does not run; `gen.attention=flash` in float32 is refused before anything loads;
* device discipline: generation with `torch.set_default_device("meta")` (a tensor made without an explicit
  device lands on meta and fails when it meets a real one), for every policy; a model dispatched with
  accelerate, one layer offloaded to disk (its parameters on meta between forwards);
* host syncs per decode step, counted by tests/synccount.py: bounded by a constant, PyramidKV's (a group of
  layers per layer) equal to Batch-Max's (one group);
* SDPA on CUDA with GQA and a mask expands K/V (no fused kernel takes both); the key-norm policies never
  copy the whole cache to float32.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from kvbench import attention, engine, memory
from kvbench import budgets as B
from kvbench.attention import backend_choice
from kvbench.attention import flash as static_flash
from kvbench.policies import BatchMax, Full, PyramidKV, registry
from tests import flash_standin
from tests.conftest import random_prompts
from tests.synccount import SyncCounter


# ------------------------------------------------------------------------------------------- flash-attn
@pytest.fixture
def flash_standin_on_cpu(monkeypatch):
    """The stand-in installed as `flash_attn`, and the CPU made a device flash-attn runs on (the gate)."""
    monkeypatch.setitem(sys.modules, "flash_attn", flash_standin.module())
    monkeypatch.setattr(backend_choice, "FLASH_DEVICES", {"cuda", "cpu"})
    monkeypatch.setattr(backend_choice, "_flash_works", {})
    monkeypatch.setitem(static_flash._checked, "flash", False)
    flash_standin.CALLS.clear()
    yield
    backend_choice._flash_works.clear()


@pytest.fixture(scope="module")
def tiny_bf16():
    from kvbench.models import build_tiny

    return build_tiny("tiny-llama", arch="llama", dtype="bfloat16", device="cpu")


def _k(B, S, H, D, dtype=torch.bfloat16):
    return torch.randn(B, S, H, D, dtype=dtype)


def test_standin_enforces_the_documented_checks():
    f, E = flash_standin.flash_attn_with_kvcache, flash_standin.FlashContractError
    q, k = _k(2, 3, 4, 64), _k(2, 10, 2, 64)
    seq = torch.tensor([7, 10], dtype=torch.int32)
    assert f(q, k, k, cache_seqlens=seq, causal=True).shape == (2, 3, 4, 64)
    with pytest.raises(E, match="fp16 and bf16"):
        f(q.float(), k.float(), k.float(), cache_seqlens=seq)
    with pytest.raises(E, match="int32"):
        f(q, k, k, cache_seqlens=seq.long())
    with pytest.raises(E, match="shape"):
        f(q, k, k, cache_seqlens=seq[:1])
    with pytest.raises(E, match="contiguous last dimension"):
        f(q, k.transpose(-1, -2).contiguous().transpose(-1, -2), k, cache_seqlens=seq)
    with pytest.raises(E, match="divide"):
        f(_k(2, 3, 5, 64), k, k, cache_seqlens=seq)
    with pytest.raises(E, match="at most 256"):
        f(_k(2, 3, 4, 264), _k(2, 10, 2, 264), _k(2, 10, 2, 264), cache_seqlens=seq)
    with pytest.raises(E, match="one device"):
        f(q, k, k, cache_seqlens=torch.tensor([7, 10], dtype=torch.int32, device="meta"))
    pages, table = _k(4, 128, 2, 64), torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    with pytest.raises(E, match="divisible by 256"):
        f(q, pages, pages, cache_seqlens=seq, block_table=table)
    with pytest.raises(E, match="int32"):
        f(q, _k(4, 256, 2, 64), _k(4, 256, 2, 64), cache_seqlens=seq, block_table=table.long())


def test_standin_is_bottom_right_causal_with_window_and_softcap():
    """Against a direct computation: query i of T sees slots j <= n_b - T + i (and the window, the softcap)."""
    torch.manual_seed(0)
    q, k, v = _k(2, 3, 2, 64), _k(2, 9, 1, 64), _k(2, 9, 1, 64)
    seq = torch.tensor([5, 9], dtype=torch.int32)
    for window, cap in (((-1, -1), 0.0), ((2, 0), 0.0), ((-1, -1), 3.0)):
        got = flash_standin.flash_attn_with_kvcache(q, k, v, cache_seqlens=seq, causal=True, window_size=window,
                                                    softcap=cap)
        for b in range(2):
            n = int(seq[b])
            for i in range(3):
                hi = n - 3 + i
                lo = 0 if window[0] < 0 else max(0, hi - window[0])
                s = (q[b, i].float() @ k[b, lo : hi + 1, 0].float().T) / 8.0  # (Hq, keys)
                if cap:
                    s = cap * torch.tanh(s / cap)
                want = torch.softmax(s, -1) @ v[b, lo : hi + 1, 0].float()
                torch.testing.assert_close(got[b, i].float(), want, atol=1e-2, rtol=1e-2)


def test_flash_detection_falls_back_when_the_module_does_not_run(monkeypatch):
    """A wheel built for another torch imports and fails at its first call: `auto` must not pick it."""
    broken = flash_standin.module()

    def fails(*a, **k):
        raise OSError("undefined symbol: _ZN3c104cuda9SetDeviceEi")

    broken.flash_attn_with_kvcache = fails
    monkeypatch.setitem(sys.modules, "flash_attn", broken)
    monkeypatch.setattr(backend_choice, "FLASH_DEVICES", {"cuda", "cpu"})
    monkeypatch.setattr(backend_choice, "_flash_works", {})
    assert not attention.flash_available("cpu")
    assert attention.resolve("auto", device_type="cpu", dtype=torch.bfloat16, needs_attention=False) == "sdpa"
    monkeypatch.setitem(sys.modules, "flash_attn", flash_standin.module())
    monkeypatch.setattr(backend_choice, "_flash_works", {})
    assert attention.flash_available("cpu")
    assert attention.resolve("auto", device_type="cpu", dtype=torch.bfloat16, needs_attention=False) == "flash"
    assert attention.resolve("auto", device_type="cpu", dtype=torch.float32, needs_attention=False) == "sdpa"


def test_flash_in_float32_is_refused_in_one_line(capsys, tmp_path):
    from kvbench import cli
    from tests.conftest import assert_one_line_exit_2

    err = assert_one_line_exit_2(cli.main, ["gen.attention=flash", "model=tiny-llama", "model.dtype=float32",
                                            f"results_dir={tmp_path}"], capsys, "gen.attention")
    assert "half precision" in err


@pytest.mark.parametrize("policy", [Full(), BatchMax(kv_size=24, evict_every=8)], ids=["full", "batch_max"])
def test_static_flash_path_matches_sdpa_in_bfloat16(flash_standin_on_cpu, tiny_bf16, policy):
    prompts = random_prompts((37, 12, 25, 40), seed=11)
    kw = dict(max_new_tokens=8, eos_token_ids=[])
    flash = engine.generate(tiny_bf16.model, tiny_bf16.tokenizer, prompts, policy, 4, attention="flash", **kw)
    sdpa = engine.generate(tiny_bf16.model, tiny_bf16.tokenizer, prompts, policy, 4, attention="sdpa", **kw)
    assert flash.attention == "flash" and flash_standin.CALLS, "the flash path did not run"
    assert all(c["dtype"] == torch.bfloat16 and c["causal"] and not c["paged"] for c in flash_standin.CALLS)
    assert static_flash._checked["flash"]  # its first call was checked against SDPA on the real cache
    assert flash.token_ids == sdpa.token_ids


def test_serve_flash_path_matches_paged_sdpa_in_bfloat16(flash_standin_on_cpu, tiny_bf16):
    from kvbench.serve import paged_attention as serve_attention
    from kvbench.serve.engine import serve
    from kvbench.serve.request import Request

    assert serve_attention.backend(torch.device("cpu"), torch.bfloat16, False, 256) == "paged_flash"
    flash_standin.CALLS.clear()  # the detection's probe call
    prompts = random_prompts((37, 12, 25, 40), seed=12)

    def run():
        reqs = [Request(rid=i, prompt=list(p), max_new_tokens=6, arrival=0.0) for i, p in enumerate(prompts)]
        out = serve(tiny_bf16.model, reqs, Full(), num_blocks=4, block_size=256, max_tokens_per_step=64)
        return [r.output for r in reqs], out

    flash, out = run()
    assert flash_standin.CALLS and all(c["paged"] and c["dtype"] == torch.bfloat16 for c in flash_standin.CALLS)
    backend_choice.FLASH_DEVICES.discard("cpu")  # the same run on paged SDPA
    assert serve_attention.backend(torch.device("cpu"), torch.bfloat16, False, 256) == "paged_sdpa"
    sdpa, _ = run()
    assert flash == sdpa


# ------------------------------------------------------------------------------------------- device discipline
def _policy(name: str):
    """Policy `name` small enough to evict in a short run (its own defaults otherwise)."""
    import dataclasses

    cls = registry()[name]
    fields = {f.name for f in dataclasses.fields(cls)}
    kw = {k: v for k, v in (("kv_size", 24), ("evict_every", 8), ("window", 4)) if k in fields}
    if name == "full":
        kw = {}
    for drop in ((), ("evict_every",)):
        try:
            return cls(**{k: v for k, v in kw.items() if k not in drop})
        except Exception:
            continue
    return cls()


@pytest.mark.parametrize("name", sorted(registry()))
def test_every_policy_runs_with_meta_as_the_default_device(tiny_llama, name):
    """A tensor created without an explicit device lands on meta and fails when it meets a real one; nothing
    in kvbench's generation may rely on the default device (on CUDA it would be the CPU)."""
    prompts = random_prompts((37, 12, 25, 40), seed=13)
    policy = _policy(name)
    want = engine.generate(tiny_llama.model, tiny_llama.tokenizer, prompts, policy, 4, max_new_tokens=6).token_ids
    torch.set_default_device("meta")
    try:
        got = engine.generate(tiny_llama.model, tiny_llama.tokenizer, prompts, policy, 4, max_new_tokens=6).token_ids
    finally:
        torch.set_default_device(None)
    assert got == want


def test_a_layer_offloaded_to_disk_generates_the_same_tokens(tmp_path):
    """accelerate keeps an offloaded layer's parameters on meta between forwards: its cache and its account
    belong to the device it computes on (its hook's execution device), not to meta."""
    from accelerate import dispatch_model

    from kvbench.models import build_tiny
    from kvbench.models.geometry import model_geometry

    lm = build_tiny("tiny-llama", arch="llama", dtype="float64", device="cpu")
    prompts = random_prompts((37, 12, 25, 40), seed=14)
    policies = (Full(), BatchMax(kv_size=24, evict_every=8))
    want = [engine.generate(lm.model, lm.tokenizer, prompts, p, 4, max_new_tokens=6).token_ids for p in policies]
    full_weights = sum(memory.ModelShape.of(lm.model).weights.values())
    dm = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
          "model.norm": "cpu", "lm_head": "cpu"}
    lm.model = dispatch_model(lm.model, device_map=dm, main_device="cpu", offload_dir=str(tmp_path))
    assert next(lm.model.model.layers[1].parameters()).device.type == "meta"  # the defect's condition
    assert [str(d) for d in model_geometry(lm.model)["layer_devices"]] == ["cpu", "cpu"]
    shape = memory.ModelShape.of(lm.model)
    assert "meta" not in shape.weights and shape.layers == {"cpu": 2}
    layer1 = sum(p.numel() * p.element_size() for p in lm.model.model.layers[1].parameters())
    assert shape.onload == {"cpu": layer1} and sum(shape.weights.values()) == full_weights - layer1
    got = [engine.generate(lm.model, lm.tokenizer, prompts, p, 4, max_new_tokens=6).token_ids for p in policies]
    assert got == want


# ------------------------------------------------------------------------------------------- host syncs
def _syncs_per_step(lm, policy, new_tokens: int, ignore_eos: bool) -> tuple[int, list]:
    """Syncs of a generation with `new_tokens` tokens (the same prompts; one batch)."""
    prompts = random_prompts((60, 33, 47, 52), seed=15)
    counter = SyncCounter(lm.model)
    with counter:
        engine.generate(lm.model, lm.tokenizer, prompts, policy, 4, max_new_tokens=new_tokens, ignore_eos=ignore_eos,
                        eos_token_ids=[257])  # an id the byte vocabulary's random model can emit
    return counter.count, counter.events


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_host_syncs_per_decode_step_do_not_grow_with_layer_groups(ignore_eos):
    """The decode loop's syncs per step, from two lengths (the prefill's cancel out): PyramidKV (every layer
    its own group, evicting group by group) equals Batch-Max (one group), and both are at most one per
    EOS_CHECK_EVERY steps (the EOS check)."""
    from kvbench.models import build_tiny

    lm = build_tiny("tiny-llama-4", arch="llama", dtype="float32", device="cpu", layers=4)
    pyr = PyramidKV(kv_size=32, evict_every=8, window=4, beta=2)
    assert len(B.layer_budgets(pyr, [60, 33, 47, 52], 4).unique(dim=0)) == 4  # four groups of layers
    slopes = {}
    for name, policy in (("batch_max", BatchMax(kv_size=32, evict_every=8)), ("pyramidkv", pyr)):
        short, _ = _syncs_per_step(lm, policy, 9, ignore_eos)
        long, events = _syncs_per_step(lm, policy, 41, ignore_eos)  # 32 more decode steps, 4+ decode evictions
        slopes[name] = (long - short) / 32
    bound = 0 if ignore_eos else 1 / engine.EOS_CHECK_EVERY
    assert slopes["pyramidkv"] == slopes["batch_max"] <= bound, (slopes, events[-20:])


# ------------------------------------------------------------------------------------------- kernels and copies
def test_cuda_sdpa_with_gqa_and_a_mask_expands_kv_and_is_charged(tiny_llama, monkeypatch):
    """No fused CUDA kernel takes GQA and a mask: SDPA would fall back to its math kernel (the probabilities
    materialised). kvbench expands K/V itself there, and the account charges the expanded copies."""
    import torch.nn.functional as F

    cfg = tiny_llama.model.config
    assert cfg.num_attention_heads != cfg.num_key_value_heads  # the tiny Llama has GQA
    calls = []
    real_sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, **kw):
        calls.append((attn_mask is not None, enable_gqa, q.shape[1] == k.shape[1]))
        return real_sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, **kw)

    prompts = random_prompts((37, 12, 25, 40), seed=16)
    policy = BatchMax(kv_size=24, evict_every=8)
    want = engine.generate(tiny_llama.model, tiny_llama.tokenizer, prompts, policy, 4, max_new_tokens=6,
                           attention="sdpa").token_ids
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(attention.sdpa, "EXPAND_GQA_DEVICES", {"cuda", "cpu"})  # the CPU takes CUDA's path
    got = engine.generate(tiny_llama.model, tiny_llama.tokenizer, prompts, policy, 4, max_new_tokens=6,
                          attention="sdpa").token_ids
    assert got == want
    masked = [c for c in calls if c[0]]
    assert masked and not any(gqa for _, gqa, _ in masked) and all(same for _, _, same in masked)
    s = memory.ModelShape.of(tiny_llama.model)
    B, T, N = 4, 1, 4000  # the attention phase is the largest with or without the copies
    cuda = memory.forward_bytes(s, B, T, N, 40, False, False, 64, cpu=False)
    mha = memory.forward_bytes(dataclasses.replace(s, kv_heads=s.q_heads), B, T, N, 40, False, False, 64,
                                cpu=False)
    assert cuda - mha == 2 * B * s.q_heads * N * s.head_dim * s.elem


@pytest.mark.parametrize("name", ["knorm", "keydiff"])
def test_key_norm_policies_never_copy_every_key_to_float32(name):
    """The score of a half-precision cache upcasts one layer of keys at a time, never all of them (which would
    double the cache's memory and halve the policy's largest batch)."""
    from torch.overrides import TorchFunctionMode

    from kvbench.policies.policy import ScoreContext

    L, B, H, N, D = 6, 2, 2, 32, 16
    keys = torch.randn(L, B, H, N, D, dtype=torch.bfloat16)
    stats = ScoreContext(pos=torch.arange(N).expand(L, B, H, N), last=torch.full((1, B, 1, 1), N - 1),
                       n=torch.full((1, B, 1, 1), N), keys=keys)
    biggest = []

    class Largest(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.dtype == torch.float32:
                biggest.append(out.numel())
            return out

    policy = registry()[name](kv_size=24, evict_every=8)
    with Largest():
        score = policy.score(stats)
    assert score.shape == (L, B, H, N)
    assert max(biggest) <= B * H * N * D < keys.numel()  # one layer's keys at most
    exact = -torch.linalg.vector_norm(keys.double(), dim=-1)
    if name == "knorm":
        torch.testing.assert_close(score.double(), exact, rtol=1e-2, atol=1e-2)


# ------------------------------------------------------------------------------------------- timing and the allocator
def test_warmup_is_on_by_default_on_cuda_only():
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from kvbench.run.static import warmup_of

    def model(kind):
        return SimpleNamespace(device=torch.device(kind, 0) if kind == "cuda" else torch.device(kind))

    for value, kind, want in ((None, "cuda", True), (None, "cpu", False), (False, "cuda", False), (True, "cpu", True)):
        cfg = OmegaConf.create({"gen": {"warmup": value}})
        assert warmup_of(cfg, model(kind)) is want


def test_the_accounts_are_computed_before_the_clock_starts(tiny_llama, monkeypatch):
    """wall_s times generation only: every batch's account is replayed before the first timed forward."""
    events = []
    real = memory.account
    monkeypatch.setattr(memory, "account", lambda *a, **k: events.append("account") or real(*a, **k))
    prompts = random_prompts((37, 12, 25, 40, 9, 30), seed=17)
    engine.generate(tiny_llama.model, tiny_llama.tokenizer, prompts, BatchMax(kv_size=24, evict_every=8), 2,
                    max_new_tokens=3, observer=lambda event, cache: events.append(event))
    assert events.count("account") == 3  # three batches of two, all of different lengths
    assert max(i for i, e in enumerate(events) if e == "account") < events.index("forward")


@pytest.mark.parametrize("message, oom", [
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", True),
    ("cuDNN error: CUDNN_STATUS_ALLOC_FAILED", True),
    ("CUDA error: out of memory", True),
    ("cudaErrorMemoryAllocation", True),
    ("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED", False),
    ("key.device: meta", False),
])
def test_is_oom_knows_the_cuda_libraries_allocation_failures(message, oom):
    assert memory.is_oom(RuntimeError(message)) is oom
