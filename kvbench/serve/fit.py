"""Whether a pool can ever hold a request, and whether its budget leaves room to run (counts only).

Called before serving (kvbench.serve.engine) and by the preflight, from prompt lengths alone.
"""

from __future__ import annotations

import torch

from kvbench.serve.block_evict import BlockRule
from kvbench.serve.blocks import blocks_for
from kvbench.serve.request import Request


def max_pages(req: Request, rule: BlockRule, budget: torch.Tensor | None) -> int:
    """Most pages the request can ever hold alone, over its (layer, KV head)s (`budget` (L, H), None: never
    evicts); its KV never includes the last output token."""
    P, bs = len(req.prompt), rule.block_size
    total = P + req.max_new_tokens - 1
    if budget is None:
        return blocks_for(total, bs)
    if rule.once:  # the whole prompt, then at most the budget and every generated token
        tokens = torch.maximum(torch.full_like(budget, min(total, P)), budget.clamp(max=P) + req.max_new_tokens - 1)
    elif rule.in_prefill:
        tokens = budget.clamp(max=total)
    else:
        tokens = (budget.clamp(min=P) + bs).clamp(max=total)
    return int(blocks_for(tokens, bs).sum())


def max_blocks(req: Request, rule: BlockRule, budget: torch.Tensor | None = None) -> int:
    """Most blocks (one page in every layer and KV head) the request can ever hold alone, rounded up."""
    if budget is None and rule.kv_size is not None:
        budget = torch.tensor([[rule.kv_size]])
    pages = max_pages(req, rule, budget)
    per = 1 if budget is None else budget.numel()
    return -(-pages // per)


def too_small(req: Request, rule: BlockRule, num_blocks: int, budget: torch.Tensor | None = None) -> str:
    """Why a pool of `num_blocks` can never hold `req` (one line)."""
    return (f"a pool of {num_blocks} blocks of {rule.block_size} tokens can never hold request {req.rid} "
            f"({len(req.prompt)} prompt tokens + {req.max_new_tokens} new): alone it needs {max_blocks(req, rule, budget)} "
            "blocks under this policy and schedule")


def stuck(req: Request, rule: BlockRule, budget: torch.Tensor | None, recent: torch.Tensor | None) -> str | None:
    """Why the request could never keep within its budget (too small for the protected areas), or None. Under the
    schedules that evict while it runs, a budget below the start blocks + its recent pairs + one block could never
    feed a token. Under after_prefill the one compression evicts whole blocks between the start blocks and the
    recent area (`BlockRule.plan`): a budget below what they leave (the recent area's partial block stays too)
    could not be reached."""
    if budget is None:
        return None
    P = len(req.prompt)
    if rule.once:
        held = torch.full_like(budget, P)
        _, evict = rule.plan(held, recent, budget, 0)  # (L, H) blocks the compression evicts
        need = held - evict * rule.block_size  # what it keeps
        why = "its one compression, in whole blocks, could not reach it"
    else:
        need = rule.start_blocks * rule.block_size + recent + rule.block_size  # (L, H)
        why = "it could never feed a token"
    ok = budget >= need
    if bool(ok.all()):
        return None
    return (f"request {req.rid}'s budget ({int(budget[~ok].min())} pairs, from its {P}-token prompt) is below the "
            f"{int(need[~ok].max())} pairs the protected start and recent areas keep in whole blocks: {why}")


def stuck_key(policy, heads) -> str:
    """The key a `stuck` budget is refused with: the block size when each head's budget is given (a streaming
    head's window is the pattern's), else the policy's budget knob."""
    return "serve.block_size" if heads is not None else f"policy.{policy.per_prompt or 'kv_size'}"


def too_long(req: Request, rule: BlockRule, max_tokens: int) -> str | None:
    """Why a request whose prompt must be fed in one forward (`rule.whole_prompt`) could never be, or None."""
    if not rule.whole_prompt or len(req.prompt) <= max_tokens:
        return None
    return (f"request {req.rid}'s {len(req.prompt)}-token prompt must be fed in one forward (its policy scores the "
            f"prompt's forward), more than a step's {max_tokens} tokens")


def check_requests(cfg, policy, lengths: list[int], layers, config=None) -> None:
    """Before any model loads: every request (one per prompt length) has a budget it can run within and, with a
    fixed pool (`serve.num_blocks`; mode=serve), fits the pool alone (`layers()`: the model's layer count, read
    only under per-layer budgets; `config`: the model's, for a head rule's fixed budgets when they need nothing
    more, `HeadRule.head_budgets`). Raises ConfigError (one line)."""
    from kvbench.budgets import head_rule
    from kvbench.errors import ConfigError
    from kvbench.serve.budgets import RequestBudgets
    from kvbench.serve.limits import limits_shape

    s = cfg.serve
    rule = BlockRule.of(policy, s.block_size)
    heads = head_rule(policy).head_budgets(policy, config, fetch=False) if policy.evicts and config else None
    budgets = RequestBudgets(policy, limits_shape(policy, layers), heads)
    for i, n in enumerate(lengths):
        req = Request(rid=i, prompt=[0] * n, max_new_tokens=cfg.gen.max_new_tokens)
        budget, recent = budgets(req)
        if (why := stuck(req, rule, budget, recent)) is not None:
            key = stuck_key(policy, heads)
            raise ConfigError(key, why, s.block_size if heads is not None else getattr(policy, key[len("policy."):]))
        if (why := too_long(req, rule, s.max_tokens_per_step)) is not None:
            raise ConfigError("serve.max_tokens_per_step", why, s.max_tokens_per_step)
        if cfg.mode == "serve" and s.num_blocks is not None and max_blocks(req, rule, budget) > s.num_blocks:
            raise ConfigError("serve.num_blocks", too_small(req, rule, s.num_blocks, budget), s.num_blocks)
