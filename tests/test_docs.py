"""The documentation stays true: the README is a short front door; every link, anchor and
repository path in README.md, docs/ and bench/README.md exists; every docs/ page cited by code and
configs exists; and the performance figures equal the committed benchmark results (bench/results/).

Which paths are checked. A path is checked when its first component is a tracked top-level entry
of the repository (`nemo_topr/`, `conf/`, `docs/`, `tests/`, `Makefile`, ...). Run-time outputs
(`runs/`, `results/`, `exports/`, which commands create and .gitignore lists), absolute paths
(`/models/...`, `/data/...`), placeholders (`RUN_DIR/...`, `OUT/...`, and a missing path with a
component in capitals such as `conf/SOURCE.yaml`) and upstream files cited as `megatron/core/...`
are not repository paths and are left alone. Globs must match a file; a
`:LINE` or `:LINE-LINE` suffix must be within the file; a `:name` or `::name` suffix must occur in it.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

from tests.conftest import REPO

README = REPO / "README.md"
README_LIMIT = 12_000
RUNTIME_ROOTS = frozenset({"runs", "results", "exports"})
PAGES = [README, *sorted((REPO / "docs").rglob("*.md")), REPO / "bench" / "README.md"]
# Code and configs whose comments, docstrings and help strings cite repository paths. This file is
# left out: its self-tests below cite missing paths on purpose.
CITING_FILES = sorted({*REPO.glob("nemo_topr/**/*.py"), *REPO.glob("bench/**/*.py"), *REPO.glob("tests/**/*.py"),
                       *REPO.glob("conf/*.yaml"), *REPO.glob("slurm/*"), *REPO.glob("launchers/*"),
                       *REPO.glob("scripts/*"), REPO / "Makefile", REPO / "pyproject.toml"} - {Path(__file__)})

FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)
PATH_TOKEN = re.compile(r"^(?P<path>[\w.*?/-]+?)(?P<suffix>:\d+(?:-\d+)?|::?[A-Za-z_]\w*)?$")
# A repository path in prose (outside backticks): a known kind of file under a top-level directory.
PROSE_PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)+[\w.-]+\.(?:md|py|yaml|sh|sbatch|json|png|txt))\b")
CITED_DOCS = re.compile(r"(?<![\w/])docs/[\w./-]*[\w/]")


@functools.cache
def repository_roots() -> frozenset[str]:
    """Top-level names of tracked files (the file system without git: everything but dot-files)."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
        names = {line.split("/", 1)[0] for line in listed.splitlines() if line}
    except (OSError, subprocess.CalledProcessError):
        names = {p.name for p in REPO.iterdir() if not p.name.startswith(".")}
    return frozenset(names - RUNTIME_ROOTS)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: rendered text, lower case, only letters, marks, digits,
    '_', '-' and spaces kept, spaces turned into '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    kept = "".join(c for c in text.lower()
                   if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return kept.replace(" ", "-")


def anchors(text: str) -> list[str]:
    """The anchors of a page's headings, in order; GitHub numbers repeated ones -1, -2, ..."""
    result, seen = [], {}
    for match in HEADING.finditer(FENCE.sub("", text)):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.append(base if count == 0 else f"{base}-{count}")
    return result


def _check_path(token: str) -> str | None:
    """A problem with one repository path (None when fine or not a repository path)."""
    token = token.strip("\"'(),;").rstrip(".:")
    token = token.rsplit("=", 1)[-1]
    match = PATH_TOKEN.match(token)
    if not match or match["path"].split("/", 1)[0] not in repository_roots():
        return None
    path, suffix = match["path"], match["suffix"] or ""
    if any(c in path for c in "*?"):
        return None if any(REPO.glob(path)) else f"{token}: no file matches"
    target = REPO / path
    if not target.exists():
        placeholder = any(re.fullmatch(r"[A-Z][A-Z0-9_]*", part.split(".")[0]) for part in path.split("/"))
        return None if placeholder else f"{token}: no such file or directory"
    if suffix.startswith("::") or (suffix and not suffix[1].isdigit()):
        name = suffix.lstrip(":")
        return None if name in target.read_text() else f"{token}: {name} does not occur in {path}"
    if suffix:
        last = int(suffix[1:].split("-")[-1])
        lines = len(target.read_text().splitlines())
        return None if last <= lines else f"{token}: {path} has only {lines} lines"
    return None


def page_problems(page: Path, text: str) -> list[str]:
    """Every broken link, anchor or repository path of one markdown page (`page` places its
    relative links; `text` is its content)."""
    problems = []
    code = [m.group(0) for m in FENCE.finditer(text)]
    prose = FENCE.sub("", text)
    code += INLINE_CODE.findall(prose)
    prose = INLINE_CODE.sub(" ", prose)
    for target in LINK.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        if not path_part:
            if anchor not in anchors(text):
                problems.append(f"link {target}: no heading with anchor #{anchor} on this page")
            continue
        linked = (page.parent / path_part).resolve()
        if not linked.exists():
            problems.append(f"link {target}: {linked} does not exist")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            problems.append(f"link {target}: no heading with anchor #{anchor} in {linked.name}")
    tokens = [token for span in code for token in span.split()] + PROSE_PATH.findall(prose)
    problems += [p for p in map(_check_path, tokens) if p]
    return problems


# ---------------------------------------------------------------------------------------------
# The checker itself, on pages written to fail


def test_checker_flags_missing_paths_links_lines_and_anchors():
    page = REPO / "docs" / "example.md"
    text = """# Example

See [the objective](objective.md#the-family), [nowhere](objective.md#no-such-section) and
[a missing page](no_such_page.md). Code: `nemo_topr/objective.py:1`, `nemo_topr/objective.py:999999`,
`nemo_topr/no_such_module.py`, `conf/*.yaml`, `conf/*.nothing`, `tests/test_objective.py::test_no_such_test`.

```bash
sbatch slurm/no_such.sbatch --out runs/r1/graded.jsonl hf_model=/models/Llama-3.1-8B-Instruct
```
"""
    problems = page_problems(page, text)
    expected = ("#no-such-section", "no_such_page.md", "objective.py:999999", "no_such_module.py",
                "conf/*.nothing", "test_no_such_test", "slurm/no_such.sbatch")
    assert len(problems) == len(expected), problems
    for part in expected:
        assert sum(part in p for p in problems) == 1, (part, problems)


def test_checker_leaves_run_time_outputs_placeholders_and_upstream_paths_alone():
    text = """# Example

`runs/gsm8k_r1/checkpoints`, `results/r1.json`, `exports/gsm8k_r1/iter_0000100`, `RUN_DIR/config.yaml`,
`/models/Llama-3.1-8B-Instruct`, `megatron/core/tensor_parallel/cross_entropy.py:25`, `OUT/round_r/`,
`conf/SOURCE.yaml`,
[arXiv](https://arxiv.org/abs/2503.14286), `nemo_topr/objective.py`, [top](#example).

```
nemo-topr export --ckpt runs/gsm8k_r1 --hf-out exports/gsm8k_r1 dataset.train_path=/data/scored.jsonl
```
"""
    assert page_problems(REPO / "docs" / "example.md", text) == []


def test_checker_finds_a_fenced_path_and_a_prose_path():
    text = "# T\n\nProse cites conf/no_such_preset.yaml.\n\n```bash\nsbatch slurm/no_such.sbatch\n```\n"
    problems = page_problems(REPO / "docs" / "example.md", text)
    assert sorted(p.split(":")[0] for p in problems) == ["conf/no_such_preset.yaml", "slurm/no_such.sbatch"]


@pytest.mark.parametrize(("heading", "expected"), [
    ("Pre-flight check: `nemo-topr plan`", "pre-flight-check-nemo-topr-plan"),
    ("The paper's claims, one by one", "the-papers-claims-one-by-one"),
    ("μ and ρ", "μ-and-ρ"),
    ("FP8: current scaling by default, delayed scaling as a switch",
     "fp8-current-scaling-by-default-delayed-scaling-as-a-switch"),
    ("Performance (`make bench`)", "performance-make-bench"),
])
def test_slug_matches_github_anchors(heading, expected):
    assert slug(heading) == expected


def test_repeated_headings_get_numbered_anchors():
    assert list(anchors("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n")) == ["a", "notes", "notes-1"]


# ---------------------------------------------------------------------------------------------
# The real pages, code and configs


def test_readme_is_a_short_front_door():
    text = README.read_text()
    assert len(text) <= README_LIMIT, f"README.md has {len(text)} characters; the limit is {README_LIMIT}"
    assert "\nmake test\n" in text  # the test command CI runs (.ci/run), exactly


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_anchors_and_paths_of_a_page_exist(page):
    assert page_problems(page, page.read_text()) == []


def test_paths_cited_by_code_and_configs_exist():
    """Every docs/ page or directory, and every repository file named with its extension, that a
    comment, docstring or help string of the code or configs cites."""
    missing = []
    for path in CITING_FILES:
        if path.is_file():
            text = path.read_text(errors="replace")
            missing += [f"{path.relative_to(REPO)}: {cited}" for cited in CITED_DOCS.findall(text)
                        if not (REPO / cited.rstrip("/")).exists()]
            missing += [f"{path.relative_to(REPO)}: {problem}" for problem in map(_check_path, PROSE_PATH.findall(text))
                        if problem]
    assert missing == []


# ---------------------------------------------------------------------------------------------
# Performance figures = committed benchmark results


def _tables(text: str) -> list[list[list[str]]]:
    """Markdown tables as lists of rows of cells (header and separator dropped)."""
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            rows.append([cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
        elif rows:
            tables.append(rows[2:])
            rows = []
    return tables


def _generated(text: str) -> str:
    from bench.docs_figures import BEGIN, END

    return text[text.index(BEGIN):text.index(END) + len(END)]


def test_performance_page_holds_the_figures_generated_from_bench_results():
    from bench.docs_figures import figures_block

    page = (REPO / "docs" / "performance.md").read_text()
    assert _generated(page) == figures_block(), "run `python -m bench.docs_figures` and commit docs/performance.md"


def test_performance_page_agrees_with_results_md():
    """Parsed independently of the generator: every RESULTS.md headline row is on the page with its
    value and status; a step-cost row appears as the direct measurement RESULTS.md reports in
    its spread column (no status) and as the modelled value RESULTS.md judges."""
    results = {row[1]: row for row in _tables((REPO / "bench" / "results" / "RESULTS.md").read_text())[0]}
    page = {row[1]: row for row in _tables(_generated((REPO / "docs" / "performance.md").read_text()))[0]}
    for figure, (section, _, value, spread, target, status, _notes) in results.items():
        if section == "1 step cost":
            model = figure.removeprefix("TOPR / SFT step time, ")
            direct = page[f"TOPR / SFT step time measured directly, {model}; A/A control = SFT / SFT"]
            assert direct[2].split()[0] == re.search(r"direct (\S+)", spread)[1]
            assert not re.match(r"(?i)met|missed", direct[5])
            modelled = page[f"TOPR / SFT step time modelled as 1 + (TOPR loss − SFT loss) / SFT step, {model}"]
            assert (modelled[2], modelled[4], modelled[5]) == (value, target, status)
        else:
            assert page[figure][2:] == [value, spread, target, status], figure
    assert len(page) == len(results) + sum(r[0] == "1 step cost" for r in results.values())


def test_every_gpu_run_committed_is_on_the_performance_page_as_it_came():
    """Read independently of the generator: each `bench.gpu_verbs` table on the page has the
    committed JSON's checks with their status and seconds, and each GPU bench's TOPR / SFT ratio
    is on the page at the JSON's median."""
    results = REPO / "bench" / "results"
    tables = _tables(_generated((REPO / "docs" / "performance.md").read_text()))
    verbs = sorted(results.glob("gpu_verbs_*.json"))
    assert verbs, "no GPU verbs run committed"
    for path in verbs:
        checks = [(c["name"], c["status"], str(c["seconds"])) for c in json.loads(path.read_text())["checks"]]
        assert checks in [[tuple(row[:3]) for row in table] for table in tables], path.name
    ratios = {(row[1].split(", ")[1], row[2]) for table in tables for row in table
              if len(row) > 2 and row[1].startswith("TOPR / SFT step time, ")}
    for path in results.glob("gpu_bench_*.json"):
        for run in json.loads(path.read_text())["bench_gpu"]["runs"]:
            figure = (run["precision"], f"{run['topr_over_sft_time']['median']:.3f}")
            assert figure in ratios, (path.name, figure)


def test_the_two_figures_issue_14_found_wrong():
    page = {row[1]: row for row in _tables(_generated((REPO / "docs" / "performance.md").read_text()))[0]}
    math500 = page["padding share packed, math500_boxed @ 4096 (tiny / Llama-3 model)"]
    assert (math500[2], math500[5]) == ("2.91 % / 5.93 %", "MISSED")
    direct = [row for figure, row in page.items() if "measured directly" in figure]
    assert [row[2].split()[0] for row in direct] == ["1.034", "1.003", "1.063"]  # bench/results/step.json


def test_no_page_states_a_benchmark_status_outside_the_generated_block():
    for page in PAGES:
        text = page.read_text()
        if page.name == "performance.md":
            text = text.replace(_generated(text), "")
        cells = [cell.strip() for line in FENCE.sub("", text).splitlines() if line.startswith("|")
                 for cell in line.split("|")]
        claims = [cell for cell in cells if re.match(r"(?i)(met|missed)\b", cell)]
        assert claims == [] and "MISSED" not in text, (page.name, claims)


def test_results_md_is_the_rendering_of_the_committed_jsons(tmp_path):
    from bench.docs_figures import load_result
    from bench.report import headline, write_markdown

    directory = REPO / "bench" / "results"
    loaded = {name: load_result(directory, name)
              for name in ("environment", "step", "logprob", "packing", "pipeline", "gpu", "headline")}
    sections = {k: v for k, v in loaded.items() if k not in ("environment", "headline")}
    assert headline(sections) == loaded["headline"]
    rendered = write_markdown(loaded, tmp_path / "RESULTS.md")
    assert rendered == (directory / "RESULTS.md").read_text()


# ---------------------------------------------------------------------------------------------
# Configs quoted in the docs are the files

QUOTED_CONFIG = re.compile(r"`(conf/[\w-]+\.ya?ml)` holds:\s*\n\s*```ya?ml\n(.*?)^```", re.M | re.S)


def quoted_config_problems(text: str) -> list[str]:
    """Each "`conf/X.yaml` holds:" listing whose YAML differs from the file (comments aside)."""
    import yaml

    problems = []
    for path, listing in QUOTED_CONFIG.findall(text):
        quoted, actual = yaml.safe_load(listing), yaml.safe_load((REPO / path).read_text())
        if quoted != actual:
            keys = sorted({*quoted, *actual}, key=str)
            changed = [key for key in keys if quoted.get(key) != actual.get(key)]
            problems.append(f"{path}: the listing differs from the file in {changed}")
    return problems


def test_the_config_checker_finds_a_drifted_listing():
    text = "`conf/iterate_tiny_cpu.yaml` holds:\n\n```yaml\nbase_model: ???\nrounds: 2\n```\n"
    problems = quoted_config_problems(text)
    assert len(problems) == 1 and problems[0].startswith("conf/iterate_tiny_cpu.yaml: the listing differs")
    assert "'device'" in problems[0] and "'rounds'" not in problems[0]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_configs_quoted_in_a_page_equal_the_files(page):
    assert quoted_config_problems(page.read_text()) == []


def test_verifier_iterate_quotes_the_iterate_config():
    assert QUOTED_CONFIG.search((REPO / "docs" / "verifier_iterate.md").read_text())


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", page.read_text(encoding="utf-8"), re.M | re.S)


def test_the_objective_pages_example_runs_as_written():
    import torch

    token_logprobs = torch.full((3, 4), -0.5, dtype=torch.float64, requires_grad=True)
    inputs = {"token_logprobs": token_logprobs, "loss_mask": torch.tensor([[0, 1, 1, 1]] * 3),
              "behavior_logprobs": torch.tensor([-1.0, -2.0, -1.2], dtype=torch.float64),
              "rewards": torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64)}
    (block,) = _python_blocks(REPO / "docs" / "objective.md")
    exec(block, inputs)  # noqa: S102 - the page's own code
    assert torch.isfinite(inputs["loss"]) and token_logprobs.grad is not None
    metrics = inputs["metrics"]
    assert metrics["num_sequences"].item() == 3 and 0 < float(metrics["effective_positive_share"]) < 1


def test_the_graders_example_gives_what_its_comments_say():
    (block,) = _python_blocks(REPO / "docs" / "generation_evaluation.md")
    namespace: dict = {}
    exec(block.splitlines()[0], namespace)  # noqa: S102 - the import line
    calls = [line.rsplit("  # ", 1) for line in block.splitlines()[1:] if "  # " in line]
    assert len(calls) == 4
    for call, expected in calls:
        assert eval(call, namespace) == eval(expected), call  # noqa: S307
