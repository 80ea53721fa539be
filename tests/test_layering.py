"""The layering of nemo_topr/ (docs/architecture.md), read from the source's imports.

Every ``import`` and ``from ... import`` anywhere in a module counts, inside functions and under
``if TYPE_CHECKING`` included, and so does ``importlib.import_module("nemo_topr.x")`` (or
``__import__``) with a literal name. ``from pkg import name`` imports the submodule ``pkg.name``
when there is one, else ``pkg``; ``import a.b.c`` imports ``a.b.c`` (not its parent packages).
The package is parsed, never imported: the test is fast and holds on a machine without Megatron.
"""

from __future__ import annotations

import ast
import functools
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

PACKAGE = "nemo_topr"
# Bottom to top. A module belongs to the layer with an entry equal to its dotted name or a parent
# package of it; the package's own name stands for its __init__ only. A layer may import from its
# own layer and the layers below it, never from a layer above.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("nemo_topr", "nemo_topr.errors", "nemo_topr.utils")),
    ("domain", ("nemo_topr.objective", "nemo_topr.grading")),
    ("model", ("nemo_topr.model",)),
    ("data", ("nemo_topr.data",)),
    ("training", ("nemo_topr.training",)),
    ("evaluation", ("nemo_topr.evaluation",)),
    ("cluster", ("nemo_topr.cluster",)),
    ("programs", ("nemo_topr.iterate", "nemo_topr.doctor", "nemo_topr.doctor_parity", "nemo_topr.doctor_attention",
                  "nemo_topr.demo", "nemo_topr.miniature")),
    ("cli", ("nemo_topr.cli",)),
)
LINE_LIMIT = 500
LONG_ALLOWED = frozenset({"nemo_topr.model.cpu_runtime"})  # a cohesive ledger of upstream patches


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    path: str  # the importer's file, relative to the scanned root
    line: int
    imported: str  # dotted module name (the submodule a `from pkg import name` names, where there is one)

    def __str__(self) -> str:
        return f"{self.path}:{self.line} → {self.imported}"


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of root/package (a package is its __init__)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _literal_import(call: ast.Call) -> str | None:
    """The module named by ``importlib.import_module("x")`` or ``__import__("x")``, when a literal."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
    if name in ("import_module", "__import__") and call.args and isinstance(call.args[0], ast.Constant) \
            and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def imports_of(module: str, path: Path, root: Path, package: str, modules: dict[str, Path]) -> list[Import]:
    """The imports of `package` made by one module, each resolved to a module name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    own_package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    relative = str(path.relative_to(root))
    found = []

    def add(name: str, line: int) -> None:
        if name == package or name.startswith(package + "."):
            found.append(Import(module, relative, line, name))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # `from . import x` in a/b/c.py is from a.b; `from ..d import x`, from a.d
                parts = own_package.split(".")
                source = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                add(submodule if submodule in modules else source, node.lineno)
        elif isinstance(node, ast.Call) and (name := _literal_import(node)):
            add(name, node.lineno)
    return found


def import_graph(root: Path, package: str) -> tuple[dict[str, Path], list[Import]]:
    """The package's modules and every import among them, once per line, in file and line order."""
    modules = module_files(root, package)
    imports = {found for module, path in modules.items() for found in imports_of(module, path, root, package, modules)}
    return modules, sorted(imports, key=lambda i: (i.path, i.line, i.imported))


def layers_of(module: str, layers=LAYERS, package: str = PACKAGE) -> list[str]:
    """The layers whose entries hold `module` (exactly one when the table is right)."""
    def holds(entry: str) -> bool:
        return module == entry or (entry != package and module.startswith(entry + "."))
    return [name for name, entries in layers if any(holds(entry) for entry in entries)]


def misplaced_modules(modules, layers=LAYERS, package: str = PACKAGE) -> list[str]:
    """Each module in no layer or in more than one, with the layers it is in."""
    problems = []
    for module in modules:
        placed = layers_of(module, layers, package)
        if len(placed) != 1:
            problems.append(f"{module}: in {len(placed)} layers {placed}; place it in LAYERS (tests/test_layering.py)")
    return problems


def unknown_imports(modules, imports: list[Import]) -> list[str]:
    """Imports of a name in the package that is no module of it (a module that moved or never was)."""
    return [f"{found}: no such module" for found in imports if found.imported not in modules]


def upward_imports(imports: list[Import], layers=LAYERS, package: str = PACKAGE) -> list[str]:
    """Each import from a lower layer of a module in a higher one: ``file:line → module (low → high)``."""
    rank = {name: index for index, (name, _) in enumerate(layers)}
    problems = []
    for found in imports:
        low, high = layers_of(found.importer, layers, package), layers_of(found.imported, layers, package)
        if len(low) == 1 and len(high) == 1 and rank[low[0]] < rank[high[0]]:
            problems.append(f"{found} ({low[0]} → {high[0]})")
    return problems


def import_cycles(imports: list[Import]) -> list[list[str]]:
    """The modules of each import cycle, sorted: the strongly connected components of the graph
    with more than one module, and any module that imports itself (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for found in imports:
        graph.setdefault(found.importer, set()).add(found.imported)
        graph.setdefault(found.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(node: str) -> None:  # recursion depth is bounded by the number of modules
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def long_modules(modules: dict[str, Path], limit: int = LINE_LIMIT, allowed=LONG_ALLOWED) -> list[str]:
    """Each module over `limit` lines that `allowed` does not name."""
    lengths = {module: len(path.read_text(encoding="utf-8").splitlines()) for module, path in modules.items()}
    return [f"{module}: {lines} lines" for module, lines in lengths.items() if lines > limit and module not in allowed]


# ---------------------------------------------------------------------------------------------
# The checker, on a small package written to fail

SMALL_LAYERS = (("base", ("pkg", "pkg.util")), ("core", ("pkg.core",)), ("app", ("pkg.app",)))


def _write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in {"pkg/__init__.py": "", "pkg/core/__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


CLEAN = {
    "pkg/util.py": "import os\n",
    "pkg/core/model.py": "from pkg import util\nfrom pkg.util import os\n",
    "pkg/core/step.py": "from . import model\nfrom .model import util\n",
    "pkg/app.py": """\
        import importlib
        import pkg.core.step
        from pkg.core import model as m

        def main():
            return importlib.import_module("pkg.core.step")
        """,
}


def test_a_clean_package_passes(tmp_path):
    modules, imports = import_graph(_write_package(tmp_path, CLEAN), "pkg")
    assert sorted(modules) == ["pkg", "pkg.app", "pkg.core", "pkg.core.model", "pkg.core.step", "pkg.util"]
    # `from pkg import util` and `from . import model` are imports of the submodules, `from pkg.util
    # import os` one of pkg.util; the literal import_module inside a function counts
    assert [(i.importer, i.line, i.imported) for i in imports] == [
        ("pkg.app", 2, "pkg.core.step"), ("pkg.app", 3, "pkg.core.model"), ("pkg.app", 6, "pkg.core.step"),
        ("pkg.core.model", 1, "pkg.util"), ("pkg.core.model", 2, "pkg.util"),
        ("pkg.core.step", 1, "pkg.core.model"), ("pkg.core.step", 2, "pkg.core.model")]
    assert misplaced_modules(modules, SMALL_LAYERS, "pkg") == []
    assert unknown_imports(modules, imports) == []
    assert upward_imports(imports, SMALL_LAYERS, "pkg") == []
    assert import_cycles(imports) == []
    assert long_modules(modules, limit=5) == ["pkg.app: 6 lines"]


def test_an_upward_import_is_reported_with_its_file_and_line(tmp_path):
    files = {**CLEAN, "pkg/util.py": "import os\n\n\ndef late():\n    from pkg.core import step\n",
             "pkg/core/model.py": "import importlib\nMAIN = importlib.import_module('pkg.app')\n"}
    _, imports = import_graph(_write_package(tmp_path, files), "pkg")
    assert upward_imports(imports, SMALL_LAYERS, "pkg") == [
        "pkg/core/model.py:2 → pkg.app (core → app)", "pkg/util.py:5 → pkg.core.step (base → core)"]


def test_a_cycle_is_reported_with_its_modules(tmp_path):
    files = {**CLEAN, "pkg/core/model.py": "def f():\n    from pkg.core.step import g\n",
             "pkg/util.py": "import pkg.util\n"}
    _, imports = import_graph(_write_package(tmp_path, files), "pkg")
    assert import_cycles(imports) == [["pkg.core.model", "pkg.core.step"], ["pkg.util"]]


def test_a_module_in_no_layer_or_two_is_named(tmp_path):
    modules, imports = import_graph(_write_package(tmp_path, {**CLEAN, "pkg/extra.py": "from pkg.gone import x\n"}),
                                    "pkg")
    layers = (*SMALL_LAYERS, ("top", ("pkg.app", "pkg.core.step")))
    assert [p.split(":")[0] for p in misplaced_modules(modules, layers, "pkg")] == [
        "pkg.app", "pkg.core.step", "pkg.extra"]
    assert unknown_imports(modules, imports) == ["pkg/extra.py:1 → pkg.gone: no such module"]


# ---------------------------------------------------------------------------------------------
# nemo_topr itself

@functools.cache
def nemo_topr_graph() -> tuple[dict[str, Path], list[Import]]:
    return import_graph(REPO, PACKAGE)


def _assert_none(problems: list) -> None:
    assert not problems, f"{len(problems)}:\n" + "\n".join(map(str, problems))


def test_every_module_is_in_exactly_one_layer():
    modules, _ = nemo_topr_graph()
    assert len(modules) > 50 and "nemo_topr.cli" in modules
    _assert_none(misplaced_modules(modules))


def test_every_import_of_the_package_names_one_of_its_modules():
    _assert_none(unknown_imports(*nemo_topr_graph()))


def test_no_import_runs_up_the_layers():
    _assert_none(upward_imports(nemo_topr_graph()[1]))


def test_no_import_cycles():
    _assert_none([" ↔ ".join(cycle) for cycle in import_cycles(nemo_topr_graph()[1])])


def test_no_module_is_over_500_lines():
    _assert_none(long_modules(nemo_topr_graph()[0]))
