"""`kvbench-reproduce experiment=...`: the paper's protocol (method.md steps 4-5) as one command.

1. ED (extreme decoding-only, kv = `reproduce.ed_kv_size`) searches the largest batch that fits
   (b_ED) and the first that does not (b0), then runs at b_ED: the decoding-only throughput bound.
2. FKV (full cache) runs at b_ED: the accuracy reference. If it does not fit there, its own search
   picks its batch.
3. Batch-Max (the experiment's policy, p = policy.evict_every) searches its largest batch and runs
   there, for every kv size of `reproduce.kv_sizes`. If none reaches `near_fkv` x FKV's metric (the
   grid was too short for this task), it goes on up in multiples of `reproduce.kv_step`: doubling
   until one does (at most up to the longest prompt + new tokens, where Batch-Max keeps everything),
   then bisecting down to the smallest multiple that does. Last, the kv sizes `reproduce.refine_step`
   around the best one so far.
4. Picks, as in the paper's two Batch-Max rows: (a) the fastest run with a metric >= FKV's,
   (b) the fastest with a metric >= `reproduce.near_fkv` x FKV's.

Every step is an ordinary kvbench run (one record in runs.jsonl), and `skip_existing` defaults to
true, so a killed driver re-run picks up where it stopped. It ends by writing the report
(tables.md, runs.csv, plots) into `results_dir` and printing the picks.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from kvbench.cli import checked, preflight
from kvbench.config import CONF_DIR, build_task


@dataclass
class Point:
    policy: str
    kv_size: int | None
    batch_size: int
    metric: float
    tok_s: float

    @classmethod
    def of(cls, rec: dict, metric: str) -> Point | None:
        if rec.get("status") != "ok" or metric not in (rec.get("metrics") or {}):
            return None
        return cls(rec["policy"], rec["kv_size"], rec["batch_size"], rec["metrics"][metric], rec["throughput_tok_s"])


def pick(points: list[Point], floor: float) -> Point | None:
    """The fastest point whose metric is at least `floor`."""
    ok = [p for p in points if p.metric >= floor]
    return max(ok, key=lambda p: (p.tok_s, -p.batch_size)) if ok else None


def search_kv_sizes(bm, kv_sizes: list[int], fkv: float, near: float, step: int, refine_step: int,
                    cap: int, min_kv: int) -> dict[int, Point | None]:
    """Batch-Max's kv sizes to run, each run once through `bm(kv) -> Point | None`; returns them all.

    The coarse grid first. If no point reaches `near` x `fkv`, extend in multiples of `step`: double
    from the largest tried until one reaches it (the last try is `cap` rounded up to `step`: there
    Batch-Max evicts nothing and equals the full cache), then bisect between the last miss and the
    first hit, assuming accuracy grows with kv (throughput falls with it, so the smallest kv that
    reaches the level is the one wanted). Last, +-`refine_step` around the best point: the fastest
    at FKV's level, else the fastest near it, else the largest kv.
    """
    tried: dict[int, Point | None] = {}

    def run(kv: int) -> bool:
        if kv not in tried:
            tried[kv] = bm(kv)
        pt = tried[kv]
        return pt is not None and pt.metric >= near * fkv

    hits = [kv for kv in kv_sizes if run(kv)]
    if not hits and kv_sizes:
        top = -(-cap // step) * step
        lo, hi = max(kv_sizes), None
        while hi is None and lo < top:
            kv = min(-(-2 * lo // step) * step, top)
            if run(kv):
                hi = kv
            else:
                lo = kv
        while hi is not None and hi - lo > step:
            mid = lo + (hi - lo) // step // 2 * step
            if run(mid):
                hi = mid
            else:
                lo = mid
    points = [pt for pt in tried.values() if pt]
    centre = pick(points, fkv) or pick(points, near * fkv)
    centre_kv = centre.kv_size if centre else max(tried)
    for kv in (centre_kv - refine_step, centre_kv + refine_step):
        if kv > min_kv and kv not in tried:
            tried[kv] = bm(kv)
    return tried


class Driver:
    def __init__(self, overrides: list[str]):
        self.base = list(overrides)
        if not any(o.split("=", 1)[0] == "skip_existing" for o in self.base):
            self.base.append("skip_existing=true")

    def compose(self, *extra: str) -> DictConfig:
        """The config of one run, its presets applied (gen.max_new_tokens=null is the task's own length)."""
        from kvbench.config import apply_presets

        cfg = compose("config", overrides=[*self.base, *extra])
        apply_presets(cfg)
        return cfg

    def run(self, *extra: str) -> dict:
        from kvbench.run import run

        cfg = self.compose(*extra)
        rec = run(cfg)
        print(f"kvbench-reproduce: {' '.join(extra)} -> {rec['status']}, b={rec['batch_size']}, "
              f"metrics={json.dumps(rec.get('metrics'))}, tok/s={rec.get('throughput_tok_s')}", flush=True)
        return rec

    def protocol(self) -> dict:
        cfg = self.compose()
        metric = build_task(cfg).metric
        rp = cfg.reproduce  # its values checked with the config (kvbench.config.validate.check_reproduce)
        p = cfg.policy.evict_every
        search = ["search.max_batch=true", "search.only=false"]

        ed = self.run("policy=extreme_decode", f"policy.kv_size={rp.ed_kv_size}", "policy.evict_every=null", *search)
        b_ed = (ed.get("search") or {}).get("max_batch_size")
        if not b_ed:
            raise SystemExit(f"kvbench-reproduce: ED fits no batch under this budget ({ed.get('error')})")
        fkv = self.run("policy=full", "policy.kv_size=null", f"batch_size={b_ed}", "search.max_batch=false")
        if fkv["status"] == "oom":
            fkv = self.run("policy=full", "policy.kv_size=null", *search)
        fkv_point = Point.of(fkv, metric)
        if fkv_point is None:
            raise SystemExit(f"kvbench-reproduce: the full-cache run failed: {fkv.get('error')}")

        def bm(kv: int) -> Point | None:
            return Point.of(self.run(f"policy.kv_size={kv}", f"policy.evict_every={p}", *search), metric)

        longest = max(fkv["prompts"]["tokens_max"], ed["prompts"]["tokens_max"]) + cfg.gen.max_new_tokens
        tried = search_kv_sizes(bm, list(rp.kv_sizes), fkv_point.metric, rp.near_fkv, rp.kv_step, rp.refine_step,
                                cap=longest, min_kv=p)
        points = [pt for pt in tried.values() if pt]
        ed_point = Point.of(ed, metric)
        result = {
            "metric": metric,
            "ed": ed_point.__dict__ if ed_point else None,
            "ed_first_oom_batch_size": ed["search"]["first_oom_batch_size"],
            "fkv": fkv_point.__dict__,
            "bm_at_fkv": (pick(points, fkv_point.metric) or Point("batch_max", None, 0, 0, 0)).__dict__,
            "bm_near_fkv": (pick(points, rp.near_fkv * fkv_point.metric) or Point("batch_max", None, 0, 0, 0)).__dict__,
            "near_fkv": rp.near_fkv,
        }
        for key in ("bm_at_fkv", "bm_near_fkv"):
            if result[key]["kv_size"] is None:
                result[key] = None
        return result


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    checked(preflight, argv, "kvbench-reproduce")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="reproduce"):
        driver = Driver(argv)
        result = driver.protocol()
        results_dir = driver.compose().results_dir
    from kvbench.report import write_report

    write_report(results_dir)
    print(json.dumps({"reproduce": result}))
    print(f"kvbench-reproduce: report in {results_dir}/tables.md")


if __name__ == "__main__":
    main()
