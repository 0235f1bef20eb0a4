"""Bad model_args of kvbench's lm-eval model (kvbench/lmeval_args.py): one line before any weight loads.

Through the console script `kvbench-lm-eval` in its own process: exit code 2, stderr exactly one line naming the
model_arg as the user wrote it, no traceback, and nothing of lm_eval's run started (its log lines, the first of
which precede the model's construction, never appear). Through `lm_eval.simple_evaluate(model="kvbench",
model_args=...)` in Python: a ConfigError of one line, raised before the loader is called (the loader patched to
fail). A typo'd key, an unknown policy or model, a value of the wrong type or range, lm_eval's own options put in
model_args, and a batch size kvbench cannot run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm_eval is not installed (pip install 'kvbench[lm-eval]')")

from kvbench.errors import ConfigError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tests" / "data" / "lm_eval"
SCRIPT = Path(sys.executable).parent / "kvbench-lm-eval"

# model_args -> the start of the one line (after "kvbench-lm-eval: error: ")
BAD_CLI = {
    "model=tiny-llama,policy=h2oo": "policy=h2oo: unknown kvbench policy (available: batch_max,",
    "model=tiny-llama,policy=h2o,kv_sise=16": "kv_sise=16: is not a model_arg of kvbench's lm-eval model",
    "model=tiny-lama": "model=tiny-lama: unknown kvbench model (available:",
    "model=tiny-llama,dtype=float17": "dtype=float17: must be auto or one of float32",
    "model=tiny-llama,batch_size=2": "batch_size=2: is lm_eval's own option, not a model_arg: give --batch_size",
}
BAD_PYTHON = {
    **BAD_CLI,
    "model=tiny-llama,max_batch_size=4": "max_batch_size=4: is lm_eval's own option",
    "model=tiny-llama,max_gen_toks=abc": "max_gen_toks=abc: must be a positive integer",
    "model=tiny-llama,max_gen_toks=0": "max_gen_toks=0: must be a positive integer",
    "model=tiny-llama,add_bos_token=maybe": "add_bos_token=maybe: must be true or false",
    "model=tiny-llama,prefix_token_id=99999": "prefix_token_id=99999: must be a token id of the model",
    "model=tiny-llama,prefill_chunk=abc": "prefill_chunk=abc: Value 'abc' of type 'str' could not be converted",
    "model=tiny-llama,policy=h2o,kv_size=-3": "kv_size=-3: must be a positive integer",
    "model=tiny-llama,policy=h2o,kv_size=64,evict_every=64": "evict_every=64: must be smaller than kv_size=64",
    "model=tiny-llama,policy=snapkv,schedule=after_prefil": "schedule=after_prefil: must be one of",
    "model=tiny-llama,attention=flash": "attention=flash: flash computes in half precision only (dtype=float32): "
                                        "set dtype=float16 or bfloat16, or attention=sdpa",
    "model=tiny-llama,pretrained=gpt2": "pretrained=gpt2: is not a model_arg of kvbench's lm-eval model",
    "model=tiny-llama,device=tpu": "device=tpu: must be auto, cpu or cuda[:N]",
}


@pytest.mark.parametrize("model_args", sorted(BAD_CLI))
def test_the_console_script_refuses_in_one_line(model_args):
    assert SCRIPT.is_file(), SCRIPT
    p = subprocess.run([str(SCRIPT), "--model", "kvbench", "--model_args", model_args, "--tasks", "kvbench_tiny_gen",
                        "--include_path", str(TASKS), "--limit", "1"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    lines = p.stderr.splitlines()
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and len(lines) == 1, p.stderr[-2000:]
    assert lines[0].startswith(f"kvbench-lm-eval: error: {BAD_CLI[model_args]}"), lines[0]
    assert p.stdout == ""


@pytest.mark.parametrize("model_args", sorted(BAD_PYTHON))
def test_simple_evaluate_refuses_before_loading(model_args, monkeypatch):
    import lm_eval

    import kvbench.lmeval  # noqa: F401  (registers the model)
    from kvbench.run import models

    def no_load(cfg):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", no_load)
    with pytest.raises(ConfigError) as e:
        lm_eval.simple_evaluate(model="kvbench", model_args=model_args, tasks=["kvbench_tiny_gen"], batch_size=1)
    assert "\n" not in str(e.value) and str(e.value).startswith(BAD_PYTHON[model_args]), str(e.value)


@pytest.mark.parametrize("batch_size", ["auto", "0", "two"])
def test_batch_sizes_kvbench_cannot_run(batch_size):
    from kvbench.lmeval_args import configure
    from kvbench.lmeval_command import command_line

    with pytest.raises(ConfigError, match="^batch_size="):
        configure(command_line(["--model", "kvbench", "--model_args", "model=tiny-llama", "--tasks", "x",
                                "--batch_size", batch_size]))


def test_the_command_line_is_read_as_lm_eval_reads_it(tmp_path):
    """Flags over a --config YAML's; several --model_args words merge; another model or subcommand is lm_eval's."""
    from kvbench.lmeval_command import command_line

    yaml = tmp_path / "run.yaml"
    yaml.write_text("model: kvbench\nmodel_args:\n  model: tiny-llama\n  policy: h2o\nbatch_size: 4\n")
    assert command_line(["run", "--config", str(yaml), "--tasks", "x"]) == {"model": "tiny-llama", "policy": "h2o",
                                                                             "batch_size": 4}
    got = command_line(["--model", "kvbench", "--model_args", "model=tiny-llama,policy=h2o", "kv_size=32",
                        "--tasks", "x", "--batch_size", "2", "--device", "cpu"])
    assert got == {"model": "tiny-llama", "policy": "h2o", "kv_size": 32, "batch_size": "2", "device": "cpu"}
    assert command_line(["--model", "hf", "--model_args", "pretrained=gpt2", "--tasks", "x"]) is None
    assert command_line(["ls", "tasks"]) is None
