"""`make test`'s xdist units (tests/conftest.py): every module that starts a real Slurm is in the
unit of the cluster it starts, which a single worker runs, found here by reading the modules, not
from the lists."""

import re
from pathlib import Path

from tests.conftest import DOCTOR_MODULES, REAL_SLURM_MODULES, xdist_unit

TESTS = Path(__file__).parent
REPO = TESTS.parent


def _modules_using(pattern: str) -> set[str]:
    uses = re.compile(pattern)
    return {str(path.relative_to(REPO)) for path in TESTS.rglob("test_*.py")
            if path != Path(__file__) and uses.search(path.read_text())}


def test_every_module_that_uses_a_real_slurm_is_in_the_unit_of_its_cluster():
    one_node = _modules_using(r"\bslurm_cluster\b(?!\.sh)")  # the fixture, not the script's name
    two_nodes = _modules_using(r"\bslurm_two_nodes\b")
    assert one_node | two_nodes | _modules_using(r"mark\.slurm\b") == set(REAL_SLURM_MODULES)
    assert not one_node & two_nodes  # a module using both clusters would hold up both units
    assert {xdist_unit(f"{module}::test_x[a]") for module in set(REAL_SLURM_MODULES) - two_nodes} == {"real_slurm"}
    assert {xdist_unit(f"{module}::test_x[a]") for module in two_nodes} == {"real_slurm_two_nodes"}


def test_other_tests_are_grouped_by_module():
    assert xdist_unit("tests/training/test_config.py::test_a[x::y]") == "tests/training/test_config.py"
    assert xdist_unit("tests/training/test_config.py::Class::test_b") == "tests/training/test_config.py"


def test_every_module_that_reads_the_shared_doctor_run_is_in_the_doctor_unit():
    found = _modules_using(r"doctor_on_cpu\(")
    assert found == set(DOCTOR_MODULES)
    assert {xdist_unit(f"{module}::test_x") for module in found} == {"doctor"}
