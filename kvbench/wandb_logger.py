"""logger=wandb: each run's record to Weights & Biases, offline unless the user has configured W&B.

One W&B run per kvbench run, opened once the record is on disk: the resolved config (plus the
record's identity under `kvbench.*`: policy, kv_size, batch_size, task, model, ...) as the run's
config, the record's metrics, timings, memory and search result as its summary, the predictions as
a table. Runs are grouped by experiment (`experiment_name`; otherwise model-task) and named
policy/kv/batch, e.g. `batch_max/kv1024/b32`.

Mode: `logger.mode` if set, else WANDB_MODE if set, else online when an API key is configured
(WANDB_API_KEY, or the ~/.netrc entry `wandb login` writes), else offline: the run lands in
`logger.dir`/wandb/offline-run-*, to upload later with `wandb sync`. A W&B failure is a warning,
never a failed run, and `wandb.finish()` always runs.

Online without a network: before the run (`start`), when the mode is online, W&B's server
(WANDB_BASE_URL, default https://api.wandb.ai) must give an HTTP answer within
`logger.init_timeout` seconds (also W&B's own init timeout); if it does not, the run logs offline,
this is said once per process, and the record's `logger` field says so (`mode: offline`,
`requested: online`, `note`). Without it each run would wait out W&B's own init timeout (~100 s).
"""

from __future__ import annotations

import logging
import netrc
import os
from pathlib import Path
from urllib.parse import urlsplit

log = logging.getLogger("kvbench")

IDENTITY = ("run_id", "config_hash", "experiment", "mode", "model", "weights", "task", "policy", "kv_size", "kv_ratio", "compression_ratio",
            "evict_every", "schedule", "batch_size", "n_samples", "max_new_tokens", "seed", "device", "attention",
            "extensions", "ignored_keys", "kvbench_version", "git_sha")
SUMMARY = ("status", "error", "oom_kind", "throughput_tok_s", "prefill_s", "decode_s", "wall_s", "evict_s",
           "attn_stats_s", "score_pass_s", "generated_tokens", "peak_kv_bytes", "decode_kv_bytes_mean",
           "decode_kv_bytes_peak", "kv_kept_share", "peak_mem_bytes", "accounted_mem_bytes")
NESTED = ("kv_budget", "serve", "serve_limits")  # record fields whose scalars (and percentiles) go to the summary as "field/key"
LEFT_OUT = ("timeline", "plot_path")  # per-step series and file paths: not summary values


def configured() -> bool:
    """Whether the user has W&B credentials (then runs go online)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(Path(os.environ.get("NETRC") or "~/.netrc").expanduser()).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def resolve_mode(mode: str | None) -> str | None:
    """The mode to pass to wandb.init; None lets W&B read WANDB_MODE."""
    if mode or os.environ.get("WANDB_MODE"):
        return mode
    return "online" if configured() else "offline"


DEFAULT_URL = "https://api.wandb.ai"
_reachable: dict[str, bool] = {}  # server URL -> answered (checked once per process)
_said: set[str] = set()  # server URLs whose offline fallback was already announced


def server_url() -> str:
    return os.environ.get("WANDB_BASE_URL") or DEFAULT_URL


def reachable(url: str, timeout: float) -> bool:
    """Whether the W&B server at `url` gives any HTTP answer within `timeout` s; cached per process."""
    from kvbench.net import answers

    if url not in _reachable:
        _reachable[url] = answers(url.rstrip("/") + "/healthz", timeout)
    return _reachable[url]


def run_name(record: dict) -> str:
    kv = [f"kv{record['kv_size']}"] if record.get("kv_size") is not None else (
        [f"ratio{record['kv_ratio']:g}"] if record.get("kv_ratio") is not None else [])
    last = "serve" if record.get("mode") == "serve" else f"b{record.get('batch_size')}"
    return "/".join([str(record.get("policy")), *kv, last])


def summary(record: dict) -> dict:
    """The record's outcome as W&B summary values: SUMMARY, its metrics, the search's result, and the
    scalars of its budgets and serving metrics (`kv_budget/min`, `serve/ttft_s/p90`, ...)."""
    out = {k: record.get(k) for k in SUMMARY}
    out.update(record.get("metrics") or {})
    search = record.get("search") or {}
    for k in ("max_batch_size", "first_oom_batch_size"):
        if k in search:
            out[f"search/{k}"] = search[k]
    for field in NESTED:
        for k, v in (record.get(field) or {}).items():
            if k in LEFT_OUT:
                continue
            if isinstance(v, dict):
                out.update({f"{field}/{k}/{q}": x for q, x in v.items()})
            else:
                out[f"{field}/{k}"] = v
    return out


def predictions_table(rows: list[dict]):
    import wandb

    metrics = sorted({k for r in rows for k in (r.get("score") or {})})
    columns = ["index", "prompt_tokens", "prompt", "prediction", "references", *metrics]
    data = [
        [r.get("index"), r.get("prompt_tokens"), r.get("prompt"), r.get("prediction"),
         "\n".join(map(str, r.get("references") or [])), *((r.get("score") or {}).get(m) for m in metrics)]
        for r in rows
    ]
    return wandb.Table(columns=columns, data=data)


class WandbLogger:
    """Logs one kvbench run to W&B (see the module docstring); fields are the `logger.*` keys."""

    def __init__(self, project: str = "kvbench", entity: str | None = None, mode: str | None = None,
                 dir: str | None = None, tags: list[str] | None = None, log_predictions: bool = True,
                 init_timeout: float = 5.0):
        self.project, self.entity, self.mode, self.dir = project, entity, mode, dir
        self.tags, self.log_predictions, self.init_timeout = list(tags or []), log_predictions, init_timeout
        self.used_mode: str | None = None  # set by start(): the mode handed to wandb.init

    def start(self) -> dict:
        """Decide the mode before the run: online falls back to offline when W&B cannot be reached."""
        mode = resolve_mode(self.mode)
        requested = mode or os.environ.get("WANDB_MODE") or "online"
        self.used_mode, out = mode, {"name": "wandb", "mode": requested}
        if requested == "online" and not reachable(server_url(), self.init_timeout):
            note = (f"logger=wandb: {server_url()} did not answer within {self.init_timeout:g} s: "
                    "logging offline (upload later with `wandb sync`)")
            if server_url() not in _said:
                _said.add(server_url())
                log.warning(note)
            self.used_mode = "offline"
            out.update(mode="offline", requested="online", note=note)
        return out

    def log_run(self, record: dict, predictions: list[dict], config: dict) -> None:
        if self.used_mode is None:
            self.start()
        try:
            import wandb
        except ImportError as e:
            log.warning("logger=wandb: wandb is not installed (%s); the run's record is saved", e)
            return
        try:
            if self.dir:
                Path(self.dir).mkdir(parents=True, exist_ok=True)
            run = wandb.init(
                project=self.project,
                entity=self.entity,
                group=record.get("experiment") or f"{record.get('model')}-{record.get('task')}",
                job_type=str(record.get("task")),
                name=run_name(record),
                config={**config, "kvbench": {k: record.get(k) for k in IDENTITY}},
                tags=[*self.tags, str(record.get("policy")), str(record.get("status"))],
                mode=self.used_mode,
                dir=self.dir,
                settings=wandb.Settings(console="off", init_timeout=self.init_timeout),
            )
            run.summary.update(summary(record))
            if self.log_predictions and predictions:
                run.log({"predictions": predictions_table(predictions)})
        except Exception as e:  # W&B never fails a run: its record is already on disk
            log.warning("logger=wandb failed (the run's record is saved): %s: %s", type(e).__name__, e)
        finally:
            try:
                wandb.finish()
            except Exception as e:
                log.warning("wandb.finish failed: %s: %s", type(e).__name__, e)
