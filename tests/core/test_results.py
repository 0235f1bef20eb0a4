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


# ------------------------------------------------------------------------- issue 13: damaged files
def test_a_record_never_glues_to_a_damaged_last_line(tmp_path):
    """Case 1: a file cut mid-line (no final newline): the next record still starts its own line."""
    append_record(tmp_path, {"config_hash": "a", "status": "ok", "run_id": "1"})
    with open(tmp_path / "runs.jsonl", "ab") as f:
        f.write(b'{"config_hash": "half", "sta')  # a crashed writer, or a copy cut short
    append_record(tmp_path, {"config_hash": "b", "status": "ok", "run_id": "2"})
    assert [r["run_id"] for r in read_records(tmp_path)] == ["1", "2"]
    assert finished(tmp_path, "b")["run_id"] == "2"  # skip_existing sees it: no rerun
    assert (tmp_path / "runs.jsonl").read_bytes().endswith(b'"run_id": "2"}\n')


def test_bad_bytes_and_stubs_are_skipped_with_one_warning(tmp_path, caplog):
    """Case 2: a non-UTF-8 line, a stub, a JSON list and a torn line are skipped, named by line number, once."""
    append_record(tmp_path, {"config_hash": "a", "status": "ok", "run_id": "1"})
    with open(tmp_path / "runs.jsonl", "ab") as f:
        f.write(b'{"config_hash": "x", "status": "ok", "run_id": "\xff\xfe"}\n')  # readable, leniently
        f.write(b'\xff\xfe not json\n{"status": "ok"}\n[1, 2]\n{"torn": \n')
    append_record(tmp_path, {"config_hash": "b", "status": "ok", "run_id": "2"})
    with caplog.at_level("WARNING", logger="kvbench"):
        records = read_records(tmp_path)
        read_records(tmp_path)  # the same damage again: not said again
    assert [r["run_id"] for r in records] == ["1", "\ufffd\ufffd", "2"]
    warnings = [r.getMessage() for r in caplog.records if "not records" in r.getMessage()]
    assert len(warnings) == 1 and "skipped 4 line(s)" in warnings[0] and "(line 3, 4, 5, 6)" in warnings[0]
    assert finished(tmp_path, "b")["run_id"] == "2"


# ------------------------------------------------------------------------------------ issue 13: claims
HOLD_CLAIM = """
import sys, time
from kvbench import results
c = results.claim(sys.argv[1], "h")
print("claimed" if c.fd is not None else "not", flush=True)
time.sleep(60)
"""


def test_a_live_claim_is_respected_and_a_dead_ones_is_taken_over(tmp_path):
    """Case 7: a configuration claimed by a running process is not started again; a dead holder's claim is stale."""
    import subprocess
    import sys

    from kvbench import results

    p = subprocess.Popen([sys.executable, "-c", HOLD_CLAIM, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "claimed"
        held = results.claim(tmp_path, "h")
        assert held.fd is None and held.done is None and held.held_by == f"pid {p.pid} on " + __import__("socket").gethostname()
    finally:
        p.kill()
        p.wait()
    assert (tmp_path / "claims" / "h").exists()  # the killed holder's claim file stays behind
    mine = results.claim(tmp_path, "h")  # ... and is taken over: its lock died with it
    assert mine.fd is not None and mine.held_by is None
    append_record(tmp_path, {"config_hash": "h", "status": "ok", "run_id": "9"}, release=mine)
    assert not (tmp_path / "claims" / "h").exists()
    again = results.claim(tmp_path, "h")
    assert again.done["run_id"] == "9" and again.fd is None
