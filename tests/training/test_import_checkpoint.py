"""`nemo-topr import`'s `validate(ImportSpec)`: every problem of an import at once, before Megatron, nothing
written (the conversion itself: tests/training/test_checkpoint_route.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tests.conftest import placeholder_hf_model

from nemo_topr.training import import_checkpoint
from nemo_topr.training.import_checkpoint import ImportSpec, validate

LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1,
         "intermediate_size": 16, "vocab_size": 32}
# (HF_DIR, OUT) relative to a folder holding a whole Llama (hf), a GPT-2 (gpt2), a non-empty
# directory (taken), an empty one (empty) and a file (notes.txt)
ROWS = [
    (("hf", "new/out"), []),
    (("hf", "empty"), []),  # an empty directory of the user's is filled
    (("gpt2", "out"), [("model.architecture.unsupported", "HF_DIR")]),
    (("missing", "out"), [("model.no_such_directory", "HF_DIR")]),
    (("hf", "taken"), [("import.out.not_empty", "OUT")]),
    (("hf", "notes.txt"), [("import.out.not_empty", "OUT")]),
    (("hf", "notes.txt/out"), [("import.out.unmakeable", "OUT")]),
    (("gpt2", "notes.txt/deeper/out"),
     [("model.architecture.unsupported", "HF_DIR"), ("import.out.unmakeable", "OUT")]),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("import_spec")
    placeholder_hf_model(root / "hf", LLAMA)
    placeholder_hf_model(root / "gpt2", {"architectures": ["GPT2LMHeadModel"]})
    (root / "taken").mkdir()
    (root / "taken" / "weights.bin").write_text("mine")
    (root / "notes.txt").write_text("mine")
    (root / "empty").mkdir()
    return root


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(path.relative_to(root)): path.read_bytes() if path.is_file() else None for path in root.rglob("*")}


@pytest.mark.parametrize("paths, problems", ROWS, ids=["/".join(paths) for paths, _ in ROWS])
def test_validate_names_every_problem_of_an_import_before_megatron_and_writes_nothing(inputs, paths, problems,
                                                                                      monkeypatch):
    monkeypatch.chdir(inputs)
    before, megatron = _tree(inputs), {name for name in sys.modules if name.startswith("megatron")}
    spec = ImportSpec.of(*paths)
    assert [(problem.key, problem.where) for problem in validate(spec)] == problems
    assert _tree(inputs) == before
    assert {name for name in sys.modules if name.startswith("megatron")} <= megatron


def test_why_unmakeable_says_what_mkdir_would(tmp_path):
    (tmp_path / "file").write_text("")
    assert import_checkpoint.why_unmakeable(tmp_path / "new" / "out") is None
    assert import_checkpoint.why_unmakeable(tmp_path / "file" / "a" / "b") == f"Not a directory: {tmp_path}/file/a/b"
    with pytest.raises(NotADirectoryError) as made:  # the words the run's mkdir would print
        (tmp_path / "file" / "a" / "b").mkdir(parents=True)
    assert f"{made.value.strerror}: {made.value.filename}" == f"Not a directory: {tmp_path}/file/a/b"
