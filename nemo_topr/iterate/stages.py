"""A stage: one `nemo-topr` command of a round, run once. Its done-marker (STAGE.done.json) holds
its arguments and what its outputs were, so that a rerun skips it, and refuses to build on it when
its arguments or those outputs changed since."""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from nemo_topr.iterate.config import IterateError
from nemo_topr.iterate.processes import Ranks, Stopped, run_command
from nemo_topr.utils.outputs import write_whole


@dataclass(frozen=True)
class Stage:
    """One `nemo-topr` command, done once its marker exists with the same arguments."""

    name: str
    directory: Path
    args: tuple[str, ...]  # `nemo-topr` arguments, verb first
    outputs: tuple[Path, ...] = ()
    redo_if_changed: bool = False  # for stages nothing depends on (the plot)
    # the outputs that later stages read, checked unchanged on a rerun (None: all); not a report
    # someone may open in an editor (eval.md), nor samples nothing reads on
    read_later: tuple[Path, ...] | None = None
    # run with --overwrite: a rerun replaces what this stage's failed try left in the driver's own
    # directory. Not recorded in args, so the marker compares only what decides the outputs.
    overwrite: bool = True
    ranks: Ranks = Ranks()  # its processes (not recorded: the outputs mean the same)

    @property
    def marker(self) -> Path:
        return self.directory / f"{self.name}.done.json"

    @property
    def log(self) -> Path:
        return self.directory / "logs" / f"{self.name}.log"

    def is_done(self) -> bool:
        if not self.marker.is_file():
            return False
        marker = json.loads(self.marker.read_text(encoding="utf-8"))
        recorded = marker["args"]
        if recorded == list(self.args) and not (changed := self.outputs_changed(marker.get("stamps"))):
            return True
        if self.redo_if_changed:
            return False
        if recorded == list(self.args):
            raise IterateError(f"{self.marker}: this stage finished, but its output {changed}; later stages use it: "
                               f"put it back, or delete {self.directory} to redo the stages there",
                               key="stage.output.changed", where=str(self.marker))
        raise IterateError(f"{self.marker}: this stage finished with other arguments, and later stages used its "
                           f"outputs; use a new `out`, or delete {self.directory} to redo it\n"
                           f"  then: {' '.join(recorded)}\n  now:  {' '.join(self.args)}",
                           key="stage.arguments.changed", where=str(self.marker))

    @property
    def checked_outputs(self) -> tuple[Path, ...]:
        return self.outputs if self.read_later is None else self.read_later

    def output_stamps(self) -> dict[str, list]:
        """{output file later stages read: [size, modification time, SHA-256]}: what the marker
        holds, so that a rerun does not build on an output emptied, edited or replaced since (an
        emptied graded.jsonl was read as "no records", the round skipped). Directories (a run, a
        model) are only checked to exist."""
        return {str(path): [*_size_and_time(path), _sha256(path)] for path in self.checked_outputs if path.is_file()}

    def outputs_changed(self, stamps: dict[str, list] | None) -> str | None:
        """How an output later stages read is gone or changed since the marker's `stamps` (None: a
        marker from before they were kept, where only its presence is checked); None when none is.
        Size and time as recorded mean the same file; else its content decides (`touch`, a copy)."""
        for path in self.checked_outputs:
            if not path.exists():
                return f"{path} is gone"
        for name, (size, mtime, digest) in (stamps or {}).items():
            path = Path(name)
            now = _size_and_time(path)
            if now != [size, mtime] and (now[0] != size or _sha256(path) != digest):
                return f"{path} changed since"
        return None


def _size_and_time(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def run_stage(stage: Stage, *, dry_run: bool = False) -> None:
    """Run `stage` unless it is done; mark it done only when its command succeeded."""
    where = f"[{stage.directory.name}] {stage.name}"
    if stage.is_done():
        print(f"{where}: done", flush=True)
        return
    command = (*stage.args, "--overwrite") if stage.overwrite else stage.args
    program = stage.ranks.command(python="python")
    print(f"{where}: {'to run' if dry_run else 'running'}: {shlex.join([*program, *command])}", flush=True)
    if dry_run:
        return
    stage.marker.unlink(missing_ok=True)  # a stale marker of other arguments (redo_if_changed)
    started = time.monotonic()
    received = run_command(command, stage.log, stage.ranks)
    seconds = round(time.monotonic() - started, 1)
    write_whole(stage.marker, json.dumps({"stage": stage.name, "args": list(stage.args),
                                               "outputs": [str(p) for p in stage.outputs],
                                               "stamps": stage.output_stamps(),
                                               "log": str(stage.log), "seconds": seconds}, indent=2) + "\n")
    print(f"{where}: finished in {seconds} s", flush=True)
    if received:  # the stage had done its work: kept, then the driver stops as told
        raise Stopped(received[0], stage.args[0], 0)
