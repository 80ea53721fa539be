"""Where records come from: raw rows with their location, renamed by an explicit column mapping.

A source is one file (JSONL, Parquet, Arrow), one directory written by `datasets`'
`save_to_disk` (a DatasetDict needs a split), or a Hugging Face hub dataset named `hub:owner/name`,
streamed through `datasets.load_dataset`. Only that prefix reaches the network: a missing local path
is an error (naming near file names), never a download. Rows are numbered from 1 in every
source (JSONL: the line number) so that errors read `source:row: field: problem`; row 0 stands for
the source as a whole.

A column mapping (our field -> their column) renames columns before validation. It is checked
before the rows are read: against the Parquet/Arrow schema, the dataset's features, or a JSONL
file's first record. Columns it does not name keep their name; those that are no field of the
schema are an error, or, with `extra_columns="meta"`, are carried under `meta`.
"""

from __future__ import annotations

import glob
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from nemo_topr.errors import UserError, nearest, suggestion
from nemo_topr.data.schema import FIELDS, REQUIRED_FIELDS, DataError, RejectedRow

FILE_FORMATS = {".jsonl": "JSONL", ".parquet": "Parquet", ".arrow": "Arrow"}
READ_SUFFIXES = ".jsonl, .parquet or .arrow"  # FILE_FORMATS, as the errors name them
NOT_A_RECORDS_PATH = (f"not a regular file or a directory (a FIFO, socket or device): give a {READ_SUFFIXES} file "
                      "or a directory of them")
# what to do with a file of another format, where there is one thing to say
FORMAT_HINTS = {**dict.fromkeys((".gz", ".bz2", ".xz", ".zst", ".zip"), "decompress it first"),
                ".json": "JSON Lines named .json, as datasets' to_json writes? rename it .jsonl; a JSON array: write "
                         "one record per line"}
ExtraColumns = Literal["error", "meta"]
EXTRA_COLUMNS = get_args(ExtraColumns)
# what datasets.load_from_disk looks for (datasets/load.py:1740-1747)
SAVED_DATASET_FILES = ("dataset_info.json", "state.json")
SAVED_DATASET_DICT_FILE = "dataset_dict.json"
HUB_PREFIX = "hub:"  # the one way to ask for a download: `hub:owner/name`
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # `name` or `owner/name`
_BATCH_ROWS = 4096


@dataclass(frozen=True)
class Source:
    """One source of rows; `read()` yields (row number, parsed row or RejectedRow)."""

    name: str  # what errors name: the file, the dataset directory, or the hub name
    format: str
    columns: tuple[str, ...] | None  # known before reading (columnar sources); None for JSONL
    read: Callable[[], Iterator[tuple[int, Any]]]


# ---------------------------------------------------------------------------------------------
# Finding sources


def open_sources(paths: str | Path | Sequence[str | Path], *,
                 split: str | None = None) -> tuple[list[Source], list[str]]:
    """The sources named by files, directories, glob patterns, saved datasets or hub names, and a
    note for each directory or pattern naming the files in it that are not read (no data format)."""
    specs = [paths] if isinstance(paths, (str, Path)) else list(paths)
    sources, notes = [], []
    for spec in specs:
        found, note = _sources_of(str(spec), split)
        sources += found
        notes += [note] if note else []
    read_as: dict[Path | str, str] = {}
    for source in sources:  # a file given twice (`a.jsonl d/`, or two spellings) was a "duplicate sample_id"
        key = source.name if source.format == "hub" else Path(source.name).resolve()
        if key in read_as:
            raise refusal(source.name, 0, f"named twice (also as {read_as[key]}): its records would be read "
                          "twice; name each file or directory once", key="path.named_twice", where="path")
        read_as[key] = source.name
    formats = {source.format: source.name for source in sources}
    if len(formats) > 1:
        named = " and ".join(f"{fmt} ({name})" for fmt, name in sorted(formats.items()))
        raise refusal(spec_name(paths), 0, f"mixes {named}; use one format per dataset", key="format.mixed",
                      where="format")
    if split is not None and not formats.keys() & {"datasets", "hub"}:
        raise refusal(spec_name(paths), 0, f"split {split!r} applies only to a saved DatasetDict or a hub dataset",
                      key="split.without_splits", where="split")
    return sources, notes


def spec_name(paths: str | Path | Sequence[str | Path]) -> str:
    return str(paths) if isinstance(paths, (str, Path)) else ",".join(map(str, paths))


def refusal(path: str | Path, line: int, problem: str, *, key: str, where: str) -> DataError:
    """The DataError `key` of field, column or option `where` of `path` at `line` (0: the source as a whole)."""
    return DataError(path, line, where, problem, key=key)


def _sources_of(spec: str, split: str | None) -> tuple[list[Source], str | None]:
    path = Path(spec)
    if path.is_dir():
        if saved_dataset_kind(path):
            return [_dataset_source(*load_saved_dataset(path, split))], None
        return _data_files(spec, sorted(path.iterdir()),
                           f"directory holds no {READ_SUFFIXES} files and no dataset written by save_to_disk")
    if path.is_file():
        if path.suffix not in FILE_FORMATS:
            raise refusal(spec, 0, f"unknown format {path.suffix!r}; expected {READ_SUFFIXES}"
                          + (f" ({FORMAT_HINTS[path.suffix]})" if path.suffix in FORMAT_HINTS else ""),
                          key="path.unknown_format", where="path")
        return [_file_source(path)], None
    if path.exists():  # a FIFO, socket or device: no records file, yet no "does not exist" either
        raise refusal(spec, 0, NOT_A_RECORDS_PATH, key="path.not_a_file_or_directory", where="path")
    if glob.has_magic(spec):
        return _data_files(spec, sorted(map(Path, glob.glob(spec))),
                           f"pattern matches no {READ_SUFFIXES} files")
    if spec.startswith(HUB_PREFIX):
        name = spec.removeprefix(HUB_PREFIX)
        if not HUB_NAME.match(name):
            raise refusal(spec, 0, f"{name!r} is no hub dataset name (owner/name)", key="path.not_a_hub_name",
                          where="path")
        return [_hub_source(name, split)], None
    raise refusal(spec, 0, "does not exist" + _missing_hint(path, path), key="path.missing", where="path")


def why_missing(spec: str, typed: str | None = None) -> str | None:
    """Why `spec` names no data here, in the words reading it would use, or None when it names a
    file, a directory, a matching pattern or a hub dataset; reads nothing (`nemo-topr submit`
    checks a job's data this way before queueing it, `typed` being the value as written, before
    it was resolved against the checkout)."""
    if spec.startswith(HUB_PREFIX) or Path(spec).is_file() or Path(spec).is_dir():
        return None
    if Path(spec).exists():
        return NOT_A_RECORDS_PATH
    if glob.has_magic(spec):
        return None if glob.glob(spec) else "pattern matches nothing"
    return "does not exist" + _missing_hint(Path(spec), Path(typed or spec))


def _missing_hint(path: Path, typed: Path) -> str:
    """What a typo most likely meant: near names beside it, or the prefix an `owner/name` needs."""
    parent = path.parent
    if parent.is_dir():
        near = nearest(path.name, [entry.name for entry in parent.iterdir()], n=3)
        return suggestion([str(parent / name) for name in near])
    if len(typed.parts) == 2 and HUB_NAME.match(str(typed)):
        return f" (a Hugging Face hub dataset is read only when named so: {HUB_PREFIX}{typed})"
    return f" (nor does its directory {parent})"


def _data_files(spec: str, entries: list[Path], none_found: str) -> tuple[list[Source], str | None]:
    """The files of a directory or pattern that are JSONL, Parquet or Arrow; the other entries (a
    README, a report, a compressed copy, a subdirectory: not searched) are named in a note, never
    dropped unsaid."""
    data, others = [], []
    for entry in entries:  # one pass: a directory may hold thousands of shards
        if entry.suffix in FILE_FORMATS and entry.is_file():
            data.append(entry)
        else:
            others.append(entry.name + ("/" if entry.is_dir() else ""))
    if not data:
        raise refusal(spec, 0, none_found + (f" (it has: {_some(others)})" if others else ""),
                      key="path.no_data_files", where="path")
    note = f"{spec}: {len(others)} not read, not a {READ_SUFFIXES} file: {_some(others)}"
    return [_file_source(file) for file in data], note if others else None


def _some(names: list[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _file_source(path: Path) -> Source:
    if path.suffix == ".parquet":
        return _parquet_source(path)
    if path.suffix == ".arrow":
        return _arrow_source(path)
    return Source(str(path), "JSONL", None, lambda: jsonl_rows(path))


# ---------------------------------------------------------------------------------------------
# Files


class KeyGivenTwice(UserError, ValueError):
    """A JSON object's key (`where`) given several `values`."""

    def __init__(self, values: list[Any], *, key: str, where: str):
        super().__init__(f"given {len(values)} times in one object, with different values "
                         f"({', '.join(f'{v!r:.40}' for v in values)}): which is meant?", key=key, where=where)


def _object_of_distinct_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys differ, or repeat a value: Python's json keeps a repeated key's
    last value, and a reward written twice (a grader's and a re-grader's) read as the last."""
    row = dict(pairs)
    if len(row) < len(pairs):
        for key in row:
            values = [value for name, value in pairs if name == key]
            if any(json.dumps(value) != json.dumps(values[0]) for value in values):  # NaN as NaN
                raise KeyGivenTwice(values, key="record.key_given_twice", where=key)
    return row


def jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, the row or a RejectedRow naming file, line and problem), line by line: not
    through `datasets`, which loses line numbers and coerces types."""
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:  # a byte-order mark opening the file is no content (RFC 8259 lets parsers ignore it)
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as error:
                problem = f"invalid UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1})"
                yield number, RejectedRow("invalid_utf8", refusal(path, number, problem, key="record.invalid_utf8",
                                                                  where="record"))
                continue
            try:
                yield number, json.loads(text.rstrip("\r\n"), object_pairs_hook=_object_of_distinct_keys)
            except KeyGivenTwice as error:
                yield number, RejectedRow("invalid_json", refusal(path, number, str(error),
                                                                  key="record.key_given_twice", where=error.where))
            except json.JSONDecodeError as error:
                problem = f"invalid JSON: {error.msg} (column {error.colno})"
                if error.msg.startswith("Unexpected UTF-8 BOM"):  # Python's message suggests a decoding option
                    problem = ("invalid JSON: the line starts with a UTF-8 byte-order mark (BOM), which belongs only "
                               "at the start of a file (files concatenated with their BOMs?); remove it")
                yield number, RejectedRow("invalid_json", refusal(path, number, problem, key="record.invalid_json",
                                                                  where="record"))


def _numbered(batches: Iterator[Any]) -> Iterator[tuple[int, Any]]:
    """Rows of pyarrow record batches (or tables), numbered from 1."""
    number = 0
    for batch in batches:
        for row in batch.to_pylist():
            number += 1
            yield number, row


def _parquet_source(path: Path) -> Source:
    import pyarrow.parquet as pq

    def unreadable(error: Exception) -> DataError:
        return refusal(path, 0, f"cannot read Parquet ({error})", key="file.parquet_unreadable", where="file")

    try:
        columns = tuple(pq.read_schema(path).names)
    except Exception as error:  # pyarrow raises several types for unreadable files
        raise unreadable(error) from error

    def read() -> Iterator[tuple[int, Any]]:
        import pyarrow as pa

        try:
            yield from _numbered(pq.ParquetFile(path).iter_batches(batch_size=_BATCH_ROWS))
        except (OSError, pa.ArrowException) as error:
            raise unreadable(error) from error

    return Source(str(path), "Parquet", columns, read)


def _arrow_batches(path: Path) -> tuple[Any, Callable[[], Iterator[Any]]]:
    """(schema, batch iterator) of an Arrow IPC file, or of the IPC stream `datasets` writes."""
    import pyarrow as pa

    try:
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
        return reader.schema, lambda: (reader.get_batch(i) for i in range(reader.num_record_batches))
    except pa.ArrowInvalid:
        pass
    try:
        schema = pa.ipc.open_stream(pa.memory_map(str(path))).schema
    except (pa.ArrowInvalid, OSError) as error:
        raise refusal(path, 0, f"cannot read Arrow (neither an IPC file nor a stream: {error})",
                      key="file.arrow_unreadable", where="file") from error
    return schema, lambda: iter(pa.ipc.open_stream(pa.memory_map(str(path))))


def _arrow_source(path: Path) -> Source:
    schema, batches = _arrow_batches(path)
    return Source(str(path), "Arrow", tuple(schema.names), lambda: _numbered(batches()))


# ---------------------------------------------------------------------------------------------
# Hugging Face datasets


def saved_dataset_kind(path: str | Path) -> str | None:
    """`Dataset` or `DatasetDict` for a directory written by save_to_disk, else None."""
    path = Path(path)
    if all((path / name).is_file() for name in SAVED_DATASET_FILES):
        return "Dataset"
    if (path / SAVED_DATASET_DICT_FILE).is_file():
        return "DatasetDict"
    return None


def load_saved_dataset(path: str | Path, split: str | None):
    """(datasets.Dataset, its directory) for a save_to_disk directory; a DatasetDict needs `split`."""
    import datasets

    path = Path(path)
    if saved_dataset_kind(path) == "DatasetDict":
        splits = json.loads((path / SAVED_DATASET_DICT_FILE).read_text())["splits"]
        if split is None:
            raise refusal(path, 0, f"a saved DatasetDict with splits {splits}; choose one (dataset.split, --split)",
                          key="split.not_chosen", where="split")
        if split not in splits:
            raise refusal(path, 0, f"no split {split!r}; splits: {splits}", key="split.unknown", where="split")
        path = path / split
    elif split is not None:
        raise refusal(path, 0, f"a saved Dataset has no splits; drop split {split!r}",
                      key="split.of_a_dataset_without_splits", where="split")
    try:
        return datasets.load_from_disk(str(path)), str(path)
    except Exception as error:  # datasets raises several types for broken directories
        raise refusal(path, 0, f"cannot load the saved dataset ({error})", key="file.saved_dataset_unloadable",
                      where="file") from error


def _dataset_source(dataset, name: str) -> Source:
    arrow = dataset.with_format("arrow")  # the same Python values as Parquet and Arrow files
    return Source(name, "datasets", tuple(dataset.column_names),
                  lambda: _numbered(arrow.iter(batch_size=_BATCH_ROWS)))


def _hub_source(name: str, split: str | None) -> Source:
    """A hub dataset, streamed: its features are known before any row is read."""
    import datasets

    try:
        dataset = datasets.load_dataset(name, split=split, streaming=True)
    except Exception as error:  # offline, unknown name, no access: datasets raises many types
        raise refusal(HUB_PREFIX + name, 0, "as a Hugging Face hub dataset it cannot be loaded "
                      f"({type(error).__name__}: {error}); on a machine without hub access, save_to_disk the "
                      "dataset elsewhere and pass that directory", key="path.hub_unloadable", where="path") from error
    if isinstance(dataset, datasets.IterableDatasetDict):
        raise refusal(HUB_PREFIX + name, 0, f"a hub dataset with splits {list(dataset)}; choose one "
                      "(dataset.split, --split)", key="split.not_chosen_on_hub", where="split")
    columns = tuple(dataset.column_names) if dataset.column_names is not None else None
    return Source(HUB_PREFIX + name + (f"[{split}]" if split else ""), "hub", columns,
                  lambda: enumerate(dataset, start=1))


# ---------------------------------------------------------------------------------------------
# Column mapping


@dataclass(frozen=True)
class ColumnMapping:
    """Our field -> the source's column; columns not named keep their name."""

    columns: dict[str, str] = field(default_factory=dict)
    extra_columns: str = "error"  # "meta": columns that are no schema field go under meta

    @classmethod
    def parse(cls, spec: Mapping[str, str] | str | Sequence[str] | None, *, extra_columns: str = "error",
              source: str = "") -> ColumnMapping:
        """From {field: column}, "field=column,field=column" or ["field=column", ...] (repeated
        --column); a problem is a DataError naming `source`."""
        if extra_columns not in EXTRA_COLUMNS:
            raise refusal(source, 0, f"extra_columns must be one of {EXTRA_COLUMNS}; got {extra_columns!r}",
                          key="extra_columns.invalid", where="extra_columns")
        pairs: list[tuple[str, Any]] = []
        if isinstance(spec, Mapping):
            pairs = list(spec.items())
        elif spec:
            for item in [spec] if isinstance(spec, str) else spec:
                for pair in filter(None, (part.strip() for part in item.split(","))):
                    name, equals, column = pair.partition("=")
                    if not equals:
                        raise refusal(source, 0, f"expected field=column, got {pair!r}",
                                      key="columns.not_field_equals_column", where="columns")
                    pairs.append((name.strip(), column.strip()))
        columns: dict[str, str] = {}
        for name, column in pairs:
            if name not in FIELDS:
                raise refusal(source, 0, f"unknown field {name!r} in the column mapping; fields: {', '.join(FIELDS)}",
                              key="columns.unknown_field", where="columns")
            if not isinstance(column, str) or not column:
                raise refusal(source, 0, f"field {name!r} maps to {column!r}; expected a column name",
                              key="columns.not_a_column_name", where="columns")
            if name in columns:
                raise refusal(source, 0, f"field {name!r} is mapped twice ({columns[name]!r} and {column!r})",
                              key="columns.field_mapped_twice", where="columns")
            other = next((f for f, c in columns.items() if c == column), None)
            if other is not None:
                raise refusal(source, 0, f"fields {other!r} and {name!r} both map to column {column!r}",
                              key="columns.column_mapped_twice", where="columns")
            columns[name] = column
        return cls(columns, extra_columns)

    def label(self, name: str) -> str:
        """How errors name a field: with the column it came from when that has another name."""
        column = self.columns.get(name, name)
        return name if column == name else f"{name} (column {column!r})"

    def check(self, source: str, columns: Sequence[str], line: int) -> None:
        """Every mapped column exists, and no column left unmapped takes a mapped field's name."""
        listed = ", ".join(map(str, columns))
        for name, column in self.columns.items():
            if column not in columns:
                raise refusal(source, line, f"mapped to column {column!r}, which is not there (columns: {listed})",
                              key="columns.mapped_column_missing", where=name)
        for column in columns:
            if column in self.columns and column not in self.columns.values():
                raise refusal(source, line, f"column {column!r} would stand for field {column!r}, which is mapped "
                              f"to column {self.columns[column]!r}; map or remove one of them",
                              key="columns.column_named_as_mapped_field", where=column)

    def rename(self, source: str, line: int, row: dict[str, Any]) -> dict[str, Any]:
        """The row under our field names (a JSONL row can hold keys the first one did not)."""
        mapped = set(self.columns.values())
        out = {name: row[column] for name, column in self.columns.items() if column in row}
        extra: dict[str, Any] = {}
        for key, value in row.items():
            if key in mapped:
                continue
            if key in out:
                raise refusal(source, line, f"column {key!r} would stand for field {key!r}, which is mapped to "
                              f"column {self.columns[key]!r}; map or remove one of them",
                              key="columns.column_named_as_mapped_field", where=key)
            if self.extra_columns == "meta" and key not in FIELDS:
                extra[key] = value
            else:
                out[key] = value
        if extra:
            meta = out.get("meta")
            if meta is None:
                out["meta"] = extra
            elif isinstance(meta, dict):  # anything else is left to validation (meta: wrong type)
                clash = sorted(meta.keys() & extra.keys())
                if clash:
                    raise refusal(source, line, f"extra column {clash[0]!r} is also a key of meta",
                                  key="extra_columns.key_of_meta", where="meta")
                out["meta"] = {**meta, **extra}
        return out

    def rows(self, source: Source) -> Iterator[tuple[int, Any]]:
        """The source's rows under our field names, the mapping checked before the first row."""
        if source.columns is not None:
            self.check(source.name, source.columns, 0)
            present = set(self.columns) | (set(source.columns) - set(self.columns.values()))
            for name in REQUIRED_FIELDS:
                if name not in present:
                    listed = ", ".join(source.columns)
                    raise refusal(source.name, 0, f"missing column (columns: {listed})", key="columns.required_missing",
                                  where=self.label(name))
        if not self.columns and self.extra_columns == "error":
            yield from source.read()  # nothing to rename: the rows as read
            return
        checked = source.columns is not None
        for line, row in source.read():
            if isinstance(row, dict):
                if not checked:
                    self.check(source.name, list(row), line)
                    checked = True
                row = self.rename(source.name, line, row)
            yield line, row
