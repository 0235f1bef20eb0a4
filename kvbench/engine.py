"""The batched greedy generator that runs a policy's evicting KV cache.

For each batch: right-pad the prompt ids on the CPU, allocate a `KVCache` sized by the policy,
run the prefill forwards of `schedule.prefill_plan` (each preceded by the evictions it needs), then
decode one token per step, evicting before a step when a sample's cache is full. Every forward gets
explicit true `position_ids` (RoPE sees real positions after eviction) and prefill materialises no
logits except the last position's (`logits_to_keep=1`; intermediate chunks run the decoder only).

Memory: before each batch `generate` computes its accounted peak (`kvbench.memory.account`) and, with a
`budget`, refuses a batch over it on CPU (`BudgetExceeded`, an out-of-memory) before anything is
allocated. `decode_steps` stops a batch early (a memory probe: the cache is still sized for
`max_new_tokens`); `warmup` runs the first batch once, untimed, before the timed ones (CUDA's lazy initialisation,
cuBLAS's setup and flash-attn's first-call check are then not in the first batch's `prefill_s`; the runner
turns it on by default on CUDA). The batches' accounts are computed before the clock starts: `wall_s` is
generation only.

Query-agnostic runs (`question_tokens`: the last q_b tokens of each prompt are its question, kvpress's
protocol): the context (the prompt less its question) is prefilled under the schedule, then compressed
(before any forward of the question: after_prefill to its budget, the other schedules down to
min(kv_size - p, kv_size - q_b) so the question fits), then the question is prefilled as one more chunk
that is never evicted before the first generated token. Budgets come from the context's length; the
question is kept like generated tokens (capacity: context budget + question + new tokens under
after_prefill). The prompt ids are the query-aware run's, so the full cache gives the same tokens.

Timings: `prefill_s` covers the prompt forwards and their evictions, `decode_s` the rest; CUDA is
synchronised at each boundary. Inside them, `evict_s` (evictions, decode_only's resize) and
`attn_stats_s` (attention statistics of scored policies) are timed by `kvbench.timing` (CUDA events,
read after the final synchronisation: timing them adds no synchronisation to the loop). EOS handling matches `model.generate`: a finished sample keeps
running on pad tokens until the batch ends; with `ignore_eos` every sample generates
`max_new_tokens` tokens (the paper's protocol).

Host syncs: the decode loop waits for the device only to test whether every sample is done, once every
`EOS_CHECK_EVERY` steps (the steps run past the last EOS give pads, dropped like a finished sample's);
index tensors go to the device in non-blocking copies (kvbench.cache.plan.to_device) and scheduling reads
counts kept on the CPU, so the syncs per step depend neither on the policy nor on its groups of layers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from kvbench import memory
from kvbench.attention import SCORE_CHUNK, kv_attention, resolve_backend
from kvbench.cache import KVCache, layer_capacities
from kvbench.cache.evict import trim_windows
from kvbench.cache.plan import to_device
from kvbench.models import family
from kvbench.models.compat import cache_kwarg
from kvbench.models.geometry import model_geometry, rope_inv_freq
from kvbench.policies.base import Policy
from kvbench.schedule import prefill_plan, rows_to_evict

EOS_CHECK_EVERY = 8  # decode steps between two checks that every sample is done (each check syncs the device)
Observer = Callable[[str, KVCache], None]  # (event, cache): "forward" after each forward, "evict" after each eviction


@dataclass
class GenerationOutput:
    token_ids: list[list[int]]  # generated ids per prompt (up to and including EOS unless ignore_eos)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    wall_s: float = 0.0
    evict_s: float = 0.0  # inside evictions (and decode_only's resize), prefill and decode (kvbench.timing)
    attn_stats_s: float | None = 0.0  # the separate statistics pass (scored policies, sdpa/flash); None when the
    # backend computes the statistics from the output's own probabilities (eager, fused): not separable
    generated_tokens: int = 0  # tokens the batches produced (finished samples' pad steps excluded)
    peak_kv_bytes: int = 0  # most KV bytes held at once (kept pairs)
    kv_allocated_bytes: int = 0  # largest cache allocation (slots, positions, statistics)
    accounted: memory.Account | None = None  # the largest accounted peak of a batch
    batches: int = 0
    prompt_tokens: list[int] = field(default_factory=list)
    attention: str = ""  # the attention backend really used (kvbench.attention.resolve)
    budget_min: int | None = None  # the smallest and largest budget of a (layer, sample) over the batches
    budget_max: int | None = None
    budget_per_layer: bool = False  # layers held different budgets (PyramidKV)

    def note_budgets(self, k: torch.Tensor | None) -> None:
        """Widen the budget range by a batch's (L, B) budgets (None: the full cache)."""
        if k is None:
            return
        self.budget_min = int(k.min()) if self.budget_min is None else min(self.budget_min, int(k.min()))
        self.budget_max = int(k.max()) if self.budget_max is None else max(self.budget_max, int(k.max()))
        self.budget_per_layer = self.budget_per_layer or bool((k != k[:1]).any())

    @property
    def throughput_tok_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s > 0 else 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Batch:
    """One batch's tensors: right-padded prompts, the cache, the generated tokens."""

    def __init__(self, model, ids: list[list[int]], policy: Policy, max_new_tokens: int, pad_id: int, geometry,
                 prefill_chunk: int | None = None, question: list[int] | None = None):
        self.question = torch.tensor(question or [0] * len(ids), dtype=torch.long, device="cpu")  # (B,) question
        self.lengths = [len(x) - q for x, q in zip(ids, self.question.tolist(), strict=True)]  # the context's
        q_max, new = int(self.question.max()), max_new_tokens
        max_new_tokens += q_max  # the question is kept like generated tokens
        B, s = len(ids), max(len(x) for x in ids)
        self.prompts = torch.full((B, s), pad_id, dtype=torch.long, device="cpu")
        for b, x in enumerate(ids):
            self.prompts[b, : len(x)] = torch.tensor(x, dtype=torch.long, device="cpu")
        windows = family.effective_windows(geometry["windows"], s + max_new_tokens)  # a window never cut: full
        self.budgets = policy.budgets(self.lengths, len(windows))  # (L, B) or None
        # what the policy compresses: the full-attention layers (windowed ones keep their window)
        full = [w is None for w in windows]
        self.full_budgets = None if self.budgets is None or not any(full) else self.budgets[full]
        # (a context of 0 tokens: kvbench.continuation's one-token contexts, all in the question's forward)
        self.plan = prefill_plan(self.lengths, policy, prefill_chunk, self.full_budgets) if max(self.lengths) else []
        family.check_length_rope(model.config, s, s, new, len(self.plan) > 1 or q_max > 0)  # the padded batch
        widest = max([int(r.max()) for r in self.plan] + [q_max])  # the question is one forward of its own
        self.cache = KVCache(
            batch_size=B,
            capacity=layer_capacities(policy.capacities(self.lengths, max_new_tokens, self.budgets), windows,
                                      self.lengths, max_new_tokens, widest),
            budgets=self.budgets,
            track_attention=policy.needs_attention,
            query_window=policy.query_window,
            rope_inv_freq=rope_inv_freq(model) if policy.rerotate and policy.evicts else None,
            **geometry,
        )
        self.pad_id = pad_id

    def chunk_ids(self, r: torch.Tensor, width: int) -> torch.Tensor:
        """(B, width) ids: sample b's next r_b prompt tokens right-aligned, pads to the left."""
        start = self.cache.seen  # tokens already processed
        i = torch.arange(width, device="cpu")[None, :]
        src = start[:, None] + i - (width - r)[:, None]
        real = src >= start[:, None]
        ids = self.prompts.gather(1, src.clamp(0, self.prompts.shape[1] - 1))
        return torch.where(real, ids, torch.full_like(ids, self.pad_id))


def _evict_if_needed(cache: KVCache, r: torch.Tensor, policy: Policy, prefill: bool, observer,
                     first_decode: bool = False, max_new_tokens: int = 0) -> None:
    """Evict, group by group of layers (one group unless budgets differ by layer), the rows that need it;
    windowed layers only keep their window (`kvbench.cache.evict.trim_windows`), whatever the policy."""
    trim_windows(cache.groups, r, cache.gather_layers)
    if not policy.evicts:
        return
    plan = [(g, rows_to_evict(g.n, r, policy, prefill, g.budget, first_decode)) for g in cache.groups
            if g.sliding is None]
    plan = [(g, rows) for g, rows in plan if rows is not None]
    if not plan:
        return
    with cache.timer("evict", cache.devices):
        for g, rows in plan:
            cache.evict(rows, policy.keep(g.budget), policy, group=g)
            need = policy.decode_capacity(int(g.budget.max()), max_new_tokens)
            if not prefill and g.capacity > need and int(g.n.max()) < need:
                cache.resize(need, group=g)  # the prompt is compressed: give its memory back
    if observer:
        observer("evict", cache)


def _compress_context(cache: KVCache, q: torch.Tensor, policy: Policy, observer, max_new_tokens: int) -> None:
    """Query-agnostic: before the question's q_b tokens come, compress the context as the schedule would at its
    end (after_prefill: to its budget; otherwise down to min(k - p, k - q_b) where n_b + q_b > k), so the
    question fits the budget and is not evicted before the first generated token."""
    trim_windows(cache.groups, q, cache.gather_layers)  # windowed layers keep their window, whatever the policy
    if not policy.evicts:
        return
    with cache.timer("evict", cache.devices):
        for g in cache.groups:
            if g.sliding is not None:
                continue
            k = torch.as_tensor(policy.kv_size if g.budget is None else g.budget, device="cpu").expand_as(q)  # (B,)
            if policy.once:
                rows, keep = g.n > k, k
            else:
                keep = torch.minimum(k - policy.evict_every, k - q)
                rows = g.n + q > k
                if bool((rows & (keep < policy.protect_first + policy.protect_recent + 1)).any()):
                    raise ValueError(f"query_aware=false: a question of {int(q.max())} tokens leaves no room in "
                                     f"a budget of {int(k.min())} pairs")
            if bool(rows.any()):
                cache.evict(rows, keep, policy, group=g)
            need = policy.decode_capacity(int(k.max()), max_new_tokens + int(q.max()))
            if g.capacity > need and int(g.n.max()) < need:
                cache.resize(need, group=g)  # the context is compressed: give its memory back
    if observer:
        observer("evict", cache)


@torch.inference_mode()
def generate_batch(
    model,
    ids: list[list[int]],
    policy: Policy,
    *,
    max_new_tokens: int,
    eos_token_ids: Sequence[int] = (),
    pad_token_id: int = 0,
    ignore_eos: bool = False,
    prefill_chunk: int | None = None,
    observer: Observer | None = None,
    geometry: dict | None = None,
    decode_steps: int | None = None,
    question_tokens: list[int] | None = None,
) -> tuple[list[list[int]], dict]:
    """Greedy-generate for one batch of token-id prompts. Returns (token ids per prompt, stats).

    `decode_steps`: stop after this many decode steps (a probe); the cache is sized for max_new_tokens.
    `question_tokens`: per prompt, its last tokens that are the question (query-agnostic, module docstring).
    """
    geometry = geometry or model_geometry(model)
    if question_tokens is not None and not any(question_tokens):
        question_tokens = None
    batch = _Batch(model, ids, policy, max_new_tokens, pad_token_id, geometry, prefill_chunk, question_tokens)
    try:
        return _run_batch(model, batch, policy, max_new_tokens, eos_token_ids, pad_token_id, ignore_eos,
                          prefill_chunk, observer, decode_steps)
    finally:  # on every path (return, EOS, OOM, interrupt): the cache's tensors go now, not at the next gc
        batch.cache.release()


def _run_batch(model, batch: _Batch, policy: Policy, max_new_tokens, eos_token_ids, pad_token_id, ignore_eos,
               prefill_chunk, observer, decode_steps) -> tuple[list[list[int]], dict]:
    dev_in = model.get_input_embeddings().weight.device
    cache = batch.cache
    allocated = cache.allocated_bytes()  # the largest: a cache only shrinks (decode_only resize)
    B = len(batch.lengths)
    eos = torch.tensor(list(eos_token_ids), dtype=torch.long, device=dev_in)
    base = model.get_decoder()
    cache_name, base_cache_name = cache_kwarg(model), cache_kwarg(base)  # `cache` from transformers 5.24 on

    def forward(tokens: torch.Tensor, r: torch.Tensor, logits: bool):
        positions = cache.begin_forward(r, tokens.shape[1])
        host = to_device({"ids": tokens if tokens.device.type == "cpu" else None, "pos": positions}, dev_in)
        kw = {"input_ids": tokens if host["ids"] is None else host["ids"], "position_ids": host["pos"], "use_cache": True,
              "kvbench_cache": cache, (cache_name if logits else base_cache_name): cache}
        out = None
        if logits:
            out = model(**kw, logits_to_keep=1).logits[:, -1]
        else:  # an intermediate prefill chunk only fills the cache: its hidden states are dropped at once
            base(**kw)
        if observer:
            observer("forward", cache)
        return out

    _sync(dev_in)
    t0 = time.perf_counter()
    plan = batch.plan
    q = batch.question if bool(batch.question.any()) else None
    for k, r in enumerate(plan):
        _evict_if_needed(cache, r, policy, True, observer)
        width = int(r.max())
        out = forward(batch.chunk_ids(r, width), r, logits=q is None and k == len(plan) - 1)
    if q is not None:  # query-agnostic: compress the context, then prefill the question, never evicted before
        _compress_context(cache, q, policy, observer, max_new_tokens)
        out = forward(batch.chunk_ids(q, int(q.max())), q, logits=True)
    next_tok = out.argmax(-1).to(dev_in)  # (B,)
    del out  # the logits are not kept alive through the decode loop (nor through its evictions)
    _sync(dev_in)
    t1 = time.perf_counter()

    done = torch.zeros(B, dtype=torch.bool, device=dev_in)
    steps = [next_tok]
    alive = [torch.ones(B, dtype=torch.bool, device=dev_in)]
    ones = torch.ones(B, dtype=torch.long, device="cpu")
    n_tokens = max_new_tokens if decode_steps is None else min(max_new_tokens, 1 + decode_steps)
    for i in range(1, n_tokens):
        if not ignore_eos:
            done = done | torch.isin(next_tok, eos)
            if i % EOS_CHECK_EVERY == 0 and bool(done.all()):  # a device sync: every EOS_CHECK_EVERY steps only
                break
        _evict_if_needed(cache, ones, policy, False, observer, first_decode=len(steps) == 1 and q is None,
                         max_new_tokens=max_new_tokens)
        logits = forward(next_tok[:, None], ones, logits=True)
        nxt = logits.argmax(-1).to(dev_in)
        del logits  # not alive during the next step's eviction
        if not ignore_eos:
            nxt = torch.where(done, torch.full_like(nxt, pad_token_id), nxt)
            alive.append(~done)
        next_tok = nxt
        steps.append(next_tok)
    _sync(dev_in)
    t2 = time.perf_counter()

    tokens = torch.stack(steps, dim=1).cpu()  # (B, steps)
    if ignore_eos:
        result = tokens.tolist()
        generated = tokens.numel()
    else:
        keep = torch.stack(alive, dim=1).cpu()
        result = [tokens[b][keep[b]].tolist() for b in range(B)]
        generated = int(keep.sum())
    sections = cache.timer.totals()  # after the final sync: CUDA events are read without stalling the loop
    stats = dict(
        prefill_s=t1 - t0,
        decode_s=t2 - t1,
        evict_s=sections.get("evict", 0.0),
        attn_stats_s=sections.get("attn_stats", 0.0),
        generated_tokens=generated,
        peak_kv_bytes=cache.peak_kv_bytes,
        kv_allocated_bytes=allocated,
        budgets=batch.full_budgets,  # (L_full, B) the budgets the compressed layers held, None for the full cache
    )
    return result, stats


def encode(tokenizer, prompts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
    return [tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"] for p in prompts]


def generate(
    model,
    tokenizer,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    policy: Policy,
    batch_size: int = 1,
    *,
    max_new_tokens: int = 64,
    eos_token_ids: Sequence[int] | None = None,
    ignore_eos: bool = False,
    prefill_chunk: int | None = None,
    score_chunk: int = SCORE_CHUNK,
    add_special_tokens: bool = True,
    progress: bool = False,
    observer: Observer | None = None,
    budget: memory.Budget | None = None,
    warmup: bool = False,
    decode_steps: int | None = None,
    attention: str = "auto",
    question_tokens: Sequence[int] | None = None,
) -> GenerationOutput:
    """Greedy generation of `prompts` (strings or token ids) in batches under `policy`.

    Batches keep the given order (no sorting), so a batch size that divides the sample count gives
    every run the same batches. EOS ids default to the model's generation config. `budget`,
    `warmup`, `decode_steps`: see the module docstring; `attention`: auto | sdpa | flash | eager | fused
    (kvbench.attention; the backend really used is `out.attention`, and the account charges its transient);
    `question_tokens`: per prompt, its last tokens that are the question, prefilled after the context's
    compression (query-agnostic; the module docstring).
    """
    if prompts and isinstance(prompts[0], str):
        ids = encode(tokenizer, prompts, add_special_tokens)
    else:
        ids = [list(p) for p in prompts]
    if any(len(x) == 0 for x in ids):
        raise ValueError("empty prompt")
    family.check_policy(model.config, policy, max(map(len, ids)) + max_new_tokens)  # a refused family or an
    # unsuitable policy: ConfigError
    if eos_token_ids is None:
        eos_token_ids = eos_ids(model, tokenizer)
    pad = pad_id(model, tokenizer)
    geometry = model_geometry(model)
    shape = memory.ModelShape.of(model)
    backend = resolve_backend(attention, model, policy.needs_attention)
    out = GenerationOutput(token_ids=[], prompt_tokens=[len(x) for x in ids], attention=backend)
    qs = list(question_tokens) if question_tokens is not None else [0] * len(ids)
    batches = [ids[start : start + batch_size] for start in range(0, len(ids), batch_size)]
    questions = [qs[start : start + batch_size] for start in range(0, len(ids), batch_size)]

    accounts: dict[tuple, memory.Account] = {}  # by the batch's lengths, computed before the clock starts

    def account(batch: list[list[int]], question: list[int]) -> memory.Account:
        key = tuple(len(x) - n for x, n in zip(batch, question, strict=True)) + (max(question),)
        if key not in accounts:  # query-agnostic: the question accounted as generated tokens
            accounts[key] = memory.account(shape, list(key[:-1]), policy, max_new_tokens=max_new_tokens + key[-1],
                                           prefill_chunk=prefill_chunk, score_chunk=score_chunk, attention=backend)
        return accounts[key]

    def run(batch: list[list[int]], question: list[int]) -> tuple[list[list[int]], dict]:
        acc = account(batch, question)
        if out.accounted is None or acc.total > out.accounted.total:
            out.accounted = acc
        if budget is not None:
            budget.admit(acc)
        return generate_batch(
            model,
            batch,
            policy,
            max_new_tokens=max_new_tokens,
            eos_token_ids=eos_token_ids,
            pad_token_id=pad,
            ignore_eos=ignore_eos,
            prefill_chunk=prefill_chunk,
            observer=observer,
            geometry=geometry,
            decode_steps=decode_steps,
            question_tokens=question,
        )

    with kv_attention(model, score_chunk=score_chunk, backend=backend, needs_attention=policy.needs_attention):
        if warmup:
            run(batches[0], questions[0])  # untimed, not counted
        for batch, question in zip(batches, questions, strict=True):  # the accounts' replay is not part of wall_s
            account(batch, question)  # (a batch over budget still fails in turn)
        t0 = time.perf_counter()
        for batch, question in tqdm(list(zip(batches, questions, strict=True)), desc=f"{policy.name} b={batch_size}",
                                    disable=not progress, leave=False):
            tokens, stats = run(batch, question)
            out.token_ids += tokens
            out.prefill_s += stats["prefill_s"]
            out.decode_s += stats["decode_s"]
            out.evict_s += stats["evict_s"]
            out.attn_stats_s += stats["attn_stats_s"]
            out.generated_tokens += stats["generated_tokens"]
            out.peak_kv_bytes = max(out.peak_kv_bytes, stats["peak_kv_bytes"])
            out.kv_allocated_bytes = max(out.kv_allocated_bytes, stats["kv_allocated_bytes"])
            out.note_budgets(stats["budgets"])
            out.batches += 1
    out.wall_s = time.perf_counter() - t0
    if policy.needs_attention and backend in ("eager", "fused"):
        out.attn_stats_s = None
    return out


def eos_ids(model, tokenizer) -> list[int]:
    """EOS ids from the model's generation config (the converted SmolLM2 tokenizer's own EOS is wrong)."""
    e = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if e is None:
        e = tokenizer.eos_token_id
    if e is None:
        return []
    return list(e) if isinstance(e, (list, tuple)) else [int(e)]


def pad_id(model, tokenizer) -> int:
    for v in (getattr(tokenizer, "pad_token_id", None), getattr(model.generation_config, "pad_token_id", None)):
        if isinstance(v, int):
            return v
    e = eos_ids(model, tokenizer)
    return e[0] if e else 0
