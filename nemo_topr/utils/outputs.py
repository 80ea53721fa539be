"""What a command writes, checked before it works: nothing it did not make is replaced, and a
path that cannot be written stops it at once rather than after hours of sampling or scoring.

- Output directories that a command empties before it fills them again (`make demo`'s --out,
  the miniature's results, `doctor --work-dir`): only ever one that the same command made. A
  mistyped path could name a checkout, a model or a home directory, so emptying is allowed only
  where the directory does not exist, is empty, or holds the mark that the command left there
  (`MARK`, one line: the command's name).
- Output files: never one of the command's inputs, never a directory, and never a file that
  exists unless the user passes --overwrite: a file carries no mark, so the command cannot tell
  whether it made it. Their directory is checked first and made by the write, so a refused
  command leaves none behind. Records are written as JSONL, so their name ends in .jsonl: the
  only name the data commands read JSONL from.
- Directories a command adds to and resumes in (`nemo-topr iterate`'s out): new, empty, or marked
  by that command; nothing in them is removed.
- A write the filesystem refuses half-way (full, over quota): `OutputWriteError`, one line naming
  the file; nothing is left under its name, nor the folders made for it."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from nemo_topr.errors import UserError

MARK = ".nemo-topr-output"


class OutputError(UserError, ValueError):
    """An output path that the command refuses before it starts its work."""


def _own_directory(path: str | Path, command: str, refusal: str) -> Path:
    """`path` resolved, when it is new, empty or marked as `command`'s; raises OutputError
    (ending in `refusal`: why and what to do) for a file or another directory with contents."""
    given, path = str(path), Path(path).resolve()
    if path.exists() and not path.is_dir():
        raise OutputError(f"{path} exists and is not a directory: {command} writes a directory there; "
                          "choose another path", key="output_dir.not_a_directory", where=given)
    if path.is_dir() and any(path.iterdir()):
        mark = path / MARK
        made_by = mark.read_text(encoding="utf-8").strip() if mark.is_file() else None
        if made_by != command:
            origin = f"was made by {made_by}" if made_by else f"has no {MARK} file from a nemo-topr command"
            raise OutputError(f"{path} is not empty and {origin}: {command} {refusal}",
                              key="output_dir.not_its_own", where=given)
    if unmakeable := _why_unmakeable(path):  # checked in a dry run too, where nothing is made
        raise OutputError(f"{path}: {command} cannot make this directory ({unmakeable}); choose another path",
                          key="output_dir.unmakeable", where=given)
    return path


def _mark(path: Path, command: str) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / MARK).write_text(command + "\n", encoding="utf-8")
    except OSError as error:  # what access() cannot tell: root under /sys, a read-only mount
        raise OutputError(f"{path}: {command} cannot make this directory ({error.strerror}); choose another "
                          "path", key="output_dir.mkdir_failed", where=str(path)) from None
    return path


def fresh_output_dir(path: str | Path, command: str) -> Path:
    """`path` resolved, empty but for `command`'s mark; raises OutputError where emptying it
    could remove what `command` did not make."""
    path = check_fresh_output_dir(path, command)
    if path.is_dir():
        shutil.rmtree(path)
    return _mark(path, command)


def check_fresh_output_dir(path: str | Path, command: str) -> Path:
    """`fresh_output_dir`'s checks alone, nothing made or emptied (a verb's `validate`): `path` resolved."""
    return _own_directory(path, command, "empties its output directory first, so it leaves this one as it is; "
                                         "choose a new or empty directory (or remove this one yourself)")


def claimed_output_dir(path: str | Path, command: str, *, make: bool = True) -> Path:
    """`path` resolved, made and marked as `command`'s (only checked with `make` False: a dry
    run), never emptied: a directory `command` resumes in, whose stages replace their own
    outputs when rerun. Raises OutputError for a directory holding anything without the mark."""
    path = _own_directory(path, command, "resumes in its output directory and replaces what its stages write there, "
                                         "so it writes only into a directory of its own; choose a new or empty "
                                         "directory")
    return _mark(path, command) if make else path


def refuse_to_overwrite_an_input(out: str | Path, inputs: Iterable[str | Path]) -> None:
    """`out` must not be one of the `inputs` files (`--out` naming the `--data` file, by a typo or
    to update it in place): writing it would replace them, and what the command drops (curated
    away, bad under --no-strict, prompts turned into records) would be lost from disk."""
    target = Path(out).resolve()
    if any(Path(name).resolve() == target for name in inputs):
        raise OutputError(f"{out} is also this command's input: writing the output there would replace what it "
                          "reads; choose another output path", key="output.is_an_input", where=str(out))


def distinct_outputs(outputs: dict[str, str | Path | None]) -> None:
    """The files one command writes, {what names it (an option): path, or None: not written},
    must be distinct paths: the second write would replace the first."""
    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        resolved = Path(path).resolve()
        if resolved in seen:
            raise OutputError(f"{flag} {path} is also {seen[resolved]}: the command writes both; give them "
                              "different paths", key="output.same_path", where=flag)
        seen[resolved] = flag


class OutputWriteError(OutputError):
    """A write the filesystem refused half-way (full, over quota, failing): nothing was written
    under the output's name."""


# what a full or failing filesystem raises while a file is written, as against a program's fault,
# and what the user can do about it there
FILESYSTEM_REMEDIES = {
    errno.ENOSPC: "free space there",
    errno.EDQUOT: "free space within your quota there (or have it raised)",
    errno.EFBIG: "the file is larger than `ulimit -f` (or the filesystem) allows: raise the limit",
    errno.EIO: "check the filesystem (its disk or mount; the kernel log names the fault)",
}


def filesystem_remedy(error: OSError) -> str | None:
    """What to do where `error` is a full or failing filesystem's refusal of a write; None for
    any other error (a program's fault, raised as it is)."""
    return FILESYSTEM_REMEDIES.get(error.errno)


@contextlib.contextmanager
def written_whole(path: str | Path, *, binary: bool = False) -> Iterator[IO]:
    """A file to write that becomes `path` only once the block completes: written as PATH.partial
    (its directory made first), then renamed over `path`. A reader or a kill never sees half of
    it, and an error half-way leaves the file it was to replace as it was (the part is removed);
    a full filesystem's error is raised as OutputWriteError, naming `path`."""
    path = Path(path)
    made = folders_to_make(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        with partial.open("wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as out:
            yield out
        os.replace(partial, path)
    except OSError as error:
        if not (remedy := filesystem_remedy(error)):
            raise
        before = "left as it was" if path.exists() else "not written"
        raise OutputWriteError(f"writing {path}: {error.strerror} ({path.name} {before}); {remedy} "
                               "or choose another path", key="output.filesystem_full", where=str(path)) from error
    finally:
        partial.unlink(missing_ok=True)
        if not path.exists():
            remove_if_empty(made)


def write_whole(path: str | Path, content: str | bytes) -> None:
    """`path` holding `content` (text as UTF-8), written whole (`written_whole`)."""
    with written_whole(path, binary=isinstance(content, bytes)) as out:
        out.write(content)


def add_overwrite_argument(parser) -> None:
    """--overwrite: replace output files that exist (without it, a command refuses them)."""
    parser.add_argument("--overwrite", action="store_true",
                        help="replace output files that already exist (refused otherwise: a file carries no mark "
                             "of the command that wrote it)")


def writable_output_file(path: str | Path, flag: str = "--out", *, inputs: Iterable[str | Path] = (),
                         overwrite: bool = False) -> Path:
    """`path`, checked writable. Refused before the command's work instead of when it writes: one
    of the command's `inputs` (`refuse_to_overwrite_an_input`, even with `overwrite`), a
    directory in its place, a file there without `overwrite`, or a directory that cannot be
    made. `flag` names the path in the message (an option, or what the file is). The directory
    is made only by the write: a command refused later (another output, a missing model) leaves
    no empty directory behind."""
    refuse_to_overwrite_an_input(path, inputs)
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{flag} {path} is a directory; a file is written there: name the file",
                          key="output.is_a_directory", where=flag)
    if path.exists() and not overwrite:
        raise OutputError(f"{flag} {path} exists: pass --overwrite to replace it, or choose another path",
                          key="output.exists", where=flag)
    unmakeable = _why_unmakeable(path.absolute().parent)
    if unmakeable:
        raise OutputError(f"{flag} {path}: its directory cannot be made ({unmakeable})",
                          key="output.directory_unmakeable", where=flag)
    return path


def nearest_existing(path: Path) -> Path:
    """`path` itself if it exists, else its nearest existing ancestor (where making it starts)."""
    return next(parent for parent in (path, *path.parents) if parent.exists())


def folders_to_make(directory: Path) -> list[Path]:
    """The folders that making `directory` creates, itself first (none when it exists)."""
    chain = (directory.absolute(), *directory.absolute().parents)
    return list(chain[: chain.index(nearest_existing(chain[0]))])


def remove_if_empty(folders: list[Path]) -> None:
    """Remove `folders` (`folders_to_make`'s, once made), deepest first, up to the first that
    holds anything: what a failed or refused command made and left empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (or gone): what is above it stays too
            break


def _why_unmakeable(directory: Path) -> str | None:
    """Why `directory` cannot be made or written in, in mkdir's words; None when it can: its nearest
    existing ancestor is a directory this process may write in."""
    existing = nearest_existing(directory)
    if not existing.is_dir():
        return f"File exists: {existing}"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"Permission denied: {existing}"
    return None


def writable_records_file(path: str | Path, flag: str = "--out", *, inputs: Iterable[str | Path] = (),
                          overwrite: bool = False) -> Path:
    """`writable_output_file` for records: also refused unless named *.jsonl, since `train` and the
    `data` commands read JSONL only from such a name (scored.json would be found unreadable only
    once the scoring or sampling had run)."""
    if Path(path).suffix != ".jsonl":
        raise OutputError(f"{flag} {path}: records are written as JSONL, which is read back only from a name ending "
                          f"in .jsonl: name it {Path(path).with_suffix('.jsonl')}",
                          key="output.records.not_jsonl", where=flag)
    return writable_output_file(path, flag, inputs=inputs, overwrite=overwrite)
