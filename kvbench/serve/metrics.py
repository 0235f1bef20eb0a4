"""Serving metrics of one run and the utilisation plot.

requests/s and output tokens/s are over the engine clock from the first arrival to the last
completion. TTFT = first token - arrival (queueing included); TPOT = (finish - first token) /
(output tokens - 1), per request with at least two tokens. Percentiles interpolate linearly.
Pool utilisation = blocks in use / pool blocks, one point per step (`timeline`).
Goodput = requests/s that met both objectives: TTFT <= `slo_ttft_s` and TPOT <= `slo_tpot_s` (a request
with one output token has no TPOT: only its TTFT counts); `slo_attained` is their share of the requests.
"""

from __future__ import annotations

import statistics

from kvbench.serve.engine import ServeOutput

MAX_TIMELINE = 400  # points kept in the record (evenly strided)


def percentiles(xs: list[float]) -> dict | None:
    if not xs:
        return None
    ys = sorted(xs)

    def q(p):
        k = (len(ys) - 1) * p
        lo = int(k)
        hi = min(lo + 1, len(ys) - 1)
        return ys[lo] + (ys[hi] - ys[lo]) * (k - lo)

    return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "mean": statistics.fmean(ys)}


def tpot(r) -> float | None:
    return (r.finished_at - r.first_token_at) / (len(r.output) - 1) if len(r.output) > 1 else None


def summarise(out: ServeOutput, num_blocks: int, block_size: int, slo_ttft_s: float = float("inf"),
              slo_tpot_s: float = float("inf")) -> dict:
    reqs = [r for r in out.requests if r.finished_at is not None]
    good = [r for r in reqs if r.first_token_at - r.arrival <= slo_ttft_s and (tpot(r) or 0.0) <= slo_tpot_s]
    t0 = min((r.arrival for r in out.requests), default=0.0)
    span = max(out.wall_s - t0, 1e-9)
    n_out = sum(len(r.output) for r in reqs)
    util = [u / num_blocks for _, u, _, _ in out.timeline]
    running = [n for _, _, n, _ in out.timeline]
    stride = max(1, -(-len(out.timeline) // MAX_TIMELINE))
    return {
        "completed": len(reqs),
        "requests_per_s": len(reqs) / span,
        "output_tok_s": n_out / span,
        "output_tokens": n_out,
        "ttft_s": percentiles([r.first_token_at - r.arrival for r in reqs]),
        "tpot_s": percentiles([t for r in reqs if (t := tpot(r)) is not None]),
        "goodput_rps": len(good) / span,
        "slo_attained": len(good) / len(out.requests) if out.requests else 0.0,
        "slo": {"ttft_s": slo_ttft_s, "tpot_s": slo_tpot_s},
        "preemptions": out.preemptions,
        "recomputed_tokens": out.recomputed_tokens,
        "evicted_blocks": out.evicted_blocks,
        "steps": out.steps,
        "busy_s": out.busy_s,
        "span_s": span,
        "num_blocks": num_blocks,
        "block_size": block_size,
        "pool_bytes": out.pool_bytes,
        "pool_util_mean": statistics.fmean(util) if util else 0.0,
        "pool_util_max": max(util, default=0.0),
        "running_mean": statistics.fmean(running) if running else 0.0,
        "running_max": max(running, default=0),
        "timeline": {
            "t": [round(p[0], 4) for p in out.timeline[::stride]],
            "blocks_used": [p[1] for p in out.timeline[::stride]],
            "running": [p[2] for p in out.timeline[::stride]],
            "waiting": [p[3] for p in out.timeline[::stride]],
        },
    }


def plot(summary: dict, path, title: str = "") -> None:
    """Pool utilisation (top) and running / waiting requests (bottom) over the engine clock."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = summary["timeline"]
    fig, (a, b) = plt.subplots(2, 1, figsize=(7, 4.5), sharex=True)
    a.step(tl["t"], [100 * u / summary["num_blocks"] for u in tl["blocks_used"]], where="post")
    a.set_ylabel("pool used (%)")
    a.set_ylim(0, 105)
    b.step(tl["t"], tl["running"], where="post", label="running")
    b.step(tl["t"], tl["waiting"], where="post", label="waiting")
    b.set_ylabel("requests")
    b.set_xlabel("engine clock (s)")
    b.legend(loc="upper right")
    a.set_title(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
