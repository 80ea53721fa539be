"""The miniature studies' refusals as a table: one row per problem, its bad input → the problem's key and where.

The rows assert the key and where only; the words are in tests/golden/refusals.txt (tests/refusal_table.py),
compared here (``NEMO_TOPR_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/miniature/test_refusals.py``
rewrites this table's section), so rewording a message changes that file and no test. Every key SOURCES can
raise has a row: a new refusal without one fails `test_the_table_covers_every_key_the_code_raises`.
A user meets them through ``python -m nemo_topr.miniature.study`` (VERB). The statistics' ValueErrors
(miniature/stats.py) check the study's own arguments and are no refusal of a user's input.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from tests.conftest import REPO
from tests.miniature.test_study3 import row, says
from tests.refusal_table import assert_covers, assert_golden, raised, rendered, row_tests
from tests.training.test_refusals_run import tree

from nemo_topr.miniature import study, study3_placebo
from nemo_topr.miniature.study_run import SharedDesign, resumable_results

MINIATURE = REPO / "nemo_topr" / "miniature"
SOURCES = [MINIATURE / name for name in ("study.py", "study_run.py", "study3_placebo.py")]
ERRORS = {"UserError", "PlaceboError"}
VERB = "miniature"
DESIGN = json.loads(json.dumps(dataclasses.asdict(SharedDesign())))  # as results.json stores it


def make_inputs(root: Path) -> None:
    """The interrupted studies the rows resume, relative to `root` (the rows run there)."""
    studies = {"other_seeds": {"design": {**DESIGN, "seeds": [1]}},
               "lost_mu": {"design": DESIGN, "mu": {"path": "lost_mu/mu"}},
               "whole": {"design": DESIGN, "mu": {"path": "whole/mu"}}}
    for name, results in studies.items():
        (root / name).mkdir()
        (root / name / "results.json").write_text(json.dumps(results))
    (root / "whole" / "mu").mkdir()


# K = 5 negatives, G = 3 on train-2: the rotation needs K >= 2G
TOO_FEW = [row("train-2", says(1), -1.0, i, "wrong") for i in range(3)] + [
    row("train-10", says(2), -1.0, i, "wrong") for i in range(2)]
# seed 8 orders [train-10, train-2]: each negative states the other prompt's answer, no swap helps
CROSSED = [row("train-2", says(20), -1.0, 0, "wrong"), row("train-10", says(12), -1.0, 0, "wrong")]

# (key, where, the problem's source: the pure function given the bad input)
ROWS = [
    ("--variants.unknown", "--variants", raised(study.main, ["--dry-run", "--variants", "topr", "grpo"])),
    ("--resume.no_results", "--resume", raised(resumable_results, Path("none"), SharedDesign())),
    ("--resume.other_options", "--resume", raised(resumable_results, Path("other_seeds"), SharedDesign())),
    ("--resume.mu_missing", "--resume", raised(resumable_results, Path("lost_mu"), SharedDesign())),
    ("placebo.negatives.too_few_for_rotation", "seed 4", raised(study3_placebo.placebo_rows, TOO_FEW, seed=4, k=16)),
    ("placebo.negative.no_swap_partner", "seed 8, record 1",
     raised(study3_placebo.placebo_rows, CROSSED, seed=8, k=16)),
]


inputs, test_each_bad_input_raises_its_problem = row_tests(ROWS, make_inputs)


def test_no_row_writes_or_prints_anything(inputs, monkeypatch, capsys):
    """A refused study writes nothing, and is refused before its plan is printed."""
    monkeypatch.chdir(inputs)
    before = tree(inputs)
    for _, _, problem in ROWS:
        problem()
    assert (tree(inputs), capsys.readouterr().out) == (before, "")


def test_the_rows_inputs_pass_but_for_their_change(inputs, monkeypatch):
    """The study each row resumes is whole but for its change; the variants named are known."""
    monkeypatch.chdir(inputs)
    assert resumable_results(Path("whole"), SharedDesign())["mu"] == {"path": "whole/mu"}
    assert raised(study.main, ["--dry-run", "--variants", "topr"])() == []


def test_the_table_covers_every_key_the_code_raises():
    assert_covers(ROWS, SOURCES, ERRORS)


def test_the_messages_are_the_golden_files(inputs, monkeypatch):
    monkeypatch.chdir(inputs)
    assert_golden("tests/miniature/test_refusals.py",
                  [rendered(VERB, key, where, *problem(), inputs) for key, where, problem in ROWS])


def test_the_table_imports_no_megatron(inputs, monkeypatch):
    """Each problem comes out of the studies' own checks, before any training: no row imports Megatron."""
    monkeypatch.chdir(inputs)
    loaded = set(sys.modules)
    for _, _, problem in ROWS:
        problem()
    assert [name for name in set(sys.modules) - loaded if name.startswith(("megatron", "transformer_engine"))] == []
