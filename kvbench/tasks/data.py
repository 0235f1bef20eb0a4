"""A task's rows, from the Hugging Face Hub (`datasets`) or from a local mirror (`data.dir`).

Both sources give the same rows: dicts with the Hub's nested column names, reduced to the columns
the task reads (NarrativeQA's Hub rows also carry whole books, which no task here needs, so Hub
splits are flattened and only those columns are kept). The mirror layout is docs/contract.md's:
`{data.dir}/{folder}/{split}.jsonl.gz` or `.jsonl`. The Hub's split sizes are written down here, so
an unknown split or a too-large `task.n_samples` fails before anything is downloaded or loaded.

A mirror file is read as bytes, line by line: a damaged gzip, a line that is not UTF-8 or not a JSON
object, a row without one of the task's columns or with a column of the wrong type (`Source.kinds`:
text where text is read) is a ConfigError naming the file, the line number and the problem (the CLI's
preflight parses every row a run reads, so it fails before any model).
"""

from __future__ import annotations

import functools
import gzip
import json
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import ConfigError

SUFFIXES = (".jsonl.gz", ".jsonl")


@dataclass(frozen=True)
class Kind:
    """What a column must hold: `name` in words (for the error), `ok` the test."""

    name: str
    ok: Callable[[object], bool]


TEXT = Kind("text", lambda v: isinstance(v, str))
ANY = Kind("anything", lambda v: True)


@dataclass(frozen=True)
class Source:
    hub: str  # Hub dataset id
    config: str | None  # Hub config name
    folder: str  # folder of the mirror
    sizes: tuple[tuple[str, int], ...]  # (split, rows) on the Hub
    columns: tuple[str, ...]  # dotted column paths the task reads
    kinds: tuple[Kind, ...] = ()  # what each column must hold (default: text)

    def splits(self) -> dict[str, int]:
        return dict(self.sizes)

    def kind(self, i: int) -> Kind:
        return self.kinds[i] if i < len(self.kinds) else TEXT


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
    return _read_mirror(str(path), path.stat().st_mtime_ns, source)


def _lines(path: str) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line) of a mirror file; ConfigError naming the file when it is damaged."""
    n = 0
    try:
        with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
            for n, raw in enumerate(f, 1):  # noqa: B007 (n names the line a damaged file ends at)
                yield n, raw
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise ConfigError("data.dir", f"{path}:{n + 1}: the file is damaged or cut short ({e})") from None


@functools.lru_cache(maxsize=32)
def _count_lines(path: str, mtime_ns: int) -> int:
    return sum(1 for _, raw in _lines(path) if raw.strip())


def parse(raw: bytes, where: str) -> dict:
    """One mirror line as a JSON object; ConfigError naming `where` (file and line) otherwise."""
    try:
        row = json.loads(raw)
    except UnicodeDecodeError as e:
        raise ConfigError("data.dir", f"{where}: not UTF-8 (byte {e.start + 1} is {raw[e.start:e.start + 1]!r})") from None
    except json.JSONDecodeError as e:
        raise ConfigError("data.dir", f"{where}: invalid JSON at column {e.colno} ({e.msg})") from None
    if not isinstance(row, dict):
        raise ConfigError("data.dir", f"{where}: not a JSON object but {type(row).__name__}")
    return row


@functools.lru_cache(maxsize=8)
def _read_mirror(path: str, mtime_ns: int, source: Source) -> list[dict]:
    return [project(parse(raw, f"{path}:{n}"), source.columns, f"{path}:{n}", source.kind)
            for n, raw in _lines(path) if raw.strip()]


@functools.lru_cache(maxsize=8)
def _read_hub(hub: str, config: str | None, split: str, columns: tuple[str, ...]) -> list[dict]:
    import datasets

    flat = datasets.load_dataset(hub, config, split=split).flatten().select_columns(list(columns))
    return [nest(row) for row in flat.to_list()]


def project(row: dict, columns: tuple[str, ...], where: str, kind: Callable[[int], Kind] = lambda i: ANY) -> dict:
    """`row` reduced to the dotted `columns`, still nested; `kind(i)`: what column i must hold."""
    flat = {}
    for i, path in enumerate(columns):
        value = row
        for part in path.split("."):
            if not isinstance(value, dict) or part not in value:
                raise ConfigError("data.dir", f"{where} has no column '{path}'")
            value = value[part]
        k = kind(i)
        if not k.ok(value):
            shown = json.dumps(value, default=str)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise ConfigError("data.dir", f"{where}: column '{path}' must be {k.name}, not {type(value).__name__} "
                              f"({shown})")
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
