"""What the account says a batch needs: the policies a plan compares and the trial each candidate batch gets.

The policies: ED (extreme decoding-only) at `reproduce.ed_kv_size`, the full cache, and the configured
evicting policy at each of `plan.kv_sizes`. A trial admits batch size b when every device's accounted
peak (kvbench.memory.account) of the worst-case batch, the b longest prompts as the real search probes
them, fits the device's usable memory. `headroom` and `window_credit` are the figures around it.
"""

from __future__ import annotations

from dataclasses import replace

from hydra.utils import instantiate
from omegaconf import DictConfig

from kvbench import memory, search
from kvbench.capacity.node import Node
from kvbench.conf import load_option


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


def _worst_batch(lengths: list[int], b: int) -> list[int]:
    """search.probe_prompts' batch of size b, as lengths: the longest prompts, repeated when b exceeds them."""
    longest = sorted(lengths, reverse=True)
    return [longest[i % len(longest)] for i in range(b)]


def trial(shape: memory.ModelShape, node: Node, lengths: list[int], policy, backend: str, cfg: DictConfig):
    """search.Trial of batch size b: does every device's accounted peak of the worst-case batch fit?"""

    def run(b: int) -> search.Trial:
        acc = memory.account(shape, _worst_batch(lengths, b), policy, max_new_tokens=cfg.gen.max_new_tokens,
                             prefill_chunk=cfg.gen.prefill_chunk, score_chunk=cfg.gen.score_chunk, attention=backend)
        fits = all(acc.devices[d].total <= node.usable[d] for d in acc.devices)
        peak = max(f.total for f in acc.devices.values())
        return search.Trial(b, "ok" if fits else "oom", peak_mem_bytes=peak, accounted_mem_bytes=acc.total)

    return run


def headroom(shape, node: Node, lengths: list[int], policy, backend: str, cfg: DictConfig, b: int) -> int:
    """Bytes left on the fullest device (memory limit less accounted peak, reserve ignored) at batch size b:
    the largest memory.reserve_gb (in bytes) under which b still fits."""
    acc = memory.account(shape, _worst_batch(lengths, b), policy, max_new_tokens=cfg.gen.max_new_tokens,
                         prefill_chunk=cfg.gen.prefill_chunk, score_chunk=cfg.gen.score_chunk, attention=backend)
    return min(node.memory_limit[d] - f.total for d, f in acc.devices.items())


def window_credit(shape: memory.ModelShape, lengths: list[int], cfg: DictConfig) -> dict:
    """The model's attention kinds and the full cache of one longest sample, as allocated (windowed layers hold
    their window only) and as it would be with every window removed: the credit windows give."""
    from kvbench.policies import Full

    def kv(s):
        acc = memory.account(s, [max(lengths)], Full(), max_new_tokens=cfg.gen.max_new_tokens,
                             prefill_chunk=cfg.gen.prefill_chunk)
        return sum(f.kv_cache for f in acc.devices.values()) - s.state_bytes_per_sequence  # the KV alone

    windows = [w for w in shape.windows if w is not None]
    kinds = [f"{len(windows)} of {len(shape.windows)} layers windowed (W={sorted(set(windows))})"] if windows else []
    kinds += [f"{len(shape.linear)} of {len(shape.windows)} layers linear attention"] if shape.linear else []
    return {"attention_kinds": "; ".join(kinds) or "full attention in every layer",
            "kv_bytes_one_sample": kv(shape), "kv_bytes_one_sample_without_windows": kv(replace(shape, windows=())),
            "state_bytes_per_sequence": shape.state_bytes_per_sequence,  # a hybrid's linear layers, apart from the KV
            "linear_layers": list(shape.linear), "kv_per_token": kv_per_token(shape)}


def kv_per_token(shape: memory.ModelShape) -> list[dict]:
    """The K/V bytes one token adds to one layer, per layer kind (window, KV heads, head size), in the model dtype."""
    kinds: dict[tuple, int] = {}
    for i in range(sum(shape.layers.values())):
        if i not in shape.linear:
            s = shape.of_layer(i)
            key = (shape.windows[i] if shape.windows else None, s.kv_heads, s.head_dim)
            kinds[key] = kinds.get(key, 0) + 1
    return [dict(layers=n, window=w, kv_heads=h, head_dim=d, bytes=2 * h * d * shape.elem) for (w, h, d), n in kinds.items()]
