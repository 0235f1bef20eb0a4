"""The configuration matrix: every option the docs offer as a choice, against every other.

Axes (`AXES`): every registered policy (PyramidKV is the per-layer budget kind), `policy.schedule` (the three),
the budget kind (`kv_size`, `kv_ratio` or kvpress's `compression_ratio`, or `kv_size_above`: a kv_size above every
prompt + new tokens, which never evicts and must cost no more than the full cache), `mode` (run, serve, serve_limits), `serve.eviction` (policy, openvino),
`gen.attention`, `policy.rerotate`, the model (tiny Llama with GQA, tiny Phi-3 without), the batch (1, or
3 prompts of different lengths, left-padded), the model's dtype (float32, bfloat16), `policy.head_budget`
(uniform, or AdaKV's adaptive split of a layer's budget over its KV heads). `Combo.kv_cache` (gen.kv_cache_dtype:
auto, int8, int4) has its rules here and is not an axis yet (see AXES). A point of the product is a `Combo`.

For each combination exactly one outcome is allowed, and `refusal` says which, from the documented
rules alone (docs/matrix.md "Refused, and why", docs/serving.md "Checks and refusals"; serve mode's budget
arithmetic in tests/matrix_budgets.py):
- refused by the preflight, before any model loads: exit 2, one line naming one of the keys `refusal`
  gives;
- or a run whose record is true (tests/project/test_config_matrix.py checks it against spies on what ran).
The preflight answers without a model, and it agrees with `refusal` on every combination of the product
(tests/project/test_matrix_preflight.py), so any cover, whatever policies the registry holds, may pick any.

Sweeps over policies (`SWEEPS`): one policy key applies to the policies of a sweep that use it (`uses`, from
the docs' table of keys: full uses none, extreme_decode fixes its budget kind, p and schedule, a policy's
own knobs are its own) and is ignored by the others (reset to their defaults, named in `ignored_keys`).

`pairwise(seed)`: every pair of axis values that can run together runs together at least once (a
greedy cover of the accepted combinations, seeded), plus, for every pair that can never run together,
one refused combination holding it (the one breaking the fewest rules, so its message is specific).
`product()`: all of them (`make test-matrix`). Both take another policy axis (`policies`), e.g. the registry
with a test's policy added.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import random
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from kvbench.conf import CONF_DIR, load_option
from kvbench.policies import registry
from tests.matrix_budgets import refused_key

POLICIES = tuple(registry())  # every registered policy (a new one joins the matrix by being defined)
AXES = {
    "policy": POLICIES,
    "schedule": ("prefill_and_decode", "decode_only", "after_prefill"),
    "budget": ("kv_size", "kv_ratio", "compression_ratio", "kv_size_above"),
    "mode": ("run", "serve", "serve_limits"),
    "eviction": ("policy", "openvino"),
    "attention": ("auto", "sdpa", "eager", "fused"),
    "rerotate": (False, True),
    "model": ("tiny-llama", "tiny-phi3"),
    "batch": (1, 3),
    "dtype": ("float32", "bfloat16"),
    "head_budget": ("uniform", "adaptive"),
}  # Combo.kv_cache (gen.kv_cache_dtype) has its refusal rules below; it joins AXES once the product's record
# (tests/data/matrix_product.json, `python -m tests.matrix_preflight`) is recomputed with it
KV_SIZE, KV_RATIO, COMPRESSION_RATIO, EVICT_EVERY, NEW_TOKENS, SAMPLES, WINDOW = 48, 0.5, 0.75, 8, 6, 3, 16
QUANT_GROUP = 16  # gen.kv_quant_group and _residual of a quantized combination: the tiny models' head size (and BLOCK)
QUANT_RUNNING = 4  # serve.max_running of a quantized serve combination (its full-precision window pages)
PROMPT_TOKENS, LAYERS, BLOCK = (161, 214, 273), 2, 16  # QUESTIONS' prompts; both tiny models' layers; serve.block_size
SERVE_STEP = 256  # serve.max_tokens_per_step's default
OPENVINO = {"kv_size": 32 + 512 + 128, "protect_first": 32, "protect_recent": 128, "schedule": "decode_only"}  # its areas
KV_ABOVE = 512  # kv_size_above: more than the longest prompt (273 tokens) + NEW_TOKENS, a whole number of blocks
QUESTIONS = (  # GSM8K-style rows of different lengths: prompts of 161, 214 and 273 tokens on the byte tokenizer
    "What is 2 + 3?",
    "Tom has 4 apples and buys 3 more. How many apples does he have now?",
    "A train leaves at 3 pm and travels 60 miles per hour for 2 hours, then 40 miles per hour for one more "
    "hour. How far did it go?",
)
# the departures each policy declares (docs: Policies): its published schedule, one pair per token, and how its
# score aggregates a GQA group (the note's words before its colon, e.g. "gqa_group_mean")
PUBLISHED_SCHEDULE = {n: c.published_schedule for n, c in registry().items() if c.published_schedule}
ONE_PER_TOKEN = tuple(n for n, c in registry().items() if c.published_evict_every == 1)
GQA_NOTE = {n: c.gqa_note.split(":")[0] for n, c in registry().items() if c.gqa_note}


# the policy keys the docs list (CLI and configuration): every policy's, and each policy's own
COMMON_KEYS = ("kv_size", "kv_ratio", "compression_ratio", "evict_every", "schedule", "protect_first", "protect_recent",
               "rerotate")
SHARED = ("_target_", *OmegaConf.load(CONF_DIR / "base" / "policy.yaml"))  # conf/base/policy.yaml: every policy's


@functools.cache
def policy_config(name: str) -> dict:
    """The policy's own config: conf/policy/<name>.yaml (its defaults applied), or the node a test registered in
    Hydra's ConfigStore (`policy/<name>.yaml`, defaults already applied): where Hydra finds `policy=<name>`."""
    if (CONF_DIR / "policy" / f"{name}.yaml").is_file():
        return OmegaConf.to_container(load_option("policy", name))
    node = OmegaConf.to_container(ConfigStore.instance().load(f"policy/{name}.yaml").node)
    assert "defaults" not in node, name
    return node


def own_keys(name: str) -> tuple[str, ...]:
    """The keys of the policy's config that not every policy has (e.g. snapkv's window)."""
    return tuple(k for k in policy_config(name) if k not in SHARED)


NOT_USED = {"full": COMMON_KEYS,  # it never evicts
            "extreme_decode": ("kv_ratio", "compression_ratio", "evict_every", "schedule")}  # Algorithm 2 fixes them
# sweeps over the policies with keys some use and some do not (values away from every policy's default); each
# leaves out the policies that refuse one of its values (pyramidkv, kvzip: rerotate; extreme_decode: protection > 1)
SWEEPS = {
    # (duo_attention: its head pattern is its budget, kv_size and kv_ratio are refused)
    "budget-knobs": (tuple(p for p in POLICIES if p != "duo_attention"), {"kv_size": 48, "evict_every": 8,
                                "schedule": "after_prefill", "window": 16, "kernel": 3,
                                "pooling": "max", "pool_window": True, "beta": 2, "budget_rule": "window_plus",
                                "seed": 1, "per_kv_head": True}),
    "kv_ratio-rerotate": (tuple(p for p in POLICIES if p not in ("pyramidkv", "kvzip", "kvzip_plus", "kvgrad",
                                                                 "duo_attention")),
                          {"kv_ratio": KV_RATIO, "rerotate": True}),  # kvzip: global head budgets, no shared rotary
    "compression-protect": (tuple(p for p in POLICIES if p != "extreme_decode"),
                            {"compression_ratio": COMPRESSION_RATIO, "protect_first": 2, "protect_recent": 2}),
}


def uses(policy: str, key: str) -> bool:
    """Whether `policy` uses its key `policy.<key>` (docs: Sweeps, keys a policy does not use)."""
    return key in own_keys(policy) or (key in COMMON_KEYS and key not in NOT_USED.get(policy, ()))


@dataclass(frozen=True)
class Combo:
    policy: str
    schedule: str
    budget: str
    mode: str
    eviction: str
    attention: str
    rerotate: bool
    model: str
    batch: int
    dtype: str
    head_budget: str = "uniform"
    kv_cache: str = "auto"  # gen.kv_cache_dtype (quantized: groups of G = R = 16, the tiny models' head size)

    @property
    def id(self) -> str:
        return "-".join(str(v) for v in asdict(self).values())

    @property
    def evicts(self) -> bool:
        return self.policy != "full"

    def knobs(self) -> dict[str, object]:
        """The `policy.<key>=<value>` overrides of this combination, as values."""
        out: dict[str, object] = {"schedule": self.schedule, "rerotate": self.rerotate}
        if self.budget == "kv_ratio":
            out["kv_ratio"] = KV_RATIO
        elif self.budget == "compression_ratio":
            out["compression_ratio"] = COMPRESSION_RATIO
        elif self.policy not in ("full", "extreme_decode") and not self.preset:
            out["kv_size"] = KV_ABOVE if self.budget == "kv_size_above" else KV_SIZE
        if self.policy not in ("full", "extreme_decode"):
            out["evict_every"] = EVICT_EVERY
        if "window" in own_keys(self.policy):  # snapkv, pyramidkv
            out["window"] = WINDOW  # the published 64 is more than these budgets hold
        if self.head_budget != "uniform":
            out["head_budget"] = self.head_budget
        return out

    def overrides(self) -> list[str]:
        """The command line of this combination (task, data and results_dir are added by `argv`)."""
        knobs = [f"policy.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in self.knobs().items()]
        return [f"policy={self.policy}", f"mode={self.mode}", f"serve.eviction={self.eviction}",
                f"gen.attention={self.attention}", f"model={self.model}", f"model.dtype={self.dtype}",
                f"batch_size={self.batch}", *knobs, *self.quant_overrides()]

    def quant_overrides(self) -> list[str]:
        if self.kv_cache == "auto":
            return []
        serve = [f"serve.max_running={QUANT_RUNNING}"] if self.mode == "serve" else []  # the pool's windows: by it
        return [f"gen.kv_cache_dtype={self.kv_cache}", f"gen.kv_quant_group={QUANT_GROUP}",
                f"gen.kv_quant_residual={QUANT_GROUP}", *serve]

    @property
    def per_prompt(self) -> bool:
        """A budget per prompt (kv_ratio, compression_ratio), not a kv_size."""
        return self.budget in ("kv_ratio", "compression_ratio")

    @property
    def holds_whole(self) -> bool:
        """kv_size_above applied: the budget holds every sequence whole, so nothing is ever evicted."""
        return self.budget == "kv_size_above" and self.policy not in ("full", "extreme_decode") and not self.preset

    @property
    def preset(self) -> bool:
        """serve.eviction=openvino: its kv_size (672) is the budget, so kv_size is not overridden."""
        return self.eviction == "openvino"

    @property
    def serving(self) -> bool:
        return self.mode in ("serve", "serve_limits")


def argv(combo: Combo, mirror, results) -> list[str]:
    """The whole command line of `combo`: a GSM8K mirror of QUESTIONS in `mirror`, records to `results`."""
    return [*combo.overrides(), "task=gsm8k", f"data.dir={mirror}", f"task.n_samples={SAMPLES}", "task.n_shot=0",
            f"gen.max_new_tokens={NEW_TOKENS}", "gen.ignore_eos=true", "logger=wandb", "device=cpu",
            f"results_dir={results}", "serve.plot=false"]


def write_mirror(root: Path) -> Path:
    """A GSM8K mirror of QUESTIONS in `root` (`data.dir`): root/gsm8k/test.jsonl.gz."""
    (root / "gsm8k").mkdir(parents=True, exist_ok=True)
    with gzip.open(root / "gsm8k" / "test.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"question": q, "answer": f"So {i}.\n#### {i}"}) + "\n" for i, q in enumerate(QUESTIONS))
    return root


WHOLE_PROMPT = tuple(n for n, c in registry().items() if c.whole_prompt)  # scored in the prompt's one forward
HEAD_PATTERN = ("duo_attention",)  # a fixed per-(layer, KV head) budget: no kv_size / kv_ratio (docs/policies.md)


def violations(c: Combo) -> list[tuple[str, ...]]:
    """The documented refusals this combination meets: for each, the keys its one-line message may name."""
    out = []
    per_prompt = c.per_prompt
    if c.policy == "full" and per_prompt:
        out.append((f"policy.{c.budget}",))  # the full cache has no budget
    if c.policy == "full" and c.rerotate:
        out.append(("policy.rerotate",))  # nothing is evicted, nothing to re-rotate
    if c.policy == "extreme_decode" and c.schedule != "decode_only":
        out.append(("policy.schedule",))  # Algorithm 2 is decoding-only
    if c.policy == "extreme_decode" and per_prompt:
        out.append((f"policy.{c.budget}",))  # it keeps one pair, whatever the prompt
    cls = registry()[c.policy]  # what each policy declares it refuses, with its reason (docs/policies.md)
    if cls.after_prefill_only and c.schedule != "after_prefill":
        out.append(("policy.schedule",))  # its rule reads the whole prompt at once (LagKV, ChunkKV, CriticalKV, Compactor)
    if c.policy in WHOLE_PROMPT and c.serving and c.evicts and max(PROMPT_TOKENS) > SERVE_STEP:
        out.append(("serve.max_tokens_per_step",))  # Compactor's prompt is fed whole: it must fit one step
    if cls.uniform_heads_only and c.head_budget == "adaptive":
        out.append(("policy.head_budget",))  # ChunkKV: every KV head keeps the same chunks; CriticalAdaKV: another rule
    if c.policy == "pyramidkv" and c.rerotate:
        out.append(("policy.rerotate",))  # rotary positions are shared by layers of different budgets
    if c.preset:  # OpenVINO's preset: serving modes, H2O's accumulated attention, its own areas and schedule
        if not c.serving:
            out.append(("serve.eviction",))
        if c.policy != "h2o":
            out.append(("serve.eviction",))
        elif c.schedule != "decode_only":
            out.append(("policy.schedule",))
        if c.policy == "h2o" and per_prompt:
            out.append((f"policy.{c.budget}",))
    if getattr(cls.needs, "passes", False):  # KVzip: the whole context reconstructed once, after prefill
        if c.schedule != "after_prefill":
            out.append(("policy.schedule",))
        if c.head_budget == "adaptive":
            out.append(("policy.head_budget",))  # its own ranking (global or layerwise)
        if c.rerotate:
            out.append(("policy.head_budget", "policy.rerotate"))  # heads of different counts
        if c.mode == "serve_limits" and c.evicts:
            out.append(("policy.head_budget",))  # its ranking needs the passes' scores, which serve_limits never computes
    if c.policy in HEAD_PATTERN:  # DuoAttention: its head pattern is the budget
        if c.head_budget == "adaptive":
            out.append(("policy.head_budget",))  # its heads keep what the pattern says
        if c.preset or c.budget != "compression_ratio":  # compression_ratio: read as the share of streaming heads
            out.append(("policy.kv_size", "policy.kv_ratio"))
        if c.rerotate:
            out.append(("policy.head_budget", "policy.rerotate"))  # heads of different counts
        if c.mode == "serve_limits":
            out.append(("policy.head_budget",))  # the pattern's heads are chosen from scores serve_limits never computes
        elif c.serving and c.schedule != "after_prefill":  # a streaming head slides by whole blocks as it runs:
            out.append(("serve.block_size",))  # the tiny models' random pattern keeps 2 + 10 pairs, under one block
    if c.head_budget == "adaptive":
        if c.policy in ("full", "window", "streaming_llm", "extreme_decode"):
            out.append(("policy.head_budget",))  # no score to split a layer's budget by (full: no budget)
        if c.schedule != "after_prefill":
            out.append(("policy.head_budget",))  # AdaKV's protocol: the heads' counts chosen once, after prefill
        if c.rerotate:
            out.append(("policy.head_budget",))  # heads of different counts: no shared rotary positions
        if c.mode == "serve_limits":
            out.append(("policy.head_budget",))  # the split needs attention scores, which serve_limits never computes
    if c.kv_cache != "auto":
        if c.mode == "serve_limits":
            out.append(("gen.kv_cache_dtype",))  # it counts pages, never K/V bytes (serve's pool: a page is a key group)
        if c.rerotate and c.evicts:
            out.append(("policy.rerotate",))  # re-rotation rebuilds keys from copies a quantized cache does not hold
    if c.serving:
        if c.batch != 1:
            out.append(("batch_size",))  # the scheduler batches
        if c.attention not in ("auto", "sdpa"):
            out.append(("gen.attention",))  # serve attends over pages with SDPA
        if c.evicts and c.schedule == "after_prefill" and c.rerotate:
            out.append(("policy.rerotate",))  # each (layer, KV head) compresses on its own: no shared positions
        key = serve_budget_refusal(c)
        if key is not None:
            out.append((key,))  # e.g. extreme_decode's kv 2: no whole number of blocks; PyramidKV's top layers
    return out


def serve_budget_refusal(c: Combo) -> str | None:
    """Serving, an evicting policy: the key its budget is refused with (tests/matrix_budgets.py, from the docs),
    or None."""
    keys = {**policy_config(c.policy), **c.knobs(), **(OPENVINO if c.preset and c.policy == "h2o" else {})}
    if not c.evicts or c.policy in HEAD_PATTERN:  # (refused before: schedule)
        return None
    # extreme_decode keeps one pair, whatever the prompt; kv_size_above is a kv_size
    kind = "kv_size" if c.policy == "extreme_decode" or c.budget == "kv_size_above" else c.budget
    return refused_key(keys, kind, PROMPT_TOKENS, LAYERS, BLOCK)


def named(line: str) -> str:
    """The key a refusal's one line names (`<key>=<value>: why` or `<key>: why`, after `kvbench: error: `)."""
    return line.removeprefix("kvbench: error: ").split(":")[0].split("=")[0]


def refusal(c: Combo) -> tuple[str, ...] | None:
    """The keys the preflight's one line may name, or None: the combination must run to a true record."""
    v = violations(c)
    return tuple(sorted({k for keys in v for k in keys})) if v else None


def product(policies: tuple[str, ...] | None = None) -> list[Combo]:
    """Every combination of the axes (`policies`: the policy axis, AXES' by default)."""
    axes = list(AXES.values())
    return [Combo(*values) for values in itertools.product(policies or axes[0], *axes[1:])]


def _pair_ids(every: list[Combo]) -> tuple[list[frozenset[int]], list[tuple]]:
    """Each combination's pairs of axis values as ints, and each int's pair ((axis, value), (axis, value))."""
    names = [f.name for f in fields(Combo) if f.name in AXES]
    index: dict[tuple, int] = {}
    out = []
    for c in every:
        items = [(n, getattr(c, n)) for n in names]  # the axes' values
        out.append(frozenset(index.setdefault(pair, len(index)) for pair in itertools.combinations(items, 2)))
    return out, list(index)


def pairwise(seed: int = 0, candidates: int = 400, policies: tuple[str, ...] | None = None) -> tuple[Combo, ...]:
    """A seeded, constraint-aware pairwise cover (module docstring): accepted combinations first, then the
    refused ones that hold the pairs no accepted combination can. `policies`: the policy axis (AXES' by default).
    Computed once per process for each."""
    return _cover(seed, candidates, tuple(policies or AXES["policy"]))


@functools.cache
def _cover(seed: int, candidates: int, policies: tuple[str, ...]) -> tuple[Combo, ...]:
    rng = random.Random(seed)
    every = product(policies)
    pairs, pair_of = _pair_ids(every)  # pairs[i]: combination i's pairs as ints; pair_of[p]: pair p
    order = {p: str(pair) for p, pair in enumerate(pair_of)}  # pairs are taken in the order of their text
    met = [violations(c) for c in every]  # each combination's refusals, computed once
    accepted = [i for i in range(len(every)) if not met[i]]
    feasible = set().union(*(pairs[i] for i in accepted))
    uncovered, chosen = set(feasible), []
    while uncovered:
        target = min(uncovered, key=order.get)  # one pair that must get covered now: the loop always progresses
        pool = rng.sample(accepted, min(candidates, len(accepted))) + [i for i in accepted if target in pairs[i]]
        best = max(pool, key=lambda i: (target in pairs[i], len(pairs[i] & uncovered)))
        chosen.append(best)
        uncovered -= pairs[best]
    infeasible = set(range(len(pair_of))) - feasible
    holders: dict[int, list[int]] = {p: [] for p in infeasible}  # the combinations holding each, in order
    for i, held in enumerate(pairs):
        for p in held & infeasible:
            holders[p].append(i)
    for p in sorted(infeasible, key=order.get):
        fewest = min(len(met[i]) for i in holders[p])
        chosen.append(rng.choice([i for i in holders[p] if len(met[i]) == fewest]))
    refused = {i: tuple(sorted({k for keys in met[i] for k in keys})) for i in range(len(every)) if met[i]}
    alone = {r for r in refused.values() if len(r) == 1} - {refused.get(i) for i in chosen}
    for keys in sorted(alone):  # each refusal key alone at least once, whatever the draws above picked
        chosen.append(rng.choice([i for i, r in refused.items() if r == keys]))
    return tuple(every[i] for i in dict.fromkeys(chosen))  # (refused[i]: refusal(every[i]), computed once)


def expected_extensions(c: Combo) -> tuple[list[str], list[str]]:
    """(substrings some extension must contain, substrings none may contain) for a run of `c`: every
    departure from the published method, and nothing that was not applied."""
    need, never = [], []
    (need if c.kv_cache != "auto" else never).append(f"{c.kv_cache[3:]}-bit codes" if c.kv_cache != "auto" else "-bit codes")
    (need if c.kv_cache != "auto" and c.mode == "serve" else never).append("serve_quantized_pages")
    if not c.evicts:
        return need, never + ["rerotate", "kv_ratio", "serve_block", "gqa", "GQA", "published", "head_budget"]
    if c.policy == "streaming_llm":
        (never if c.rerotate else need).append("source positions kept")
        never.append("rerotate:")
    else:
        (need if c.rerotate else never).append("rerotate")
    (need if c.budget == "kv_ratio" else never).append("kv_ratio=")
    (need if c.head_budget == "adaptive" else never).append("head_budget=adaptive")
    (need if c.budget == "compression_ratio" else never).append("compression_ratio=")
    (need if c.serving else never).append("serve_block_eviction")
    (need if c.preset else never).append("serve.eviction=openvino")
    gqa = GQA_NOTE.get(c.policy)
    if c.model == "tiny-llama" and gqa and c.mode != "serve_limits":  # serve_limits scores nothing
        need.append(gqa)
    else:
        never += ["gqa", "GQA"]
    published = PUBLISHED_SCHEDULE.get(c.policy)
    prefill = c.schedule == "prefill_and_decode"
    if c.schedule == "after_prefill":  # the published protocol of the one-off compressions, a departure for others
        if published in ("decode_only", "prefill_and_decode"):
            need.append("schedule=after_prefill")
        never += ["(published: never)", "block by block", "schedule=decode_only"]  # no prefill or decode eviction
    elif published == "after_prefill":
        need.append("(published: never)")
        (need if prefill else never).append("evicts during prefill")
    elif published == "decode_only":
        (need if prefill else never).append("evicts during prefill")
    elif published == "prefill_and_decode":
        (need if not prefill else never).append("schedule=decode_only")
    else:
        never += ["evicts during prefill", "schedule=decode_only", "(published: never)"]
    if c.policy in ONE_PER_TOKEN and c.mode == "run" and c.schedule != "after_prefill":
        need.append(f"evict_every={EVICT_EVERY}")
    else:
        never.append("evict_every=")
    return need, never
