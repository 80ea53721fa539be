"""Output directories that a command empties before it fills them again (`make demo`'s --out, the
miniature's results, `doctor --work-dir`): only ever one that the same command made.

A mistyped path could name a checkout, a model or a home directory, so emptying is allowed only
where the directory does not exist, is empty, or holds the mark that the command left there
(`MARK`, one line: the command's name). Anything else is refused with the path and the way on."""

from __future__ import annotations

import shutil
from pathlib import Path

MARK = ".nemo-topr-output"


class OutputDirError(ValueError):
    """A directory that the command would have to empty but did not make."""


def fresh_output_dir(path: str | Path, command: str) -> Path:
    """`path` resolved, empty but for `command`'s mark; raises OutputDirError where emptying it
    could remove what `command` did not make."""
    path = Path(path).resolve()
    if path.exists() and not path.is_dir():
        raise OutputDirError(f"{path} exists and is not a directory: {command} writes a directory there; "
                             "choose another path")
    if path.is_dir() and any(path.iterdir()):
        mark = path / MARK
        made_by = mark.read_text(encoding="utf-8").strip() if mark.is_file() else None
        if made_by != command:
            origin = f"was made by {made_by}" if made_by else f"has no {MARK} file from a nemo-topr command"
            raise OutputDirError(f"{path} is not empty and {origin}: {command} empties its output directory first, "
                                 "so it leaves this one as it is; choose a new or empty directory (or remove this "
                                 "one yourself)")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / MARK).write_text(command + "\n", encoding="utf-8")
    return path
