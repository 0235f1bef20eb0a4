"""`kvbench-plan`: the largest batch and the first out-of-memory batch b0, predicted without weights.

Before renting GPUs, a researcher wants to know what batch a setting reaches. The planner answers it
from the same account the runs are budgeted with (kvbench.memory), on a node described in the config:

- the model is built on the **meta device** from its config (`ModelSpec`, each loader's weight-free
  twin: the paper's two models' config.json ship inside kvbench, so they plan offline; other Hub
  models read theirs from the Hub), so every parameter and buffer has its real shape and dtype and
  none has storage;
- its layers and weights are **placed per device by transformers' own `device_map="auto"` code**
  (`_get_device_map`: accelerate's balanced `max_memory`, then `infer_auto_device_map`) with the
  node's per-GPU memory, exactly as `from_pretrained` would place them; a loader that does not split
  (GGUF, tiny) puts everything on one device, as it does when it loads;
- the node: `plan.gpus` x `plan.gpu_mem_mib`, else the GPUs of `model.max_memory` (each capped at
  `memory.budget_gb` when set), else the CPU under the accounted `memory.budget_gb`; on every device
  `memory.reserve_gb` is taken off the budget (the CUDA context and allocator slack the account does
  not see);
- the prompts: the task's real prompt lengths (its tokenizer, `data.dir` or the Hub), or every
  prompt `plan.prompt_tokens` long (the worst case; needed offline for the paper's models, whose
  tokenizers are on the Hub only);
- for each attention backend of `plan.backends` and each policy (ED at `reproduce.ed_kv_size`, the
  full cache, and the configured evicting policy at each of `plan.kv_sizes`), `kvbench.search.search`
  over `search.candidates` with a trial that admits a batch when every device's accounted peak of the
  worst-case batch (the b longest prompts, as the real search probes) fits its budget.

On the CPU this is the verdict `search.max_batch=true search.probe=account` reaches with the
weights loaded (a test checks it). It prints a table and appends one record with `mode: plan` to
`results_dir/runs.jsonl`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import time
import uuid
from dataclasses import dataclass, replace

from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, OmegaConf

import kvbench
from kvbench import memory, results, search
from kvbench.conf import load_option
from kvbench.config import CONF_DIR, build_task, config_hash, search_candidates, validate
from kvbench.errors import ConfigError

MiB = 2**20
log = logging.getLogger("kvbench")


# ------------------------------------------------------------------------------------------- the node
@dataclass(frozen=True)
class Node:
    """Where the plan runs: each device's usable bytes (budget less reserve), and the placement memory."""

    usable: dict[str, int]  # "cuda:0" / "cpu" -> bytes an accounted peak may reach
    budget: dict[str, int]  # the same before memory.reserve_gb
    max_memory: dict[int, int] | None  # per-GPU memory for device_map=auto; None on the CPU

    @property
    def gpu(self) -> bool:
        return self.max_memory is not None

    def describe(self) -> str:
        sizes = sorted(set(self.budget.values()))
        each = "/".join(f"{b / MiB:.0f}" for b in sizes)
        return f"{len(self.budget)} x GPU {each} MiB" if self.gpu else f"CPU, accounted budget {each} MiB"


def _mem_bytes(v) -> int:
    from accelerate.utils import convert_file_size_to_int

    return int(v) if isinstance(v, (int, float)) else convert_file_size_to_int(str(v))


def node_of(cfg: DictConfig) -> Node:
    """The node described by plan.gpus / plan.gpu_mem_mib, model.max_memory, memory.budget_gb."""
    p, budget_gb = cfg.plan, cfg.memory.budget_gb
    reserve = int(float(cfg.memory.reserve_gb or 0) * memory.GiB)
    given = {int(k): _mem_bytes(v) for k, v in (cfg.model.get("max_memory") or {}).items() if str(k).isdigit()}
    gpus = p.gpus if p.gpus is not None else len(given)
    if not gpus:
        if budget_gb is None:
            raise ConfigError("memory.budget_gb", "a CPU plan needs an accounted budget (GiB); or describe GPUs with"
                              " plan.gpus and plan.gpu_mem_mib")
        b = int(budget_gb * memory.GiB)
        return Node(usable={"cpu": b - reserve}, budget={"cpu": b}, max_memory=None)
    if p.gpu_mem_mib is not None:
        place = dict.fromkeys(range(gpus), p.gpu_mem_mib * MiB)
    elif given and all(i in given for i in range(gpus)):
        place = {i: given[i] for i in range(gpus)}
    elif budget_gb is not None:
        place = dict.fromkeys(range(gpus), int(budget_gb * memory.GiB))
    else:
        raise ConfigError("plan.gpu_mem_mib", f"{gpus} GPUs need their memory: plan.gpu_mem_mib, model.max_memory"
                          " or memory.budget_gb", None)
    cap = None if budget_gb is None or p.gpu_mem_mib is not None else int(budget_gb * memory.GiB)
    budget = {f"cuda:{i}": (m if cap is None else min(m, cap)) for i, m in place.items()}
    if any(b <= reserve for b in budget.values()):
        raise ConfigError("memory.reserve_gb", "leaves no memory on a GPU of the plan", cfg.memory.reserve_gb)
    return Node(usable={d: b - reserve for d, b in budget.items()}, budget=budget, max_memory=place)


def check(cfg: DictConfig) -> None:
    """The node a plan describes (no model, no tokenizer): ConfigError naming the key. The plan.* keys'
    own values are checked by kvbench.config.validate, for every command alike."""
    node_of(cfg)


# ------------------------------------------------------------------------------------------ placement
def spec_of(cfg: DictConfig, node: Node):
    """The model of `cfg` without weights (its loader's twin in kvbench.models.SPECS), for where the node runs it."""
    from kvbench.models import SPECS

    loader = get_method(cfg.model._target_)
    if loader not in SPECS:
        raise ConfigError("model", f"{cfg.model._target_} has no weight-free spec for planning", cfg.model.name)
    args = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items() if k != "_target_"}
    return SPECS[loader](**{**args, "device": "cuda" if node.gpu else "cpu"})


def placement(model, spec, node: Node) -> dict[str, str]:
    """Module name -> device ("cuda:i" / "cpu") as `from_pretrained(device_map=..., max_memory=...)` would place it."""
    if not node.gpu:
        return {"": "cpu"}
    if not spec.device_map:  # loaders that do not split move the whole model to one GPU
        return {"": "cuda:0"}
    from transformers.integrations.accelerate import _get_device_map

    quiet = logging.getLogger("accelerate.utils.modeling")  # "Device 0 is not available": this machine's GPUs
    level, quiet.level = quiet.level, logging.ERROR
    try:
        dmap = _get_device_map(model, spec.device_map, dict(node.max_memory), None)
    finally:
        quiet.level = level
    off = sorted({str(v) for v in dmap.values() if not isinstance(v, int)})
    if off:
        raise ConfigError("plan.gpu_mem_mib", f"the weights do not fit on {node.describe()}: device_map would put"
                          f" part of the model on {', '.join(off)}", None)
    return {k: f"cuda:{v}" for k, v in dmap.items()}


def _device(name: str, dmap: dict[str, str]) -> str:
    """The device of a parameter or module: its longest prefix in the device map."""
    while True:
        if name in dmap:
            return dmap[name]
        if not name:
            raise KeyError(name)
        name = name.rpartition(".")[0]


def placed_shape(model, dmap: dict[str, str]) -> memory.ModelShape:
    """The account's ModelShape of a meta model placed by `dmap`: weights and decoder layers per device."""
    weights: dict[str, int] = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:  # tied weights are yielded once
        d = _device(name, dmap)
        weights[d] = weights.get(d, 0) + t.numel() * t.element_size()
    stack = model.get_decoder().layers
    prefix = next(n for n, m in model.named_modules() if m is stack)
    layers: dict[str, int] = {}
    for i in range(len(stack)):
        d = _device(f"{prefix}.{i}", dmap)
        layers[d] = layers.get(d, 0) + 1
    return replace(memory.ModelShape.of(model), weights=weights, layers=layers)


# -------------------------------------------------------------------------------------------- prompts
def prompt_lengths(cfg: DictConfig, spec) -> tuple[list[int], str]:
    """The task's prompt lengths in tokens, or plan.prompt_tokens for every sample; and where they came from."""
    task = build_task(cfg)
    if cfg.plan.prompt_tokens is not None:
        return [int(cfg.plan.prompt_tokens)] * max(1, task.n_samples or 1), "plan.prompt_tokens"
    try:
        tok = spec.tokenizer()
        samples = task.samples(tok)
    except Exception as e:
        raise ConfigError(
            "plan.prompt_tokens",
            f"the task's prompt lengths need {cfg.model.name}'s tokenizer and the data, and loading them failed"
            f" ({type(e).__name__}; offline?): give the longest prompt instead, e.g. plan.prompt_tokens=3584",
            None,
        ) from None
    return [len(task.encode(tok, s.prompt)) for s in samples], f"{task.name} prompts ({len(samples)} samples)"


# ------------------------------------------------------------------------------------------- policies
def plan_policies(cfg: DictConfig) -> list[tuple[str, object]]:
    """(method, policy): ED at reproduce.ed_kv_size, the full cache, the configured evicting policy per kv size."""
    from kvbench.report import METHODS

    def conf(name: str, **values):
        node = load_option("policy", name)
        node.update(values)
        return instantiate(node, _convert_="all")

    out = [("ED", conf("extreme_decode", kv_size=cfg.reproduce.ed_kv_size)), ("FKV", conf("full"))]
    own = instantiate(cfg.policy, _convert_="all")
    if own.name not in ("extreme_decode", "full"):
        for kv in list(cfg.plan.kv_sizes) if cfg.plan.kv_sizes is not None else [own.kv_size]:
            out.append((METHODS.get(own.name, own.name), instantiate(cfg.policy, kv_size=kv, _convert_="all")))
    return out


# ------------------------------------------------------------------------------------------------ plan
def trial(shape: memory.ModelShape, node: Node, lengths: list[int], policy, backend: str, cfg: DictConfig):
    """search.Trial of batch size b: does every device's accounted peak of the worst-case batch fit?"""
    longest = sorted(lengths, reverse=True)

    def run(b: int) -> search.Trial:
        batch = [longest[i % len(longest)] for i in range(b)]  # search.probe_prompts' batch, as lengths
        acc = memory.account(shape, batch, policy, max_new_tokens=cfg.gen.max_new_tokens,
                             prefill_chunk=cfg.gen.prefill_chunk, score_chunk=cfg.gen.score_chunk, attention=backend)
        fits = all(acc.devices[d].total <= node.usable[d] for d in acc.devices)
        peak = max(f.total for f in acc.devices.values())
        return search.Trial(b, "ok" if fits else "oom", peak_mem_bytes=peak, accounted_mem_bytes=acc.total)

    return run


def window_credit(shape: memory.ModelShape, lengths: list[int], cfg: DictConfig) -> dict:
    """The model's attention kinds and the full cache of one longest sample, as allocated (windowed layers hold
    their window only) and as it would be with every window removed: the credit windows give."""
    from kvbench.policies import Full

    def kv(s):
        acc = memory.account(s, [max(lengths)], Full(), max_new_tokens=cfg.gen.max_new_tokens,
                             prefill_chunk=cfg.gen.prefill_chunk)
        return sum(f.kv_cache for f in acc.devices.values())

    windows = [w for w in shape.windows if w is not None]
    return {"attention_kinds": f"{len(windows)} of {len(shape.windows)} layers windowed (W={sorted(set(windows))})"
            if windows else "full attention in every layer",
            "kv_bytes_one_sample": kv(shape), "kv_bytes_one_sample_without_windows": kv(replace(shape, windows=()))}


def prepare(cfg: DictConfig):
    """(node, spec, meta model, placed ModelShape, prompt lengths, their source) of a checked config."""
    node = node_of(cfg)
    spec = spec_of(cfg, node)
    model = spec.meta_model()
    shape = placed_shape(model, placement(model, spec, node))
    lengths, source = prompt_lengths(cfg, spec)
    return node, spec, model, shape, lengths, source


def headroom(shape, node: Node, lengths: list[int], policy, backend: str, cfg: DictConfig, b: int) -> int:
    """Bytes left on the fullest device (budget less accounted peak, reserve ignored) at batch size b: the
    largest memory.reserve_gb (in bytes) under which b still fits."""
    longest = sorted(lengths, reverse=True)
    acc = memory.account(shape, [longest[i % len(longest)] for i in range(b)], policy,
                         max_new_tokens=cfg.gen.max_new_tokens, prefill_chunk=cfg.gen.prefill_chunk,
                         score_chunk=cfg.gen.score_chunk, attention=backend)
    return min(node.budget[d] - f.total for d, f in acc.devices.items())


def plan(cfg: DictConfig) -> dict:
    """Make the plan, append its record, return it."""
    t0 = time.perf_counter()
    validate(cfg)
    check(cfg)
    node, spec, model, shape, lengths, source = prepare(cfg)
    from kvbench.models.family import check_policy

    for _, policy in plan_policies(cfg):  # a policy with nothing to compress (every layer windowed) is refused
        check_policy(spec.config, policy, max(lengths) + cfg.gen.max_new_tokens)
    candidates = search_candidates(cfg)
    rows = []
    for backend in cfg.plan.backends:
        for method, policy in plan_policies(cfg):
            found = search.search(candidates, trial(shape, node, lengths, policy, backend, cfg))
            best = next((t for t in found.trials if t.batch_size == found.max_batch_size), None)
            rows.append({
                "attention": backend, "method": method, "policy": policy.name, "kv_size": policy.kv_size,
                "max_batch_size": found.max_batch_size, "first_oom_batch_size": found.first_oom_batch_size,
                "peak_bytes": best.peak_mem_bytes if best else None,  # the fullest device's, at the largest batch
                "trials": [t.__dict__ for t in found.trials],
            })
    n_params = sum(p.numel() for p in model.parameters())
    kv = window_credit(shape, lengths, cfg)
    started = dt.datetime.now(dt.timezone.utc)
    chash = config_hash(cfg)
    from kvbench.runner import git_sha

    record = {
        "run_id": f"{started:%Y%m%d-%H%M%S}-plan-{chash[:8]}-{uuid.uuid4().hex[:4]}",
        "config_hash": f"plan-{chash}",  # never the identity of a run: skip_existing must not take it for one
        "started_at": started.isoformat(timespec="seconds"),
        "kvbench_version": kvbench.__version__,
        "git_sha": git_sha(),
        "mode": "plan",
        "status": "ok",
        "error": None,
        "experiment": cfg.experiment_name,
        "model": cfg.model.name,
        "task": build_task(cfg).name,
        "n_samples": len(lengths),
        "max_new_tokens": cfg.gen.max_new_tokens,
        "seed": cfg.seed,
        "device": node.describe(),
        "plan": {
            "node": {"budget_bytes": node.budget, "usable_bytes": node.usable, "reserve_gb": cfg.memory.reserve_gb,
                     "max_memory": node.max_memory},
            "model": {"dtype": str(spec.dtype).removeprefix("torch."), "parameters": n_params,
                      "weights_bytes": shape.weights, "layers": shape.layers, **kv},
            "prompts": {"source": source, "tokens_max": max(lengths), "tokens_min": min(lengths), "n": len(lengths)},
            "candidates": candidates,
            "rows": rows,
            "seconds": round(time.perf_counter() - t0, 2),
        },
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    results.append_record(cfg.results_dir, record)
    return record


def table(record: dict) -> str:
    """The plan as a text table (one line per backend and policy)."""
    p = record["plan"]
    layers = " / ".join(f"{d} {n}" for d, n in sorted(p["model"]["layers"].items()))
    weights = " / ".join(f"{w / memory.GiB:.2f}" for _, w in sorted(p["model"]["weights_bytes"].items()))
    kv, plain = p["model"]["kv_bytes_one_sample"], p["model"]["kv_bytes_one_sample_without_windows"]
    lines = [
        f"kvbench-plan: {record['model']} ({p['model']['dtype']}, {p['model']['parameters'] / 1e9:.2f}B parameters)"
        f" on {record['device']}, reserve {p['node']['reserve_gb']:g} GiB per device",
        f"  layers {layers}; weights {weights} GiB; {p['model']['attention_kinds']}",
        f"  full KV cache of one longest sample: {kv / 2**20:.1f} MiB"
        + (f" ({plain / 2**20:.1f} MiB if no layer had a window)" if plain != kv else ""),
        f"  {record['task']}: prompts {p['prompts']['tokens_min']}-{p['prompts']['tokens_max']} tokens"
        f" ({p['prompts']['source']}), {record['max_new_tokens']} new tokens; batch sizes from {len(p['candidates'])}"
        " candidates",
        "",
        f"{'attention':<10}{'method':<8}{'kv':>6}{'b':>6}{'b0':>6}  peak at b (fullest device)",
    ]
    for r in p["rows"]:
        peak = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / memory.GiB:.2f} GiB"
        lines.append(f"{r['attention']:<10}{r['method']:<8}{r['kv_size'] or '-':>6}{r['max_batch_size'] or '-':>6}"
                     f"{r['first_oom_batch_size'] or '-':>6}  {peak}")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------- command
def preflight(argv: list[str]) -> None:
    """Compose and check every job of the command line (no model, no tokenizer)."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from kvbench.cli import HELP_FLAGS, split_argv

    overrides, multirun, config_name, runs = split_argv(argv)
    if any(a in HELP_FLAGS for a in argv):
        return
    parsed = OverridesParser.create().parse_overrides(overrides)
    jobs = [j for batch in BasicSweeper.split_arguments(parsed, None) for j in batch] if multirun else [overrides]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="kvbench-plan"):
        for job in jobs:
            cfg = compose(config_name=config_name, overrides=list(job))
            if runs:
                validate(cfg)
                check(cfg)


def main(argv: list[str] | None = None) -> None:
    from kvbench.cli import checked

    argv = list(sys.argv[1:] if argv is None else argv)
    checked(preflight, argv, "kvbench-plan")
    import hydra

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
    def app(cfg) -> None:
        try:
            record = plan(cfg)
        except ConfigError as e:
            print(f"kvbench-plan: error: {e}", file=sys.stderr)
            sys.exit(2)
        print(table(record), flush=True)
        summary = [{k: r[k] for k in ("attention", "method", "kv_size", "max_batch_size", "first_oom_batch_size")}
                   for r in record["plan"]["rows"]]
        print("kvbench-plan:", json.dumps({"run_id": record["run_id"], "rows": summary}), flush=True)

    sys.argv = [sys.argv[0], *argv]
    app()


if __name__ == "__main__":
    main()
