"""`generate`: prompts (strings or token ids) in batches under a policy, each batch checked against the memory
limit before anything is allocated; the model's EOS and pad ids."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from tqdm.auto import tqdm

from kvbench import memory
from kvbench.attention import SCORE_CHUNK, kv_attention, resolve_backend
from kvbench.budgets import head_rule
from kvbench.engine.loop import generate_batch
from kvbench.engine.output import GenerationOutput
from kvbench.models import family
from kvbench.models.geometry import model_geometry
from kvbench.policies.policy import Policy


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
    observer=None,
    memory_limit: memory.MemoryLimit | None = None,
    warmup: bool = False,
    decode_steps: int | None = None,
    attention: str = "auto",
    question_tokens: Sequence[int] | None = None,
    kinds=None,
    kv_quant=None,
) -> GenerationOutput:
    """Greedy generation of `prompts` (strings or token ids) in batches under `policy`.

    Batches keep the given order (no sorting), so a batch size that divides the sample count gives
    every run the same batches. EOS ids default to the model's generation config. `memory_limit` (bytes per
    device, `kvbench.memory.MemoryLimit`), `warmup`, `decode_steps`: see
    kvbench.engine; `attention`: auto | sdpa | flash | eager | fused (kvbench.attention; the backend really
    used is `out.attention`, and the account charges its transient); `question_tokens`: per prompt, its last
    tokens that are the question, prefilled after the context's compression (query-agnostic); `kinds`: the
    model's attention kinds (kvbench.models.family) when the caller has read them and checked them against this
    policy and sequences at least this long (`family.check_policy`, as `kvbench.run` does once per run; None:
    read and checked here);
    `kv_quant`: K/V stored quantized (kvbench.quant.qconfig.KVQuant; never with flash: auto resolves to SDPA). A
    backend that cannot run the policy raises kvbench.attention.UnsupportedBackend.
    """
    ids = encode(tokenizer, prompts, add_special_tokens) if prompts and isinstance(prompts[0], str) else [
        list(p) for p in prompts]
    if any(len(x) == 0 for x in ids):
        raise ValueError("empty prompt")
    if kinds is None:  # a refused family or an unsuitable policy: ConfigError (else the caller checked, once per run)
        kinds = family.check_policy(model.config, policy, max(map(len, ids)) + max_new_tokens)
    policy.prepare(tokenizer, model)  # once per run: KVzip's template, DuoAttention's head pattern
    if eos_token_ids is None:
        eos_token_ids = eos_ids(model, tokenizer)
    pad = pad_id(model, tokenizer)
    geometry = model_geometry(model, kinds)
    shape = dataclasses.replace(memory.ModelShape.of(model, kinds), kv_quant=kv_quant)
    backend = resolve_backend(attention, model, policy.needs.attention, head_rule(policy).uneven or kv_quant is not None,
                              kinds)
    out = GenerationOutput(token_ids=[], prompt_tokens=[len(x) for x in ids], attention=backend)
    qs = list(question_tokens) if question_tokens is not None else [0] * len(ids)
    batches = [(ids[s : s + batch_size], qs[s : s + batch_size]) for s in range(0, len(ids), batch_size)]
    accounts: dict[tuple, memory.Account] = {}  # by the batch's lengths, computed before the clock starts

    def account(batch: list[list[int]], question: list[int]) -> memory.Account:
        key = (tuple(len(x) - n for x, n in zip(batch, question, strict=True)), tuple(question))
        if key not in accounts:  # query-agnostic: the contexts' lengths and the questions', as the batch plans them
            accounts[key] = memory.account(shape, list(key[0]), policy, max_new_tokens=max_new_tokens,
                                           prefill_chunk=prefill_chunk, score_chunk=score_chunk, attention=backend,
                                           question=list(question) if any(question) else None)
        return accounts[key]

    def run(batch: list[list[int]], question: list[int]) -> tuple[list[list[int]], dict]:
        acc = account(batch, question)
        if out.accounted is None or acc.total > out.accounted.total:
            out.accounted = acc
        if memory_limit is not None:
            memory_limit.admit(acc)
        return generate_batch(model, batch, policy, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids,
                              pad_token_id=pad, ignore_eos=ignore_eos, prefill_chunk=prefill_chunk,
                              observer=observer, geometry=geometry, decode_steps=decode_steps,
                              question_tokens=question, attention=backend, score_chunk=score_chunk,
                              kv_quant=kv_quant)

    with kv_attention(model, hidden=policy.needs.hidden):
        if warmup:
            run(*batches[0])  # untimed, not counted
        for batch, question in batches:  # the accounts' replay is not part of wall_s
            account(batch, question)  # (a batch over the limit still fails in turn)
        t0 = time.perf_counter()
        for batch, question in tqdm(batches, desc=f"{policy.name} b={batch_size}", disable=not progress,
                                    leave=False):
            out.add(*run(batch, question))
    out.wall_s = time.perf_counter() - t0
    if policy.needs.attention and backend in ("eager", "fused"):
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
