"""The workload: one request per task sample, arriving all at time 0 or as a seeded Poisson process.

With `rate` (requests/s) the gaps between arrivals are exponential with mean 1 / rate, drawn from
`random.Random(seed)`; the first request arrives at 0. Every request asks for `max_new_tokens`.
"""

from __future__ import annotations

import random

from kvbench.serve.request import Request


def arrivals(n: int, rate: float | None, seed: int) -> list[float]:
    if rate is None:
        return [0.0] * n
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        if i:
            t += rng.expovariate(rate)
        out.append(t)
    return out


def build_requests(ids: list[list[int]], max_new_tokens: int, rate: float | None, seed: int) -> list[Request]:
    times = arrivals(len(ids), rate, seed)
    return [Request(rid=i, prompt=list(p), max_new_tokens=max_new_tokens, arrival=t) for i, (p, t) in enumerate(zip(ids, times, strict=True))]
