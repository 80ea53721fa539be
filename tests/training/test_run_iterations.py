"""RUN@ITERATION and `export --all-iterations` on a run directory made of just the files
`nemo_topr.model.source` reads (no training, no Megatron): fast tests of guarantees the slow
end-to-end tests (tests/training/test_e2e.py, test_checkpoint_route.py) also hold."""

import json
from pathlib import Path

import pytest
from tests.conftest import torch_dist_save

from nemo_topr.model import source as model_source
from nemo_topr.model.source import ModelSourceError, resolve
from nemo_topr.training import export

SAVED = (2, 4, 6)  # iterations of the fake run; 6 is the latest


def _iteration(checkpoints: Path, iteration: int, *, finished: bool = True) -> Path:
    path = torch_dist_save(checkpoints / f"iter_{iteration:07d}")
    for name in ("metadata.json", "train_state.pt"):
        (path / name).write_text("")
    if finished:  # what Bridge writes last (model_source.ITERATION_FILES)
        (path / "run_config.yaml").write_text(f"model:\n  num_layers: 2\n  hidden_size: 64\n# iteration {iteration}\n")
    return path


@pytest.fixture
def run_dir(tmp_path) -> Path:
    run = tmp_path / "run"
    checkpoints = run / "checkpoints"
    for iteration in SAVED:
        _iteration(checkpoints, iteration)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(SAVED[-1]))
    artifacts = checkpoints / model_source.HF_ARTIFACTS
    artifacts.mkdir()
    (artifacts / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2,
                                                       "hidden_size": 64}))
    (artifacts / "tokenizer.json").write_text("{}")
    (run / "config.yaml").write_text("run_dir: run\n")
    return run


def test_run_at_iteration_loads_that_iteration(run_dir):
    for iteration in SAVED:
        source = resolve(f"{run_dir}@{iteration}")
        assert (source.kind, source.iteration) == ("run", iteration)
        assert source.checkpoint == run_dir.resolve() / "checkpoints" / f"iter_{iteration:07d}"
        assert source.run_config()["model"]["num_layers"] == 2
    latest = resolve(run_dir)
    assert (latest.iteration, latest.checkpoint.name) == (6, "iter_0000006")
    assert latest.saved_iterations() == list(SAVED)


def test_run_at_iteration_errors_name_the_saved_iterations(run_dir):
    with pytest.raises(ModelSourceError, match=r"no checkpoint .*iter_0000005; saved iterations: \[2, 4, 6\]"):
        resolve(f"{run_dir}@5")
    eighth = _iteration(run_dir / "checkpoints", 8, finished=False)
    with pytest.raises(ModelSourceError) as refused:
        resolve(f"{run_dir}@8")
    assert str(refused.value) == (
        f"base_model={run_dir}: {eighth} has no run_config.yaml: a Megatron-Bridge save killed before its last file, or a "
        "checkpoint Megatron-LM wrote (it writes none). nemo-topr reads Megatron-Bridge checkpoints (its runs, "
        "`nemo-topr import`); convert a Megatron-LM one to a Hugging Face directory and pass that (complete "
        "iterations: [2, 4, 6])")
    (eighth / ".metadata").unlink()  # the list names complete iterations only, not this one
    with pytest.raises(ModelSourceError, match=r"unfinished save: .*iter_0000008 lacks \.metadata, run_config.yaml "
                                               r"\(written when a save completes\); complete iterations: \[2, 4, 6\]$"):
        resolve(f"{run_dir}@8")


def test_a_directory_named_like_run_at_iteration_is_not_split(run_dir, tmp_path):
    odd = tmp_path / "run@4"
    run_dir.rename(odd)
    assert resolve(odd).iteration == 6  # the directory "run@4" itself, at its latest iteration


def test_export_all_iterations_maps_each_output_to_its_own_iteration(run_dir, tmp_path, monkeypatch, capsys):
    """The heavy conversion is replaced by a recorder; what is checked is which checkpoint goes
    to which output directory and what nemo_topr_export.json says about it."""
    converted = []

    class RecordingBridge:
        def export_ckpt(self, checkpoint, out, show_progress):
            converted.append((Path(checkpoint).name, Path(out).name))
            Path(out).mkdir(parents=True, exist_ok=True)  # as Bridge does: export makes it first

    monkeypatch.setattr(export, "use_device", lambda device, where: device)
    monkeypatch.setattr("nemo_topr.model.providers.config_only_bridge", lambda hf_dir: RecordingBridge())
    out = tmp_path / "exports"
    assert export.main(["--ckpt", str(run_dir), "--hf-out", str(out), "--all-iterations", "--device", "cpu"]) == 0
    names = [f"iter_{i:07d}" for i in SAVED]
    # each checkpoint into the directory of its own name, written as .NAME.partial and renamed when complete
    assert converted == [(name, f".{name}.partial") for name in names]
    assert sorted(p.name for p in out.iterdir()) == names
    for iteration, name in zip(SAVED, names, strict=True):
        record = json.loads((out / name / "nemo_topr_export.json").read_text())
        assert record["iteration"] == iteration and Path(record["checkpoint"]).name == name
    assert capsys.readouterr().out.splitlines() == [
        f"exported {run_dir.resolve() / 'checkpoints' / name} -> {out / name}" for name in names]


def test_a_runs_tokenizer_is_found_beside_its_checkpoints(run_dir, tmp_path):
    """`data validate --tokenizer RUN` (and stats): the tokenizer training uses, kept in
    hf_artifacts/; it said "cannot load a tokenizer from this directory"."""
    import shutil

    from nemo_topr.data.tokenization import load_tokenizer
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    hf_dir = build_tiny_hf_llama(tmp_path / "tiny", build_tiny_tokenizer())
    artifacts = run_dir / "checkpoints" / model_source.HF_ARTIFACTS
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_dir / name, artifacts / name)
    text = "Question: 12 apples and 30 more?\nAnswer: 42"
    expected = load_tokenizer(hf_dir)(text)["input_ids"]
    checkpoints = run_dir / "checkpoints"
    for spec in (run_dir, f"{run_dir}@4", checkpoints, checkpoints / "iter_0000002"):
        assert load_tokenizer(spec)(text)["input_ids"] == expected, spec
    assert len(expected) > 5
