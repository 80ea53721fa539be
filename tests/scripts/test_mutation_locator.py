"""The mutation check's locator (scripts/mutation_locator.py) on a small package of its own: a
mutant's definition and AST pattern are found wherever the module lives, and what is not found
exactly once is refused, naming what was found."""

import importlib.util
import sys
import textwrap

import pytest

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("mutation_locator", REPO / "scripts" / "mutation_locator.py")
locator = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # its dataclasses look it up there
_spec.loader.exec_module(locator)

OBJECTIVE = textwrap.dedent('''
    BOUNDS = {"topr": (1.0, 1.0, 0.0, 1.0), "tis": (0.0, 1.0, 0.0, 1.0)}


    class Weights:
        def truncated(self, rho, reward):
            """min(rho, 1) on negatives"""
            return min(rho, 1) if reward < 0 else 1.0


    def sides(rewards, advantages, rule):
        positive = [r >= 0 for r in rewards]
        negative = [(a if rule == "advantage" else r) < 0 for a, r in zip(advantages, rewards)]
        return positive, negative
''')
JOB = textwrap.dedent('''
    #!/usr/bin/env bash
    finish() {
        if [[ -f $run_dir/STOPPED ]];   then
            scontrol requeue "$job_id"
        fi
    }
    if ((status == 138)); then exit 0; fi
''')


@pytest.fixture
def checkout(tmp_path):
    (tmp_path / "pkg" / "training").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "objective.py").write_text(OBJECTIVE)
    (tmp_path / "pkg" / "training" / "step.py").write_text("def sides(batch):\n    return batch[0] >= 0\n")
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "job.sh").write_text(JOB)
    return tmp_path


def _mutated(site) -> str:
    return site.apply(site.path.read_text())


def test_a_pattern_is_found_in_its_function_and_replaced_there_only(checkout):
    site = locator.Locator(checkout, "pkg").python_site("objective.sides", "r >= 0", "r > 0")
    assert site.path == checkout / "pkg" / "objective.py" and site.scope == "pkg.objective.sides"
    assert _mutated(site) == OBJECTIVE.replace("[r >= 0 for", "[r > 0 for")
    # a method, by its class; a call's argument; a module-level constant
    site = locator.Locator(checkout, "pkg").python_site("Weights.truncated", "min(_1, 1)", "_1")
    assert "return (rho) if reward < 0 else 1.0" in _mutated(site)
    site = locator.Locator(checkout, "pkg").python_site("BOUNDS", "(1.0, 1.0, 0.0, 1.0)", "(1.0, 1.0, 0.0, 9.0)")
    assert '"topr": (1.0, 1.0, 0.0, 9.0), "tis": (0.0, 1.0, 0.0, 1.0)' in _mutated(site)


def test_a_wildcard_keeps_the_expression_it_matched_whole(checkout):
    site = locator.Locator(checkout, "pkg").python_site("objective.sides", "_1 < 0", "-_1 > 0")
    assert '[-(a if rule == "advantage" else r) > 0 for a, r' in _mutated(site)  # not -a if ... else r > 0


def test_a_pattern_or_definition_not_found_once_is_missing_naming_what_was_found(checkout):
    find = locator.Locator(checkout, "pkg").python_site
    with pytest.raises(locator.MissingSite, match=r"pkg.objective.sides: the pattern 'r > 0' matches 0 times"):
        find("objective.sides", "r > 0", "r >= 0")
    with pytest.raises(locator.MissingSite, match=r"pkg.objective.BOUNDS: the pattern .* matches 2 times"):
        find("BOUNDS", "(_1, 1.0, 0.0, 1.0)", "(_1, 1.0, 0.0, 9.0)")
    with pytest.raises(locator.MissingSite, match=r"policy_loss: defined 0 times under pkg/$"):
        find("policy_loss", "r >= 0", "r > 0")
    with pytest.raises(locator.MissingSite, match=r"sides: defined 2 times .*objective.sides, pkg.training.step.sides"):
        find("sides", "r >= 0", "r > 0")


def test_a_mutant_is_found_after_its_module_moves_into_a_subpackage(checkout):
    before = _mutated(locator.Locator(checkout, "pkg").python_site("objective.sides", "r >= 0", "r > 0"))
    (checkout / "pkg" / "loss").mkdir()
    (checkout / "pkg" / "objective.py").rename(checkout / "pkg" / "loss" / "objective.py")
    after = locator.Locator(checkout, "pkg").python_site("objective.sides", "r >= 0", "r > 0")
    assert after.path == checkout / "pkg" / "loss" / "objective.py" and after.scope == "pkg.loss.objective.sides"
    assert _mutated(after) == before


def test_shell_words_are_found_whatever_the_spacing_in_a_function_or_the_whole_script(checkout):
    find = locator.Locator(checkout, "pkg", shell_globs=("slurm/*.sh",)).shell_site
    site = find("finish", "if [[ -f $run_dir/STOPPED ]]; then", "if true; then")
    assert "    if true; then\n        scontrol requeue" in _mutated(site)
    assert "if false; then exit 0" in _mutated(find(None, "if ((status == 138)); then", "if false; then"))
    with pytest.raises(locator.MissingSite, match=r"shell function finish\(\): the words .* occur 0 times"):
        find("finish", "if ((status == 138)); then", "if false; then")
