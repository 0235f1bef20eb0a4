"""DuoAttention (Xiao et al., ICLR 2025, arXiv 2410.10819; kvpress 0.5.5's `DuoAttentionPress`): retrieval heads
keep every pair, streaming heads only their first `sink_size` and newest `recent_size` pairs.

Each (layer, KV head) has a head score (higher = retrieval); the round(L x H_kv x head_compression_ratio) lowest
(Python's round, np.argsort over the flattened table, as kvpress; on a hybrid, L counts its attention layers only:
its linear-attention layers hold no KV heads) are streaming heads (kvbench.artifacts.
duo_patterns). The scores come from, in this order: `calibration` (a local .txt/.json/.jsonl of texts: kvpress's
on-the-fly scores, `num_samples` texts at `q_len`, kvbench.artifacts.duo_calibration; kvpress calibrates on 50
BookSum chapters from the Hub), `patterns` (a local folder or a model id in DuoAttention's published layout:
config.json with sink_size/recent_size + full_attention_heads.tsv), the model's own published pattern (kvpress's six
models), or, for a model with no name (kvbench's tiny random ones), random scores (seed 0; they mean nothing).
Resolved once per run by `prepare(tokenizer, model)` (calibrations cached per model), else at the first eviction
from the attention modules' config (every source but a calibration).
Windows: `sink_size`/`recent_size` when set, else the pattern's (published config.json), kvpress's 128/256 for
on-the-fly scores, 2/10 for the random ones.

Budget: the pattern (head rule `pattern`, layer rule `streaming`): `head_compression_ratio` is the knob;
`compression_ratio` is read as it (the leaderboard's ratio), `kv_size` and `kv_ratio` are refused. Schedules:
after_prefill, kvpress's protocol (streaming heads cut once after prefill, then every head grows while decoding);
prefill_and_decode / decode_only, DuoAttention's own rule (a streaming head evicts `evict_every` pairs whenever it
would exceed its window, retrieval heads never evict).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from kvbench.artifacts import duo_calibration, duo_patterns
from kvbench.artifacts.duo_patterns import HeadPattern
from kvbench.errors import ConfigError
from kvbench.models import family
from kvbench.policies.policy import AFTER_PREFILL, Needs, Policy, ScoreContext

TINY_WINDOWS = (2, 10)  # a nameless (test) model's random pattern: sink_size, recent_size
_CALIBRATED: dict = {}  # (file, samples, q_len, model) -> HeadPattern: one calibration per model and process


def _fingerprint(model) -> tuple:
    w = next(model.parameters())
    return id(model), model_name(model.config), float(w.detach().float().sum())


def model_name(config) -> str:
    """The model's name as from_pretrained sets it ("" for kvbench's tiny nameless models)."""
    return getattr(config, "name_or_path", "") or ""


def head_pattern(policy, config, model=None, tokenizer=None) -> HeadPattern:
    """The policy's head scores and windows for a model `config` (module docstring); a calibration needs the model."""
    name = model_name(config)
    if policy.calibration is not None:
        if model is None or tokenizer is None:
            raise RuntimeError(f"{policy.name}: calibration needs prepare(tokenizer, model) before generating "
                               "(kvbench.engine.generate calls it)")
        key = (policy.calibration, policy.num_samples, policy.q_len, *_fingerprint(model))
        if key not in _CALIBRATED:
            texts = duo_calibration.read_texts(policy.calibration, policy.num_samples)
            ids = [list(tokenizer(t)["input_ids"]) for t in texts]  # whole texts, special tokens (kvpress)
            _CALIBRATED[key] = duo_calibration.calibrate(model, ids, policy.q_len)
        pattern = _CALIBRATED[key]
    elif policy.patterns is not None or duo_patterns.known(name):
        pattern = duo_patterns.published_pattern(policy.patterns or name)
    elif not name:
        L, H = config.num_hidden_layers, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        pattern = HeadPattern(np.random.default_rng(0).random((L, H)), *TINY_WINDOWS)
    else:
        raise _no_pattern(name)
    return duo_patterns.check_shape(pattern, config)


def _no_pattern(name: str) -> ConfigError:
    return ConfigError(duo_patterns.KEY, f"no published DuoAttention pattern for model {name}: give policy.patterns "
                       "(a folder) or policy.calibration (a file of texts)")


@dataclass
class DuoAttention(Policy):
    kv_size: int | None = None
    evict_every: int = 8  # while running: a streaming head slides by this many pairs (the paper: 1)
    schedule: str = AFTER_PREFILL
    head_budget: str = "pattern"
    head_compression_ratio: float = 0.5  # the share of (layer, KV head) pairs that are streaming heads
    patterns: str | None = None  # a folder or model id in the published layout; None: the model's own
    calibration: str | None = None  # a local file of texts: head scores on the fly (kvpress's on_the_fly_scoring)
    num_samples: int = 50  # calibration: its first texts
    q_len: int = 500  # calibration: the positions the mean query and key are placed at
    sink_size: int | None = None  # None: the pattern's (128 on the fly)
    recent_size: int | None = None  # None: the pattern's (256 on the fly)
    name: ClassVar[str] = "duo_attention"
    label: ClassVar[str] = "DuoAttention"
    summary: ClassVar[str] = "retrieval heads keep every pair, streaming heads their sinks and newest pairs"
    paper: ClassVar[tuple[str, str]] = ("Xiao et al., ICLR 2025", "https://arxiv.org/abs/2410.10819")
    published_schedule: ClassVar[str] = AFTER_PREFILL  # kvpress's protocol (the paper's: see `describe`)
    published_evict_every: ClassVar[int] = 1  # the paper's streaming heads slide one pair per token
    layer_budget: ClassVar[str] = "streaming"
    needs: ClassVar[Needs] = Needs(module=True)  # the attention modules' config: the pattern's model
    no_loglikelihood: ClassVar[str | None] = "its head pattern is resolved in generation only"

    def validate(self) -> None:
        if self.head_budget != "pattern":
            raise ConfigError("policy.head_budget", f"{self.name}'s heads keep what its pattern says: pattern",
                              self.head_budget)
        for key in ("kv_ratio", "kv_size"):
            if getattr(self, key) is not None:
                raise ConfigError(f"policy.{key}", f"{self.name}'s budget is its head pattern: set policy."
                                  "head_compression_ratio (or compression_ratio, read as it)", getattr(self, key))
        if self.compression_ratio is not None:  # the leaderboard's ratio is the share of streaming heads
            self.head_compression_ratio = self.compression_ratio
        r = self.head_compression_ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1:
            raise ConfigError("policy.head_compression_ratio", "must be the share of streaming heads, in [0, 1]", r)
        self.head_compression_ratio = float(r)
        for key in ("num_samples", "q_len", "sink_size", "recent_size"):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < (key in ("num_samples", "q_len"))):
                raise ConfigError(f"policy.{key}", "must be a positive integer" if key in ("num_samples", "q_len")
                                  else "must be a non-negative integer, or null", v)
        if self.patterns is not None and self.calibration is not None:
            raise ConfigError("policy.calibration", "and policy.patterns both give head scores: set one",
                              self.calibration)
        self._pattern: tuple | None = None  # (config key, retrieval (L, H) bool, sink, recent) once resolved
        super().validate()
        self._check_window(*self._windows(None))

    def _check_window(self, sink: int, recent: int) -> None:
        """While running, a streaming head evicts evict_every pairs at once and keeps its sinks: both must fit."""
        if self.evicts and not self.once and sink + recent - self.evict_every <= sink:
            raise ConfigError("policy.evict_every", f"must be below recent_size={recent} (a streaming head keeps "
                              f"sink + recent - evict_every pairs after an eviction)", self.evict_every)

    @property
    def evicts(self) -> bool:
        return self.head_compression_ratio > 0  # no streaming head: every head keeps every pair, the full cache

    def _windows(self, pattern: HeadPattern | None) -> tuple[int, int]:
        sink = pattern.sink_size if pattern is not None else duo_patterns.ON_THE_FLY_WINDOWS[0]
        recent = pattern.recent_size if pattern is not None else duo_patterns.ON_THE_FLY_WINDOWS[1]
        return (sink if self.sink_size is None else self.sink_size,
                recent if self.recent_size is None else self.recent_size)

    @property
    def window(self) -> int:
        """The pairs a streaming head keeps, sink + recent (before the pattern is resolved: the fields or 128/256)."""
        return sum(self._pattern[2:]) if self._pattern is not None else sum(self._windows(None))

    def _resolve(self, config, model=None, tokenizer=None) -> tuple:
        key = (id(config), model_name(config))
        if self._pattern is None or self._pattern[0] != key:
            p = head_pattern(self, config, model, tokenizer)
            linear = family.kinds(config).linear  # a hybrid's linear-attention layers: no heads to rank
            retrieval, _, _ = duo_patterns.retrieval_heads(p, self.head_compression_ratio, linear)
            self._check_window(*self._windows(p))
            self._pattern = (key, retrieval, *self._windows(p))
        return self._pattern

    def retrieval_heads(self, config, fetch: bool = True) -> torch.Tensor | None:
        """(L, H) bool: the retrieval heads of the model of `config` (its pattern resolved, as `score` does).
        `fetch=False` (the preflight: no weights, nothing fetched): None unless the pattern resolves from the config
        alone (a nameless model's random scores, a local pattern folder)."""
        name = model_name(config)
        local = self.calibration is None and (Path(self.patterns).is_dir() if self.patterns else not name)
        return self._resolve(config)[1] if fetch or local else None

    def check_model(self, config) -> None:
        """The preflight's check, from the model's config alone (nothing fetched): a model with no published
        pattern needs policy.patterns or policy.calibration; a pattern folder must fit the model's heads. A pattern
        known without the Hub or the weights (a folder, a nameless model's random scores) is resolved here, so the
        preflight's budgets have its windows (task.query_aware=false: the question must fit a streaming head's)."""
        name = model_name(config)
        if self.calibration is None and self.patterns is None and name and not duo_patterns.known(name):
            raise _no_pattern(name)
        if self.patterns is not None and (Path(self.patterns).is_dir() or not duo_patterns.known(self.patterns)):
            duo_patterns.check_shape(duo_patterns.published_pattern(self.patterns), config)
        self.retrieval_heads(config, fetch=False)  # resolved where it is local: `window` is then the pattern's

    def prepare(self, tokenizer, model=None) -> None:
        """The head pattern for this run's model (a calibration runs here, once per model and process)."""
        if model is not None:
            self._resolve(model.config, model, tokenizer)

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        _, retrieval, sink, _ = self._resolve(ctx.modules[0].config)
        r = retrieval.to(ctx.pos.device)[ctx.layers.view(-1)]  # (L, H) of the scored layers
        keep = (ctx.pos < sink) | r[:, None, :, None]  # a retrieval head's pairs, a streaming head's sinks
        return ctx.pos.float().masked_fill(keep, float("inf"))  # (L, B, H, N): then the newest

    def describe(self, gqa: bool = False, paged: bool = False) -> dict:
        d = super().describe(gqa, paged)
        src = (f"calibration={self.calibration} ({self.num_samples} texts, q_len {self.q_len}; kvpress: 50 BookSum "
               "chapters)" if self.calibration else f"patterns={self.patterns}" if self.patterns else
               "the model's published pattern (random scores for a model with no name)")
        ext = [e for e in d["extensions"] if not e.startswith("compression_ratio=")]  # not a count of pairs here
        if self.compression_ratio is not None:
            ext.append(f"compression_ratio={self.compression_ratio:g} is read as head_compression_ratio (the share of "
                       "streaming heads, as kvpress's leaderboard sets DuoAttention's ratio)")
        if not self.evicts:  # no streaming head: nothing evicted, no pattern read
            d["extensions"] = ext
            return d
        slide = ("and grow while decoding (kvpress's protocol; the paper keeps them at sink + recent)" if self.once
                 else "as tokens arrive, retrieval heads never evict (DuoAttention's own rule; kvpress: once, after "
                 "prefill)")
        d["extensions"] = ext + [f"head scores: {src}", f"streaming heads keep {self.window} pairs (sink + recent) "
                                 + slide]
        return d
