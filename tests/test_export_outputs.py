"""`nemo-topr export` never replaces what it did not make: a non-empty --hf-out is refused unless
--overwrite names an earlier export, and a model appears under its name only once written completely. The checkpoint
is a file-level fake (what `nemo_topr.model_source` inspects); Bridge's writer is replaced by
one that writes a marker file, so no Megatron import is needed (the real export is covered by
tests/test_checkpoint_route.py and tests/test_training_e2e.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import torch_dist_save
from safetensors import SafetensorError

from nemo_topr.training import export


def _fake_checkpoint(root: Path) -> Path:
    torch_dist_save(root / "iter_0000001")
    (root / "latest_checkpointed_iteration.txt").write_text("1")
    for name in ("metadata.json", "run_config.yaml"):
        (root / "iter_0000001" / name).write_text("{}\n" if name != "run_config.yaml" else "model: {}\n")
    (root / "hf_artifacts").mkdir()
    (root / "hf_artifacts" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                                  "hidden_size": 64}))
    (root / "hf_artifacts" / "tokenizer.json").write_text("{}")
    return root


class _FakeBridge:
    def __init__(self, fail: bool = False, error: BaseException | None = None):
        self.error = error or (RuntimeError("killed half-way") if fail else None)

    def export_ckpt(self, checkpoint: str, out: str, show_progress: bool) -> None:
        Path(out).mkdir(parents=True)
        (Path(out) / "model.safetensors").write_text(f"exported from {checkpoint}")
        if self.error:
            raise self.error


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr("nemo_topr.model.config_only_bridge", lambda hf_dir: _FakeBridge())
    return _fake_checkpoint(tmp_path / "ckpt")


def test_a_non_empty_hf_out_is_refused_and_left_as_it_was(checkpoint, tmp_path, capsys):
    base = tmp_path / "Llama-3.1-8B"
    base.mkdir()
    (base / "model.safetensors").write_text("the base weights")
    with pytest.raises(SystemExit, match=rf"nemo-topr export: {base}: exists and is not empty; .*--overwrite"):
        export.main(["--ckpt", str(checkpoint), "--hf-out", str(base), "--device", "cpu"])
    assert [p.name for p in base.iterdir()] == ["model.safetensors"]
    assert (base / "model.safetensors").read_text() == "the base weights"


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("hf_out, flags, where", [
    ("ckpt", [], "is {ckpt}"),  # --ckpt X --hf-out X: the checkpoint itself
    (".", [], "holds {ckpt}"),  # a directory above it
    ("ckpt/hf_artifacts/model", [], "is inside {ckpt}"),
    ("ckpt", ["--all-iterations"], "is inside {ckpt}"),  # ckpt/iter_0000001: the Megatron iteration itself
], ids=["itself", "above", "inside", "all-iterations"])
def test_the_checkpoint_being_exported_is_refused_as_its_output_even_with_overwrite(checkpoint, tmp_path, hf_out,
                                                                                    flags, where):
    """With --overwrite, export used to delete --hf-out before moving the model there: naming the
    checkpoint (or a directory holding it) deleted the weights being exported."""
    before = _tree(tmp_path)
    out = tmp_path / hf_out
    with pytest.raises(SystemExit, match=rf"^nemo-topr export: {out}.*: {where.format(ckpt=checkpoint)}.*, part of the "
                                         rf"checkpoint being exported; writing there would replace or corrupt it: "
                                         rf"choose an --hf-out outside {checkpoint}$"):
        export.main(["--ckpt", str(checkpoint), "--hf-out", str(out), *flags, "--device", "cpu", "--overwrite"])
    assert _tree(tmp_path) == before


def test_an_export_into_the_runs_own_directory_beside_its_checkpoints_is_accepted(tmp_path, monkeypatch):
    monkeypatch.setattr("nemo_topr.model.config_only_bridge", lambda hf_dir: _FakeBridge())
    run = tmp_path / "run"
    _fake_checkpoint(run / "checkpoints")
    (run / "config.yaml").write_text("model: {}\n")
    assert export.main(["--ckpt", str(run), "--hf-out", str(run / "hf"), "--device", "cpu"]) == 0
    assert (run / "hf" / "model.safetensors").read_text() == f"exported from {run / 'checkpoints' / 'iter_0000001'}"


def test_overwrite_replaces_an_earlier_export_and_an_empty_directory_is_filled(checkpoint, tmp_path):
    earlier, empty = tmp_path / "earlier", tmp_path / "empty"
    assert export.main(["--ckpt", str(checkpoint), "--hf-out", str(earlier), "--device", "cpu"]) == 0
    (earlier / "stale.bin").write_text("left by the earlier export")
    empty.mkdir()
    assert export.main(["--ckpt", str(checkpoint), "--hf-out", str(earlier), "--device", "cpu", "--overwrite"]) == 0
    assert export.main(["--ckpt", str(checkpoint), "--hf-out", str(empty), "--device", "cpu"]) == 0
    for out in (earlier, empty):
        assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "nemo_topr_export.json"]
        assert (out / "model.safetensors").read_text() == f"exported from {checkpoint / 'iter_0000001'}"
    assert not list(tmp_path.glob(".*.partial"))


def test_the_current_directory_or_a_symlink_to_an_empty_one_is_filled(checkpoint, tmp_path, monkeypatch):
    """`--hf-out .` ended in a traceback (`PosixPath('.') has an empty name`); a symlink to an empty
    directory was exported in full, then `rmtree` refused the link, leaving `.link.partial` behind."""
    shell, target, link = tmp_path / "shell", tmp_path / "target", tmp_path / "link"
    shell.mkdir()
    target.mkdir()
    link.symlink_to(target)
    monkeypatch.chdir(shell)
    assert export.main(["--ckpt", str(checkpoint), "--hf-out", ".", "--device", "cpu"]) == 0
    assert export.main(["--ckpt", str(checkpoint), "--hf-out", str(link), "--device", "cpu"]) == 0
    for out in (Path.cwd(), shell, link, target):
        assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "nemo_topr_export.json"]
    assert Path.cwd().samefile(shell) and link.is_symlink()  # the same directories, not replaced ones
    assert not list(tmp_path.glob(".*.partial"))
    assert export.main(["--ckpt", str(checkpoint), "--hf-out", str(link), "--device", "cpu", "--overwrite"]) == 0
    assert link.is_symlink() and (target / "nemo_topr_export.json").is_file()


@pytest.mark.parametrize("flags", [[], ["--all-iterations"]], ids=["one", "iterations"])
def test_overwrite_never_replaces_what_export_did_not_make(checkpoint, tmp_path, flags):
    """--overwrite used to delete any non-empty --hf-out: a typo naming the base model (or a
    file) replaced it with the export."""
    base = tmp_path / "Llama-3.1-8B"
    target = base / "iter_0000001" if flags else base
    target.mkdir(parents=True)
    (target / "model.safetensors").write_text("the base weights")
    before = _tree(tmp_path)
    with pytest.raises(SystemExit, match=rf"^nemo-topr export: {target}: exists and holds no nemo_topr_export.json, "
                                         r"so it is no earlier export; --overwrite replaces only those: remove it "
                                         r"yourself or choose another --hf-out$"):
        export.main(["--ckpt", str(checkpoint), "--hf-out", str(base), *flags, "--device", "cpu", "--overwrite"])
    assert _tree(tmp_path) == before
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with pytest.raises(SystemExit, match=rf"^nemo-topr export: {a_file}: exists and holds no nemo_topr_export.json"):
        export.main(["--ckpt", str(checkpoint), "--hf-out", str(a_file), "--device", "cpu", "--overwrite"])
    assert a_file.read_text() == "mine"


@pytest.mark.parametrize("flags, hf_out", [(["--iteration", "1"], "earlier"), ([], "earlier/model")],
                         ids=["iterations", "one"])
def test_an_export_inside_an_earlier_export_is_refused(checkpoint, tmp_path, flags, hf_out):
    """`--iteration 1 --hf-out EARLIER`, EARLIER a single export (an HF model directory), wrote
    EARLIER/iter_0000001 into that model's directory without a word."""
    earlier = tmp_path / "earlier"
    assert export.main(["--ckpt", str(checkpoint), "--hf-out", str(earlier), "--device", "cpu"]) == 0
    before = _tree(tmp_path)
    out = earlier / "iter_0000001" if flags else tmp_path / hf_out
    with pytest.raises(SystemExit, match=rf"^nemo-topr export: {out}: inside {earlier}, an earlier export \(it holds "
                                         r"nemo_topr_export.json\): a model written there would nest in that model's "
                                         r"directory; choose an --hf-out outside it \(--iteration and "
                                         r"--all-iterations write HF_OUT/iter_NNNNNNN\)$"):
        export.main(["--ckpt", str(checkpoint), "--hf-out", str(tmp_path / hf_out), *flags, "--device", "cpu"])
    assert _tree(tmp_path) == before


def test_an_interrupted_export_leaves_nothing_under_the_target_name(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr("nemo_topr.model.config_only_bridge", lambda hf_dir: _FakeBridge(fail=True))
    with pytest.raises(RuntimeError, match="killed half-way"):
        export.main(["--ckpt", str(checkpoint), "--hf-out", str(tmp_path / "model"), "--device", "cpu"])
    assert not (tmp_path / "model").exists()
    monkeypatch.setattr("nemo_topr.model.config_only_bridge", lambda hf_dir: _FakeBridge())
    assert export.main(["--ckpt", str(checkpoint), "--hf-out", str(tmp_path / "model"), "--device", "cpu"]) == 0
    assert not (tmp_path / ".model.partial").exists()


@pytest.mark.parametrize("error", [
    # what safetensors raised writing a shard to a full tmpfs (by hand, 400 KB): not an OSError
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
    OSError(28, "No space left on device"),
], ids=["safetensors", "oserror"])
def test_an_export_that_cannot_be_written_is_removed_and_named_in_one_line(checkpoint, tmp_path, monkeypatch, error):
    monkeypatch.setattr("nemo_topr.model.config_only_bridge", lambda hf_dir: _FakeBridge(error=error))
    with pytest.raises(SystemExit, match=rf"^nemo-topr export: writing {tmp_path / 'model'}: .*No space left on "
                                         r"device.* \(the partial export is removed\)$"):
        export.main(["--ckpt", str(checkpoint), "--hf-out", str(tmp_path / "model"), "--device", "cpu"])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ckpt"]  # no model, no partial directory


def test_bad_inputs_are_refused_before_megatron_is_imported(tmp_path):
    """A refusal costs no Megatron start-up (10-20 s): the inputs are checked first."""
    import subprocess
    import sys

    from conftest import REPO

    ckpt = _fake_checkpoint(tmp_path / "ckpt")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "model.safetensors").write_text("the base weights")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for args, message in ((["--ckpt", str(tmp_path / "missing"), "--hf-out", str(tmp_path / "out")], str(tmp_path / "missing")),
                          (["--ckpt", str(ckpt), "--hf-out", str(taken)], f"{taken}: exists and is not empty"),
                          (["--ckpt", str(ckpt), "--hf-out", str(tmp_path / "out"), "--iteration", "7"], "7"),
                          # refused after Megatron's ~14 s start-up, when written ("[Errno 20] Not a directory")
                          (["--ckpt", str(ckpt), "--hf-out", str(a_file / "sub")],
                           f"{a_file / 'sub'}: {a_file} is not a directory, so nothing can be written under it: "
                           "choose another --hf-out")):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "nemo_topr.cli", "export", *args, "--device", "cpu"],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
        assert proc.returncode == 1 and lines[-1].startswith("nemo-topr export: ") and message in lines[-1], lines
        assert "| megatron" not in proc.stderr  # -X importtime lists every module imported
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("named, flags", [
    ("run@2", ["--iteration", "1"]),
    ("run/checkpoints/iter_0000002", ["--iteration", "1"]),
    ("run/checkpoints/iter_0000002", ["--all-iterations"]),
], ids=["run-at-iteration", "iteration-directory", "all-iterations"])
def test_an_iteration_named_twice_is_refused_not_one_of_the_two_dropped(tmp_path, monkeypatch, named, flags):
    """`--ckpt RUN@2 --iteration 1` exported iteration 1 without a word, and an iter_* directory
    with --all-iterations exported every iteration."""
    monkeypatch.setattr("nemo_topr.model.config_only_bridge", lambda hf_dir: _FakeBridge())
    run = tmp_path / "run"
    checkpoints = _fake_checkpoint(run / "checkpoints")
    (checkpoints / "iter_0000002").mkdir()
    for made in (checkpoints / "iter_0000001").iterdir():
        (checkpoints / "iter_0000002" / made.name).write_bytes(made.read_bytes())
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("2")
    (run / "config.yaml").write_text("run_dir: run\n")
    monkeypatch.chdir(tmp_path)
    whole = "run" if "@" in named else str(checkpoints)
    with pytest.raises(SystemExit, match=rf"^nemo-topr export: --ckpt {named} names one iteration and {flags[0]} "
                                         rf"chooses the iterations too: give --ckpt {whole} with {flags[0]}, or drop "
                                         rf"{flags[0]}$"):
        export.main(["--ckpt", named, "--hf-out", "hf", *flags, "--device", "cpu"])
    assert not (tmp_path / "hf").exists()
    assert export.main(["--ckpt", "run", "--hf-out", "hf", "--iteration", "1", "--device", "cpu"]) == 0
    assert (tmp_path / "hf/iter_0000001/model.safetensors").read_text() == f"exported from {checkpoints}/iter_0000001"
