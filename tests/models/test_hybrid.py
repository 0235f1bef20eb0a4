"""Hybrid linear-attention models (Qwen3.5 dense and MoE, Qwen3-Next): their Gated-DeltaNet layers run as transformers
defines them, with transformers' own state inside kvbench's cache; the attention layers are kvbench's.

The family matrix (test_family.py, test_family_policies.py) checks the tokens against `generate` and runs H2O and
Batch-Max; here: why the prompts run on one grid (kvbench.grid), the state in the cache and in the memory account
(KV + state, exact), the record, the refusal of serve mode, and the shipped Qwen3.5 configs planned offline.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers.cache_utils import LinearAttentionLayer

from kvbench import batch_plan, memory
from kvbench.grid import grid_chunks
from kvbench.models import family
from kvbench.policies import H2O, BatchMax, Full
from kvbench.schedule import prefill_chunks
from tests.models.test_family import _plan, model, run


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (70, 57)]


def _states(lm, prompts, chunk, i):
    """Linear layer i's (conv, recurrent) states after each of kvbench's prefill forwards (one new token: no decode)."""
    states = []
    run(lm, prompts, prefill_chunk=chunk, max_new_tokens=1, observer=lambda ev, c: states.append(
        (c.layers[i].conv_states[0].clone(), c.layers[i].recurrent_states[0].clone())) if ev == "forward" else None)
    return states


def _hf_states(lm, prompts, width, i):
    """transformers' states after the first `width` positions of the left-padded batch (one forward, its mask)."""
    s = max(map(len, prompts))
    ids, am = torch.full((2, s), lm.tokenizer.pad_token_id), torch.zeros(2, s, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, s - len(p):], am[b, s - len(p):] = torch.tensor(p), 1
    with torch.no_grad():
        cache = lm.model(ids[:, :width], attention_mask=am[:, :width], use_cache=True).cache
    return cache.layers[i].conv_states[0], cache.layers[i].recurrent_states[0]


@pytest.mark.parametrize("chunk", [None, 16, 23])
@pytest.mark.parametrize("arch", ["qwen3.5", "qwen3-next"])
def test_the_grid_keeps_pads_out_of_the_linear_state(arch, prompts, chunk, monkeypatch):
    """After the first forward and after the prefill, the linear layer's states are transformers' own (a left-padded
    forward with its mask): the shorter prompt's pads (before its first token) are zeroed by the 2-D mask kvbench
    passes (the pad's embedding is made non-zero here: it is zero in these tiny models, not in real ones). With each
    sample's own blocks (right-aligned per forward) the longer prompt's last chunk would have pads after its real
    tokens, which shift its conv window and decay its recurrent state: the states would differ."""
    lm = model(arch)
    i = family.kinds(lm.model.config).linear[0]
    pad = lm.model.get_input_embeddings().weight.data[lm.tokenizer.pad_token_id]
    saved = pad.clone()
    pad.copy_(torch.randn(pad.shape, generator=torch.Generator().manual_seed(0)))
    try:
        states = _states(lm, prompts, chunk, i)
        first = int(grid_chunks([len(p) for p in prompts], Full(), chunk)[0].max())  # the shorter prompt starts in it
        assert first == (chunk or 70)
        torch.testing.assert_close(states[0], _hf_states(lm, prompts, first, i))
        torch.testing.assert_close(states[-1], _hf_states(lm, prompts, 70, i))
        if chunk == 23:  # 70 = 3 x 23 + 1, 57 = 2 x 23 + 11: per sample, the longer prompt's last token follows 10 pads
            monkeypatch.setattr(batch_plan, "grid_chunks", prefill_chunks)
            with pytest.raises(AssertionError):
                torch.testing.assert_close(_states(lm, prompts, chunk, i)[-1], _hf_states(lm, prompts, 70, i))
    finally:
        pad.copy_(saved)


@pytest.mark.parametrize("policy", [Full(), H2O(kv_size=24, evict_every=1, schedule="prefill_and_decode"),
                                    BatchMax(kv_size=24, evict_every=8)], ids=lambda p: p.name)
@pytest.mark.parametrize("chunk", [None, 8, 16])
def test_grid_pads_only_before_the_first_real_token(policy, chunk):
    """Each forward is full for every sample that has started (pads only before a sample's first token), and each
    sample's own blocks (Algorithm 1 on its prompt) end at forward boundaries: it evicts where it would alone."""
    lengths = [70, 57, 9]
    grid = torch.stack(grid_chunks(lengths, policy, chunk), dim=1)  # (B, forwards)
    widths = grid.max(dim=0).values
    assert grid.sum(dim=1).tolist() == lengths
    for b, row in enumerate(grid):
        first = int(((row > 0).cumsum(0) > 0).long().argmax())
        assert bool((row[first + 1:] == widths[first + 1:]).all())
        own = [w for w in torch.stack(prefill_chunks([lengths[b]], policy, chunk), dim=1)[0].tolist() if w]
        ends = set(row.cumsum(0).tolist())
        assert {sum(own[: j + 1]) for j in range(len(own))} <= ends, (b, own)


def test_the_cache_holds_transformers_linear_state(prompts):
    lm = model("qwen3.5")
    k = family.kinds(lm.model.config)
    assert k.linear == (0,) and k.full_layers == [1] and not k.plain
    seen = []
    run(lm, prompts, observer=lambda ev, c: seen.append((type(c.layers[0]), [g.layers for g in c.groups],
                                                          c.allocated_bytes(), sum(g.nbytes() for g in c.groups))))
    kind, groups, allocated, kv = seen[-1]
    assert kind is LinearAttentionLayer and groups == [[1]]
    state = k.state.bytes_per_sequence(torch.float32)
    assert state == 64 * 4 * 4 + 4 * 8 * 8 * 4  # conv (64 = 2 * 2 * 8 + 4 * 8, kernel 4) + float32 recurrent (4, 8, 8)
    assert allocated - kv == 2 * state


@pytest.mark.parametrize("policy", [Full(), H2O(kv_size=24, evict_every=1, schedule="prefill_and_decode"),
                                    BatchMax(kv_size=24, evict_every=8)], ids=lambda p: p.name)
def test_the_account_charges_kv_and_state_as_allocated(prompts, policy):
    """The accounted cache (KV of the attention layers + the linear layers' state of every sequence) is the cache's
    allocation once the first forward made the state, at every forward."""
    lm = model("qwen3.5")
    acc = memory.account(lm.model, [len(p) for p in prompts], policy, max_new_tokens=10, prefill_chunk=8)
    held = []
    run(lm, prompts, policy, prefill_chunk=8,
        observer=lambda ev, c: held.append(c.allocated_bytes()) if ev == "forward" else None)
    assert acc.devices["cpu"].kv_cache == max(held) == held[0]


def test_rerotation_is_refused_on_a_hybrid():
    from kvbench.errors import ConfigError

    with pytest.raises(ConfigError, match="rerotate.*hybrid"):
        family.check_policy(model("qwen3.5").model.config, H2O(kv_size=24, rerotate=True))


def test_release_frees_the_state(prompts):
    from kvbench.cache import KVCache

    lm = model("qwen3.5")
    caches = []
    run(lm, prompts, observer=lambda ev, c: caches.append(c))
    cache: KVCache = caches[-1]
    assert cache.allocated_bytes() == 0 and isinstance(cache.layers[0], LinearAttentionLayer)


def test_record_names_the_state_and_the_compressed_layers(tmp_path):
    from tests.models.test_family import h2o_record

    rec = h2o_record("qwen3.5", tmp_path)
    assert rec["compressed_layers"] == [1] and rec["state_bytes_per_sequence"] == 64 * 4 * 4 + 4 * 8 * 8 * 4
    assert rec["model_family"].startswith("qwen3_5_text: 1 of 2 layers linear attention")
    assert any("linear-attention layers [0] keep their whole state" in e for e in rec["extensions"])


def test_serve_refuses_a_hybrid_before_loading(capsys, tmp_path, monkeypatch):
    import transformers

    from kvbench.cli import main
    from tests.conftest import assert_one_line_exit_2

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("weights were built")))
    assert_one_line_exit_2(main, ["model=tiny-llama", "model.arch=qwen3.5", "mode=serve", "task=passkey",
                                  "task.n_samples=1", f"results_dir={tmp_path}"], capsys, "linear attention")


@pytest.mark.parametrize("name,linear,state,kv_token", [
    ("qwen35-27b", 48, 48 * (10240 * 4 * 2 + 48 * 128 * 128 * 4), 16 * 4 * (2 * 256 * 2 + 4)),
    ("qwen35-35b-a3b", 30, 30 * (8192 * 4 * 2 + 32 * 128 * 128 * 4), 10 * 2 * (2 * 256 * 2 + 4)),
])
def test_shipped_qwen35_configs_plan_their_state_apart(name, linear, state, kv_token, tmp_path):
    """The state per sequence is the published geometry's (bfloat16 conv, float32 recurrent states), shown apart
    from the KV, whose one sample grows by the attention layers' K/V (and int32 positions) per token only."""
    from kvbench.capacity import table

    def plan(tokens):
        return _plan(f"model={name}", "plan.gpus=1", "plan.gpu_mem_mib=81920", f"plan.prompt_tokens={tokens}",
                     "plan.backends=[sdpa]", "policy=h2o", "policy.kv_size=512", "gen.max_new_tokens=256",
                     "search.candidates=[1,2,4,8]", f"results_dir={tmp_path}")

    rec, longer = plan(4000), plan(4100)
    m = rec["plan"]["model"]
    assert m["state_bytes_per_sequence"] == state and len(m["linear_layers"]) == linear
    assert m["attention_kinds"].endswith(f"{linear} of {linear * 4 // 3} layers linear attention")
    assert longer["plan"]["model"]["kv_bytes_one_sample"] - m["kv_bytes_one_sample"] == 100 * kv_token
    assert f"linear-attention state {state / 2**20:.2f} MiB per sequence" in table(rec)
    if name == "qwen35-27b":  # docs/models.md states this plan's state per sequence
        docs = (Path(__file__).parents[2] / "docs" / "models.md").read_text()
        assert f"{state:,} bytes ({state / 2**20:.2f} MiB) per sequence" in docs


def _qwen3_next_three_layers():
    """A tiny Qwen3-Next of 3 layers (attention, linear, attention): its last attention layer reads a linear state."""
    from types import SimpleNamespace

    from transformers import AutoConfig, AutoModelForCausalLM

    from kvbench.models.tiny import byte_tokenizer, tiny_config

    fields = {k: v for k, v in tiny_config("qwen3-next").to_dict().items() if k not in ("model_type", "layer_types")}
    cfg = AutoConfig.for_model("qwen3_next", **{**fields, "num_hidden_layers": 3,
                                                 "layer_types": ["full_attention", "linear_attention", "full_attention"]})
    torch.manual_seed(0)
    return SimpleNamespace(model=AutoModelForCausalLM.from_config(cfg).eval(), tokenizer=byte_tokenizer())


@pytest.mark.parametrize("arch", ["qwen3.5", "qwen3-next"])
def test_scoring_passes_continue_from_each_row_s_linear_state(arch, prompts, monkeypatch):
    """KVzip's passes over a hybrid (several per row, of different lengths: rows padded in each round): the hidden
    states entering every attention layer are the model's own reading the pass's tokens right after the row's
    context (transformers' forward of context + pass ids, the row alone). Without the context's linear-attention state
    the pass would be a model that never read the context at those layers. The passes leave the state as it was."""
    from kvbench.attention import attention_modules
    from kvbench.attention.pass_step import run_rows
    from kvbench.cache import linear_state
    from kvbench.engine import scoring_passes
    from kvbench.policies import KVzip

    lm = model(arch) if arch == "qwen3.5" else _qwen3_next_three_layers()
    policy = KVzip(kv_size=None, kv_ratio=0.5, chunk_size=20)
    contexts, seen = [], []
    passes, pass_scores = KVzip.scoring_passes, KVzip.pass_scores
    monkeypatch.setattr(KVzip, "scoring_passes", lambda self, ctx: contexts.append((ctx, passes(self, ctx))) or
                        contexts[-1][1])
    monkeypatch.setattr(KVzip, "pass_scores", lambda self, ctx: seen.append((ctx.layer, ctx.hidden, ctx.real)) or
                        pass_scores(self, ctx))
    states = lambda linear: [t.clone() for la in linear.values() for t in linear_state.tensors(la)]  # noqa: E731
    untouched = []

    def rows(model, held, policy, state, per_row, seen_, pad_id, linear=None):  # the passes leave the state as it was
        before = states(linear)
        run_rows(model, held, policy, state, per_row, seen_, pad_id, linear)
        untouched.append(all(torch.equal(a, b) for a, b in zip(before, states(linear), strict=True)))

    monkeypatch.setattr(scoring_passes, "run_rows", rows)
    run(lm, prompts, policy, max_new_tokens=2)
    assert untouched == [True]
    assert len({len(p) for _, p in contexts}) == 2  # the rows have different numbers of passes
    modules = attention_modules(lm.model)
    layers = [i for i, m in enumerate(modules) if m is not None]
    captured = {}

    def keep(module, args, kwargs):
        captured[module.layer_idx] = kwargs["hidden_states"][0]

    hooks = [modules[i].register_forward_pre_hook(keep, with_kwargs=True) for i in layers]
    try:
        rounds = iter(seen)
        for r in range(max(len(p) for _, p in contexts)):
            for layer in layers:
                at, hidden, real = next(rounds)
                assert at == layer
                for b, (ctx, rows) in enumerate(contexts):
                    if r >= len(rows):
                        assert not real[b].any()
                        continue
                    ids = rows[r].ids
                    with torch.no_grad():
                        lm.model(input_ids=torch.tensor([ctx + ids]))
                    torch.testing.assert_close(hidden[b][real[b]], captured[layer][len(ctx):], rtol=1e-4,
                                               atol=1e-4)
    finally:
        for h in hooks:
            h.remove()
