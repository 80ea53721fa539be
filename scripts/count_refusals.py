"""Count the refusals of `nemo_topr/`: the distinct problems it can tell a user about.

A restructuring keeps every refusal: run this before and after and compare the counts (and, with
``--list``, the refusals themselves). It reads the code, never runs it.

A refusal *site* is
- ``raise E(...)`` of any exception but the internal ones (`INTERNAL`),
- ``parser.error(...)`` (argparse's refusal of a command line),
- ``problems.append(...)`` / ``problems.extend(...)`` / ``yield`` of a message in a function that
  collects problems (its name holds ``problem`` or starts with ``check``).
A refusal is identified by its message *template*: the literal text of the message's strings, each
interpolated value written ``{}`` (`key=` and `where=` are not part of it). Sites whose message is
built elsewhere (``raise ConfigError(message)``) are identified by their function's name and the
expression. Two sites with the same template are one refusal (one problem told in two places), so
merging duplicate checks keeps the count, unless they carry different `key=`s: then each key is a
problem of its own, told in the same words. Moving code or renaming a module does not change the
count; rewording changes a template but not the count.

    .venv/bin/python scripts/count_refusals.py            # the count
    .venv/bin/python scripts/count_refusals.py --list     # every template, sorted, with a site
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nemo_topr"
# raised for control flow or a programming error, never shown to a user as a refusal
INTERNAL = {"NotImplementedError", "AssertionError", "StopIteration", "KeyboardInterrupt", "Terminated", "Skipped",
            "CheckFailed"}
NAMING = {"key", "where"}  # a refusal's name and location (nemo_topr.errors.UserError), not its words


def template(node: ast.AST) -> str | None:
    """The literal text of a message expression, values as ``{}``; None when it holds no string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left, right = template(node.left), template(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else "{}") + (right if right is not None else "{}")
    if isinstance(node, ast.IfExp):
        body, orelse = template(node.body), template(node.orelse)
        if body is None and orelse is None:
            return None
        return f"{body if body is not None else '{}'}|{orelse if orelse is not None else '{}'}"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("join", "format"):
        inner = template(node.func.value)
        return None if inner is None else inner
    return None


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _message(call: ast.Call, function: str) -> str:
    # key= and where= name and locate the problem; the message is the rest
    told = [*call.args, *(keyword.value for keyword in call.keywords if keyword.arg not in NAMING)]
    texts = [text for arg in told if (text := template(arg)) is not None]
    bare = ast.Call(call.func, call.args, [keyword for keyword in call.keywords if keyword.arg not in NAMING])
    return " | ".join(texts) if texts else f"{function}: {ast.unparse(bare)}"


def _key(call: ast.Call) -> str | None:
    return next((template(keyword.value) for keyword in call.keywords if keyword.arg == "key"), None)


class _Sites(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path, self.function, self.sites = path, "<module>", []

    def _add(self, message: str, node: ast.AST, kind: str, key: str | None = None) -> None:
        self.sites.append((message, f"{self.path}:{node.lineno}", kind if key is None else f"{kind} key={key}"))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def _collects(self) -> bool:
        return "problem" in self.function or self.function.lstrip("_").startswith("check")

    def visit_Raise(self, node: ast.Raise) -> None:
        if isinstance(node.exc, ast.Call):
            name = _callee(node.exc)
            is_int_exit = name == "SystemExit" and node.exc.args and isinstance(node.exc.args[0], ast.Constant) \
                and isinstance(node.exc.args[0].value, int)
            if name not in INTERNAL and not is_int_exit:
                self._add(_message(node.exc, self.function), node, f"raise {name}", _key(node.exc))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if _callee(node) == "refuse" and (key := _key(node)) is not None:
            # `errors.refuse(problems, key=...)`: the several problems a validate found, told as one,
            # in the words of its separator (default a new line)
            separator = next((template(keyword.value) for keyword in node.keywords if keyword.arg == "separator"), "\n")
            self._add(f"{{}}{separator}{{}}", node, "refuse", key)
        if isinstance(func, ast.Attribute):
            owner = ast.unparse(func.value)
            if func.attr == "error" and "parser" in owner.lower() and node.args:
                self._add(_message(node, self.function), node, "parser.error")
            elif func.attr in ("append", "extend") and "problem" in owner.lower() and node.args:
                # a problem collected as an error (`problems.append(UserError(message, key=...))`): its message
                told = node.args[0] if isinstance(node.args[0], ast.Call) and _callee(node.args[0]).endswith("Error") \
                    else node
                self._add(_message(told, self.function), node, f"{owner}.{func.attr}", _key(told))
        self.generic_visit(node)

    def visit_Yield(self, node: ast.Yield) -> None:
        if node.value is not None and self._collects() and (text := template(node.value)) is not None:
            self._add(text, node, "yield")
        self.generic_visit(node)


def refusals(package: Path = PACKAGE) -> dict[str, list[str]]:
    """template -> the sites (path:line kind [key=KEY]) that tell it."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        visitor = _Sites(str(path.relative_to(package.parent)))
        visitor.visit(ast.parse(path.read_text(), str(path)))
        for message, site, kind in visitor.sites:
            found.setdefault(message, []).append(f"{site} {kind}")
    return found


def count(found: dict[str, list[str]]) -> int:
    """The refusals: one per template, or one per distinct key where sites of a template name
    different keys (two problems told in the same words)."""
    return sum(max(1, len({site.split(" key=")[1] for site in sites if " key=" in site})) for sites in found.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print every refusal's template and its sites as JSON")
    parser.add_argument("--package", type=Path, default=PACKAGE, help="the package folder to read")
    args = parser.parse_args(argv)
    found = refusals(args.package)
    if args.list:
        json.dump(dict(sorted(found.items())), sys.stdout, indent=1)
        print()
    sites = sum(len(where) for where in found.values())
    print(f"{count(found)} refusals ({sites} sites) in {args.package.name}/", file=sys.stderr if args.list else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
