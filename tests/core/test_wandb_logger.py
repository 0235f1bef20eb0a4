"""logger=wandb: offline by default it writes a run directory holding the record's summary, config and
predictions table; a broken W&B never fails a run (the record is still written, wandb.finish runs)."""

import struct
import time

import pytest
from hydra import compose, initialize_config_dir

from kvbench import run as kvrun
from kvbench import wandb_logger
from kvbench.config import CONF_DIR
from kvbench.results import read_records

TINY = ["model=tiny-llama", "task.n_samples=2", "task.context_tokens=32", "gen.max_new_tokens=2", "batch_size=2",
        "policy=batch_max", "policy.kv_size=32", "policy.evict_every=8", "experiment_name=wandb_test", "logger=wandb"]


@pytest.fixture
def no_wandb_account(monkeypatch, tmp_path):
    """No WANDB_MODE (conftest disables W&B), no API key, no netrc: the logger must choose offline."""
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))


def _run(tmp_path, *extra):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*TINY, f"results_dir={tmp_path / 'results'}", *extra])
    return kvrun.run(cfg)


def _records(path):
    """The protobuf records of a W&B transaction log (.wandb): leveldb-log blocks after a 7-byte header."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunk, out, block = 7, b"", [], 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        if pos + 7 + length > len(data):  # still being written
            break
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            rec = Record()
            rec.ParseFromString(chunk)
            out.append(rec)
            chunk = b""
    return out


def _finished_log(run_dir, timeout=60.0):
    """The run's records once W&B's service process has written them all (it may lag wandb.finish)."""
    deadline = time.monotonic() + timeout
    while True:
        records = _records(next(run_dir.glob("run-*.wandb")))
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def test_offline_run_directory_has_the_summary(tmp_path, no_wandb_account):
    import json

    rec = _run(tmp_path)
    assert rec["status"] == "ok"
    (run_dir,) = (tmp_path / "wandb-dir" / "wandb").glob("offline-run-*")  # offline: nothing configured
    records = _finished_log(run_dir)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.display_name == "batch_max/kv32/b2" and run.run_group == "wandb_test" and run.job_type == "passkey"
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["kvbench"]["policy"] == "batch_max" and config["kvbench"]["run_id"] == rec["run_id"]
    assert config["policy"]["kv_size"] == 32 and config["batch_size"] == 2  # the resolved config
    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update({u.key: json.loads(u.value_json) for u in r.summary.update if u.key})
    assert summary["accuracy"] == rec["metrics"]["accuracy"]
    assert summary["throughput_tok_s"] == pytest.approx(rec["throughput_tok_s"])
    assert summary["status"] == "ok" and summary["peak_kv_bytes"] == rec["peak_kv_bytes"]
    (table,) = (run_dir / "files" / "media" / "table").glob("predictions_*.table.json")
    data = json.loads(table.read_text())
    assert data["columns"][:4] == ["index", "prompt_tokens", "prompt", "prediction"] and len(data["data"]) == 2


def test_broken_wandb_still_writes_the_record(tmp_path, no_wandb_account, monkeypatch, caplog):
    import wandb

    def broken(**kwargs):
        raise RuntimeError("W&B is down")

    finished = []
    monkeypatch.setattr(wandb, "init", broken)
    monkeypatch.setattr(wandb, "finish", lambda *a, **k: finished.append(True))
    rec = _run(tmp_path)
    assert rec["status"] == "ok" and finished == [True]
    assert [r["run_id"] for r in read_records(tmp_path / "results")] == [rec["run_id"]]
    assert "W&B is down" in caplog.text
    assert not (tmp_path / "wandb-dir" / "wandb").exists()


@pytest.mark.parametrize("env,mode,expected", [
    ({}, None, "offline"),
    ({"WANDB_API_KEY": "x" * 40}, None, "online"),
    ({"WANDB_MODE": "disabled"}, None, None),  # W&B reads WANDB_MODE itself
    ({"WANDB_API_KEY": "x" * 40}, "offline", "offline"),  # logger.mode wins
])
def test_mode(env, mode, expected, no_wandb_account, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert wandb_logger.resolve_mode(mode) == expected


def test_wandb_login_netrc_means_online(no_wandb_account, tmp_path):
    (tmp_path / "no-netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert wandb_logger.resolve_mode(None) == "online"


@pytest.fixture
def silent_server():
    """A server that accepts connections and never answers (a black hole behind a firewall)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("where", ["no_such_host", "silent"])
def test_online_without_network_decides_offline_within_the_timeout(where, no_wandb_account, monkeypatch, caplog,
                                                                   silent_server):
    """Case 9: online asked for, W&B unreachable: offline within logger.init_timeout, said once."""
    url = {"no_such_host": "http://wandb.invalid", "silent": silent_server}[where]
    monkeypatch.setenv("WANDB_BASE_URL", url)
    monkeypatch.setattr(wandb_logger, "_reachable", {}, raising=False)
    monkeypatch.setattr(wandb_logger, "_said", set(), raising=False)
    with caplog.at_level("WARNING", logger="kvbench"):
        start = time.monotonic()
        first = wandb_logger.WandbLogger(mode="online", init_timeout=1).start()
        assert time.monotonic() - start < 5  # W&B's own init timeout is ~90 s
        second = wandb_logger.WandbLogger(mode="online", init_timeout=1).start()
    assert first == second and {k: first[k] for k in ("name", "mode", "requested")} == {
        "name": "wandb", "mode": "offline", "requested": "online"}
    assert f"{url} did not answer within 1 s" in first["note"]
    assert caplog.text.count("did not answer") == 1  # said once per process


def test_online_without_network_runs_offline_and_the_record_says_so(tmp_path, no_wandb_account, monkeypatch,
                                                                    silent_server):
    """Case 9: the run logs offline (a W&B offline run directory) and its record carries the fallback."""
    import wandb

    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", silent_server)
    monkeypatch.setattr(wandb_logger, "_reachable", {}, raising=False)
    monkeypatch.setattr(wandb_logger, "_said", set(), raising=False)
    modes, init = [], wandb.init
    monkeypatch.setattr(wandb, "init", lambda **kw: modes.append(kw["mode"]) or init(**kw))
    rec = _run(tmp_path, "logger.mode=online")  # the default logger.init_timeout (5 s)
    assert rec["status"] == "ok" and modes == ["offline"]
    (stored,) = read_records(tmp_path / "results")
    assert stored["logger"]["mode"] == "offline" and stored["logger"]["requested"] == "online"
    assert f"{silent_server} did not answer within 5 s" in stored["notes"][0]
    assert len(list((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*"))) == 1
