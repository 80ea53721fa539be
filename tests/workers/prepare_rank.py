"""One launcher rank (RANK in the environment) of `nemo-topr train` up to the end of prepare(),
which runs before torch.distributed exists. For tests/training/test_checkpoints.py.

    prepare_rank.py RUN_DIR READY_DIR START_FILE key=value...

Builds the run, touches READY_DIR/RANK, waits for START_FILE (so that every rank enters prepare()
at the same moment), then records -- with a Python audit hook, i.e. what the interpreter actually
did -- every file opened for writing, renamed, removed or created under RUN_DIR, and prints that
list as the last line of JSON."""

import json
import os
import sys
import time
from pathlib import Path

from nemo_topr.model import cpu_runtime
from nemo_topr.training import recipe
from nemo_topr.training.config import build_training_run, compose

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def main() -> None:
    run_dir, ready_dir, start_file, *overrides = sys.argv[1:]
    root = os.path.realpath(run_dir)
    cpu_runtime.enable_cpu_runtime()
    run = build_training_run(compose("tiny_cpu", [f"run_dir={run_dir}", *overrides]))
    Path(ready_dir, os.environ["RANK"]).touch()
    while not Path(start_file).exists():
        time.sleep(0.005)

    changes = []

    def under_run_dir(path) -> str | None:
        if isinstance(path, (str, bytes, os.PathLike)):
            resolved = os.path.realpath(os.fsdecode(path))
            return os.path.relpath(resolved, root) if resolved.startswith(root + os.sep) else None
        return None

    def audit(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writing = any(c in mode for c in "wax+") if mode else bool(flags & WRITE_FLAGS)
            if writing and (name := under_run_dir(path)):
                changes.append(["write", name])
        elif event in ("os.rename", "os.remove", "os.mkdir") and (name := under_run_dir(args[0])):
            changes.append([event.removeprefix("os."), name])

    sys.addaudithook(audit)
    recipe.prepare(run)
    print(json.dumps(changes), flush=True)


if __name__ == "__main__":
    main()
