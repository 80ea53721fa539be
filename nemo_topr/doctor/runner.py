"""The doctor's harness: each check runs with its own time limit, passes, fails (saying what to fix)
or is skipped (naming the check it needed); no failure stops the others. A check's own process
(te attention, packed parity) prints its result on a line `result_line` finds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

RERUN_ALONE = "rerun this check alone with more time"


@dataclass
class Check:
    name: str
    status: str = "pass"  # pass | fail | skipped
    seconds: float = 0.0
    detail: str = ""
    fix: str = ""


class CheckFailed(Exception):
    def __init__(self, detail: str, fix: str) -> None:
        super().__init__(detail)
        self.fix = fix


class Skipped(Exception):
    pass


@dataclass
class Doctor:
    device: str
    work: Path
    timeout: float
    deadline: float | None = None  # time.monotonic() by which every check must end (a lent machine)
    after_check: Callable[[Doctor], None] | None = None  # e.g. rewrite the JSON table
    checks: list[Check] = field(default_factory=list)
    done: set[str] = field(default_factory=set)

    @property
    def precision(self) -> str:
        return "bf16" if self.device == "cuda" else "fp32"

    def env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def run(self, name: str, step: Callable[[], str], needs: tuple[str, ...] = ()) -> None:
        """Run one check; record pass/fail/skipped with its time and what to fix."""
        check = Check(name)
        started = time.monotonic()
        missing = [need for need in needs if need not in self.done]
        try:
            if missing:
                raise Skipped(f"needs {', '.join(missing)}, which did not pass")
            check.detail = step()
            self.done.add(name)
        except Skipped as skipped:
            check.status, check.detail = "skipped", str(skipped)
        except CheckFailed as failure:
            check.status, check.detail, check.fix = "fail", str(failure), failure.fix
        except Exception as error:  # noqa: BLE001 - a doctor reports every failure and goes on
            check.status, check.detail = "fail", f"{type(error).__name__}: {error}"
            check.fix = "an error inside the doctor itself; report it with the table"
        check.seconds = round(time.monotonic() - started, 1)
        self.checks.append(check)
        print(f"[doctor] {check.name}: {check.status} ({check.seconds} s) {check.detail}", flush=True)
        if self.after_check:
            self.after_check(self)

    def time_limit(self) -> float:
        """Seconds the next command may take: the per-check limit, cut to what the deadline leaves."""
        if self.deadline is None:
            return self.timeout
        left = self.deadline - time.monotonic()
        if left < 1:
            raise CheckFailed("no time left before the deadline", RERUN_ALONE)
        return min(self.timeout, left)

    def command(self, name: str, args: list[str], *, env: dict[str, str] | None = None,
                expect: tuple[int, ...] = (0,)) -> str:
        """Run `nemo-topr ARGS` with this check's time limit; its output goes to WORK/NAME.log."""
        return self.python(name, ["-m", "nemo_topr.cli", *args], env=env, expect=expect)

    def python(self, name: str, args: list[str], *, env: dict[str, str] | None = None,
               expect: tuple[int, ...] = (0,)) -> str:
        """Run `python ARGS` with this check's time limit; its output goes to WORK/NAME.log."""
        log = self.work / f"{name.replace(' ', '_')}.log"
        limit = self.time_limit()
        with log.open("w") as out:
            process = subprocess.Popen([sys.executable, *args], stdout=out,
                                       stderr=subprocess.STDOUT, env=env or self.env(), start_new_session=True)
            try:
                code = process.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                if limit < self.timeout:  # the deadline cut it short: not evidence of a hang
                    raise CheckFailed(f"cut off by the deadline after {limit:.0f} s, unfinished (log: {log})",
                                      RERUN_ALONE) from None
                raise CheckFailed(f"no result within {limit:.0f} s (log: {log})",
                                  "a hang: look at the log's last lines (NCCL, a compile, a download); "
                                  "raise --timeout on a slow node") from None
        if code not in expect:
            tail = log.read_text().strip().splitlines()[-3:]
            what = f"nemo-topr {args[2]}" if args[:2] == ["-m", "nemo_topr.cli"] else "python " + " ".join(args[:2])
            raise CheckFailed(f"`{what}` exited {code} (log: {log}): {' | '.join(tail)[-600:]}",
                              f"the log names the failing call; fix it and rerun `nemo-topr doctor --device "
                              f"{self.device}`")
        return str(log)


# marks the line a check's own process prints as its result: other lines may follow it (torch's
# NCCL warning at exit came last in packed parity's log on the H200, and the table showed it)
RESULT_PREFIX = "doctor result: "


def report_result(line: str) -> None:
    print(RESULT_PREFIX + line, flush=True)


def result_line(log: str) -> str:
    """A check's result as its process printed it with `report_result`."""
    results = [line for line in Path(log).read_text().splitlines() if line.startswith(RESULT_PREFIX)]
    if not results:
        raise CheckFailed(f"the check's process printed no result line (log: {log})", "see the log")
    return results[-1][len(RESULT_PREFIX):]
