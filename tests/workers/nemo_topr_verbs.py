"""Several `nemo-topr` verbs one after another in one process, so that Megatron is imported once
(tests/training/test_checkpoint_route.py): each step's exit code or the exception it ended with,
and what it wrote on file descriptors 1 and 2 (Megatron's and Gloo's prints included).

    python nemo_topr_verbs.py STEPS.json RESULTS.json

STEPS.json maps a name to a step: {"argv": [VERB, ...]} runs `nemo_topr.cli.main(argv)`;
"main": MODULE runs MODULE.main(argv) instead (a verb's own, without cli's handling of Ctrl-C);
"patch": PYTHON runs first, with `patch(obj, attribute, value)` replacing an attribute for that
step alone. Every step runs, in order, whatever the ones before it did; an exception a step ends
with is recorded ("raised") and its traceback written on the step's stderr.
"""

import importlib
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path


def run_step(step: dict) -> dict:
    undo = []

    def patch(obj, attribute: str, value) -> None:
        # as defined there (a classmethod, not the bound method getattr gives), or inherited: None
        undo.append((obj, attribute, vars(obj).get(attribute)))
        setattr(obj, attribute, value)

    result = {}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush(), sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)
        try:
            exec(step.get("patch", ""), {"patch": patch, "Path": Path})
            result["returncode"] = importlib.import_module(step.get("main", "nemo_topr.cli")).main(step["argv"])
        except BaseException as error:  # noqa: BLE001 - Ctrl-C and SystemExit too: what the step ended with
            traceback.print_exc()  # on the step's stderr, as the process would have printed it
            result["raised"] = [type(error).__name__, str(error)]
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])
            for obj, attribute, value in reversed(undo):
                setattr(obj, attribute, value) if value is not None else delattr(obj, attribute)
        for name, captured in (("stdout", out), ("stderr", err)):
            captured.seek(0)
            result[name] = captured.read().decode(errors="replace")
    return result


if __name__ == "__main__":
    steps = json.loads(Path(sys.argv[1]).read_text())
    results = {}
    for name, step in steps.items():
        results[name] = run_step(step)
        print(f"{name}: {results[name].get('returncode', results[name].get('raised'))}", flush=True)
    Path(sys.argv[2]).write_text(json.dumps(results))
