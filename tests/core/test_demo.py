"""`make demo` compares every policy kvbench has, on the passkey task (no data needed).

The demo lists the registered policies (kvbench.policies.registry); the test counts them from the other side,
the shipped configs (conf/policy/*.yaml), so a policy without a config or a class fails here."""

from kvbench import demo
from kvbench.conf import options
from kvbench.results import read_records


def test_demo_runs_every_policy_and_prints_the_table(tmp_path, capsys):
    demo.main(["model=tiny-llama", "device=cpu", f"results_dir={tmp_path}", "task.context_tokens=64",
               "gen.max_new_tokens=4"])
    records = read_records(tmp_path)
    assert sorted(r["policy"] for r in records) == options("policy")  # every shipped policy joins the demo
    assert {r["task"] for r in records} == {"passkey"}  # no data.dir: the synthetic task only
    assert all(r["status"] == "ok" for r in records), [r["error"] for r in records]
    out = capsys.readouterr().out
    table = out[out.index("task "):]  # the final table: a header, a rule, a row per run
    rows = [line for line in table.splitlines()[2:] if line.startswith("passkey")]
    assert [line.split()[1] for line in rows] == [r["policy"] for r in records]
