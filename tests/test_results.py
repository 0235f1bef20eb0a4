"""runs.jsonl: one whole line per record; a torn line never breaks reading."""

import json
import multiprocessing as mp

from kvbench.results import append_record, finished, read_records


def _writer(path, k):
    for i in range(50):
        append_record(path, {"writer": k, "i": i, "pad": "x" * 5000})


def test_concurrent_appends_stay_whole(tmp_path):
    procs = [mp.Process(target=_writer, args=(tmp_path, k)) for k in range(3)]
    [p.start() for p in procs]
    [p.join() for p in procs]
    lines = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 150 and all(json.loads(x)["pad"] == "x" * 5000 for x in lines)


def test_partial_line_is_skipped_and_finished_lookup(tmp_path):
    append_record(tmp_path, {"config_hash": "a", "status": "ok", "run_id": "1"})
    append_record(tmp_path, {"config_hash": "b", "status": "error", "run_id": "2"})
    with open(tmp_path / "runs.jsonl", "a") as f:
        f.write('{"config_hash": "c", "sta')  # a writer killed mid-line (not kvbench's own)
    assert [r["run_id"] for r in read_records(tmp_path)] == ["1", "2"]
    assert finished(tmp_path, "a")["run_id"] == "1"
    assert finished(tmp_path, "b") is None and finished(tmp_path, "c") is None
