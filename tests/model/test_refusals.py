"""The refusals of the model plumbing and its verbs as a table: one row per problem, its bad input → the
problem's key and where.

The rows assert the key and where only; the words are in tests/golden/refusals.txt (tests/refusal_table.py),
read as a whole and compared here (``NEMO_TOPR_UPDATE_GOLDEN=1 .venv/bin/python -m pytest
tests/model/test_refusals.py`` rewrites this table's section), so rewording a message changes that file and no
test. Every key SOURCES can raise has a row, or is in UNREACHABLE with why: a new refusal without one fails
`test_the_table_covers_every_key_the_code_raises`.

SOURCES: the model plumbing (nemo_topr/model: source, hf_weights, device, attention_check), the verbs `import`,
`export` and `score-logprobs`, and the outputs and option types every verb shares (nemo_topr/utils: outputs,
arguments). A golden line names the verb a user most often meets the refusal through (VERBS, by the key's first
part): a model source's problems `train` (base_model=), which `score-logprobs`, `export`, `import`, `generate`
and `eval` tell too, naming their own option (a row given by one is that verb's: OPTION_VERBS); the weights',
device's and attention's `train` as well; an output file's `data`, an emptied output directory's `demo`. An
option type's refusal (OPTION) is printed by argparse after the option's name, exit 2; its line here is the
type's own words.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from tests.conftest import REPO, checkout_env, placeholder_hf_model
from omegaconf import OmegaConf
from tests.refusal_table import assert_covers, assert_golden, raised, rendered, row_tests

from nemo_topr.errors import UserError
from nemo_topr.model import attention_check, device, hf_weights
from nemo_topr.model.architecture import architecture_from_hf_config
from nemo_topr.model.checkpoint_layout import latest_iteration
from nemo_topr.model.providers import hf_llama_provider
from nemo_topr.model import source as model_source
from nemo_topr.model.source import MEGATRON_KINDS, resolve
from nemo_topr.training import export, scoring
from nemo_topr.training.export import EXPORT_RECORD
from nemo_topr.training.import_checkpoint import import_hf
from nemo_topr.utils import arguments, outputs

MODEL = REPO / "nemo_topr" / "model"
TRAINING = REPO / "nemo_topr" / "training"
SOURCES = [MODEL / "source.py", MODEL / "hf_weights.py", MODEL / "device.py", MODEL / "attention_check.py",
           MODEL / "architecture.py", MODEL / "settings.py", MODEL / "checkpoint_layout.py", MODEL / "providers.py",
           REPO / "nemo_topr" / "utils" / "outputs.py", TRAINING / "import_checkpoint.py", TRAINING / "export.py",
           TRAINING / "scoring.py", REPO / "nemo_topr" / "utils" / "arguments.py"]
ERRORS = {"ModelSourceError", "WeightsError", "DeviceError", "AttentionError", "OutputError", "OutputWriteError",
          "ExportWriteError", "ConfigError", "OptionValueError", "ArchitectureError", "ModelSettingsError",
          "DamagedCheckpointError", "ModelDirectoryError"}
# keys the table cannot reach cheaply, and what reaching them needs
UNREACHABLE = {
    "import.out.no_space": "Megatron-Bridge's model, loaded before the space it takes is known",
    "import.out.write_failed": "Megatron-Bridge's save of a loaded model failing on a full disk",
    "model.transformer_impl.without_transformer_engine": "follow_transformer_impl sets Megatron-Bridge's layer spec, "
                                                         "imported first"}
VERBS = {"model": "train", "checkpoint": "train", "base_model": "train", "weights": "train", "device": "train", "attention": "train",
         "output_dir": "demo", "output": "data", "import": "import", "export": "export",
         "train_config": "score-logprobs", "tp_pp": "score-logprobs", "world_size": "score-logprobs",
         "option": "score-logprobs", "score-logprobs": "score-logprobs"}
# a model named by another verb's option is met through that verb
OPTION_VERBS = {"--ckpt": "export", "--model": "score-logprobs", "HF_DIR": "import"}
KEY_VERBS = {"model.not_hugging_face": "generate",
             "train_config.model.fp8.without_transformer_engine": "score-logprobs",
             "option.below_0": "export", "option.not_finite": "data", "option.not_above_0": "doctor",
             "option.not_a_share": "eval"}
LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1,
         "intermediate_size": 16, "vocab_size": 32}
TE_ATTENTION = "megatron.core.extensions.transformer_engine.TEDotProductAttention"
LOCAL_ATTENTION = "megatron.core.transformer.dot_product_attention.DotProductAttention"


def hf_model(directory: Path, config: dict | str | None = None, *, tokenizer: bool = True) -> Path:
    """A Hugging Face directory as model/source.py inspects it; its tokenizer a file that only has to exist."""
    placeholder_hf_model(directory, config, tokenizer=False)
    if tokenizer:
        (directory / "tokenizer.json").write_text("{}\n")
    return directory


def checkpoint(root: Path, *, tracker: str | None = "1", files: tuple[str, ...] = (".metadata", "metadata.json"),
               run_config: str | None = "model: {}\n", hf_config: dict | None = LLAMA, tokenizer: bool = True) -> Path:
    """A Megatron checkpoint root with iteration 1 holding `files` (and `run_config`), its hf_artifacts/
    holding `hf_config` (None: no hf_artifacts/)."""
    iteration = root / "iter_0000001"
    iteration.mkdir(parents=True)
    for name in files:
        (iteration / name).write_bytes(b"garbage")
    if run_config is not None:
        (iteration / "run_config.yaml").write_text(run_config)
    if tracker is not None:
        (root / "latest_checkpointed_iteration.txt").write_text(tracker)
    if hf_config is not None:
        hf_model(root / "hf_artifacts", hf_config, tokenizer=tokenizer)
    return root


def safetensors(path: Path, header: bytes, size: int | None = None) -> None:
    """A safetensors file of `header` (its length first) and no data, or its first `size` bytes."""
    data = len(header).to_bytes(8, "little") + header
    path.write_bytes(data[:size])


def make_inputs(root: Path) -> None:
    """The files the rows name, relative to `root` (the rows run there)."""
    hf_model(root / "hf")
    hf_model(root / "hf_sized", LLAMA)
    hf_model(root / "no_tokenizer", tokenizer=False)
    hf_model(root / "not_json", "{")
    hf_model(root / "json_list", "[]")
    hf_model(root / "gpt2", {"architectures": ["GPT2LMHeadModel"]})
    hf_model(root / "zero_size", {**LLAMA, "hidden_size": 0}, tokenizer=False)
    (root / "notes.txt").write_text("not a model\n")
    (root / "config_only").mkdir()
    (root / "config_only" / "config.json").write_text("{}")
    (root / "empty").mkdir()
    for part in ("context", "weights"):
        (root / "nemo2" / part).mkdir(parents=True)
    hf_model(root / "exports" / "iter_0000001", LLAMA)
    checkpoint(root / "ckpt")
    checkpoint(root / "tracker_release", tracker="release")
    checkpoint(root / "no_tracker", tracker=None)
    checkpoint(root / "tracker_2", tracker="2")
    checkpoint(root / "no_run_config", run_config=None)
    checkpoint(root / "no_metadata_json", files=(".metadata",))
    checkpoint(root / "no_hf_artifacts", hf_config=None)
    checkpoint(root / "artifacts_no_tokenizer", tokenizer=False)
    checkpoint(root / "other_shape", run_config="model: {num_layers: 4}\n")
    checkpoint(root / "run_config_bad_yaml", run_config="model: [\n")
    checkpoint(root / "run_config_list", run_config="- 1\n")
    weights = root / "w"
    weights.mkdir()
    (weights / "short.safetensors").write_bytes(b"123")
    safetensors(weights / "bad_header.safetensors", b"not json")
    safetensors(weights / "cut.safetensors",
                json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode())
    for name, index in (("bad_index", "{"), ("lost_shard", json.dumps({"weight_map": {"x": "shard-2.safetensors"}}))):
        (weights / name).mkdir()
        (weights / name / hf_weights.INDEX).write_text(index)
    (root / "no_safetensors").mkdir()
    (root / "records.jsonl").write_text("{}\n")
    (root / "shape.yaml").write_text("defaults:\n  - topr\n  - _self_\nmodel:\n  num_layers: 7\n")
    export = root / "export"  # an export of ckpt's iteration 1, and one of another checkpoint's
    export.mkdir()
    (export / EXPORT_RECORD).write_text("{}")
    other = root / "mixed" / "iter_0000003"
    other.mkdir(parents=True)
    (other / EXPORT_RECORD).write_text(json.dumps({"checkpoint": "/elsewhere/iter_0000003"}))


def device_after_cuda_started() -> list[UserError]:
    """`select_device("cpu")` in a process whose CUDA has started (stood in for: no GPU here)."""
    with mock.patch.dict(os.environ), mock.patch.object(torch.cuda, "is_available", lambda: True):
        return raised(device.select_device, "cpu", where="--device")()


# the kinds attention_check registers itself: a module imported before (training.flex_attention) adds its own
MEGATRON_ATTENTION = {name: kind for name, kind in attention_check.ATTENTION_KINDS.items() if name.startswith("megatron.")}


def attention(name: str, impl: str, *, shared_prefix: bool = False, **config: object) -> Callable[[], list]:
    check = raised(attention_check.check_attention, name, "causal", SimpleNamespace(transformer_impl=impl, **config),
                   shared_prefix=shared_prefix)

    def problem() -> list:
        with mock.patch.dict(attention_check.ATTENTION_KINDS, MEGATRON_ATTENTION, clear=True):
            return check()
    return problem


def written_on_a_full_disk() -> None:
    """A write that the filesystem refuses half-way (stood in for: the block raises ENOSPC)."""
    with outputs.written_whole("written.json") as out:
        out.write("{")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def locked_by_another_export() -> list[UserError]:
    """`export`'s lock on HF_OUT's partial directory while another export holds it."""
    (partial := Path("locked.partial")).mkdir(exist_ok=True)
    held = os.open(partial, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return raised(export._locked, partial, Path("locked"))()
    finally:
        os.close(held)
        partial.rmdir()


class FullDiskBridge:
    """Bridge's exporter on a full disk."""

    def export_ckpt(self, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def exported_on_a_full_disk() -> list[UserError]:
    return raised(export.write_export, FullDiskBridge(), resolve("ckpt"), Path("full.partial"), Path("full"))()


def targets(ckpt: str, hf_out: str) -> dict:
    return {resolve(ckpt): Path(hf_out).resolve()}


def scoring_fp8_without_te() -> list[UserError]:
    """--train-config's FP8 on a GPU without Transformer Engine (the provider's settling stood in for)."""
    with mock.patch.object(scoring, "device_model_settings", lambda provider, **kwargs: provider):
        return raised(scoring.scoring_model_settings, SimpleNamespace(fp8="hybrid", transformer_impl="local"),
                      "llama31_8b_fp8")()


def shape_keys_in_train_config() -> list[UserError]:
    """A --train-config whose model section sets the weights' shapes (its schema check, which reads Bridge's
    dataclasses, stood in for)."""
    with mock.patch.object(scoring, "check_values", lambda config: None):
        return raised(scoring.training_model_section, "shape.yaml", SimpleNamespace(num_layers=2))()


def world(tp: int, pp: int, world_size: int) -> Callable[[], list]:
    return raised(scoring.check_scoring_world, SimpleNamespace(tensor_model_parallel_size=tp,
                                                               pipeline_model_parallel_size=pp), world_size, None)


# (key, where, the problem's source: the pure function given the bad input)
ROWS = [
    ("model.is_a_file", "base_model", raised(resolve, "notes.txt")),
    ("model.no_such_directory", "base_model", raised(resolve, "no_such_model")),
    ("model.nemo2_checkpoint", "base_model", raised(resolve, "nemo2")),
    ("model.exports_folder", "base_model", raised(resolve, "exports")),
    ("model.exports_folder.nothing_to_export", "--ckpt",
     raised(resolve, "exports", named="--ckpt ", expected=f"one of: {MEGATRON_KINDS}")),
    ("model.weights.none", "base_model", raised(resolve, "config_only")),
    ("model.unknown_kind", "base_model", raised(resolve, "empty")),
    ("model.tokenizer.missing", "--model", raised(resolve, "no_tokenizer", named="--model ")),
    ("model.config_json.not_json", "base_model", raised(resolve, "not_json")),
    ("model.config_json.not_an_object", "base_model", raised(resolve, "json_list")),
    ("model.architecture.unsupported", "HF_DIR", raised(resolve, "gpt2", named="")),
    ("model.not_a_run_directory", "base_model", raised(resolve, "empty@5")),
    ("model.checkpoint.tracker_damaged", "base_model", raised(resolve, "tracker_release")),
    ("model.checkpoint.no_tracker", "base_model", raised(resolve, "no_tracker")),
    ("model.iteration.missing", "base_model", raised(resolve, "tracker_2")),
    ("model.run_config.missing", "base_model", raised(resolve, "no_run_config")),
    ("model.iteration.save_unfinished", "base_model", raised(resolve, "no_metadata_json")),
    ("model.hf_artifacts.missing", "base_model", raised(resolve, "no_hf_artifacts")),
    ("model.architecture.differs_from_checkpoint", "base_model", raised(resolve, "other_shape")),
    ("model.run_config.not_yaml", "base_model", raised(resolve, "run_config_bad_yaml")),
    ("model.run_config.not_a_mapping", "base_model", raised(resolve, "run_config_list")),
    ("model.iterations.of_hugging_face", "base_model", raised(lambda: resolve("hf").at_iteration(1))),
    ("model.weights.config_json.incomplete", "base_model", raised(lambda: model_source.check_intact(resolve("hf")))),
    ("model.iteration.cut_short", "--ckpt",
     raised(lambda: model_source.check_intact(resolve("ckpt", named="--ckpt ")))),
    ("model.not_hugging_face", "--model", raised(model_source.require_hugging_face, "ckpt")),
    ("base_model.alias_disagrees", "hf_model",
     raised(lambda: model_source.fold_alias(OmegaConf.create({"base_model": "/a", "hf_model": "/b"})))),
    ("base_model.unset", "base_model", raised(model_source.load_route, {"base_model": None}, must_exist=True)),
    ("model.config_json.sizes.missing", "config_only/config.json",
     raised(architecture_from_hf_config, Path("config_only/config.json"), "config_only")),
    ("model.config_json.sizes.not_positive_integers", "zero_size/config.json",
     raised(architecture_from_hf_config, Path("zero_size/config.json"), "zero_size")),
    ("model.config_json.missing", "empty", raised(hf_llama_provider, "empty")),
    ("checkpoint.tracker.names_no_iteration", "tracker_release/latest_checkpointed_iteration.txt",
     raised(latest_iteration, Path("tracker_release"))),
    ("weights.not_safetensors", "w/short.safetensors",
     raised(hf_weights.safetensors_shapes, Path("w/short.safetensors"))),
    ("weights.header_unreadable", "w/bad_header.safetensors",
     raised(hf_weights.safetensors_shapes, Path("w/bad_header.safetensors"))),
    ("weights.cut_short", "w/cut.safetensors", raised(hf_weights.safetensors_shapes, Path("w/cut.safetensors"))),
    ("weights.index_unreadable", f"w/bad_index/{hf_weights.INDEX}",
     raised(hf_weights.weight_files, Path("w/bad_index"))),
    ("weights.shards_missing", f"w/lost_shard/{hf_weights.INDEX}",
     raised(hf_weights.weight_files, Path("w/lost_shard"))),
    ("weights.no_safetensors", "no_safetensors", raised(hf_weights.check_llama_weights, Path("no_safetensors"), LLAMA)),
    ("weights.config_json.incomplete", "hf_sized/config.json",
     raised(hf_weights.check_llama_weights, Path("hf_sized"), {"hidden_size": 8})),
    ("weights.not_the_config", "hf_sized",
     raised(hf_weights.check_llama_weights, Path("hf_sized"), {**LLAMA, "num_hidden_layers": 2})),
    ("device.invalid", "device", raised(device.resolve_device, "tpu", cuda_available=False, where="device")),
    ("device.cuda_unavailable", "device",
     raised(device.resolve_device, "cuda", cuda_available=False, where="device")),
    ("device.cuda_started", "--device", device_after_cuda_started),
    ("attention.unknown", "model.transformer_impl", attention("my.Attention", "local")),
    ("attention.mask_not_read", "model.transformer_impl", attention(TE_ATTENTION, "local")),
    ("attention.shared_prefix_mask_not_read", "model.transformer_impl",
     attention(TE_ATTENTION, "transformer_engine", shared_prefix=True)),
    ("attention.refused", "model.transformer_impl", attention(LOCAL_ATTENTION, "local", masked_softmax_fusion=True)),
    ("output_dir.not_a_directory", "notes.txt", raised(outputs.fresh_output_dir, "notes.txt", "nemo_topr.demo")),
    ("output_dir.not_its_own", "hf", raised(outputs.fresh_output_dir, "hf", "nemo_topr.demo")),
    ("output_dir.unmakeable", "notes.txt/out", raised(outputs.fresh_output_dir, "notes.txt/out", "nemo_topr.demo")),
    ("output_dir.mkdir_failed", "notes.txt/out", raised(outputs._mark, Path("notes.txt/out"), "nemo_topr.demo")),
    ("output.is_an_input", "records.jsonl",
     raised(outputs.refuse_to_overwrite_an_input, "records.jsonl", ["records.jsonl"])),
    ("output.same_path", "--stats", raised(outputs.distinct_outputs, {"--out": "out.jsonl", "--stats": "out.jsonl"})),
    ("output.filesystem_full", "written.json", raised(written_on_a_full_disk)),
    ("output.is_a_directory", "--out", raised(outputs.writable_output_file, "empty")),
    ("output.exists", "--out", raised(outputs.writable_output_file, "records.jsonl")),
    ("output.directory_unmakeable", "--out", raised(outputs.writable_output_file, "notes.txt/out.json")),
    ("output.records.not_jsonl", "--out", raised(outputs.writable_records_file, "scored.json")),
    ("import.hf_dir.megatron", "HF_DIR", raised(import_hf, "ckpt", "out")),
    ("import.out.not_empty", "OUT", raised(import_hf, "hf_sized", "hf")),
    ("import.out.unmakeable", "OUT", raised(import_hf, "hf_sized", "notes.txt/out")),
    ("import.several_problems", "HF_DIR, OUT", raised(import_hf, "ckpt", "hf")),
    ("export.ckpt.hugging_face", "--ckpt", raised(lambda: export.export_targets(resolve("hf"), Path("out"), None))),
    ("export.ckpt.iteration_chosen_twice", "--ckpt",
     raised(lambda: export.check_one_choice_of_iterations("ckpt/iter_0000001", resolve("ckpt/iter_0000001"),
                                                          "--iteration"))),
    ("export.hf_out.in_the_checkpoint", "--hf-out",
     raised(lambda: export.check_outputs(targets("ckpt", "ckpt/hf_artifacts"), overwrite=True))),
    ("export.hf_out.not_empty", "--hf-out", raised(lambda: export.check_outputs(targets("ckpt", "hf"), False))),
    ("export.hf_out.not_an_export", "--hf-out", raised(lambda: export.check_outputs(targets("ckpt", "hf"), True))),
    ("export.hf_out.another_checkpoints", "--hf-out",
     raised(lambda: export.check_one_checkpoint_per_folder(resolve("ckpt"), Path("mixed")))),
    ("export.hf_out.under_a_file", "--hf-out", raised(export.check_parents, Path("notes.txt/out"))),
    ("export.hf_out.inside_an_export", "--hf-out", raised(export.check_parents, Path("export/iter_0000001"))),
    ("export.hf_out.unmakeable", "--hf-out", raised(export.claim_partial, Path("notes.txt/out.partial"),
                                                    Path("notes.txt/out"))),
    ("export.hf_out.locked", "--hf-out", locked_by_another_export),
    ("export.several_problems", "--device, --ckpt", raised(export.export, "hf", "out", device="tpu")),
    ("export.write_failed", "--hf-out", exported_on_a_full_disk),
    ("export.move_failed", "--hf-out", raised(export.move_into_place, Path("no.partial"), Path("moved"),
                                              Path("moved.replaced"))),
    ("train_config.model.shape_keys", "--train-config",
     shape_keys_in_train_config),
    ("train_config.with_layout_flags", "--train-config",
     raised(scoring.apply_scoring_layout, SimpleNamespace(), "cuda", train_config="llama31_8b_bf16", precision="bf16",
            tensor_parallel=None, pipeline_parallel=None)),
    ("score-logprobs.several_problems", "--model, --device",
     raised(scoring.score_logprobs, "absent", "records.jsonl", "scored.jsonl", device="tpu")),
    ("tp_pp.below_1", "--tp, --pp", world(0, 1, 1)),
    ("world_size.not_multiple_of_tp_pp", "WORLD_SIZE", world(2, 1, 3)),
    ("train_config.model.fp8.without_transformer_engine", "--train-config", scoring_fp8_without_te),
    ("option.below_1", "OPTION", raised(arguments.at_least_one, "0")),
    ("option.below_0", "OPTION", raised(arguments.non_negative, "-1")),
    ("option.not_finite", "OPTION", raised(arguments.finite, "nan")),
    ("option.not_above_0", "OPTION", raised(arguments.positive_seconds, "0")),
    ("option.not_a_share", "OPTION", raised(arguments.share, "1.5")),
]


def verb(key: str, where: str) -> str:
    return KEY_VERBS.get(key) or OPTION_VERBS.get(where) or VERBS[key.split(".")[0]]


inputs, test_each_bad_input_raises_its_problem = row_tests(ROWS, make_inputs)


def test_the_rows_inputs_pass_but_for_their_change(inputs, monkeypatch):
    """What each row changes is its problem: the model and the checkpoint it starts from are whole."""
    monkeypatch.chdir(inputs)
    assert resolve("hf").kind == "huggingface"
    assert resolve("ckpt").iteration == 1
    assert hf_weights.check_llama_weights(Path("hf_sized"), LLAMA) is None
    assert device.resolve_device("cuda", cuda_available=True, where="device") == "cuda"
    assert attention(LOCAL_ATTENTION, "local")() == []
    assert [arguments.at_least_one("1"), arguments.non_negative("0"), arguments.finite("-1e9"),
            arguments.positive_seconds("0.5"), arguments.share("1")] == [1, 0, -1e9, 0.5, 1.0]


def test_no_row_writes_anything(inputs, monkeypatch):
    """A refusal leaves the files as they were: no output made, emptied or left half-written."""
    monkeypatch.chdir(inputs)
    before = tree(inputs)
    for _, _, problem in ROWS:
        problem()
    assert tree(inputs) == before


def tree(root: Path) -> dict[str, bytes | None]:
    return {str(path.relative_to(root)): path.read_bytes() if path.is_file() else None for path in root.rglob("*")}


def test_the_table_covers_every_key_the_code_raises():
    assert_covers(ROWS, SOURCES, ERRORS, unreachable=UNREACHABLE)


def test_the_messages_are_the_golden_files(inputs, monkeypatch):
    monkeypatch.chdir(inputs)
    assert_golden("tests/model/test_refusals.py",
                  [rendered(verb(key, where), key, where, *problem(), inputs) for key, where, problem in ROWS])


def megatron_after_the_rows(root: Path) -> list[str]:
    """The Megatron and Transformer Engine modules imported once every row has run in `root` (for a fresh
    interpreter: `test_the_table_imports_no_megatron`)."""
    make_inputs(root)
    os.chdir(root)
    assert all(len(problem()) == 1 for _, _, problem in ROWS)
    return sorted(name for name in sys.modules if name.startswith(("megatron", "transformer_engine")))


def test_the_table_imports_no_megatron(tmp_path):
    """Each problem comes out of the pure checks: no row needs Megatron or Transformer Engine."""
    code = "import pathlib, tests.model.test_refusals as t; print(t.megatron_after_the_rows(pathlib.Path.cwd()))"
    env = checkout_env()
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert (run.returncode, run.stdout.strip().splitlines()[-1:]) == (0, ["[]"]), run.stderr[-2000:]
