"""`nemo-topr generate`'s `validate(GenerateSpec)`: every problem of a command line at once, before a model or
the prompts' rows are read, nothing written (the sampling itself: tests/evaluation/test_generate_eval.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tests.conftest import placeholder_hf_model

from nemo_topr.evaluation import generate

# argv's changes to `--prompts p.jsonl --task gsm8k --model hf --out out.jsonl --device cpu`, run in a folder
# holding the prompt file p.jsonl and a Hugging Face model hf
ROWS = [
    ({}, []),
    ({"--prompts": "gsm8k-test", "--task": None}, []),
    ({"--num-samples": "0"}, [("--num-samples.below_1", "--num-samples")]),
    ({"--model": "missing"}, [("model.no_such_directory", "--model")]),
    ({"--prompts": "gsm8k-tst"}, [("--prompts.no_such_file", "--prompts")]),
    ({"--task": None}, [("--task.unset_for_prompt_file", "--task")]),
    ({"--out": "out.json"}, [("output.records.not_jsonl", "--out")]),
    ({"--out": "p.jsonl", "--overwrite": ""}, [("output.is_an_input", "p.jsonl")]),
    # --limit 0 is refused by the sampling options and by the prompts: told once
    ({"--model": "missing", "--limit": "0", "--out": "out.json"},
     [("--limit.below_1", "--limit"), ("model.no_such_directory", "--model"), ("output.records.not_jsonl", "--out")]),
]


def argv(changes: dict[str, str | None]) -> list[str]:
    given = {"--prompts": "p.jsonl", "--task": "gsm8k", "--model": "hf", "--out": "out.jsonl", "--device": "cpu",
             **changes}
    return [token for option, value in given.items() if value is not None
            for token in ([option, value] if value else [option])]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("generate_spec")
    (root / "p.jsonl").write_text('{"prompt": "What is 2 + 3?", "reference_answer": "5", "prompt_id": "q0"}\n')
    placeholder_hf_model(root / "hf")
    return root


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(path.relative_to(root)): path.read_bytes() if path.is_file() else None for path in root.rglob("*")}


@pytest.mark.parametrize("changes, problems", ROWS, ids=[str(changes) for changes, _ in ROWS])
def test_validate_names_every_problem_of_a_command_line_before_sampling_and_writes_nothing(inputs, changes,
                                                                                           problems, monkeypatch):
    monkeypatch.chdir(inputs)
    before, megatron = _tree(inputs), {name for name in sys.modules if name.startswith("megatron")}
    spec = generate.GenerateSpec.of(generate.build_parser().parse_args(argv(changes)))
    assert [(problem.key, problem.where) for problem in generate.validate(spec)] == problems
    assert _tree(inputs) == before
    assert {name for name in sys.modules if name.startswith("megatron")} <= megatron
