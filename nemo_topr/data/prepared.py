"""Prepared data sets: a data set tokenized and packed once, stored as memory-mapped arrays,
found again by the content it came from (docs/data.md, "Prepared data sets").

A set is a directory PREPARED_DIR/KEY holding

    tokens.bin                 uint32 token ids of every sequence, end to end (4 bytes a token)
    offsets.npy                int64 [N + 1]: sequence i is tokens[offsets[i]:offsets[i + 1]]
    prompt_lengths.npy ...     one .npy a per-sequence column (`sequence_table.COLUMNS`)
    row_offsets.npy, row_members.npy   the packing of one epoch (`packing.pack_sequences`' rows)
    prompt_keys.json           dense prompt_id -> the records' prompt key
    manifest.json              written last: the key's parts, the counts, the validation report,
                               the table's digest, every file's size and sha256

KEY is a hash of the format version, the data files' bytes, the tokenizer's files, the sequence
length, the model's context, the too-long policy, strictness and how the source is read (column
mapping, split, extra columns, rendered prompts): a changed file or tokenizer is another set.

A set is written into a temporary sibling directory, its files fsynced, and renamed into place
in one step, so a reader finds a whole set or none; two writers at once both finish, the second
rename fails and its copy is discarded. No lock is taken (NFS and Lustre do not all honour
flock). A set whose files differ in size from its manifest (truncated, half copied) is moved
aside and written again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nemo_topr.errors import UserError
from nemo_topr.data.records import DataError, RecordSet, ValidationReport, load_records, require_scored
from nemo_topr.data.sequence_table import COLUMNS, TOKEN_DTYPE, SequenceTable, TableSequences, pack_rows

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
# records tokenized at a time, by one process: a set is never held as token lists whole, and a
# thousand records keep every core busy at 10 k records and the parent's share of the work small
CHUNK_RECORDS = 1_000
# files of a tokenizer (transformers' AutoTokenizer reads these): a change to any is another key
TOKENIZER_FILE_PREFIXES = ("tokenizer", "special_tokens_map", "added_tokens", "chat_template", "vocab", "merges")


class PreparedSetError(UserError, RuntimeError):
    """A prepared set that another process was to write did not appear in time."""


@dataclass(frozen=True)
class PrepareSpec:
    """What a prepared set is made from: the data, the tokenizer and the settings that decide its
    sequences (`ToprDatasetConfig`'s fields of the same names)."""

    train_path: str
    tokenizer_dir: str
    seq_length: int = 2048
    strict: bool = True
    too_long: str | None = None
    model_context: int | None = None
    columns: Any = None
    split: str | None = None
    extra_columns: str = "error"
    rendered_prompts: bool = False

    def source_options(self) -> dict[str, Any]:
        return {"columns": self.columns, "split": self.split, "extra_columns": self.extra_columns,
                "rendered_prompts": self.rendered_prompts}

    def key_parts(self) -> dict[str, Any]:
        """The key's parts; hashing the data and tokenizer files reads them whole."""
        from nemo_topr.data.tokenization import too_long_policy

        columns = self.columns or None  # {} (ToprDatasetConfig's default) and None: no mapping
        if columns is not None and not isinstance(columns, str):
            columns = dict(sorted(dict(columns).items())) if hasattr(columns, "items") else list(columns)
        return {"format_version": FORMAT_VERSION, "data": data_files_digest(self.train_path),
                "tokenizer": tokenizer_digest(self.tokenizer_dir), "seq_length": self.seq_length,
                "model_context": self.model_context, "too_long": too_long_policy(self.too_long, self.strict),
                "strict": self.strict, "columns": columns, "split": self.split,
                "extra_columns": self.extra_columns, "rendered_prompts": self.rendered_prompts}


def key_of(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _file_sha256(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def data_files_digest(train_path: str) -> str:
    """sha256 over the bytes of every file `train_path` names (a file, a directory's files, a
    glob's matches), each under its name relative to where it was found."""
    import glob

    path = Path(train_path)
    if path.is_file():
        files = [(path.name, path)]
    elif path.is_dir():
        files = sorted((str(f.relative_to(path)), f) for f in path.rglob("*") if f.is_file())
    else:
        files = sorted((f, Path(f)) for f in glob.glob(train_path) if Path(f).is_file())
    if not files:
        raise DataError(train_path, 0, "path", "names no local data files to prepare (a prepared set is keyed by "
                                               "the files' content)",
                        key="dataset.train_path.no_local_files", where=f"{train_path}: path")
    digest = hashlib.sha256()
    for name, file in files:
        digest.update(f"{name}\0{_file_sha256(file)}\0".encode())
    return digest.hexdigest()


def tokenizer_digest(tokenizer_dir: str) -> str:
    """sha256 over the tokenizer's own files in the directory `load_tokenizer` reads."""
    from nemo_topr.model import source as model_source

    directory = Path(tokenizer_dir)
    if not any((directory / name).is_file() for name in model_source.TOKENIZER_FILES):
        try:
            directory = model_source.resolve(tokenizer_dir, megatron=False).hf_dir
        except model_source.ModelSourceError:
            pass  # load_tokenizer names what the directory lacks
    files = sorted(f for f in directory.glob("*") if f.is_file() and f.name.startswith(TOKENIZER_FILE_PREFIXES))
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.name}\0{_file_sha256(file)}\0".encode())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Reading


@dataclass
class PreparedSet:
    """An open (memory-mapped) prepared set."""

    path: Path
    manifest: dict[str, Any]
    table: SequenceTable
    row_offsets: np.ndarray
    row_members: np.ndarray

    @property
    def sequences(self) -> TableSequences:
        return TableSequences(self.table)

    @property
    def prompt_keys(self) -> list[str]:
        """Dense prompt_id -> the records' prompt key (read from disk when asked)."""
        return json.loads((self.path / "prompt_keys.json").read_text(encoding="utf-8"))

    @property
    def prompt_count(self) -> int:
        return self.manifest["prompts"]

    @property
    def record_baselines(self) -> bool:
        return bool(len(self.table)) and not math.isnan(self.table.baselines[0])

    @property
    def table_digest(self) -> str:
        return self.manifest["table_digest"]

    @property
    def pad_id(self) -> int:
        return self.manifest["pad_id"]

    @property
    def report(self) -> ValidationReport:
        saved = self.manifest["report"]
        return ValidationReport(files=saved["files"], records_in=saved["records_in"],
                                records_used=saved["records_used"], dropped=Counter(saved["dropped"]),
                                first_error=saved["first_error"], notes=saved["notes"])


def set_problem(path: Path) -> str | None:
    """Why `path` is no whole prepared set (None when it is one): no manifest, or a file whose
    size is not the manifest's."""
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{path / MANIFEST} is missing"
    except (OSError, ValueError) as error:
        return f"{path / MANIFEST} is unreadable ({error})"
    for name, entry in manifest.get("files", {}).items():
        try:
            size = (path / name).stat().st_size
        except FileNotFoundError:
            return f"{path / name} is missing"
        if size != entry["bytes"]:
            return f"{path / name} holds {size} bytes, the manifest {entry['bytes']}"
    return None


def open_set(path: Path) -> PreparedSet:
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    tokens = np.memmap(path / "tokens.bin", dtype=TOKEN_DTYPE, mode="r")  # a set holds a sequence at least

    def array(name: str) -> np.ndarray:
        return np.load(path / f"{name}.npy", mmap_mode="r")

    table = SequenceTable(tokens, array("offsets"), **{name: array(name) for name in COLUMNS})
    return PreparedSet(path, manifest, table, array("row_offsets"), array("row_members"))


# ---------------------------------------------------------------------------------------------
# Finding, waiting for, or writing a set


def find_prepared(spec: PrepareSpec, prepared_dir: str | Path) -> PreparedSet | None:
    """The whole set for `spec` under `prepared_dir`, or None."""
    final = Path(prepared_dir) / key_of(spec.key_parts())
    return open_set(final) if set_problem(final) is None else None


def find_or_prepare(spec: PrepareSpec, prepared_dir: str | Path, *, write: bool = True,
                    records: RecordSet | None = None, wait_timeout: float = 3600.0,
                    poll: float = 1.0, processes: int | None = None) -> tuple[PreparedSet, bool]:
    """(the set for `spec` under `prepared_dir`, whether this call wrote it). With `write`, a
    missing or damaged set is written here (from `records` when given, read from the spec's
    data otherwise; by `processes` processes, every core given by default); without, this waits
    up to `wait_timeout` seconds for another process (rank 0, `nemo-topr data prepare`) to
    publish it."""
    parts = spec.key_parts()
    final = Path(prepared_dir) / key_of(parts)
    problem = set_problem(final)
    if problem is None:
        return open_set(final), False
    if not write:
        deadline = time.monotonic() + wait_timeout
        while (problem := set_problem(final)) is not None:
            if time.monotonic() >= deadline:
                raise PreparedSetError(f"the prepared data set {final} for {spec.train_path} was not written within "
                                       f"{wait_timeout:.0f} s by the process preparing it (launcher rank 0): {problem}",
                                       key="prepared_set.not_written_in_time", where=str(final))
            time.sleep(poll)
        return open_set(final), False
    if final.exists():  # damaged: moved aside in one step, so a reader never sees it half-removed
        stale = final.with_name(f".{final.name}.stale-{uuid.uuid4().hex[:8]}")
        try:
            final.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
        except FileNotFoundError:
            pass  # another writer moved it first
    written = publish(spec, parts, final, records, processes)
    return open_set(final), written


def publish(spec: PrepareSpec, parts: dict[str, Any], final: Path, records: RecordSet | None = None,
            processes: int | None = None) -> bool:
    """Write the set into a temporary sibling of `final` and rename it into place; when another
    writer published first, keep theirs (and return False)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = final.with_name(f".{final.name}.partial-{uuid.uuid4().hex[:8]}")
    temporary.mkdir()
    try:
        write_set(spec, parts, temporary, records, processes)
        try:
            temporary.rename(final)
        except OSError:
            if set_problem(final) is not None:
                raise
            return False  # another process published the same set first: theirs is as good
        _fsync(final.parent)
        return True
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_set(spec: PrepareSpec, parts: dict[str, Any], directory: Path, records: RecordSet | None = None,
              processes: int | None = None) -> None:
    """Validate, tokenize (in chunks, on `processes` processes, default every core given) and
    pack `spec`'s data into `directory`, manifest last."""
    from nemo_topr.data.packing import group_mean_rewards
    from nemo_topr.data.parallel_tokenization import cores_given, tokenized_tables
    from nemo_topr.data.tokenization import load_tokenizer, pad_id_of

    if records is None:
        records = load_records(spec.train_path, strict=spec.strict, **spec.source_options())
    require_scored(records)
    tokenizer = load_tokenizer(spec.tokenizer_dir)
    prompt_keys: dict[str, int] = {}
    lengths, columns = [], {name: [] for name in COLUMNS if name != "group_mean_rewards"}
    tokens_sha256 = hashlib.sha256()
    with (directory / "tokens.bin").open("wb") as tokens:
        for chunk in tokenized_tables(records, tokenizer, prompt_keys, chunk_size=CHUNK_RECORDS,
                                      processes=processes or cores_given(), max_seq_length=spec.seq_length,
                                      strict=spec.strict, too_long=spec.too_long, model_context=spec.model_context):
            tokens.write(chunk.tokens)
            tokens_sha256.update(chunk.tokens)
            lengths.append(chunk.lengths)
            for name, parts_of_column in columns.items():
                parts_of_column.append(getattr(chunk, name))
        tokens.flush()
        os.fsync(tokens.fileno())
    arrays = {name: np.concatenate(values).astype(COLUMNS[name], copy=False) for name, values in columns.items()}
    arrays["group_mean_rewards"] = np.asarray(group_mean_rewards(arrays["prompt_ids"].tolist(),
                                                                 arrays["rewards"].tolist()), np.float64)
    arrays["offsets"] = np.zeros(len(arrays["rewards"]) + 1, np.int64)
    np.cumsum(np.concatenate(lengths), out=arrays["offsets"][1:])
    arrays["row_offsets"], arrays["row_members"] = pack_rows(np.diff(arrays["offsets"]), spec.seq_length)
    sha256 = {"tokens.bin": tokens_sha256.hexdigest()}
    for name, array in arrays.items():
        sha256[f"{name}.npy"] = _write_synced(directory / f"{name}.npy", lambda file, array=array: np.save(file, array))
    sha256["prompt_keys.json"] = _write_synced(directory / "prompt_keys.json",
                                               lambda file: file.write(json.dumps(list(prompt_keys)).encode()))
    table = SequenceTable(np.memmap(directory / "tokens.bin", dtype=TOKEN_DTYPE, mode="r"), arrays["offsets"],
                          **{name: arrays[name] for name in COLUMNS})
    files = {name: {"bytes": (directory / name).stat().st_size, "sha256": sha256[name]} for name in sorted(sha256)}
    manifest = {"key": parts, "tokens": int(arrays["offsets"][-1]), "sequences": len(table),
                "prompts": len(prompt_keys), "pad_id": pad_id_of(tokenizer),
                "epoch_rows": len(arrays["row_offsets"]) - 1,
                "report": records.report.to_dict(), "table_digest": table.digest(), "files": files,
                "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _write_synced(directory / MANIFEST, lambda file: file.write((json.dumps(manifest, indent=1) + "\n").encode()))
    _fsync(directory)


class _HashingFile:
    """A file open for writing that hashes what is written to it."""

    def __init__(self, file) -> None:  # noqa: ANN001
        self.file, self.sha256 = file, hashlib.sha256()

    def write(self, data) -> int:  # noqa: ANN001
        self.sha256.update(data)
        return self.file.write(data)


def _write_synced(path: Path, write) -> str:  # noqa: ANN001
    """Write `path` with `write(file)`, flushed to disk; the sha256 of what was written."""
    with path.open("wb") as file:
        hashing = _HashingFile(file)
        write(hashing)
        file.flush()
        os.fsync(file.fileno())
    return hashing.sha256.hexdigest()
