"""`make test`'s xdist units (tests/conftest.py): every module that starts a real Slurm is in the
one unit that a single worker runs, found here by reading the modules, not from the list."""

import re
from pathlib import Path

from tests.conftest import DOCTOR_MODULES, REAL_SLURM_MODULES, xdist_unit

TESTS = Path(__file__).parent
REPO = TESTS.parent


def test_every_module_that_uses_a_real_slurm_is_in_the_real_slurm_unit():
    uses = re.compile(r"\bslurm_cluster\b|\bslurm_two_nodes\b|mark\.slurm\b")
    found = {str(path.relative_to(REPO)) for path in TESTS.rglob("test_*.py")
             if path != Path(__file__) and uses.search(path.read_text())}
    assert found == set(REAL_SLURM_MODULES)
    assert {xdist_unit(f"{module}::test_x[a]") for module in found} == {"real_slurm"}


def test_other_tests_are_grouped_by_module():
    assert xdist_unit("tests/training/test_config.py::test_a[x::y]") == "tests/training/test_config.py"
    assert xdist_unit("tests/training/test_config.py::Class::test_b") == "tests/training/test_config.py"


def test_every_module_that_reads_the_shared_doctor_run_is_in_the_doctor_unit():
    found = {str(path.relative_to(REPO)) for path in TESTS.rglob("test_*.py")
             if path != Path(__file__) and "doctor_on_cpu(" in path.read_text()}
    assert found == set(DOCTOR_MODULES)
    assert {xdist_unit(f"{module}::test_x") for module in found} == {"doctor"}
