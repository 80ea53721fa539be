"""Commands that empty their output directory first (`make demo`'s --out, the miniature's results,
`doctor --work-dir`) empty only one they made: a mistyped path naming a checkout or a model is
refused and left byte for byte as it was."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO
from nemo_topr.output_dir import MARK, OutputDirError, fresh_output_dir


def _tree(root):
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def test_a_new_or_empty_directory_is_made_and_marked(tmp_path):
    made = fresh_output_dir(tmp_path / "a" / "b", "nemo_topr.demo")
    assert made == (tmp_path / "a" / "b").resolve() and _tree(made) == {MARK: b"nemo_topr.demo\n"}
    (tmp_path / "empty").mkdir()
    assert _tree(fresh_output_dir(tmp_path / "empty", "nemo_topr.demo")) == {MARK: b"nemo_topr.demo\n"}


def test_the_commands_own_directory_is_emptied_for_the_rerun(tmp_path):
    out = fresh_output_dir(tmp_path / "out", "nemo_topr.demo")
    (out / "run" / "checkpoints").mkdir(parents=True)
    (out / "run" / "checkpoints" / "model.pt").write_bytes(b"old")
    (out / "summary.json").write_text("{}")
    again = fresh_output_dir(tmp_path / "out", "nemo_topr.demo")
    assert again == out and _tree(out) == {MARK: b"nemo_topr.demo\n"}


@pytest.mark.parametrize("mark", [None, "nemo-topr doctor", "nemo_topr.demo (edited)"])
def test_a_directory_the_command_did_not_make_is_refused_and_kept(tmp_path, mark):
    out = tmp_path / "model"
    (out / "weights").mkdir(parents=True)
    (out / "config.json").write_text('{"hidden_size": 8}')
    (out / "weights" / "model.safetensors").write_bytes(b"\x00" * 64)
    if mark is not None:
        (out / MARK).write_text(mark + "\n")
    before = _tree(out)
    with pytest.raises(OutputDirError) as refused:
        fresh_output_dir(out, "nemo_topr.demo")
    origin = f"was made by {mark}" if mark else f"has no {MARK} file from a nemo-topr command"
    assert str(refused.value) == (f"{out.resolve()} is not empty and {origin}: nemo_topr.demo empties its output "
                                  "directory first, so it leaves this one as it is; choose a new or empty directory "
                                  "(or remove this one yourself)")
    assert _tree(out) == before


def test_a_file_in_the_way_is_refused_and_kept(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputDirError, match="notes.txt exists and is not a directory"):
        fresh_output_dir(tmp_path / "notes.txt", "nemo-topr doctor")
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("command", [["-m", "nemo_topr.demo", "--out"],
                                     ["-m", "nemo_topr.miniature", "--out"],
                                     ["-m", "nemo_topr.miniature.study", "--docs", "", "--out"],
                                     ["-m", "nemo_topr.cli", "doctor", "--device", "cpu", "--work-dir"]],
                         ids=["demo", "miniature", "study", "doctor"])
def test_each_command_refuses_a_directory_it_did_not_make_before_doing_anything(tmp_path, command):
    """The whole command, as a user runs it, with --out naming a Hugging Face model directory:
    a one-line error naming the path, exit status 1, and the model untouched."""
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *command, str(model)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"{model} is not empty and has no {MARK} file" in proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr
    assert _tree(model) == {"config.json": b'{"model_type": "llama"}'}
