"""kvbench.run.store: predictions, scores and the record land in results_dir; what the folder refuses goes
to a rescue folder (temp, else home) and RecordNotWritten names it; the run's claim is released."""

from __future__ import annotations

import errno

import pytest
from omegaconf import OmegaConf

from kvbench import results
from kvbench.results import read_jsonl, read_records
from kvbench.run import store

ROWS = [{"index": 0, "prediction": "a", "score": {"accuracy": 1.0}, "output_tokens": 1, "token_ids": [1]},
        {"index": 1, "prediction": "b", "score": {"accuracy": 0.0}, "output_tokens": 2, "token_ids": [2, 3]}]


def _record(run_id="20260101-000000-abcdef01-0000"):
    return {"run_id": run_id, "config_hash": "abcdef0123456789", "status": "ok", "notes": [],
            "predictions_path": None, "scores_path": None}


def test_everything_goes_to_the_results_folder(tmp_path):
    cfg = OmegaConf.create({"results_dir": str(tmp_path)})
    rec = _record()
    store.save(cfg, rec, ROWS, None)
    assert rec["predictions_path"] == str(tmp_path / "predictions" / f"{rec['run_id']}.jsonl")
    assert read_jsonl(rec["predictions_path"]) == ROWS
    assert [r["index"] for r in read_jsonl(rec["scores_path"])] == [0, 1]
    (stored,) = read_records(tmp_path)
    assert stored == rec and not rec["notes"]


def test_no_rows_writes_the_record_alone(tmp_path):
    rec = _record()
    store.save(OmegaConf.create({"results_dir": str(tmp_path)}), rec, [], None)
    assert rec["predictions_path"] is None and not (tmp_path / "predictions").exists()
    assert read_records(tmp_path) == [rec]


def test_a_full_disk_sends_everything_to_the_rescue_folder_and_says_where(tmp_path, monkeypatch):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    res = tmp_path / "res"
    write, append = results.write_jsonl, results.append_record
    monkeypatch.setattr(results, "write_jsonl", lambda path, rows: full() if res in store.Path(path).parents
                        else write(path, rows))
    monkeypatch.setattr(results, "append_record", lambda d, r, release=None: full() if store.Path(d) == res
                        else append(d, r, release))
    monkeypatch.setattr(store.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    rec = _record()
    with pytest.raises(store.RecordNotWritten, match="No space left") as exc:
        store.save(OmegaConf.create({"results_dir": str(res)}), rec, ROWS, None)
    rescue = exc.value.rescue
    assert rescue == tmp_path / "tmp" / "kvbench-rescue" / rec["run_id"]
    assert read_jsonl(rescue / "predictions.jsonl") == ROWS and (rescue / "scores.jsonl").exists()
    (stored,) = read_records(rescue)
    assert stored["predictions_path"] == str(rescue / "predictions.jsonl") and len(stored["notes"]) == 2


def test_the_rescue_folder_falls_back_to_home(tmp_path, monkeypatch):
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setattr(store.tempfile, "gettempdir", lambda: str(tmp_path / "not-a-folder"))
    monkeypatch.setattr(store.Path, "home", classmethod(lambda cls: tmp_path / "home"))
    assert store.rescue_dir("r1") == tmp_path / "home" / "kvbench-rescue" / "r1"


def test_the_claim_is_released_with_the_record(tmp_path):
    claim = results.claim(tmp_path, "abcdef0123456789")
    assert claim.fd is not None and claim.path.exists()
    store.save(OmegaConf.create({"results_dir": str(tmp_path)}), _record(), [], claim)
    assert claim.fd is None and not claim.path.exists()
