"""One run: config -> model, task, policy -> the mode's function -> scores -> one record, never lost.

One idea per module, imports one way (record <- store, static <- modes <- life):

    record.py   the record's schema: the stamp every record starts with, a run's record, a plan's record
    store.py    writing a run's predictions, scores and record; a rescue folder when results_dir fails
    signals.py  SIGTERM / SIGINT during a run: an `interrupted` record, then exit 143 / 130
    models.py   the model a process keeps for its next run; loading under `memory.limit_gb`
    static.py   mode=run: static batches, a fixed or searched batch size, generation and scores
    modes.py    the mode table: `mode=` -> its function (serve's are kvbench.serve.run's)
    life.py     `run(cfg)`: check, build, claim, load, run the mode, record whatever happened

Memory (kvbench.memory): `memory.limit_gb` caps every GPU before the model loads and is checked against
the weights once they are loaded; with `search.max_batch=true` the batch size comes from kvbench.search
(`search.only=true` records the search and stops). The record carries the accounted peak and, on CUDA,
`max_memory_allocated` per device (`peak_mem_bytes` = measured on CUDA, accounted on CPU) and
`max_memory_reserved` (`peak_reserved_bytes_per_device`: what the CUDA cap limits).

To replace a piece in a test, patch it where it is looked up: `kvbench.run.models.load_model` (a model
load), `kvbench.run.models.load_within`, `kvbench.run.static.execute` (mode=run's generation),
`kvbench.run.store.tempfile` (the rescue folder's root).
"""

from kvbench.run.life import run
from kvbench.run.store import RecordNotWritten

__all__ = ["run", "RecordNotWritten"]
