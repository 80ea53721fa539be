"""`nemo-topr eval`'s `validate(EvalSpec)`: every problem of a command line at once, before a model, a prompt or
a record is read, nothing written (evaluating itself: tests/evaluation/test_generate_eval.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tests.conftest import placeholder_hf_model

from nemo_topr.evaluation import evaluate

# command lines run in a folder holding records (r.jsonl), a result (a.json), a prompt file (p.jsonl) and a
# Hugging Face model (hf)
ROWS = [
    ("--records r.jsonl --out res.json", []),
    ("--plot a.json --out rounds.png", []),
    ("--prompts p.jsonl --task gsm8k --model hf --out res.json", []),
    ("--benchmark gsm8k --model hf --samples-out s.jsonl --out res.json", []),
    ("--records missing.jsonl --out res.json", [("path.missing", "missing.jsonl: path")]),
    ("--records r.jsonl --out r.jsonl --overwrite", [("output.is_an_input", "r.jsonl")]),
    ("--plot a.json --out rounds.txt", [("--out.not_a_plot_format", "--out")]),
    ("--prompts p.jsonl --model hf --out res.json", [("--task.unset_for_prompt_file", "--task")]),
    ("--benchmark gsm8k --model missing --out res.json", [("model.no_such_directory", "--model")]),
    ("--benchmark gsm8k --model hf --samples-out s.json --out res.json",
     [("output.records.not_jsonl", "--samples-out")]),
    ("--records missing.jsonl --limit 0 --out res.md",
     [("--limit.below_1", "--limit"), ("path.missing", "missing.jsonl: path"),
      ("output.same_path", "--out's Markdown")]),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eval_spec")
    for name in ("r.jsonl", "p.jsonl", "a.json"):
        (root / name).write_text("{}\n")
    placeholder_hf_model(root / "hf")
    return root


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(path.relative_to(root)): path.read_bytes() if path.is_file() else None for path in root.rglob("*")}


@pytest.mark.parametrize("argv, problems", ROWS, ids=[argv for argv, _ in ROWS])
def test_validate_names_every_problem_of_a_command_line_before_reading_and_writes_nothing(inputs, argv, problems,
                                                                                          monkeypatch):
    monkeypatch.chdir(inputs)
    before, megatron = _tree(inputs), {name for name in sys.modules if name.startswith("megatron")}
    spec = evaluate.EvalSpec.of(evaluate.build_parser().parse_args(argv.split()))
    assert [(problem.key, problem.where) for problem in evaluate.validate(spec)] == problems
    assert _tree(inputs) == before
    assert {name for name in sys.modules if name.startswith("megatron")} <= megatron
