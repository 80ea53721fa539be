"""scripts/count_refusals.py on a small package of its own: each distinct problem is one refusal,
whichever way it is raised, and the several problems a validate finds, told as one by
`errors.refuse(..., key=...)`, are one per key and separator."""

import importlib.util
import sys
import textwrap

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("count_refusals", REPO / "scripts" / "count_refusals.py")
counter = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(counter)

VERB = textwrap.dedent('''
    from nemo_topr import errors
    from nemo_topr.errors import UserError, refuse

    def validate(spec):
        problems = []
        if spec.a:
            problems.append(UserError(f"--a {spec.a} is no file", key="a.missing", where="--a"))
        if spec.b:
            raise UserError(f"--b {spec.b} is no file", key="b.missing", where="--b")
        return problems

    def main(spec):
        refuse(validate(spec), key="verb.several_problems")

    def other(spec):
        errors.refuse(validate(spec), key="verb.several_problems")  # the same refusal, told again
        errors.refuse(validate(spec), key="config.several_problems", separator="; ")
        refuse(validate(spec))  # no key: its problems are counted where they are raised
''')


def test_each_problem_and_each_combined_refusal_counts_once(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "verb.py").write_text(VERB)
    found = counter.refusals(package)
    assert found["{}\n{}"] == ["pkg/verb.py:14 refuse key=verb.several_problems",
                               "pkg/verb.py:17 refuse key=verb.several_problems"]
    assert found["{}; {}"] == ["pkg/verb.py:18 refuse key=config.several_problems"]
    assert counter.count(found) == 4  # a.missing, b.missing, verb.several_problems, config.several_problems
