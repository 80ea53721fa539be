"""`nemo-topr train`'s console (`nemo_topr.training.console`): what reaches the terminal, what
only the run's log keeps, and the warnings repeated at the end. The whole console of a real run
is checked in tests/training/test_e2e.py (test_a_run_with_warnings_...)."""

import contextlib
import os
import sys
from pathlib import Path

from nemo_topr.objective import ObjectiveConfig
from nemo_topr.training.console import MAX_WIDTH, RunConsole, data_lines, log_file, summary_lines
from nemo_topr.training.recipe import check_baseline

@contextlib.contextmanager
def python_on_descriptors():
    """Python's sys.stdout and sys.stderr writing to file descriptors 1 and 2, as in a process of
    its own (pytest's capfd sends them straight to its capture when a test starts)."""
    kept = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = kept


BRIDGE_LINE = " [2026-12-06 22:08:09] iteration        1/       6 | consumed samples:            4 | " + "x: 1 | " * 90


def test_the_console_shows_ours_and_stderr_and_the_log_keeps_every_byte(tmp_path, capfd):
    with python_on_descriptors(), RunConsole(verbose=False, environ={}) as console:
        print("[nemo-topr] base model: tiny", flush=True)  # before the log exists: held for it
        check_baseline(ObjectiveConfig(baseline=0.0), {0.0, 1.0})  # the 0/1-reward warning, a long line
        log = console.open_log(tmp_path / "run", 0)
        os.write(1, b"[Gloo] Rank 0 is connected to 0 peer ranks. Expected number of connected peer ranks is : 0\n")
        print(BRIDGE_LINE, flush=True)
        print("a warning on stderr", file=sys.stderr, flush=True)
    out, err = capfd.readouterr()
    lines = out.splitlines()
    assert lines[0] == "[nemo-topr] base model: tiny"
    assert lines[1].startswith("[nemo-topr] WARNING: no record is negative (reward < 0), and the records with")
    assert all(line.startswith("    ") for line in lines[2:]) and len(lines) > 2, lines  # the warning, wrapped
    assert max(map(len, lines)) <= MAX_WIDTH and "Gloo" not in out and "iteration" not in out
    assert err == "a warning on stderr\n"
    assert log.parent == tmp_path / "run" / "logs" and log.name.endswith("-rank0.log")
    kept = log.read_text().splitlines()
    assert "a warning on stderr" in kept  # stdout and stderr are read by two threads: in either order
    kept.remove("a warning on stderr")
    assert kept[0] == "[nemo-topr] base model: tiny" and kept[1].startswith("[nemo-topr] WARNING: no record")
    assert kept[2:] == ["[Gloo] Rank 0 is connected to 0 peer ranks. Expected number of connected peer ranks is : 0",
                        BRIDGE_LINE]
    assert [warning[:40] for warning in console.warnings] == ["WARNING: no record is negative (reward <"]


def test_verbose_shows_everything_unwrapped(tmp_path, capfd):
    with python_on_descriptors(), RunConsole(verbose=True, environ={}) as console:
        console.open_log(tmp_path, 3)
        print(BRIDGE_LINE, flush=True)
    assert capfd.readouterr().out == BRIDGE_LINE + "\n"


def test_a_start_that_ends_before_its_log_exists_shows_what_it_held(tmp_path, capfd):
    """A refused new run makes no directory: what the console hid goes to the terminal instead."""
    with python_on_descriptors(), RunConsole(verbose=False, environ={}):
        print("[nemo-topr] base model: tiny", flush=True)
        print("Bridge's line", flush=True)
    assert capfd.readouterr().out == "[nemo-topr] base model: tiny\nBridge's line\n"
    assert not any(tmp_path.iterdir())


def test_under_slurm_the_log_sits_beside_the_job_scripts_rank_files():
    environ = {"SLURM_JOB_ID": "812", "SLURM_RESTART_COUNT": "2"}
    assert log_file(Path("/r"), 1, environ) == Path("/r/logs/job-812-start-2/train-rank1.log")  # slurm/topr_job.sh
    assert log_file(Path("/r"), 0, {}, now=0) == Path("/r/logs/train-19700101-000000-rank0.log")


def test_the_summary_repeats_every_warning_once():
    lines = summary_lines(trained="trained iterations 1-6 of 6", metrics="iteration 6: loss 1", checkpoint="/c/iter_6",
                          log_path=Path("/r/logs/x.log"), warnings=["WARNING: a", "WARNING: b", "WARNING: a"])
    assert lines == ["[nemo-topr] summary: trained iterations 1-6 of 6", "[nemo-topr]   final: iteration 6: loss 1",
                     "[nemo-topr]   checkpoint: /c/iter_6", "[nemo-topr]   full log: /r/logs/x.log",
                     "[nemo-topr]   warnings: 2 (repeated from above)", "[nemo-topr]   WARNING: a",
                     "[nemo-topr]   WARNING: b"]


def test_the_data_lines_say_whether_this_start_wrote_or_found_the_prepared_set():
    summary = {"records_in": 4, "records_used": 4, "records_dropped": 0, "sequences": 4, "positives": 2, "prompts": 2,
               "rows": 1, "padding_share": 0.5, "p_tilde": 0.5}
    assert len(data_lines(summary, 512)) == 1  # in memory: no set
    written, found = (data_lines({**summary, "prepared_set": "/p/KEY", "prepared_set_written": flag}, 512)[-1]
                      for flag in (True, False))
    assert written == "[nemo-topr] prepared data: wrote /p/KEY (this start tokenized and packed the records)"
    assert found == "[nemo-topr] prepared data: found /p/KEY (this start wrote nothing)"
