"""The mutation check: plausible bugs planted one at a time, each against the tests that must catch it.

What it does. The checkout (tracked and untracked-but-not-ignored files, `git ls-files -co
--exclude-standard`) is copied once to a scratch directory. Every mutant of `scripts/mutants.py`
is located there by its definition's qualified name and an AST pattern inside it
(`scripts/mutation_locator.py`); one that is not found exactly once is *missing*. Its tests are
the ones carrying its marker (`guards_<concern>`, never a test id): one collection finds the test
files that hold each marker. The marked tests must pass unmutated; then each mutant rewrites its
span in the copy, runs `pytest -x -m "<marker> and not slurm"` there, serially, with PYTHONPATH =
the copy (so subprocesses and torchrun workers import the mutant too: tests/conftest.py), records
*caught* (a test failed) or *survived*, and restores the file. Tests marked `slurm` never run:
real Slurm is not started from here.

How to run (not part of `make test`):

    .venv/bin/python scripts/mutation_check.py                       # all; writes the report below
    .venv/bin/python scripts/mutation_check.py --only labels_not_shifted failures_requeued
    .venv/bin/python scripts/mutation_check.py --list                # each mutant and where it applies

It exits non-zero when a mutant survived or is missing (or the unmutated tests fail), and a full
run writes bench/results/mutation_check.json (each mutant's definition, pattern, marker, outcome
and seconds; the date and the commit); `--only` writes a report only where `--out` says.

How to add a mutant. Append to MUTANTS in scripts/mutants.py, e.g.

    py("zero_reward_is_negative", "_advantages", "_1 < 0", "_1 <= 0", OBJECTIVE,
       "R = 0 treated as a negative (tapered) sample"),

(scope: a function, method, class or module-level name, as its tail `Class.method` or
`module.function` when the bare name is ambiguous; pattern: an expression or statement, `_1`.. are
wildcards; shell mutants: `sh(name, function or None, words, replacement, marker, bug)` over
slurm/*.sh). Put the concern's marker on the tests that should catch it, as one line
(`@pytest.mark.guards_objective`; a new concern is registered in pyproject.toml), then run it with
`--only NAME`: it must be caught.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant  # noqa: E402
from mutation_locator import Locator, MissingSite, Site  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
REPORT = REPO / "bench" / "results" / "mutation_check.json"

# A pytest plugin for the one collection: which test files hold tests of each guards_ marker.
MARKER_PLUGIN = textwrap.dedent("""
    import json, os

    def pytest_collection_modifyitems(session, config, items):
        files = {}
        for item in items:
            names = {mark.name for mark in item.iter_markers()}
            if "slurm" in names:
                continue
            for name in names:
                if name.startswith("guards_"):
                    files.setdefault(name, set()).add(item.nodeid.split("::")[0])
        with open(os.environ["MUTATION_MARKER_FILES"], "w") as out:
            json.dump({name: sorted(paths) for name, paths in files.items()}, out)
""")


def copy_checkout(destination: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_file() and not source.is_symlink():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    (destination / ".venv").symlink_to((REPO / ".venv").resolve())


def locate(locator: Locator, mutant: Mutant) -> Site:
    if mutant.shell:
        return locator.shell_site(mutant.scope, mutant.pattern, mutant.replacement)
    return locator.python_site(mutant.scope, mutant.pattern, mutant.replacement)


def pytest(copy: Path, args: list[str], timeout: float, **env: str) -> tuple[int | None, float, str]:
    """(exit status or None on a time-out, seconds, output tail) of pytest in `copy`."""
    environment = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1", **env}
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=copy,
                              env=environment, capture_output=True, text=True, timeout=timeout)
        status, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        status, output = None, f"timed out after {timeout:.0f} s"
    return status, time.monotonic() - start, output[-3000:]


def marker_files(copy: Path, scratch: Path, markers: list[str]) -> dict[str, list[str]]:
    """The test files holding tests of each marker (tests marked `slurm` do not count)."""
    plugin_dir = scratch / "plugin"
    plugin_dir.mkdir()
    (plugin_dir / "mutation_markers.py").write_text(MARKER_PLUGIN)
    found = scratch / "marker_files.json"
    status, _, output = pytest(copy, ["--collect-only", "-p", "mutation_markers", "-m", " or ".join(markers)], 900,
                               PYTHONPATH=f"{copy}{os.pathsep}{plugin_dir}", MUTATION_MARKER_FILES=str(found))
    if status != 0:
        raise SystemExit(f"collecting the marked tests failed (status {status}):\n{output}")
    return json.loads(found.read_text())


def selection(marker: str) -> list[str]:
    return ["-m", f"({marker}) and not slurm"]


def run_mutant(copy: Path, site: Site, files: list[str], marker: str, timeout: float) -> tuple[str, float, str]:
    """(outcome, seconds, output tail): caught, caught-by-timeout or survived."""
    original = site.path.read_text()
    site.path.write_text(site.apply(original))
    try:
        status, seconds, output = pytest(copy, ["-x", *selection(marker), *files], timeout)
    finally:
        site.path.write_text(original)
    if status in (3, 4, 5):  # internal error, usage error, nothing collected: not a verdict on the mutant
        raise SystemExit(f"pytest could not run the tests of {marker} (status {status}):\n{output}")
    outcome = "survived" if status == 0 else "caught" if status is not None else "caught-by-timeout"
    return outcome, seconds, output


def commit() -> dict[str, object]:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    return {"commit": head, "uncommitted_changes": bool(dirty)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants only")
    parser.add_argument("--list", action="store_true", help="list the mutants and where they apply, then exit")
    parser.add_argument("--out", type=Path,
                        help=f"the JSON report (default for a full run: {REPORT.relative_to(REPO)})")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutant's pytest run")
    args = parser.parse_args(argv)
    names = {m.name for m in MUTANTS}
    if len(names) != len(MUTANTS):
        raise SystemExit("two mutants share a name")
    if unknown := sorted(set(args.only or ()) - names):
        parser.error(f"unknown mutants: {unknown}")
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    out = args.out or (None if args.only else REPORT)
    started = time.monotonic()

    with tempfile.TemporaryDirectory(prefix="nemo_topr_mutants_") as scratch_name:
        scratch = Path(scratch_name)
        copy = scratch / "repo"
        copy_checkout(copy)
        locator, sites, missing = Locator(copy), {}, {}
        for m in mutants:
            try:
                sites[m.name] = locate(locator, m)
            except MissingSite as error:
                missing[m.name] = str(error)
        if args.list:
            for m in mutants:
                where = sites[m.name].scope if m.name in sites else f"MISSING: {missing[m.name]}"
                print(f"{m.name:44} {m.marker:22} {where}")
            return 1 if missing else 0

        markers = sorted({m.marker for m in mutants if m.name in sites})
        files = marker_files(copy, scratch, markers) if markers else {}
        for m in mutants:
            if m.name in sites and not files.get(m.marker):
                missing[m.name] = f"no test outside `slurm` carries the marker {m.marker}"
        runnable = [m for m in mutants if m.name not in missing]
        if runnable:
            every = sorted({f for m in runnable for f in files[m.marker]})
            status, seconds, output = pytest(copy, selection(" or ".join(markers)) + every, 3600)
            print(f"unmutated: {'pass' if status == 0 else 'FAIL'} ({seconds:.0f} s)", flush=True)
            if status != 0:
                raise SystemExit(f"the marked tests fail without any mutant:\n{output}")

        results = []
        for m in mutants:
            if m.name in missing:
                outcome, seconds, where = "missing", 0.0, None
                print(f"MISSING  {m.name:44} {missing[m.name]}", flush=True)
            else:
                outcome, seconds, output = run_mutant(copy, sites[m.name], files[m.marker], m.marker, args.timeout)
                where = sites[m.name].scope
                print(f"{outcome.upper() if outcome == 'survived' else outcome:8} {m.name:44} {seconds:5.0f} s  "
                      f"{m.bug}", flush=True)
                if outcome == "survived":
                    print(textwrap.indent(output[-1000:], "    "), flush=True)
            results.append({"mutant": m.name, "function": where or m.scope, "pattern": m.pattern,
                            "replacement": m.replacement, "marker": m.marker, "outcome": outcome,
                            "seconds": round(seconds, 1), "bug": m.bug,
                            **({"why_missing": missing[m.name]} if m.name in missing else {})})

    counts = {outcome: sum(r["outcome"].startswith(outcome) for r in results)
              for outcome in ("caught", "survived", "missing")}
    wall = time.monotonic() - started
    print(f"{counts['caught']} caught, {counts['survived']} survived, {counts['missing']} missing "
          f"of {len(results)} mutants ({wall:.0f} s)")
    if out:
        report = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), **commit(),
                  "wall_seconds": round(wall), **counts, "mutants": results}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if counts["survived"] or counts["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
