"""`nemo-topr export` never replaces what it did not make: a non-empty --hf-out is refused unless
--overwrite names an earlier export, and a model appears under its name only once written completely. The checkpoint
is a file-level fake (what `nemo_topr.model.source` inspects); Bridge's writer is replaced by
one that writes a marker file, so no Megatron import is needed (the real export is covered by
tests/training/test_checkpoint_route.py and tests/training/test_e2e.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.conftest import placeholder_hf_model, torch_dist_save
from safetensors import SafetensorError

from nemo_topr.errors import UserError
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
        Path(out).mkdir(parents=True, exist_ok=True)  # as Bridge does
        (Path(out) / "model.safetensors").write_text(f"exported from {checkpoint}")
        if self.error:
            raise self.error


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr("nemo_topr.model.providers.config_only_bridge", lambda hf_dir: _FakeBridge())
    return _fake_checkpoint(tmp_path / "ckpt")


def test_a_non_empty_hf_out_is_refused_and_left_as_it_was(checkpoint, tmp_path, capsys):
    base = tmp_path / "Llama-3.1-8B"
    base.mkdir()
    (base / "model.safetensors").write_text("the base weights")
    with pytest.raises(UserError) as refused:
        export.main(["--ckpt", str(checkpoint), "--hf-out", str(base), "--device", "cpu"])
    assert refused.value.key == "export.hf_out.not_empty"
    assert [p.name for p in base.iterdir()] == ["model.safetensors"]
    assert (base / "model.safetensors").read_text() == "the base weights"


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("hf_out, flags", [
    ("ckpt", []),  # --ckpt X --hf-out X: the checkpoint itself
    (".", []),  # a directory above it
    ("ckpt/hf_artifacts/model", []),
    ("ckpt", ["--all-iterations"]),  # ckpt/iter_0000001: the Megatron iteration itself
], ids=["itself", "above", "inside", "all-iterations"])
def test_the_checkpoint_being_exported_is_refused_as_its_output_even_with_overwrite(checkpoint, tmp_path, hf_out,
                                                                                    flags):
    """With --overwrite, export replaces --hf-out: naming the checkpoint (or a directory holding it)
    would delete the weights being exported."""
    before = _tree(tmp_path)
    out = tmp_path / hf_out
    with pytest.raises(UserError) as refused:
        export.main(["--ckpt", str(checkpoint), "--hf-out", str(out), *flags, "--device", "cpu", "--overwrite"])
    assert refused.value.key == "export.hf_out.in_the_checkpoint"
    assert _tree(tmp_path) == before


def test_an_export_into_the_runs_own_directory_beside_its_checkpoints_is_accepted(tmp_path, monkeypatch):
    monkeypatch.setattr("nemo_topr.model.providers.config_only_bridge", lambda hf_dir: _FakeBridge())
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
    """--overwrite replaces only an earlier export: a typo naming the base model (or a file) must
    not replace it with the export."""
    base = tmp_path / "Llama-3.1-8B"
    target = base / "iter_0000001" if flags else base
    target.mkdir(parents=True)
    (target / "model.safetensors").write_text("the base weights")
    before = _tree(tmp_path)
    with pytest.raises(UserError) as refused:
        export.main(["--ckpt", str(checkpoint), "--hf-out", str(base), *flags, "--device", "cpu", "--overwrite"])
    assert refused.value.key == "export.hf_out.not_an_export"
    assert _tree(tmp_path) == before
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with pytest.raises(UserError) as refused:
        export.main(["--ckpt", str(checkpoint), "--hf-out", str(a_file), "--device", "cpu", "--overwrite"])
    assert refused.value.key == "export.hf_out.not_an_export"
    assert a_file.read_text() == "mine"


@pytest.mark.parametrize("flags, hf_out", [(["--iteration", "1"], "earlier"), ([], "earlier/model")],
                         ids=["iterations", "one"])
def test_an_export_inside_an_earlier_export_is_refused(checkpoint, tmp_path, flags, hf_out):
    """`--iteration 1 --hf-out EARLIER`, EARLIER a single export (an HF model directory), wrote
    EARLIER/iter_0000001 into that model's directory without a word."""
    earlier = tmp_path / "earlier"
    assert export.main(["--ckpt", str(checkpoint), "--hf-out", str(earlier), "--device", "cpu"]) == 0
    before = _tree(tmp_path)
    with pytest.raises(UserError) as refused:
        export.main(["--ckpt", str(checkpoint), "--hf-out", str(tmp_path / hf_out), *flags, "--device", "cpu"])
    assert refused.value.key == "export.hf_out.inside_an_export"
    assert _tree(tmp_path) == before


def test_an_interrupted_export_leaves_nothing_under_the_target_name(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr("nemo_topr.model.providers.config_only_bridge", lambda hf_dir: _FakeBridge(fail=True))
    with pytest.raises(RuntimeError, match="killed half-way"):
        export.main(["--ckpt", str(checkpoint), "--hf-out", str(tmp_path / "model"), "--device", "cpu"])
    assert not (tmp_path / "model").exists()
    monkeypatch.setattr("nemo_topr.model.providers.config_only_bridge", lambda hf_dir: _FakeBridge())
    assert export.main(["--ckpt", str(checkpoint), "--hf-out", str(tmp_path / "model"), "--device", "cpu"]) == 0
    assert not (tmp_path / ".model.partial").exists()


@pytest.mark.parametrize("error", [
    # what safetensors raised writing a shard to a full tmpfs (by hand, 400 KB): not an OSError
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
    OSError(28, "No space left on device"),
], ids=["safetensors", "oserror"])
def test_an_export_that_cannot_be_written_is_removed_and_named_in_one_line(checkpoint, tmp_path, monkeypatch, error):
    monkeypatch.setattr("nemo_topr.model.providers.config_only_bridge", lambda hf_dir: _FakeBridge(error=error))
    with pytest.raises(UserError) as refused:
        export.main(["--ckpt", str(checkpoint), "--hf-out", str(tmp_path / "model"), "--device", "cpu"])
    assert refused.value.key == "export.write_failed"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ckpt"]  # no model, no partial directory


@pytest.mark.slow
def test_bad_inputs_are_refused_before_megatron_is_imported(tmp_path):
    """A refusal costs no Megatron start-up (10-20 s): the inputs are checked first."""
    import subprocess
    import sys

    from tests.conftest import REPO

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
    monkeypatch.setattr("nemo_topr.model.providers.config_only_bridge", lambda hf_dir: _FakeBridge())
    run = tmp_path / "run"
    checkpoints = _fake_checkpoint(run / "checkpoints")
    (checkpoints / "iter_0000002").mkdir()
    for made in (checkpoints / "iter_0000001").iterdir():
        (checkpoints / "iter_0000002" / made.name).write_bytes(made.read_bytes())
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("2")
    (run / "config.yaml").write_text("run_dir: run\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as refused:
        export.main(["--ckpt", named, "--hf-out", "hf", *flags, "--device", "cpu"])
    assert refused.value.key == "export.ckpt.iteration_chosen_twice"
    assert not (tmp_path / "hf").exists()
    assert export.main(["--ckpt", "run", "--hf-out", "hf", "--iteration", "1", "--device", "cpu"]) == 0
    assert (tmp_path / "hf/iter_0000001/model.safetensors").read_text() == f"exported from {checkpoints}/iter_0000001"


def _with_iterations(root: Path, iterations: int) -> list[Path]:
    """`root` (a `_fake_checkpoint`) with iterations 1..N saved, each a copy of the first."""
    for i in range(2, iterations + 1):
        (root / f"iter_{i:07d}").mkdir()
        for made in (root / "iter_0000001").iterdir():
            (root / f"iter_{i:07d}" / made.name).write_bytes(made.read_bytes())
    (root / "latest_checkpointed_iteration.txt").write_text(str(iterations))
    return [root / f"iter_{i:07d}" for i in range(1, iterations + 1)]


class _CountingBridge(_FakeBridge):
    """Writes what `_FakeBridge` writes and records each checkpoint; stops (^C) at `stop_at`."""

    def __init__(self, stop_at: str | None = None):
        super().__init__(error=None)
        self.exported, self.stop_at = [], stop_at

    def export_ckpt(self, checkpoint: str, out: str, show_progress: bool) -> None:
        if Path(checkpoint).name == self.stop_at:
            raise KeyboardInterrupt
        self.exported.append(Path(checkpoint).name)
        super().export_ckpt(checkpoint, out, show_progress)


def test_an_export_cut_short_goes_on_where_it_stopped_when_run_again(checkpoint, tmp_path, monkeypatch, capsys):
    """`--all-iterations` stopped at its second iteration (a job's time limit), run again as it
    was: it exports the rest and keeps the first, rather than refusing ("exists and is not empty")
    and leaving --overwrite to export every iteration again."""
    iterations = _with_iterations(checkpoint, 3)
    hf = tmp_path / "hf"
    args = ["--ckpt", str(checkpoint), "--hf-out", str(hf), "--all-iterations", "--device", "cpu"]
    stopped = _CountingBridge(stop_at="iter_0000002")
    monkeypatch.setattr("nemo_topr.model.providers.config_only_bridge", lambda hf_dir: stopped)
    with pytest.raises(KeyboardInterrupt):
        export.main(args)
    assert stopped.exported == ["iter_0000001"] and sorted(p.name for p in hf.iterdir()) == ["iter_0000001"]
    first = (hf / "iter_0000001" / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    again = _CountingBridge()
    monkeypatch.setattr("nemo_topr.model.providers.config_only_bridge", lambda hf_dir: again)
    assert export.main(args) == 0
    assert again.exported == ["iter_0000002", "iter_0000003"]
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"kept {iterations[0]} -> {hf / 'iter_0000001'} (exported earlier, unchanged since)",
        f"exported {iterations[1]} -> {hf / 'iter_0000002'}", f"exported {iterations[2]} -> {hf / 'iter_0000003'}"]
    # stderr: how far it is, from the first checkpoint on (of the two left to export), not only at the end
    assert [line.split(",")[0] for line in err.splitlines() if line.startswith("[export]")] == [
        "[export] 1/2 checkpoints (50.0%)", "[export] 2/2 checkpoints (100.0%)"]
    assert (hf / "iter_0000001" / "model.safetensors").stat().st_mtime_ns == first
    for iteration in iterations:
        assert (hf / iteration.name / "model.safetensors").read_text() == f"exported from {iteration}"
    # all current: nothing exported, nor Megatron imported (the bridge is never built)
    monkeypatch.setattr("nemo_topr.model.providers.config_only_bridge", lambda hf_dir: pytest.fail("bridge built"))
    assert export.main(args) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["kept"] * 3
    monkeypatch.setattr("nemo_topr.model.providers.config_only_bridge", lambda hf_dir: again)
    assert export.main([*args, "--overwrite"]) == 0  # --overwrite redoes them all
    assert again.exported == ["iter_0000002", "iter_0000003", "iter_0000001", "iter_0000002", "iter_0000003"]


@pytest.mark.parametrize("changed", ["checkpoint", "hf_config", "shard_truncated", "shard_deleted"])
def test_an_export_changed_since_or_of_a_checkpoint_changed_since_is_not_kept(checkpoint, tmp_path, changed, capsys):
    """A run directory trained again from scratch under the same name, or a new HF config: the
    earlier export is of other weights. A shard of the export cut short (a copy that ran out of
    space) or deleted: it is no whole model. Either way it is refused, named as such, and
    --overwrite exports it again; a damaged export is never kept as current."""
    hf = tmp_path / "hf"
    args = ["--ckpt", str(checkpoint), "--hf-out", str(hf), "--device", "cpu"]
    assert export.main(args) == 0
    touched = {"checkpoint": checkpoint / "iter_0000001/metadata.json",
               "hf_config": checkpoint / "hf_artifacts/tokenizer.json"}.get(changed, hf / "model.safetensors")
    if changed == "shard_deleted":
        touched.unlink()
    elif changed == "shard_truncated":
        touched.write_text(touched.read_text()[:-3])
    else:
        touched.write_text(touched.read_text() + "\n")
    with pytest.raises(UserError) as refused:
        export.main(args)
    assert refused.value.key == "export.hf_out.not_empty"
    capsys.readouterr()
    assert export.main([*args, "--overwrite"]) == 0
    assert capsys.readouterr().out.startswith("exported ")
    assert (hf / "model.safetensors").read_text() == f"exported from {checkpoint / 'iter_0000001'}"
    assert export.main(args) == 0  # current again
    assert capsys.readouterr().out.startswith("kept ")


def test_a_second_export_into_a_target_being_written_is_refused(checkpoint, tmp_path, monkeypatch):
    """Two exports into one --hf-out at once (round 2's while round 1's still ran) both wrote
    .NAME.partial, the second deleting the first's: one could end with the other checkpoint's weights
    under its record, which a rerun then kept. The second is refused while the first holds the
    target (a real flock: two opens of one directory conflict as two processes' do), the first ends
    whole and its own; one killed earlier (SIGKILL: nothing removed it) holds no lock and is cleared."""
    import shutil

    other = Path(shutil.copytree(checkpoint, tmp_path / "round2"))
    hf, partial = tmp_path / "hf", tmp_path / ".hf.partial"
    partial.mkdir()
    (partial / "model.safetensors").write_text("half of a model from an export killed earlier")
    second = ["--ckpt", str(other), "--hf-out", str(hf), "--device", "cpu"]
    refusals = []

    class SecondExportMeanwhile(_FakeBridge):
        def export_ckpt(self, ckpt: str, out: str, show_progress: bool) -> None:
            super().export_ckpt(ckpt, out, show_progress)
            with pytest.raises(UserError) as refused:
                export.main(second)
            refusals.append(str(refused.value))

    monkeypatch.setattr("nemo_topr.model.providers.config_only_bridge", lambda hf_dir: SecondExportMeanwhile())
    assert export.main(["--ckpt", str(checkpoint), "--hf-out", str(hf), "--device", "cpu"]) == 0
    assert refusals == [f"{hf}: another export is writing it now ({partial} is locked): wait for "
                        "it to end, or choose another --hf-out"]
    assert _tree(hf) == {"model.safetensors": f"exported from {checkpoint / 'iter_0000001'}".encode(),
                         export.EXPORT_RECORD: (hf / export.EXPORT_RECORD).read_bytes()}
    assert json.loads((hf / export.EXPORT_RECORD).read_text())["checkpoint"] == str(checkpoint / "iter_0000001")
    monkeypatch.setattr("nemo_topr.model.providers.config_only_bridge", lambda hf_dir: _FakeBridge())
    assert export.main([*second, "--overwrite"]) == 0  # once the first has ended
    assert (hf / "model.safetensors").read_text() == f"exported from {other / 'iter_0000001'}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "hf", "round2"]


def test_a_read_only_folder_keeps_its_current_exports_and_refuses_new_ones_in_one_line(checkpoint, tmp_path,
                                                                                        monkeypatch, capsys):
    """A folder of exports made read-only (archived) and exported into again: what is current is
    kept, reading only; a new target there is one line naming it (checked by hand on a read-only
    tmpfs mount: the same words), not a traceback after Megatron's start-up."""
    import errno
    import os

    hf = tmp_path / "hf"
    args = ["--ckpt", str(checkpoint), "--hf-out", str(hf), "--device", "cpu"]
    assert export.main(args) == 0
    real_mkdir = Path.mkdir

    def read_only(path, *rest, **options):
        if tmp_path in Path(path).parents:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_mkdir(path, *rest, **options)

    monkeypatch.setattr(Path, "mkdir", read_only)
    capsys.readouterr()
    assert export.main(args) == 0
    assert capsys.readouterr().out.startswith("kept ")
    with pytest.raises(UserError) as refused:
        export.main(["--ckpt", str(checkpoint), "--hf-out", str(tmp_path / "new"), "--device", "cpu"])
    assert refused.value.key == "export.hf_out.unmakeable"


def test_an_overwrite_stopped_while_replacing_leaves_a_whole_model_or_none(checkpoint, tmp_path, monkeypatch):
    """Deleted in place, the earlier export, stopped part way, could keep its record beside half its
    weights, and a rerun would keep that as current. Whatever the stop, --hf-out holds a whole
    model (weights and record) or nothing."""
    hf = tmp_path / "hf"
    args = ["--ckpt", str(checkpoint), "--hf-out", str(hf), "--device", "cpu"]
    assert export.main(args) == 0
    (checkpoint / "hf_artifacts" / "tokenizer.json").write_text("{ }")  # the earlier export is stale
    real_rmtree = export.shutil.rmtree

    def stopped_while_deleting(path, *rest, **options):
        if (Path(path) / "model.safetensors").exists():  # the earlier model: a stop once its weights are gone
            (Path(path) / "model.safetensors").unlink()
            raise KeyboardInterrupt
        return real_rmtree(path, *rest, **options)

    monkeypatch.setattr(export.shutil, "rmtree", stopped_while_deleting)
    with pytest.raises(KeyboardInterrupt):
        export.main([*args, "--overwrite"])
    monkeypatch.setattr(export.shutil, "rmtree", real_rmtree)
    assert sorted(p.name for p in hf.iterdir()) == ["model.safetensors", "nemo_topr_export.json"]
    assert export.main(args) == 0  # the new export, current; what was set aside goes at the next export
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "hf"]


def test_a_directory_filled_in_place_gets_its_record_last(checkpoint, tmp_path, monkeypatch):
    """An empty --hf-out (the shell's own directory) is filled entry by entry: a stop part way must
    not leave the record, which would make a rerun keep a model missing its weights."""
    hf = tmp_path / "hf"
    hf.mkdir()
    moved, real_move = [], export.shutil.move

    def recorded(source, target):
        moved.append(Path(target).name)
        return real_move(source, target)

    monkeypatch.setattr(export.shutil, "move", recorded)
    assert export.main(["--ckpt", str(checkpoint), "--hf-out", str(hf), "--device", "cpu"]) == 0
    assert moved == ["model.safetensors", "nemo_topr_export.json"]


def _refused_into(out: Path, error: int):
    """os.rename and shutil.copyfile failing with `error` for any path inside `out`, as for a mount
    point of another filesystem (EXDEV: rename only, the copy works) or a read-only one."""
    import errno
    import os
    import shutil

    real_rename, real_copy = os.rename, shutil.copyfile

    def rename(source, target, *rest, **options):
        if Path(target).parent == out or (error != errno.EXDEV and Path(source) == out):
            raise OSError(error, os.strerror(error), str(source), None, str(target))
        return real_rename(source, target, *rest, **options)

    def copyfile(source, target, *rest, **options):
        if Path(target).parent == out and error != errno.EXDEV:
            raise OSError(error, os.strerror(error), str(target))
        return real_copy(source, target, *rest, **options)

    return rename, copyfile


@pytest.mark.parametrize("error", ["EXDEV", "EROFS"], ids=["another-filesystem", "read-only"])
def test_an_empty_hf_out_that_refuses_renames_is_filled_by_copying_or_refused_in_one_line(checkpoint, tmp_path,
                                                                                          monkeypatch, error):
    """An empty --hf-out on another filesystem (a mount point, a container's volume) ended, after the
    whole export, in "Invalid cross-device link", a read-only one in a PermissionError: tracebacks,
    with the whole model left hidden in .DIR.partial beside it."""
    import errno

    out = tmp_path / "mounted"
    out.mkdir()
    rename, copyfile = _refused_into(out, getattr(errno, error))
    monkeypatch.setattr("os.rename", rename)
    monkeypatch.setattr("shutil.copyfile", copyfile)
    args = ["--ckpt", str(checkpoint), "--hf-out", str(out), "--device", "cpu"]
    if error == "EXDEV":  # copied instead
        assert export.main(args) == 0
        assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "nemo_topr_export.json"]
    else:
        with pytest.raises(UserError) as refused:
            export.main(args)
        assert refused.value.key == "export.move_failed"
        assert list(out.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "mounted"]  # no .mounted.partial


def test_iterations_of_another_checkpoint_in_the_folder_are_refused(checkpoint, tmp_path, capsys):
    """A round-2 run exported with --all-iterations into round 1's folder: its iter_* sat beside
    round 1's as one run's, and --overwrite left round 1's later iterations in place."""
    import shutil

    _with_iterations(checkpoint, 3)
    other = Path(shutil.copytree(checkpoint, tmp_path / "round2"))
    (other / "latest_checkpointed_iteration.txt").write_text("1")
    shutil.rmtree(other / "iter_0000002")
    shutil.rmtree(other / "iter_0000003")
    hf = tmp_path / "exports"
    assert export.main(["--ckpt", str(checkpoint), "--hf-out", str(hf), "--all-iterations", "--device", "cpu"]) == 0
    for flags in ([], ["--overwrite"]):
        with pytest.raises(UserError) as refused:
            export.main(["--ckpt", str(other), "--hf-out", str(hf), "--all-iterations", "--device", "cpu", *flags])
        assert refused.value.key == "export.hf_out.another_checkpoints"
    assert json.loads((hf / "iter_0000001" / "nemo_topr_export.json").read_text())["checkpoint"] == \
        str(checkpoint / "iter_0000001")


# `validate(ExportSpec)`: every problem of an export at once, before Megatron, nothing written. The
# rows' paths are relative to a folder holding a whole checkpoint (ckpt), one cut short (damaged), a
# Hugging Face directory (hf) and a fresh output's parent.
SPEC_ROWS = [
    ({}, []),
    ({"device": "tpu"}, [("device.invalid", "--device")]),
    ({"ckpt": "hf"}, [("export.ckpt.hugging_face", "--ckpt")]),
    ({"ckpt": "ckpt/iter_0000001", "iterations": (1,)}, [("export.ckpt.iteration_chosen_twice", "--ckpt")]),
    ({"iterations": (7,)}, [("model.iteration.missing", "--ckpt")]),
    ({"hf_out": "ckpt/hf_artifacts/model"}, [("export.hf_out.in_the_checkpoint", "--hf-out")]),
    ({"hf_out": "hf"}, [("export.hf_out.not_empty", "--hf-out")]),
    ({"ckpt": "damaged"}, [("model.iteration.cut_short", "--ckpt")]),
    # each check apart: the device, the outputs and the checkpoint's files, told in one refusal
    ({"device": "tpu", "ckpt": "damaged", "hf_out": "hf"},
     [("device.invalid", "--device"), ("export.hf_out.not_empty", "--hf-out"),
      ("model.iteration.cut_short", "--ckpt")]),
]


@pytest.fixture(scope="module")
def spec_inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export_spec")
    _fake_checkpoint(root / "ckpt")
    damaged = _fake_checkpoint(root / "damaged") / "iter_0000001"
    shard = next(path for path in damaged.iterdir() if path.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:-1])  # cut short since the save
    placeholder_hf_model(root / "hf")
    return root


def _spec(**given) -> export.ExportSpec:
    return export.ExportSpec.of(**{"ckpt": "ckpt", "hf_out": "out", "device": "cpu", **given})


@pytest.mark.parametrize("given, problems", SPEC_ROWS, ids=[str(given) for given, _ in SPEC_ROWS])
def test_validate_names_every_problem_of_an_export_before_megatron_and_writes_nothing(spec_inputs, given, problems,
                                                                                      monkeypatch):
    import sys

    monkeypatch.chdir(spec_inputs)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what device cpu sets, put back after the test
    before, megatron = _tree(spec_inputs), {name for name in sys.modules if name.startswith("megatron")}
    assert [(problem.key, problem.where) for problem in export.validate(_spec(**given))] == problems
    assert _tree(spec_inputs) == before
    assert {name for name in sys.modules if name.startswith("megatron")} <= megatron


def test_several_problems_are_refused_as_one_naming_each(spec_inputs, monkeypatch):
    monkeypatch.chdir(spec_inputs)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(UserError) as refused:
        export.export("damaged", "hf", device="tpu")
    assert (refused.value.key, refused.value.where) == ("export.several_problems", "--device, --hf-out, --ckpt")
    assert len(str(refused.value).splitlines()) == 3
