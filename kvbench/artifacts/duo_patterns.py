"""DuoAttention's published head patterns (kvpress 0.5.5 `DuoAttentionPress.load_attention_pattern`) and the rule
that turns head scores into retrieval / streaming heads.

DuoAttention (arXiv 2410.10819) keeps the whole cache in retrieval heads and only `sink_size` + `recent_size`
pairs in streaming heads. The patterns were optimised per model by the authors and published in their GitHub
repository (not the Hub): `<BASE>/<dir>/config.json` (`sink_size`, `recent_size`) and
`<BASE>/<dir>/full_attention_heads.tsv` (L rows x H_kv tab-separated floats, clipped to [0, 1]; higher means
retrieval). kvpress knows six models (`PATTERNS`); a local folder in the same layout is accepted for any model.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

import numpy as np
import torch

from kvbench.errors import ConfigError

KEY = "policy.patterns"  # the config key a pattern comes from (conf/policy/duo_attention.yaml)
BASE = "https://raw.githubusercontent.com/mit-han-lab/duo-attention/refs/heads/main/attn_patterns"
_SUFFIX_32K = "lr%3D0.02-reg%3D0.05-ctx%3D1000_32000-multi_passkey10"
PATTERNS = {  # kvpress's PATTERNS_DICT, verbatim (the doubled "//" of the gradientai names included)
    "togethercomputer/Llama-2-7B-32K-Instruct": f"Llama-2-7B-32K-Instruct/{_SUFFIX_32K}",
    "gradientai//Llama-3-8B-Instruct-Gradient-1048k": f"Llama-3-8B-Instruct-Gradient-1048k/{_SUFFIX_32K}",
    "gradientai//Llama-3-8B-Instruct-Gradient-4194k": f"Llama-3-8B-Instruct-Gradient-4194k/{_SUFFIX_32K}",
    "meta-llama/Meta-Llama-3.1-8B-Instruct":
        "Meta-Llama-3.1-8B-Instruct/lr=0.02-reg=0.05-ctx=1000_128000-multi_passkey10",
    "mistralai/Mistral-7B-Instruct-v0.2": f"Mistral-7B-Instruct-v0.2/{_SUFFIX_32K}",
    "mistralai/Mistral-7B-Instruct-v0.3": f"Mistral-7B-Instruct-v0.3/{_SUFFIX_32K}",
}
# the same weights under the Hub's newer repository name (kvpress looks up the older one only; its leaderboard loads
# that name): the pattern goes with the weights, not with the spelling
ALIASES = {"meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B-Instruct"}
ON_THE_FLY_WINDOWS = (128, 256)  # kvpress's hard-coded (sink_size, recent_size) for on-the-fly scores


@dataclass(frozen=True)
class HeadPattern:
    """Head scores (L, H_kv) float64, higher = retrieval; the streaming heads' sink and recent window sizes."""

    scores: np.ndarray
    sink_size: int
    recent_size: int


def parse_pattern(config_text: str, tsv_text: str, where: str) -> HeadPattern:
    """The published files' text -> a HeadPattern (scores clipped to [0, 1] as duo_attn.utils does)."""
    try:
        cfg = json.loads(config_text)
        sink, recent = int(cfg["sink_size"]), int(cfg["recent_size"])
        scores = np.loadtxt(StringIO(tsv_text), dtype=float, delimiter="\t", ndmin=2)
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(KEY, f"not a DuoAttention pattern ({type(e).__name__}: {e})", where) from None
    return HeadPattern(np.clip(scores, 0, 1), sink, recent)


def known(name: str) -> str | None:
    """kvpress's name of the published pattern for model `name` (its aliases resolved), None when there is none."""
    name = ALIASES.get(name, name)
    return name if name in PATTERNS else None


def _get(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def published_pattern(source: str, timeout: float = 30.0) -> HeadPattern:
    """`source`: a local folder holding config.json + full_attention_heads.tsv, or a model id kvpress knows
    (fetched from the duo-attention repository, as kvpress does)."""
    folder = Path(source)
    if folder.is_dir():
        files = [folder / "config.json", folder / "full_attention_heads.tsv"]
        for f in files:
            if not f.is_file():
                raise ConfigError(KEY, f"the pattern folder has no {f.name}", source)
        return parse_pattern(files[0].read_text(), files[1].read_text(), source)
    if known(source) is None:
        raise ConfigError(KEY, f"no published pattern for this model (known: {sorted(PATTERNS)}), "
                          "give a local folder or calibrate on the fly", source)
    url = f"{BASE}/{PATTERNS[known(source)]}/"
    try:
        return parse_pattern(_get(url + "config.json", timeout), _get(url + "full_attention_heads.tsv", timeout), url)
    except (urllib.error.URLError, OSError) as e:
        raise ConfigError(KEY, f"could not fetch the published pattern ({type(e).__name__})", url) from None


def check_shape(pattern: HeadPattern, model_config) -> HeadPattern:
    """The pattern must have one row per layer and one column per KV head of the model."""
    want = (model_config.num_hidden_layers, model_config.num_key_value_heads)
    if pattern.scores.shape != want:
        raise ConfigError(KEY, f"pattern shape {pattern.scores.shape} is not the model's (layers, kv heads) {want}")
    return pattern


def streaming_heads(scores: np.ndarray, head_compression_ratio: float, skip=()) -> torch.Tensor:
    """kvpress's rule: the `round(L*H*ratio)` lowest scores (Python round, half to even; np.argsort over the
    flattened (L, H) table, quicksort as numpy's default) are streaming. Returns (L, H_kv) bool, True = streaming;
    retrieval heads are its negation. `skip`: rows with no KV heads (a hybrid's linear-attention layers), left out of
    the table (never streaming, not counted in L)."""
    if not 0 <= head_compression_ratio <= 1:
        raise ConfigError("policy.head_compression_ratio", "must lie in [0, 1]", head_compression_ratio)
    mask = torch.zeros(scores.shape, dtype=torch.bool)  # (L, H_kv)
    rows = np.array([i for i in range(scores.shape[0]) if i not in set(skip)], dtype=int)
    table = scores[rows]  # (L_attention, H_kv)
    n = round(table.size * head_compression_ratio)
    if n > 0:
        idx = np.argsort(table, axis=None)[:n]
        r, h = np.unravel_index(idx, table.shape)
        mask[rows[r], h] = True
    return mask


def retrieval_heads(pattern: HeadPattern, head_compression_ratio: float, skip=()) -> tuple[torch.Tensor, int, int]:
    """What a DuoAttention policy needs: (L, H_kv) bool, True = retrieval head (keeps every pair); and the
    streaming heads' sink_size and recent_size (pairs [sink_size, n - recent_size) of a streaming head go)."""
    return ~streaming_heads(pattern.scores, head_compression_ratio, skip), pattern.sink_size, pattern.recent_size
