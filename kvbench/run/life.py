"""One run's life cycle: check, build, claim, load, run its mode, record whatever happened.

Before anything loads, `prepare` and `kvbench.config.preflight` check everything that needs no model. Then the
record is written whatever happens (status "ok", "oom", "error" or "interrupted"), predictions first
(kvbench.run.store), so a crash or an OOM in one run of a sweep loses nothing already written. One
exception: bad input found only once the model is loaded (a ConfigError, e.g. `ModelDoesNotFit`: a memory
limit below the model's own weights) is not a measurement; it leaves no record and is raised.
"""

from __future__ import annotations

import logging
import traceback

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from kvbench import memory, results
from kvbench.config import build_policy, build_task, drop_inapplicable, preflight, prepare
from kvbench.errors import ConfigError
from kvbench.memory import is_oom
from kvbench.models import family
from kvbench.models.loaded import LoadedModel
from kvbench.quant.qconfig import kv_quant
from kvbench.run import models, modes
from kvbench.run.record import memory_fields, new_record, quant_extensions, task_extensions
from kvbench.run.signals import SIGNALS, TermGuard, Terminated
from kvbench.run.store import save
from kvbench.scoring import prompt_stats

log = logging.getLogger("kvbench")


def run(cfg: DictConfig, lm: LoadedModel | None = None, sweep: bool = False) -> dict:
    """Run one configuration and append its record; returns the record (also on oom / error).

    The policy keys its policy does not use are reset to the policy's defaults and named in the record's
    `ignored_keys` (not part of its identity): in a sweep (`sweep`) any of them, before validation (full in
    `-m policy=full,h2o policy.kv_size=128`); in a single run only what validation accepts (a budget for full
    is refused there).

    Bad input (a ConfigError: from the preflight, or found once the model is loaded, such as a memory limit
    below its weights) leaves no record and is raised. SIGTERM and SIGINT leave an `interrupted` record,
    then stop the process (exit code 143 / 130). RecordNotWritten: the results folder failed after the
    run; everything went to a rescue folder it names.
    """
    ignored = drop_inapplicable(cfg) if sweep else []
    prepare(cfg)
    ignored = ignored or drop_inapplicable(cfg)
    prompts = preflight.check_run(cfg)  # no model: the results folder, the model's files, prompts, serve's pool
    policy, task = build_policy(cfg), build_task(cfg)
    record = new_record(cfg, policy, task)
    record["ignored_keys"] = ignored
    memory_limit = memory.memory_limit_of(cfg)
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
        record["extensions"] = policy.describe(paged=serve_mode)["extensions"] + task_extensions(task, cfg.gen.max_new_tokens)
        logger = instantiate(cfg.logger)
        record["logger"] = logger.start()
        if record["logger"] and record["logger"].get("note"):
            record["notes"].append(record["logger"]["note"])
        samples = ids = None
        if cfg.mode not in modes.NO_MODEL:
            torch.manual_seed(cfg.seed)
            lm = models.load_within(cfg, memory_limit, lm)
            samples, ids = _prompts(cfg, record, lm, policy, task, prompts, serve_mode)
        rows = modes.MODES[cfg.mode](cfg, record, lm, policy, task, samples, ids, memory_limit)
    except ConfigError:  # bad input found once the model is loaded (a budget below its weights...): no record
        recorded = False
        raise
    except Exception as e:  # recorded, never lost; the caller decides whether to re-raise
        _failed(record, e, lm)
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


def _prompts(cfg: DictConfig, record: dict, lm: LoadedModel, policy, task, prompts: list[int] | None,
             serve_mode: bool) -> tuple[list, list[list[int]]]:
    """The task's samples and token ids with the loaded tokenizer; fills the record's model family, the
    layers the policy compresses (windowed layers keep their window) and the prompts' statistics."""
    samples = task.samples(lm.tokenizer)
    ids = [task.encode(lm.tokenizer, s.prompt) for s in samples]
    kinds = lm.kinds  # the run's one family check: the preflight's, or here (the engine trusts checked kinds)
    if not (preflight.family_checked(cfg, prompts) and [len(x) for x in ids] == prompts):
        family.check_policy(lm.model.config, policy, max(map(len, ids), default=0) + cfg.gen.max_new_tokens, kinds)
    record["model_family"] = f"{kinds.family}: {kinds.describe()}"
    described = policy.describe(gqa=kinds.gqa, paged=serve_mode)
    record["extensions"] = described["extensions"] + task_extensions(task, cfg.gen.max_new_tokens)
    record["extensions"] += quant_extensions(kv_quant(cfg.gen), serve=cfg.mode == "serve")
    windows, bands = family.split_windows(kinds.windows, max(map(len, ids), default=0) + cfg.gen.max_new_tokens,
                                          policy.kv_size if policy.evicts else None)
    record["compressed_layers"] = [i for i, w in enumerate(windows) if w is None and i not in kinds.linear] \
        if policy.evicts else []
    if kinds.state is not None:  # a hybrid: its linear layers hold a fixed state per sequence, never evicted
        record["state_bytes_per_sequence"] = kinds.state.bytes_per_sequence(lm.model.dtype)
        if policy.evicts:
            record["extensions"].append(f"linear-attention layers {list(kinds.linear)} keep their whole state (nothing "
                                        "to evict); each prompt's blocks run on one axis, as if left-padded to the longest prompt, split "
                                        "where another prompt's block ends")
    if any(bands):
        record["extensions"].append(
            f"windowed layers {[i for i, b in enumerate(bands) if b]} are compressed too (budget kv_size="
            f"{policy.kv_size} below their window): each query still sees only the kept pairs inside its window, "
            "and pairs outside every later query's window are evicted first")
    if policy.evicts and any(w is not None for w in windows):
        n = len(record["compressed_layers"])
        per_layer = f" ({described['budgets']}: over these {n} layers)" if "budgets" in described else ""
        record["extensions"].append(
            f"windowed layers {[i for i, w in enumerate(windows) if w is not None]} keep their sliding window "
            f"as the model was trained; the policy compresses the {n} full-attention layers only{per_layer}")
    record["prompts"] = prompt_stats(samples, ids)
    if prompts is not None and [len(x) for x in ids] != prompts:  # the preflight's tokenizer is the model's
        record["notes"].append("the preflight's prompt lengths differ from the loaded tokenizer's")
    return samples, ids


def _failed(record: dict, e: Exception, lm: LoadedModel | None) -> None:
    """Fill the record of a run that raised: status oom (with the figure that did not fit) or error."""
    record["status"] = "oom" if is_oom(e) else "error"
    record["oom_kind"] = memory.oom_kind(e) if record["status"] == "oom" else None
    record["error"] = f"{type(e).__name__}: {e}"
    record["traceback"] = traceback.format_exc(limit=20)
    if record["status"] == "oom":  # the figure that did not fit: accounted (CPU) or measured (CUDA)
        record.update(memory_fields(lm, getattr(e, "account", None)))
    log.error("run %s ended with %s: %s", record["run_id"], record["status"], record["error"])
