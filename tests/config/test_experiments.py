"""Experiment configs (lightning-hydra-template style): every file composes and validates, runs on
tiny-llama with a tiny override (its own task on a tiny dataset mirror), and the paper configs hold
the published setting."""

import gzip
import json

import pytest
from hydra import compose, initialize_config_dir

from kvbench import run as kvrun
from kvbench.config import CONF_DIR, prepare, with_presets
from tests.tasks.ruler_shards import kvpress_rows

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
PAPER = [e for e in EXPERIMENTS if e.startswith("paper_")]
KVPRESS = [e for e in EXPERIMENTS if e.startswith("kvpress_ruler_")]  # RULER 4k, kvpress's leaderboard protocol
# cards as CUDA reports them: V100-32GB 32510 MiB, TITAN V-12GB 12066 MiB
V100, TITAN_V = ("32510MiB", 31.75), ("12066MiB", 11.78)
HARDWARE = {  # experiment -> (model, task, GPUs, per-GPU max_memory, memory.limit_gb)
    "paper_llama2_cnndm": ("llama2-13b-chat", "cnndm", 4, *V100),
    "paper_llama2_narrativeqa": ("llama2-13b-chat", "narrativeqa", 4, *V100),
    "paper_llama2_gsm8k": ("llama2-13b-chat", "gsm8k", 2, *V100),
    "paper_phi35_cnndm": ("phi35-mini", "cnndm", 4, *TITAN_V),
    "paper_phi35_narrativeqa": ("phi35-mini", "narrativeqa", 4, *TITAN_V),
    "paper_phi35_gsm8k": ("phi35-mini", "gsm8k", 4, *TITAN_V),
}
PUBLISHED_KV = {"paper_llama2_cnndm": (1024, 896), "paper_llama2_narrativeqa": (1792, 1728),
                "paper_llama2_gsm8k": (1536, 1408), "paper_phi35_cnndm": (2176,),
                "paper_phi35_narrativeqa": (1984,), "paper_phi35_gsm8k": (1664,)}


def _compose(*overrides, hydra=False):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """A tiny dataset mirror in interface.md's layout: 20 short rows per split."""
    root = tmp_path_factory.mktemp("data")
    n = range(20)
    splits = {
        "cnn_dailymail/test": [{"article": f"Story {i}: the town fair opened on day {i}.", "highlights": f"Fair day {i}.",
                                "id": str(i)} for i in n],
        "gsm8k/test": [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in n],
        "narrativeqa/test": [{"document": {"id": f"d{i}", "summary": {"text": f"Ann met Bob {i} times."}},
                              "question": {"text": "Who met Bob?"}, "answers": [{"text": "Ann"}, {"text": "Ann."}]}
                             for i in n],
    }
    splits["ruler_kvpress/4096/test"] = kvpress_rows(["niah_single_1"])  # kvpress's leaderboard rows (simonjegou/ruler)
    splits["cnn_dailymail/validation"] = splits["cnn_dailymail/test"]
    splits["gsm8k/train"] = splits["gsm8k/test"]
    splits["narrativeqa/validation"] = splits["narrativeqa/test"]
    for name, rows in splits.items():
        path = root / f"{name}.jsonl.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return root


def tiny(experiment: str, mirror) -> list[str]:
    """The experiment on tiny-llama: 2 samples, 2 new tokens, a small cache, the tiny mirror."""
    base = _compose(f"experiment={experiment}")
    out = [f"experiment={experiment}", "model=tiny-llama", "device=cpu", f"data.dir={mirror}",
           "task.n_samples=2", "task.n_shot=1", "task.max_input_tokens=512", "gen.max_new_tokens=2",
           "policy.kv_size=64", "policy.evict_every=16"]
    if base.mode != "serve":  # serve mode refuses a batch size (its scheduler batches)
        out.append("batch_size=2")
    if base.model.get("max_memory"):  # a Hub model's GPU split: not an argument of the tiny model
        out.append("~model.max_memory")
    return out


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_composes_and_validates(experiment):
    cfg = _compose(f"experiment={experiment}")
    prepare(cfg)
    assert cfg.experiment_name == experiment


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_runs_on_tiny_llama(experiment, mirror, tmp_path):
    cfg = _compose(*tiny(experiment, mirror), f"results_dir={tmp_path}")
    rec = kvrun.run(cfg)
    assert rec["status"] == "ok", rec["error"]
    if experiment in KVPRESS:  # RULER's niah_single_1 by default, query-agnostic, EOS not ignored
        assert rec["task"] == "niah_single_1" and rec["query_aware"] is False and rec["generated_tokens"] <= 4
        return
    assert rec["experiment"] == experiment and rec["task"] == experiment.rsplit("_", 1)[-1]
    assert rec["n_samples"] == 2 and rec["generated_tokens"] == 4  # ignore_eos: every token generated


@pytest.mark.parametrize("experiment", KVPRESS)
def test_kvpress_protocol_settings(experiment):
    """RULER at 4k tokens, query-agnostic, compressed once after prefill, kvpress's ratios in the documented sweep."""
    cfg = _compose(f"experiment={experiment}", hydra=True)
    assert cfg.hydra.runtime.choices.task == "niah_single_1" and cfg.task.context_length == 4096
    assert cfg.task.query_aware is False and cfg.policy.schedule == "after_prefill"
    assert cfg.task.source == "kvpress" and cfg.gen.max_new_tokens is None  # kvpress's rows, RULER's lengths
    assert with_presets(cfg).gen.max_new_tokens == 128
    assert cfg.model.dtype == "bfloat16" and cfg.model.pretrained in ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B")
    text = (CONF_DIR / "experiment" / f"{experiment}.yaml").read_text()
    assert "policy.compression_ratio=0.25,0.5,0.75,0.875" in text


def _grid(experiment: str) -> list[tuple[list[str], list[str]]]:
    """The grid an experiment file's comment documents, per `policy=` of it: (the policies, the `policy.*`
    overrides their jobs take: the first of each swept value, and one `policy.schedule=` per schedule swept)."""
    import re

    text = (CONF_DIR / "experiment" / f"{experiment}.yaml").read_text()
    comment = " ".join(line.lstrip("# ").rstrip("\\ ") for line in text.splitlines() if line.startswith("#"))
    out = []
    for segment in re.split(r"(?<![.\w])policy=", comment)[1:]:
        names, rest = segment.split(" ", 1)
        knobs = [f"policy.{k}={v.split(',')[0]}" for k, v in re.findall(r"policy\.(\w+)=(\S+)", rest)
                 if k != "schedule"]
        schedules = re.search(r"policy\.schedule=(\S+)", rest)
        out.append((names.split(","), knobs + [f"policy.schedule={s}" for s in (
            schedules[1].split(",") if schedules else ["after_prefill"])]))
    return out


# The methods kvpress's grids run (the experiment files' comments, docs/long-context.md): kvpress's leaderboard methods
# kvbench implements, its own baselines and the full cache. A fixed experiment, not "every registered policy": a
# policy added later runs on the same protocol with `policy=<name>` and needs no edit here (issue 58).
KVPRESS_GRID = {"snapkv", "pyramidkv", "tova", "knorm", "keydiff", "vatp", "streaming_llm", "window", "h2o", "batch_max",
                "expected_attention", "kvzap", "duo_attention", "random", "kvzip", "kvzip_plus", "kvgrad", "chunkkv",
                "lagkv", "compactor", "critical", "full"}


def check_kvpress_grid(experiment: str) -> None:
    """The experiment's documented grid names KVPRESS_GRID, each a registered policy, and each job of it passes the
    preflight's checks that need no weights: its config, and the policy against the model's shipped config (e.g.
    DuoAttention without a published pattern for the model is refused)."""
    from kvbench.config.groups import build_policy
    from kvbench.config.preflight import model_config
    from kvbench.models.family.adapter import check_policy
    from kvbench.policies import registry

    grid = _grid(experiment)
    named = {n for names, _ in grid for n in names}
    assert named == KVPRESS_GRID, named ^ KVPRESS_GRID
    assert named <= set(registry()), named - set(registry())
    for names, knobs in grid:
        schedules = [k for k in knobs if k.startswith("policy.schedule=")]
        for name in names:
            for schedule in schedules:
                cfg = _compose(f"experiment={experiment}", f"policy={name}", schedule,
                               *[k for k in knobs if k not in schedules])
                prepare(cfg)
                check_policy(model_config(cfg), build_policy(cfg), cfg.task.context_length + 128)


@pytest.mark.parametrize("experiment", KVPRESS)
def test_kvpress_grid_runs_every_method_on_its_model(experiment):
    check_kvpress_grid(experiment)


def test_a_new_policy_leaves_the_kvpress_grids_alone(monkeypatch):
    """A newcomer's first policy (a Knorm copy registered under a new name, its config where Hydra finds it) is in
    no grid and breaks none."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from kvbench import policies
    from kvbench.conf import load_option
    from tests.matrix_preflight import Throwaway

    node = OmegaConf.to_container(load_option("policy", "knorm"))
    node["_target_"] = f"{Throwaway.__module__}.{Throwaway.__qualname__}"
    monkeypatch.setitem(policies._REGISTRY, Throwaway.name, Throwaway)
    store = ConfigStore.instance()
    store.store(group="policy", name=Throwaway.name, node=node)
    try:
        for experiment in KVPRESS:
            check_kvpress_grid(experiment)
    finally:
        del store.repo["policy"][f"{Throwaway.name}.yaml"]


def test_experiments_exist():
    assert set(HARDWARE) <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", PAPER)
def test_paper_settings(experiment):
    """`kvbench experiment=... --cfg job` holds the published setting (method.md)."""
    model, task, gpus, per_gpu, budget = HARDWARE[experiment]
    cfg = _compose(f"experiment={experiment}", hydra=True)
    choices = cfg.hydra.runtime.choices
    assert (choices.model, choices.task, choices.policy) == (model, task, "batch_max")
    assert cfg.task.n_samples == 960 and cfg.task.seed == 0 and cfg.seed == 0
    assert cfg.task.max_input_tokens == 3584 == 4096 - 512
    assert cfg.gen.max_new_tokens == 512 and cfg.gen.ignore_eos is True
    assert cfg.policy.evict_every == 64 and cfg.policy.schedule == "prefill_and_decode"
    assert cfg.search.candidates == "divisors_of_960"
    assert dict(cfg.model.max_memory) == {i: per_gpu for i in range(gpus)}
    assert cfg.memory.limit_gb == budget
    assert cfg.model.dtype == "float16"
    r = cfg.reproduce
    assert list(r.kv_sizes) == list(range(128, 3585, 128)) and r.refine_step == 64
    assert r.near_fkv == 0.96 and r.ed_kv_size == 2
    reachable = {k + d for k in r.kv_sizes for d in (-r.refine_step, 0, r.refine_step)}
    assert set(PUBLISHED_KV[experiment]) <= reachable
    assert {"cnndm": 1, "narrativeqa": 2, "gsm8k": 16}[task] == cfg.task.n_shot


def test_runs_write_outside_the_committed_results():
    """With no `results_dir=` (the root config, and every experiment) records go under outputs/, which git ignores
    in the checkout: a first run never appends to the committed results/ (studies there pass results_dir)."""
    import shutil
    import subprocess
    from pathlib import Path

    dirs = {"(root)": _compose().results_dir, **{e: _compose(f"experiment={e}").results_dir for e in EXPERIMENTS}}
    assert all(Path(d).parts[0] == "outputs" for d in dirs.values()), dirs
    root = Path(__file__).resolve().parents[2]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    probes = [f"{d}/runs.jsonl" for d in dirs.values()]
    ignored = subprocess.run(["git", "check-ignore", *probes], cwd=root, capture_output=True, text=True).stdout.split()
    assert sorted(ignored) == sorted(probes), set(probes) - set(ignored)
