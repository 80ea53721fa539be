"""The base model a run started from: its files recorded in OUT/base_model.json at the first start,
compared on every rerun, as the same path may hold other weights since."""

from __future__ import annotations

import json
from pathlib import Path

from nemo_topr.iterate.config import IterateError
from nemo_topr.model import source as model_source
from nemo_topr.utils.outputs import write_whole


BASE_MODEL_RECORD = "base_model.json"  # in OUT: the files the rounds started from


def model_root(source: model_source.ModelSource) -> Path:
    """The directory holding `source`'s files: a Hugging Face directory, or a Megatron checkpoint's iteration."""
    return (source.checkpoint if source.is_megatron else source.path).resolve()


def model_files(source: model_source.ModelSource) -> list[list]:
    """Name, size and modification time of each file of `source` (`model_root`): the same path
    holding other weights (an `export --overwrite`, a run trained on) is another model. Hashing
    would cost minutes at 70B."""
    root = model_root(source)
    return [[str(path.relative_to(root)), path.stat().st_size, path.stat().st_mtime_ns]
            for path in sorted(root.rglob("*")) if path.is_file()]


def check_same_base_model(record: Path, spec: str, *, write: bool = True) -> None:
    """A rerun resumes OUT's stages by their arguments; base_model's path among them is the same
    when the files there changed, and every stage would count as done on the earlier weights.
    OUT's first start records base_model's files (`model_files`), a rerun compares them."""
    source = model_source.resolve(spec)
    now = {"base_model": str(source.path), "files": model_files(source)}
    if not record.is_file():
        if write:
            write_whole(record, json.dumps(now, indent=1) + "\n")
        return
    then = json.loads(record.read_text(encoding="utf-8"))
    if then != now:
        files_then, files_now = ({name: stat for name, *stat in files} for files in (then["files"], now["files"]))
        changed = sorted(name for name in files_then | files_now if files_then.get(name) != files_now.get(name))
        raise IterateError(f"base_model={spec} is not what {record.parent} started from ({then['base_model']}): "
                           f"{', '.join(changed[:5]) or 'its path'} changed since (size or time; {record}). Its "
                           "stages were built on the earlier model: use a new `out`",
                           key="base_model.changed_since_out_started", where="base_model")
