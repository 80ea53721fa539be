"""Where a mutant applies: a definition found by its qualified name, and one AST pattern inside it.

The check (`scripts/mutation_check.py`) keys each mutant to what it breaks, never to a file path or
a line, so that moving a module, reformatting a function or renaming a test leaves it valid:

- Python: `scope` is a qualified name (`policy_loss`, `ObjectiveConfig.weight_bounds`,
  `ToprForwardStep._log_samples`, a module-level constant such as `_VARIANT_BOUNDS`), matched as
  the tail of the dotted name `package.module.qualname` of every definition in every module under
  the package: `step.topr_loss` narrows `topr_loss` down, wherever `step` lives. `pattern` is a
  Python expression or statement; it matches the nodes inside the scope whose AST equals it
  (layout, comments and quote style do not count). Names `_1` … `_9` in the pattern are wildcards
  for any expression, and the same names in `replacement` stand for the source text they matched
  (in parentheses).
- Shell: `pattern` is a run of shell words, matched with any whitespace between them, inside the
  function `scope` (`name() {` … the `}` at its indentation) or, with no scope, anywhere in the
  scripts searched (`slurm/*.sh`).

Either must match exactly once; otherwise `MissingSite` says what was (not) found. The result is
a `Site`: the file and the character span to replace, and the text to put there.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

WILDCARD = re.compile(r"\b_([1-9])\b")
SHELL_GLOBS = ("slurm/*.sh",)


class MissingSite(LookupError):
    """The scope or the pattern of a mutant is not found exactly once."""


@dataclass(frozen=True)
class Site:
    path: Path  # the file to mutate
    scope: str  # the full dotted name of the definition (Python) or the script and function (shell)
    start: int  # character offsets of the text to replace
    end: int
    replacement: str

    def apply(self, text: str) -> str:
        return text[: self.start] + self.replacement + text[self.end :]


def _definitions(tree: ast.Module, module: str) -> dict[str, ast.AST]:
    """Full dotted name -> node of every function, class and module-level assignment."""
    found: dict[str, ast.AST] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[f"{prefix}.{node.name}"] = node
                visit(node.body, f"{prefix}.{node.name}")
            elif prefix == module and isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        found[f"{prefix}.{target.id}"] = node

    visit(tree.body, module)
    return found


def _same(node: object, pattern: object, captures: dict[str, ast.AST]) -> bool:
    """Whether `node` has the structure of `pattern` (positions and contexts ignored)."""
    if isinstance(pattern, ast.Name) and WILDCARD.fullmatch(pattern.id):
        if not isinstance(node, ast.expr):
            return False
        if pattern.id in captures:
            return _same(node, captures[pattern.id], {})
        captures[pattern.id] = node
        return True
    if isinstance(pattern, list):
        return (isinstance(node, list) and len(node) == len(pattern)
                and all(_same(n, p, captures) for n, p in zip(node, pattern)))
    if isinstance(pattern, ast.AST):
        return type(node) is type(pattern) and all(
            _same(getattr(node, field, None), getattr(pattern, field, None), captures)
            for field in pattern._fields if field not in ("ctx", "kind", "type_comment"))
    return type(node) is type(pattern) and node == pattern  # 1 != 1.0 != True here


def _parse_pattern(pattern: str) -> ast.AST:
    body = ast.parse(textwrap.dedent(pattern).strip()).body
    if len(body) != 1:
        raise ValueError(f"a pattern is one expression or statement: {pattern!r}")
    return body[0].value if isinstance(body[0], ast.Expr) else body[0]


def _offset(lines: list[str], lineno: int, col_bytes: int) -> int:
    """Character offset of AST position (1-based line, UTF-8 byte column) in the joined lines."""
    return sum(map(len, lines[: lineno - 1])) + len(lines[lineno - 1].encode()[:col_bytes].decode())


class Locator:
    """Finds mutants' sites in one checkout; parses each file once."""

    def __init__(self, root: Path, package: str = "nemo_topr", shell_globs: tuple[str, ...] = SHELL_GLOBS):
        self.root, self.package, self.shell_globs = Path(root), package, shell_globs
        self._modules: dict[Path, tuple[str, dict[str, ast.AST]]] | None = None

    def modules(self) -> dict[Path, tuple[str, dict[str, ast.AST]]]:
        if self._modules is None:
            self._modules = {}
            for path in sorted((self.root / self.package).rglob("*.py")):
                text = path.read_text()
                parts = path.relative_to(self.root).with_suffix("").parts
                module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
                self._modules[path] = (text, _definitions(ast.parse(text), module))
        return self._modules

    def python_site(self, scope: str, pattern: str, replacement: str) -> Site:
        scopes = [(path, name, node) for path, (_, definitions) in self.modules().items()
                  for name, node in definitions.items() if name == scope or name.endswith("." + scope)]
        if len(scopes) != 1:
            where = ", ".join(name for _, name, _ in scopes)
            raise MissingSite(f"{scope}: defined {len(scopes)} times under {self.package}/"
                              + (f" ({where})" if where else ""))
        path, name, node = scopes[0]
        text = self.modules()[path][0]
        wanted = _parse_pattern(pattern)
        matches = []
        for candidate in ast.walk(node):
            captures: dict[str, ast.AST] = {}
            if _same(candidate, wanted, captures):
                matches.append((candidate, captures))
        if len(matches) != 1:
            raise MissingSite(f"{name}: the pattern {pattern!r} matches {len(matches)} times (expected once)")
        found, captures = matches[0]
        # parenthesised, so that a captured `a if b else c` stays one operand where it is put
        filled = WILDCARD.sub(lambda m: f"({ast.get_source_segment(text, captures[m.group(0)])})", replacement)
        lines = text.splitlines(keepends=True)
        start = _offset(lines, found.lineno, found.col_offset)
        end = _offset(lines, found.end_lineno, found.end_col_offset)
        indent = " " * (start - sum(map(len, lines[: found.lineno - 1])))
        site = Site(path, name, start, end, filled.replace("\n", "\n" + indent))
        try:
            ast.parse(site.apply(text))
        except SyntaxError as error:
            raise ValueError(f"{name}: the replacement {replacement!r} does not parse: {error}") from None
        return site

    def shell_site(self, scope: str | None, pattern: str, replacement: str) -> Site:
        words = pattern.split()
        regex = re.compile(r"\s+".join(map(re.escape, words)))
        matches = []
        for path in sorted(p for glob in self.shell_globs for p in self.root.glob(glob)):
            text = path.read_text()
            span = (0, len(text)) if scope is None else _shell_function(text, scope)
            if span is not None:
                matches += [(path, m) for m in regex.finditer(text, *span)]
        where = "slurm scripts" if scope is None else f"shell function {scope}()"
        if len(matches) != 1:
            raise MissingSite(f"{where}: the words {pattern!r} occur {len(matches)} times (expected once)")
        path, match = matches[0]
        return Site(path, f"{path.name}:{scope or '-'}", match.start(), match.end(), replacement)


def _shell_function(text: str, name: str) -> tuple[int, int] | None:
    """Span of the body of shell function `name` (`name() {` to the `}` at its indentation)."""
    head = re.search(rf"^([ \t]*)(?:function[ \t]+)?{re.escape(name)}[ \t]*\(\)[ \t]*\{{[ \t]*$", text, re.MULTILINE)
    if head is None:
        return None
    tail = re.compile(rf"^{head.group(1)}\}}", re.MULTILINE).search(text, head.end())
    return head.end(), tail.start() if tail else len(text)
