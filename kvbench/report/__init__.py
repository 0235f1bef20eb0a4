"""`kvbench-report RESULTS_DIR`: the paper's tables, a CSV of every run and plots, from runs.jsonl.

Writes into RESULTS_DIR (or `--out`):
- `tables.md`: per setting (below) and attention backend (records of `mode: plan` are no runs and
  are left out), the paper's layout (Method, b,
  kv, metric, tokens/s). The summary picks ED's and FKV's fastest runs and, for every other method,
  the fastest run at FKV's metric or above ("BM >= FKV") and at `--near-fkv` of it ("BM >= 96% FKV",
  the paper's second Batch-Max row); "All runs" lists every configuration. A known out-of-memory
  batch is a row "(b=5 OOM)" after the largest run of the same method and kv, as in the paper.
- `runs.csv`: every record of runs.jsonl (errors and repeats included), flattened.
- `plots/*.png`: per table, the metric vs throughput (one point per run, the FKV level as a line),
  the largest batch size the search found per method and kv, and peak memory vs batch size.

Settings are kept apart: one table per setting, the whole resolved config (`record["config"]`) minus
the knobs a table compares (COMPARED: the policy and its hyper-parameters, the batch size, the
search keys, where results, logs and data live), so runs with another n_shot, seed, prompt style,
input cut, ignore_eos, context length, budget or device never share a table, and ED's and FKV's
reference rows come from the same setting only. A heading names what its setting has that other
settings of the same model and task do not (e.g. `task.n_shot=0`). A search where not even the
smallest batch fits is a row "(b=1 OOM)".

Only the latest record of a configuration (its `config_hash`) that ended ok or oom counts; a record
the report cannot use (no policy, no batch size, metrics that are no mapping) is left out and
counted in the header, never a crash. The metric column is the task's own (`Task.metric`, rows.metric_key).
Method names: ED extreme decoding-only, FKV full cache, BM Batch-Max; "(P&D)" / "(D)" marks a
policy run under the schedule it does not default to.

Uncertainty (kvbench.stats, per-sample data through kvbench.compare): a metric shows its 95%
bootstrap interval, `0.064 [0.051, 0.078]` (the record's `<metric>_ci`, else rebuilt from the run's
predictions or scores file), with error bars in the plot. When per-sample data is at hand, every
summary pick says whether its paired difference to FKV (same samples, matched by index) is
distinguishable from 0, and a section "Against FKV" lists, per run, that difference with its
interval, how far its generated tokens follow FKV's (the share equal up to the first divergence,
and identical outputs) and its output lengths; a plot shows the agreement against kv size.

The package, one job per module: rows.py (the row model and labels), grouping.py (which records count,
which table each belongs to), tables.py (a table, its picks, the pairing with FKV, its markdown),
plots.py (the figures), heatmap.py (the needle heatmaps of depth-swept runs), files.py (tables.md, runs.csv),
report_cli.py (the command).
"""

from kvbench.report.files import write_csv, write_report
from kvbench.report.grouping import attention_of, group_key, latest, unusable
from kvbench.report.plots import plot_table
from kvbench.report.report_cli import main
from kvbench.report.rows import METHODS, Row
from kvbench.report.tables import Table, tables

__all__ = ["main", "write_report", "write_csv", "plot_table", "METHODS", "Row", "Table", "tables", "latest",
           "attention_of", "group_key", "unusable"]
