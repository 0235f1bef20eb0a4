"""One run: config -> model, task, policy -> generation -> scores -> one record.

The runner owns the run's life cycle and its failure modes. Before anything loads, `validate` and
`kvbench.preflight` check everything that needs no model (the results folder, the model's files, the
prompts, serve's pool). Then the record is written whatever happens (status "ok", "oom", "error" or
"interrupted"), predictions first, so a crash or an OOM in one run of a sweep loses nothing already
written; when the results folder itself fails at the end (a disk filling up), everything goes to a
rescue folder that `RecordNotWritten` names. One exception: bad input found only once the model is
loaded (a ConfigError, e.g. `ModelDoesNotFit`: a memory budget below the model's own weights) is not a
measurement; it leaves no record and the CLI reports it in one line with exit code 2, like a bad override.

Memory (kvbench.memory): `memory.budget_gb` caps every GPU before the model loads and is checked
against the weights once they are loaded; with `search.max_batch=true` the batch size comes from
kvbench.search (`search.only=true` records the search and stops). The record carries the accounted
peak and, on CUDA, `max_memory_allocated` per device (`peak_mem_bytes` = measured on CUDA,
accounted on CPU) and `max_memory_reserved` (`peak_reserved_bytes_per_device`: what the CUDA cap limits). Loaded models are kept for the next run of the same process
(Hydra's basic launcher runs a sweep's jobs in one process), keyed by the model config.
"""

from __future__ import annotations

import datetime as dt
import functools
import gc
import logging
import signal
import subprocess
import tempfile
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import kvbench
from kvbench import engine, memory, preflight, results, search
from kvbench.attention import resolve_backend
from kvbench.config import SERVE_MODES, build_policy, build_task, config_hash, drop_inapplicable, validate
from kvbench.errors import ConfigError, OutOfMemory
from kvbench.memory import is_oom
from kvbench.models import family, weights_format
from kvbench.models.base import LoadedModel, resolve_device
from kvbench.scoring import predictions, prompt_stats, score_rows
from kvbench.serve import run as serve_run

log = logging.getLogger("kvbench")
_models: dict[str, LoadedModel] = {}


@functools.lru_cache(maxsize=1)
def git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(kvbench.__file__).parent, capture_output=True, text=True, timeout=5
        )
        sha = out.stdout.strip()
        return sha if len(sha) == 40 else None
    except (OSError, subprocess.SubprocessError):
        return None


def load_model(cfg: DictConfig) -> LoadedModel:
    """The model of `cfg`, reused if this process already loaded it (only one is kept)."""
    key = f"{OmegaConf.to_yaml(cfg.model)}|{cfg.device}"
    if key not in _models:
        _models.clear()
        gc.collect()
        _models[key] = instantiate(cfg.model, device=cfg.device, _convert_="all")
    return _models[key]


def load_within(cfg: DictConfig, budget: memory.Budget | None, lm: LoadedModel | None = None) -> LoadedModel:
    """The model (loaded under the budget's CUDA cap unless given); ModelDoesNotFit if its weights exceed it."""
    memory.apply_cuda_cap(budget)
    if lm is None:
        try:
            lm = load_model(cfg)
        except Exception as e:
            if budget is None or not is_oom(e):
                raise
            raise memory.ModelDoesNotFit(
                "memory.budget_gb", "the model alone does not fit: loading it ran out of memory", budget.gb
            ) from None
    if budget is not None:
        budget.check_weights(lm.model)
    return lm


def memory_fields(lm: LoadedModel | None, acc: memory.Account | None) -> dict:
    """Record fields: accounted peak, and measured peak (CUDA) or the accounted one (CPU), per device."""
    accounted = acc.per_device() if acc is not None else {}
    devices = memory.cuda_devices(lm.model) if lm is not None else []
    measured = memory.measured_peaks(devices) if devices else accounted
    return {
        "peak_mem_bytes": sum(measured.values()) if measured else None,
        "peak_mem_bytes_per_device": measured or None,
        "peak_reserved_bytes_per_device": memory.reserved_peaks(devices) if devices else None,  # CUDA only
        "accounted_mem_bytes": acc.total if acc is not None else None,
        "accounted_mem_bytes_per_device": accounted or None,
    }


def task_extensions(task) -> list[str]:
    """The task's departures from its published definition (RULER's), and a query-agnostic run said as one."""
    ext = list(task.describe().get("extensions", []))
    if not getattr(task, "query_aware", True):
        ext.append("task: query_aware=false: the context is compressed before the question is prefilled "
                   "(kvpress's protocol)")
    return ext


def warmup_of(cfg: DictConfig, model) -> bool:
    """gen.warmup, or when null: on CUDA (lazy init, cuBLAS setup, flash's first call kept out of the timings)."""
    w = cfg.gen.get("warmup")
    return bool(w) if w is not None else model.device.type == "cuda"


def new_record(cfg: DictConfig, policy, task) -> dict:
    started = dt.datetime.now(dt.timezone.utc)
    chash = config_hash(cfg)
    return {
        "run_id": f"{started:%Y%m%d-%H%M%S}-{chash[:8]}-{uuid.uuid4().hex[:4]}",
        "config_hash": chash,
        "started_at": started.isoformat(timespec="seconds"),
        "kvbench_version": kvbench.__version__,
        "git_sha": git_sha(),
        "status": "error",
        "error": None,
        "oom_kind": None,  # with status oom: "accounted" (final) or "measured" (retried once by skip_existing)
        "experiment": cfg.experiment_name,
        "mode": cfg.mode,
        "model": cfg.model.name,
        "weights": weights_format(cfg),
        "task": task.name,
        "query_aware": getattr(task, "query_aware", True),  # false: the context compressed before the question
        "policy": policy.name,
        "kv_size": policy.kv_size,
        "kv_ratio": policy.kv_ratio,
        "compression_ratio": policy.compression_ratio,
        "kv_budget": None,  # {"by": kv_size | kv_ratio, "min", "max", "per_layer"}: the budgets a (layer, sample) held
        "evict_every": policy.evict_every if policy.evicts and cfg.mode not in SERVE_MODES and not policy.once else None,
        "schedule": policy.schedule if policy.evicts else None,
        "batch_size": cfg.batch_size if cfg.mode not in SERVE_MODES else None,  # serve: the scheduler batches
        "n_samples": task.n_samples,
        "max_new_tokens": cfg.gen.max_new_tokens,
        "seed": cfg.seed,
        "device": str(resolve_device(cfg.device)),
        "metrics": {},
        "throughput_tok_s": None,
        "prefill_s": None,
        "decode_s": None,
        "wall_s": None,
        "evict_s": None,
        "attn_stats_s": None,
        "generated_tokens": None,
        "output_tokens": None,
        "peak_kv_bytes": None,
        "peak_mem_bytes": None,
        "peak_mem_bytes_per_device": None,
        "peak_reserved_bytes_per_device": None,
        "accounted_mem_bytes": None,
        "accounted_mem_bytes_per_device": None,
        "search": None,
        "attention": None,  # the attention backend really used (kvbench.attention.resolve), once the model is loaded
        "model_family": None,  # the model's family and attention kinds (kvbench.models.family), once it is loaded
        "compressed_layers": None,  # the decoder layers the policy compressed (windowed layers keep their window)
        "extensions": [],
        "ignored_keys": [],  # policy keys this run's policy does not use, reset to its defaults (kvbench.config)
        "notes": [],
        "logger": None,
        "prompts": None,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "predictions_path": None,
        "scores_path": None,
    }


def execute(
    cfg: DictConfig, record: dict, lm: LoadedModel, policy, task, samples, ids, batch_size: int,
    budget: memory.Budget | None = None,
) -> list[dict]:
    """Generate, score and fill `record`; returns the prediction rows."""
    memory.reset_peaks(memory.cuda_devices(lm.model))
    out = engine.generate(
        lm.model,
        lm.tokenizer,
        ids,
        policy,
        batch_size=batch_size,
        max_new_tokens=cfg.gen.max_new_tokens,
        eos_token_ids=lm.eos_token_ids,
        ignore_eos=cfg.gen.ignore_eos,
        prefill_chunk=cfg.gen.prefill_chunk,
        score_chunk=cfg.gen.score_chunk,
        progress=True,
        budget=budget,
        warmup=warmup_of(cfg, lm.model),
        attention=cfg.gen.attention,
        question_tokens=question_tokens(task, lm, samples, ids),
    )
    rows, metrics, lengths = predictions(task, samples, ids, out.token_ids, lm, cfg.output.save_prompt_ids)
    record.update(
        status="ok",
        metrics=metrics,
        output_tokens=lengths,
        throughput_tok_s=out.throughput_tok_s,
        prefill_s=out.prefill_s,
        decode_s=out.decode_s,
        wall_s=out.wall_s,
        evict_s=out.evict_s,
        attn_stats_s=out.attn_stats_s,
        generated_tokens=out.generated_tokens,
        peak_kv_bytes=out.peak_kv_bytes,
        kv_budget=None if out.budget_min is None else {
            "by": policy.per_prompt or "kv_size",
            "min": out.budget_min, "max": out.budget_max, "per_layer": out.budget_per_layer},
        **memory_fields(lm, out.accounted),
    )
    return rows


def question_tokens(task, lm: LoadedModel, samples, ids) -> list[int] | None:
    """Query-agnostic runs (task.query_aware=false): each prompt's question tokens, prefilled after compression."""
    if getattr(task, "query_aware", True):
        return None
    return [task.question_tokens(lm.tokenizer, s, x) for s, x in zip(samples, ids, strict=True)]


def find_batch_size(cfg: DictConfig, record: dict, lm: LoadedModel, policy, ids, budget) -> int:
    """search.max_batch: record the search, return the batch size it found (OutOfMemory if none fits).

    When nothing fits, the record's batch size is the smallest one tried (the one that ran out).
    """
    result = search.max_batch(cfg, lm, policy, ids, budget)
    record.update(search=result.to_record(), batch_size=result.max_batch_size or result.first_oom_batch_size)
    if result.max_batch_size is None:
        kind = result.trials[-1].oom_kind  # the smallest candidate's trial (the search stops there)
        raise OutOfMemory(f"search: not even batch size {result.first_oom_batch_size} fits", kind=kind)
    best = next(t for t in result.trials if t.batch_size == result.max_batch_size)  # a search.only record's peak;
    record.update(peak_mem_bytes=best.peak_mem_bytes, accounted_mem_bytes=best.accounted_mem_bytes)  # a run's replaces it
    return result.max_batch_size


class Terminated(BaseException):
    """SIGTERM (what SLURM and most schedulers send) or SIGINT (Ctrl-C) during a run; `args[0]` names it."""


SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}


@dataclass
class TermGuard:
    """SIGTERM and SIGINT during one run: raise Terminated (once) while the run works; while its record is
    written (`defer`) they wait; `uninstall` then stops the process quietly (exit code 128 + the signal's
    number: 143 for SIGTERM, 130 for SIGINT) if one came."""

    defer: bool = False
    fired: int | None = None  # the signal that came
    previous: dict = field(default_factory=dict)

    def install(self) -> TermGuard:
        if _main_thread():  # signal handlers live in the main thread only
            self.previous = {sig: signal.signal(sig, self.handler) for sig in SIGNALS}
        return self

    def handler(self, signum, frame) -> None:
        if self.fired is None:
            self.fired = signum
            if not self.defer:
                raise Terminated(SIGNALS[signum])

    def uninstall(self) -> None:
        for sig, previous in self.previous.items():
            signal.signal(sig, previous)
        self.previous = {}
        if self.fired is not None:
            raise SystemExit(128 + self.fired)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def fit_batch_size(record: dict, batch_size: int, n: int) -> int:
    """A fixed batch larger than the data runs (and is recorded) at the data's size, with a warning."""
    if batch_size > n:
        note = f"batch_size={batch_size} is larger than the {n} samples: ran and recorded batch size {n}"
        log.warning(note)
        record["notes"].append(note)
        batch_size = n
    record["batch_size"] = batch_size
    return batch_size


class RecordNotWritten(OSError):
    """The results folder failed after the run (a disk filling up): the record and predictions went to `rescue`."""

    def __init__(self, message: str, rescue: Path):
        super().__init__(message)
        self.rescue = rescue


def rescue_dir(run_id: str) -> Path:
    """Where a run's files go when its results folder cannot take them: the temp folder, else the home folder."""
    for root in (Path(tempfile.gettempdir()), Path.home()):
        path = root / "kvbench-rescue" / run_id
        try:
            path.mkdir(parents=True, exist_ok=True)
            return path
        except OSError:
            continue
    raise OSError("no writable folder for the rescued record (temp and home folders both failed)")


def save(cfg: DictConfig, record: dict, rows: list[dict], claim) -> None:
    """Predictions, scores, then the record, into results_dir; what fails goes to `rescue_dir`, never lost
    (RecordNotWritten says where, once everything is written somewhere)."""
    failed, rescue = [], None

    def place(kind: str, name: str) -> Path:
        return Path(cfg.results_dir) / kind / name if rescue is None else rescue / name

    for kind, data, key in (("predictions", rows, "predictions_path"), ("scores", score_rows(rows) if rows else [],
                                                                        "scores_path")):
        if not rows:
            break
        name = f"{record['run_id']}.jsonl" if rescue is None else f"{kind}.jsonl"
        try:
            record[key] = str(results.write_jsonl(place(kind, name), data))
        except OSError as e:
            failed.append(f"{place(kind, name)}: {e.strerror or e}")
            rescue = rescue or rescue_dir(record["run_id"])
            record[key] = str(results.write_jsonl(rescue / f"{kind}.jsonl", data))
    if rescue is not None:
        record["notes"].append(f"the results folder failed ({'; '.join(failed)}): files written to {rescue}")
    try:
        results.append_record(cfg.results_dir, record, release=claim)
    except OSError as e:
        failed.append(f"{Path(cfg.results_dir) / results.RUNS}: {e.strerror or e}")
        rescue = rescue or rescue_dir(record["run_id"])
        record["notes"].append(f"the record could not be appended ({failed[-1]}): written to {rescue}")
        results.append_record(rescue, record)
    if failed:
        raise RecordNotWritten(f"could not write {'; '.join(failed)}: the run's record and predictions are in "
                               f"{rescue}", rescue)


def run_static(cfg: DictConfig, record: dict, lm: LoadedModel, policy, task, samples, ids, budget) -> list[dict]:
    """mode=run: static batches (a fixed batch size, or the largest the search finds), then scores."""
    record["attention"] = resolve_backend(cfg.gen.attention, lm.model, policy.needs_attention)
    batch_size = fit_batch_size(record, cfg.batch_size, len(ids))
    if cfg.search.max_batch:
        batch_size = find_batch_size(cfg, record, lm, policy, ids, budget)
    if cfg.search.max_batch and cfg.search.only:
        record["status"] = "ok"
        return []
    return execute(cfg, record, lm, policy, task, samples, ids, batch_size, budget)


def prompt_report(cfg: DictConfig, record: dict, lm: LoadedModel, policy, task, samples, ids, budget) -> list[dict]:
    """mode=prompt_report: the prompts' statistics alone (already in the record); nothing is generated."""
    record["status"] = "ok"
    return []


# mode -> what runs it, all with one signature: (cfg, record, lm, policy, task, samples, ids, budget) -> rows
MODES = {"run": run_static, "serve": serve_run.execute, "prompt_report": prompt_report,
         "serve_limits": serve_run.execute_limits}
NO_MODEL = ("serve_limits",)  # modes that count without loading the model


def run(cfg: DictConfig, lm: LoadedModel | None = None, sweep: bool = False) -> dict:
    """Run one configuration and append its record; returns the record (also on oom / error).

    The policy keys its policy does not use are reset to the policy's defaults and named in the record's
    `ignored_keys` (not part of its identity): in a sweep (`sweep`) any of them, before validation (full in
    `-m policy=full,h2o policy.kv_size=128`); in a single run only what validation accepts (a budget for full
    is refused there).

    Bad input (a ConfigError: from the preflight, or found once the model is loaded, such as a budget
    below its weights) leaves no record and is raised. SIGTERM and SIGINT leave an `interrupted` record,
    then stop the process (exit code 143 / 130). RecordNotWritten: the results folder failed after the
    run; everything went to a rescue folder it names.
    """
    ignored = drop_inapplicable(cfg) if sweep else []
    validate(cfg)
    ignored = ignored or drop_inapplicable(cfg)
    prompts = preflight.check_run(cfg)  # no model: the results folder, the model's files, prompts, serve's pool
    policy, task = build_policy(cfg), build_task(cfg)
    record = new_record(cfg, policy, task)
    record["ignored_keys"] = ignored
    budget = memory.budget_of(cfg)
    claim = None
    if cfg.skip_existing:
        claim = results.claim(cfg.results_dir, record["config_hash"])
        if claim.done is not None:
            done = claim.done
            log.info("skip: %s already recorded as %s (%s)", record["config_hash"], done["status"], done.get("run_id"))
            return done
        if claim.held_by is not None:
            log.info("skip: %s is being run by %s", record["config_hash"], claim.held_by)
            record.update(status="claimed", error=f"claimed by {claim.held_by}")
            return record
    rows: list[dict] = []
    recorded = True
    logger = None
    serve_mode = cfg.mode in ("serve", "serve_limits")
    term = TermGuard().install()
    try:
        record["extensions"] = policy.describe(paged=serve_mode)["extensions"] + task_extensions(task)
        logger = instantiate(cfg.logger)
        record["logger"] = logger.start()
        if record["logger"] and record["logger"].get("note"):
            record["notes"].append(record["logger"]["note"])
        samples = ids = None
        if cfg.mode not in NO_MODEL:
            torch.manual_seed(cfg.seed)
            lm = load_within(cfg, budget, lm)
            kinds = family.check_policy(lm.model.config, policy)
            record["model_family"] = f"{kinds.family}: {kinds.describe()}"
            record["extensions"] = policy.describe(gqa=kinds.gqa, paged=serve_mode)["extensions"] + task_extensions(task)
            samples = task.samples(lm.tokenizer)
            ids = [task.encode(lm.tokenizer, s.prompt) for s in samples]
            windows = kinds.windows_for(max(map(len, ids), default=0) + cfg.gen.max_new_tokens)
            record["compressed_layers"] = [i for i, w in enumerate(windows) if w is None] if policy.evicts else []
            if policy.evicts and any(w is not None for w in windows):
                record["extensions"].append(
                    f"windowed layers {[i for i, w in enumerate(windows) if w is not None]} keep their sliding window "
                    f"as the model was trained; the policy compresses the {len(record['compressed_layers'])} "
                    "full-attention layers only")
            record["prompts"] = prompt_stats(samples, ids)
            if prompts is not None and [len(x) for x in ids] != prompts:  # the preflight's tokenizer is the model's
                record["notes"].append("the preflight's prompt lengths differ from the loaded tokenizer's")
        rows = MODES[cfg.mode](cfg, record, lm, policy, task, samples, ids, budget)
    except ConfigError:  # bad input found once the model is loaded (a budget below its weights...): no record
        recorded = False
        raise
    except Exception as e:  # recorded, never lost; the caller decides whether to re-raise
        record["status"] = "oom" if is_oom(e) else "error"
        record["oom_kind"] = memory.oom_kind(e) if record["status"] == "oom" else None
        record["error"] = f"{type(e).__name__}: {e}"
        record["traceback"] = traceback.format_exc(limit=20)
        if record["status"] == "oom":  # the figure that did not fit: accounted (CPU) or measured (CUDA)
            record.update(memory_fields(lm, getattr(e, "account", None)))
        log.error("run %s ended with %s: %s", record["run_id"], record["status"], record["error"])
    except BaseException as e:  # interrupted (Ctrl-C, SIGTERM): still leave a record, then stop
        record["status"] = "interrupted"
        record["error"] = f"interrupted: {e.args[0] if isinstance(e, Terminated) else type(e).__name__}"
        raise
    finally:
        term.defer = True  # the record is written whole, whatever comes
        try:
            if recorded:
                save(cfg, record, rows, claim)
        finally:
            results.release(cfg.results_dir, claim)
            if term.fired is not None:
                log.error("run %s interrupted by %s: recorded, exiting", record["run_id"], SIGNALS[term.fired])
            term.uninstall()  # after a SIGTERM / SIGINT: SystemExit(143 / 130)
    if record["status"] == "oom":
        memory.release()  # the next run of a sweep starts from the memory this one found
    if logger is not None:
        try:
            logger.log_run(record, rows, record["config"])
        except Exception as e:  # a tracker failure never fails a run
            log.warning("logger failed: %s", e)
    return record
