"""A fresh clone stands alone: nothing the project runs refers to a path outside its repository."""

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

SCANNED = ("nemo_topr", "tests", "bench", "conf", "slurm", "launchers", "scripts", "Makefile")
NOT_SCANNED = (
    REPO / "bench" / "results",  # recorded outputs of past runs (tracebacks hold that machine's paths)
    Path(__file__).resolve(),  # spells the patterns below
)
# a sibling `shared/` folder, the development machine's absolute paths, a step above the root
OUTSIDE = re.compile(r"\.\./shared|\bshared/data\b|(?<![\w.])/work/|\b(?:REPO|ROOT|REPO_ROOT)\.parent\b")
PARENTS_INDEX = re.compile(r"__file__\)(?:\.resolve\(\))?\.parents\[(\d+)\]")
PARENT_CHAIN = re.compile(r"__file__\)(?:\.resolve\(\))?((?:\.parent)+)\b")


def outside_references(text: str, relative: Path) -> list[str]:
    """Lines of a file at `relative` (to the root) that name a path outside the repository.

    `Path(__file__).parents[n]` of a file k folders deep is the root for n = k - 1 and above the
    root beyond; `.parent` repeated m times is `parents[m - 1]`."""
    depth = len(relative.parts)
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        ups = [int(n) for n in PARENTS_INDEX.findall(line)]
        ups += [chain.count(".parent") - 1 for chain in PARENT_CHAIN.findall(line)]
        if OUTSIDE.search(line) or any(up >= depth for up in ups):
            found.append(f"{relative}:{number}: {line.strip()}")
    return found


def _scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        root = REPO / name
        candidates = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        files += [p for p in candidates if "__pycache__" not in p.parts
                  and not any(p.resolve() == skip or skip in p.resolve().parents for skip in NOT_SCANNED)]
    return files


def test_nothing_refers_to_a_path_outside_the_repository():
    files = _scanned_files()
    assert len(files) > 100 and REPO / "nemo_topr" / "data" / "prompts.py" in files
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary fixtures
        found += outside_references(text, path.relative_to(REPO))
    assert not found, "\n".join(found)


@pytest.mark.parametrize("line, relative, escapes", [
    ('ROOT = Path(__file__).resolve().parents[2] / "conf"', "nemo_topr/training/config.py", False),
    ('Path(__file__).resolve().parents[3] / "shared" / "data"', "nemo_topr/data/prompts.py", True),
    ("REPO = Path(__file__).resolve().parents[1]", "tests/conftest.py", False),
    ("Path(__file__).parent.parent.parent", "tests/conftest.py", True),
    ("Path(__file__).parent.parent", "tests/conftest.py", False),
    ('DATA = REPO.parent / "shared" / "data"', "tests/conftest.py", True),
    ("--data ../shared/data/gsm8k_train.jsonl", "slurm/task.sh", True),
    ("cd /work/main && make", "Makefile", True),
    ("see tests/workers/hf_roundtrip.py", "tests/test_docs.py", False),
])
def test_the_scan_finds_references_outside(line, relative, escapes):
    assert bool(outside_references(line, Path(relative))) == escapes
