"""tests/long_tests.py: the tests allowed over 60 s exist, and a run's JUnit XML is read right."""

import ast
from pathlib import Path

from tests.long_tests import LONG_TESTS, durations, main, over_the_limit

REPO = Path(__file__).resolve().parents[1]


def test_every_listed_test_is_a_test_function_of_its_module():
    for nodeid, why in LONG_TESTS.items():
        module, function = nodeid.split("::")
        tree = ast.parse((REPO / module).read_text())
        assert function in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}, nodeid
        assert why.strip(), nodeid


def test_a_run_over_the_limit_names_the_unlisted_tests_only(tmp_path, capsys):
    listed = next(iter(LONG_TESTS))
    module, function = listed.split("::")
    classname = module.removesuffix(".py").replace("/", ".")
    xml = tmp_path / "test.xml"
    xml.write_text(f"""<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
        <testcase classname="{classname}" name="{function}[a]" time="300.5"/>
        <testcase classname="tests.data.test_records" name="test_slow" time="61.0"/>
        <testcase classname="tests.data.test_records" name="test_at_the_limit" time="60.0"/>
        <testcase classname="tests.data.test_records" name="test_quick" time="0.2"/>
        </testsuite></testsuites>""")
    times = durations(xml)
    assert times["tests/data/test_records.py::test_quick"] == 0.2
    assert over_the_limit(times) == ({f"{listed}[a]": 300.5}, {"tests/data/test_records.py::test_slow": 61.0})
    assert main([str(xml)]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[-1] for line in printed] == [f"{listed}[a]", "tests/data/test_records.py::test_slow"]
