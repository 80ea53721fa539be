"""What every refusal table (the tests/test_refusals_VERB files) shares: a row's problem, the check that the table
covers every key the code raises, and the one golden file of rendered messages.

A table is a list of rows ``(key, where, problem)``: `problem()` returns the `UserError`s a minimal bad
input gives. Rows assert the key and where only; the words live in tests/golden/refusals.txt, one section
per table, which a reviewer reads as a whole. ``NEMO_TOPR_UPDATE_GOLDEN=1`` rewrites a table's section
when its test runs, so rewording a message changes that file and no test.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import io
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from tests.conftest import REPO

from nemo_topr.errors import UserError, run_refusing

GOLDEN = Path(__file__).parent / "golden" / "refusals.txt"
HEADER = ("# The refusals' messages as printed: one section per table (## and the table's path), one line per row, "
          "VERB  KEY  WHERE: MESSAGE. Written by NEMO_TOPR_UPDATE_GOLDEN=1 .venv/bin/python -m pytest TABLE; "
          "do not edit.")
Row = tuple[str, str, Callable[[], list[UserError]]]


def raised(check: Callable[..., object], *args: object, **kwargs: object) -> Callable[[], list[UserError]]:
    """A row's problem: the UserError `check(*args, **kwargs)` raises (none: an empty list)."""
    def problem() -> list[UserError]:
        try:
            check(*args, **kwargs)
        except UserError as error:
            return [error]
        return []
    return problem


def row_tests(rows: list[Row], make_inputs: Callable[[Path], None]):
    """The `inputs` fixture (a folder holding `make_inputs`'s files, built once per table) and the test
    that each row's problem is its (key, where), run in that folder. A table binds both by their names:
    ``inputs, test_each_bad_input_raises_its_problem = row_tests(ROWS, make_inputs)``."""
    @pytest.fixture(scope="module")
    def inputs(tmp_path_factory) -> Path:
        root = tmp_path_factory.mktemp("refusal_inputs")
        make_inputs(root)
        return root

    @pytest.mark.parametrize("key, where, problem", rows, ids=[row[0] for row in rows])
    def test_each_bad_input_raises_its_problem(key, where, problem, inputs, monkeypatch):
        monkeypatch.chdir(inputs)
        assert [(error.key, error.where) for error in problem()] == [(key, where)]

    return inputs, test_each_bad_input_raises_its_problem


def key_templates(sources: Iterable[Path], errors: set[str]) -> dict[str, str]:
    """Each `key=` template of a call to one of `errors` (class or function names) in `sources`, a value
    written ``{}``, → its first site; a call without key= and where= fails the test, naming its site. A
    `refuse(problems, key=...)` (nemo_topr/errors.py) is the site of that key, raised for several problems."""
    found, bare = {}, []
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text())):
            if not (isinstance(node, ast.Call) and (_name(node.func) in errors or _is_combining(node))):
                continue
            site = f"{source.relative_to(REPO)}:{node.lineno}"
            keywords = {keyword.arg: keyword.value for keyword in node.keywords}
            if _is_combining(node):  # its where is the joined wheres of the problems it names
                keywords.setdefault("where", keywords["key"])
            if "key" not in keywords or "where" not in keywords:
                bare.append(site)
                continue
            key = keywords["key"]
            parts = key.values if isinstance(key, ast.JoinedStr) else [key]
            found.setdefault("".join(part.value if isinstance(part, ast.Constant) else "{}" for part in parts), site)
    assert not bare, f"{sorted(errors)} raised without key= and where=: {bare}"
    return found


def _is_combining(node: ast.Call) -> bool:
    """A call of `nemo_topr.errors.refuse` giving the key of several problems at once: a refusal of its own."""
    return _name(node.func) == "refuse" and any(keyword.arg == "key" for keyword in node.keywords)


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def best_template(key: str, templates: Iterable[str]) -> str | None:
    """The template `key` is an instance of, the most literal one where several fit."""
    fitting = [template for template in templates
               if re.fullmatch(".+".join(re.escape(part) for part in template.split("{}")), key)]
    return max(fitting, key=lambda template: len(template.replace("{}", "")), default=None)


def assert_covers(rows: list[Row], sources: Iterable[Path], errors: set[str],
                  unreachable: Iterable[str] = ()) -> None:
    """Every row names a key the code raises, one row per key, and every key of `sources` has a row
    (but the `unreachable` templates, which a table says why it cannot reach)."""
    templates = key_templates(sources, errors)
    matched = {key: best_template(key, templates) for key, _, _ in rows}
    assert [key for key, template in matched.items() if template is None] == []  # a row for no refusal
    missing = set(templates) - set(matched.values()) - set(unreachable)
    assert not missing, f"refusals without a row: {sorted((templates[t], t) for t in missing)}"
    assert len(matched) == len(rows)  # one row per problem


def rendered(verb: str, key: str, where: str, error: UserError, inputs: Path | None = None) -> str:
    """The row's golden line: its message as `nemo-topr VERB` prints it (`run_refusing`, as `cli.main`),
    further lines indented, `inputs` (the rows' files) written INPUTS and the checkout REPO."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        run_refusing(f"nemo-topr {verb}", lambda argv: (_ for _ in ()).throw(error), [])
    message = stderr.getvalue().rstrip("\n")
    if inputs is not None:
        message = message.replace(str(inputs), "INPUTS")
    message = message.replace(str(REPO), "REPO")
    return f"{verb}  {key}  {where}: " + message.replace("\n", "\n    ")


def sections(text: str) -> dict[str, str]:
    """The golden file's sections: table path → its lines."""
    found: dict[str, str] = {}
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        table, _, body = part.partition("\n")
        found[table] = body
    return found


def assert_golden(table: str, lines: Iterable[str]) -> None:
    """`lines` (sorted) are the golden file's section for `table` (its path from the checkout); with
    NEMO_TOPR_UPDATE_GOLDEN=1 the section is written first. Every section names a table that exists."""
    body = "".join(f"{line}\n" for line in sorted(lines))
    found = sections(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("NEMO_TOPR_UPDATE_GOLDEN") == "1":
        found[table] = body
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(HEADER + "\n" + "".join(f"## {name}\n{found[name]}" for name in sorted(found)))
    assert [name for name in found if not (REPO / name).is_file()] == []  # a section of a removed table
    golden = (found.get(table) or "").splitlines()
    assert golden == body.splitlines(), "\n".join(difflib.unified_diff(golden, body.splitlines(), "golden", "now",
                                                                       lineterm=""))
