"""The tests allowed to take over 60 s (set-up included) on an idle 2-core machine, and why.

Every other test stays under a minute. A run's times are in its JUnit XML (`make test` writes
runs/pytest/test.xml); this names the tests over the limit that are not listed here:

    .venv/bin/python -m tests.long_tests runs/pytest/test.xml

It prints them and exits 1 when there are any; the listed ones are printed with their times too.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

LIMIT_SECONDS = 60.0

# "module path::test function" (every parametrisation of it) -> why it needs that long
LONG_TESTS: dict[str, str] = {
    "tests/slurm/test_two_nodes.py::test_iterate_scores_and_trains_across_two_nodes_and_a_rerun_redoes_nothing":
        "a whole iterate round (generate, curate, score, train, export, eval) as jobs of a real two-node "
        "Slurm, each rank importing Megatron, then the rerun that must redo nothing",
    "tests/slurm/test_two_nodes.py::test_a_two_node_job_is_preempted_requeued_and_completes_with_every_sample_once":
        "a real two-node job warned, requeued by Slurm and started again: two Megatron start-ups of two "
        "ranks and Slurm's requeue delay",
    "tests/slurm/test_scripts.py::test_a_real_time_limit_preempts_with_its_warning_and_the_next_start_resumes":
        "waits for a real Slurm time limit (Slurm counts it in minutes) to send its warning, then for the "
        "requeued start",
    "tests/slurm/test_scripts.py::test_a_warning_while_the_ranks_import_requeues_on_real_slurm":
        "a real job warned while its ranks import Megatron, requeued by Slurm and trained to the end",
    "tests/slurm/test_scripts.py::test_the_shipped_8b_sbatch_requeues_after_a_warning_at_a_random_moment":
        "the shipped sbatch script on a real Slurm: warned at a random moment, requeued, resumed to the end",
    "tests/slurm/test_scripts.py::test_a_warning_before_the_ranks_hold_it_requeues_the_real_job":
        "a real job whose warning comes before the ranks hold it: Slurm's requeue and a second start",
    "tests/slurm/test_scripts.py::test_a_killed_rank_fails_the_real_job_without_a_requeue":
        "a real job whose two ranks import Megatron and prepare the run before one is killed, then Slurm "
        "ends the other (--kill-on-bad-exit) and the job",
    "tests/bench/test_gpu_verbs.py::test_every_verb_passes_on_cpu_and_the_copies_of_the_model_score_alike":
        "the first reader of the session's one CPU doctor run (tests/doctor/cpu_doctor.py): every verb "
        "in a process of its own, shared with tests/doctor/test_doctor.py",
    "tests/doctor/test_doctor.py::test_doctor_on_cpu_passes_and_writes_its_table":
        "the other reader of the one CPU doctor run: whichever of the two the worker runs first builds it",
    "tests/training/test_e2e.py::test_the_demo_ends_pointing_to_the_tour_and_its_tensorboard_logs":
        "the first reader of the module's one real `make demo` run (sampling, scoring, training, export "
        "and the reload), which every test of tests/training/test_e2e.py reads",
    "tests/miniature/test_miniature.py::test_miniature_smoke":
        "the miniature's one real pipeline smoke (the studies' smokes run on a fake pipeline): pretraining, "
        "two variants trained and every checkpoint evaluated through Megatron, each in a process of its own",
    "tests/bench/test_bench.py::test_make_bench_quick_writes_every_section":
        "the first reader of the one quick `make bench` run (every section at tiny sizes, each in "
        "subprocesses that start Megatron), shared with the shared-prefix section's test",
}


def function_of(nodeid: str) -> str:
    """A node id's test function ("module path::test function"), its parameters dropped."""
    return nodeid.split("[")[0]


def durations(junit_xml: Path) -> dict[str, float]:
    """Seconds per test (set-up and tear-down included, pytest's default) by its node id."""
    times = {}
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        times[f"{module}::{case.get('name')}"] = float(case.get("time", 0))
    return times


def over_the_limit(times: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """(listed tests over the limit, unlisted tests over the limit)."""
    over = {nodeid: seconds for nodeid, seconds in times.items() if seconds > LIMIT_SECONDS}
    listed = {nodeid: seconds for nodeid, seconds in over.items() if function_of(nodeid) in LONG_TESTS}
    return listed, {nodeid: seconds for nodeid, seconds in over.items() if nodeid not in listed}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    listed, unlisted = over_the_limit(durations(Path(argv[0])))
    for title, found in (("listed", listed), ("NOT LISTED", unlisted)):
        for nodeid, seconds in sorted(found.items(), key=lambda item: -item[1]):
            print(f"{title:>10}  {seconds:6.1f} s  {nodeid}")
    return 1 if unlisted else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
