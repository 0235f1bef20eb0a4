"""A task's rows, from the Hugging Face Hub (`datasets`) or from a local mirror (`data.dir`).

Both sources give the same rows: dicts with the Hub's nested column names, reduced to the columns
the task reads (NarrativeQA's Hub rows also carry whole books, which no task here needs, so Hub
splits are flattened and only those columns are kept). The mirror layout is interface.md's:
`{data.dir}/{folder}/{split}.jsonl.gz` or `.jsonl`. The Hub's split sizes are written down here, so
an unknown split or a too-large `task.n_samples` fails before anything is downloaded or loaded.
"""

from __future__ import annotations

import functools
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import ConfigError

SUFFIXES = (".jsonl.gz", ".jsonl")


@dataclass(frozen=True)
class Source:
    hub: str  # Hub dataset id
    config: str | None  # Hub config name
    folder: str  # folder of the mirror
    sizes: tuple[tuple[str, int], ...]  # (split, rows) on the Hub
    columns: tuple[str, ...]  # dotted column paths the task reads

    def splits(self) -> dict[str, int]:
        return dict(self.sizes)


def mirror_file(source: Source, split: str, data_dir: str) -> Path:
    for suffix in SUFFIXES:
        path = Path(data_dir) / source.folder / f"{split}{suffix}"
        if path.is_file():
            return path
    raise ConfigError("data.dir", f"has no {source.folder}/{split}.jsonl.gz or .jsonl", data_dir)


def n_rows(source: Source, split: str, data_dir: str | None, key: str = "task.split") -> int:
    """Rows of a split, without loading it; ConfigError (naming `key`) for an unknown split."""
    sizes = source.splits()
    if split not in sizes:
        raise ConfigError(key, f"{source.hub} has the splits {', '.join(sizes)}", split)
    if not data_dir:
        return sizes[split]
    path = mirror_file(source, split, data_dir)
    return _count_lines(str(path), path.stat().st_mtime_ns)


def load(source: Source, split: str, data_dir: str | None) -> list[dict]:
    """All rows of a split (cached per process; callers must not modify them)."""
    if not data_dir:
        return _read_hub(source.hub, source.config, split, source.columns)
    path = mirror_file(source, split, data_dir)
    return _read_mirror(str(path), path.stat().st_mtime_ns, source.columns)


def _open(path: str):
    return gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8")


@functools.lru_cache(maxsize=32)
def _count_lines(path: str, mtime_ns: int) -> int:
    with _open(path) as f:
        return sum(1 for line in f if line.strip())


@functools.lru_cache(maxsize=8)
def _read_mirror(path: str, mtime_ns: int, columns: tuple[str, ...]) -> list[dict]:
    with _open(path) as f:
        lines = enumerate(f, 1)
        return [project(json.loads(line), columns, f"{path}:{n}") for n, line in lines if line.strip()]


@functools.lru_cache(maxsize=8)
def _read_hub(hub: str, config: str | None, split: str, columns: tuple[str, ...]) -> list[dict]:
    import datasets

    flat = datasets.load_dataset(hub, config, split=split).flatten().select_columns(list(columns))
    return [nest(row) for row in flat.to_list()]


def project(row: dict, columns: tuple[str, ...], where: str) -> dict:
    """`row` reduced to the dotted `columns`, still nested."""
    flat = {}
    for path in columns:
        value = row
        for part in path.split("."):
            if not isinstance(value, dict) or part not in value:
                raise ConfigError("data.dir", f"{where} has no column '{path}'")
            value = value[part]
        flat[path] = value
    return nest(flat)


def nest(flat: dict) -> dict:
    """{"a.b": 1} -> {"a": {"b": 1}}."""
    out: dict = {}
    for path, value in flat.items():
        *parents, leaf = path.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out
