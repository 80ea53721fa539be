"""`base_model=`: kind detection of a Hugging Face directory and the errors for what is not a
model (the Megatron kinds, from a real `nemo-topr import`, are in tests/training/test_checkpoint_route.py)."""

import json
import shutil
import subprocess
import sys

import pytest
from tests.conftest import REPO, placeholder_hf_model

from nemo_topr.errors import UserError
from nemo_topr.model import source as model_source
from nemo_topr.model.source import ModelSourceError, resolve
from nemo_topr.training import export
from nemo_topr.training.config import build_training_run, compose
from nemo_topr.training.config_error import ConfigError


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    corpus = ["Question: 12 apples and 30 more?\nAnswer: 42", "The answer is 7."] * 20
    return build_tiny_hf_llama(tmp_path_factory.mktemp("hf") / "tiny", build_tiny_tokenizer(corpus=corpus, vocab_size=300))


def test_a_hugging_face_directory_is_detected(tiny_hf):
    source = resolve(tiny_hf)
    assert (source.kind, source.hf_dir, source.checkpoint, source.is_megatron) == ("huggingface", tiny_hf, None, False)
    assert source.describe() == f"Hugging Face directory {tiny_hf}"


@pytest.mark.parametrize("make, key", [
    (lambda d: None, "model.no_such_directory"),
    (lambda d: d.mkdir(), "model.unknown_kind"),
    (lambda d: (d / "data").mkdir(parents=True), "model.unknown_kind"),
])
def test_a_directory_of_no_known_kind_is_refused(tmp_path, make, key):
    target = tmp_path / "somewhere"
    make(target)
    with pytest.raises(ModelSourceError) as error:
        resolve(target)
    assert (error.value.key, error.value.where) == (key, "base_model")


def test_a_hub_id_is_named_as_one_with_how_to_fetch_it(tmp_path, monkeypatch):
    """Nothing is downloaded; the first thing a user tries is often the model's hub ID."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSourceError) as error:
        resolve("meta-llama/Llama-3.1-8B", named="--model ")
    assert (error.value.key, error.value.where) == ("model.no_such_directory", "--model")
    assert str(error.value).endswith(model_source._hub_id_hint("meta-llama/Llama-3.1-8B"))
    assert "huggingface-cli download meta-llama/Llama-3.1-8B" in model_source._hub_id_hint("meta-llama/Llama-3.1-8B")
    (tmp_path / "runs").mkdir()
    for local in ("runs/round1", "./round1", str(tmp_path / "round1"), "round1"):
        assert model_source._hub_id_hint(local) == "", local  # a path under an existing directory is a typo


def test_hf_model_is_an_alias_of_base_model(tiny_hf, tmp_path):
    # on the command line, over a YAML that sets base_model
    assert compose("tiny_cpu", [f"hf_model={tiny_hf}"]).base_model == str(tiny_hf)
    assert "hf_model" not in compose("tiny_cpu", [f"hf_model={tiny_hf}"])
    # in a user's own YAML written before the rename (topr.yaml leaves base_model missing)
    (tmp_path / "old.yaml").write_text(f"defaults:\n  - topr\n  - _self_\nhf_model: {tiny_hf}\n")
    from nemo_topr.utils.arguments import CONF_DIR

    shutil.copy(CONF_DIR / "topr.yaml", tmp_path / "topr.yaml")
    assert compose("old", [], tmp_path).base_model == str(tiny_hf)
    (tmp_path / "both.yaml").write_text(f"defaults:\n  - topr\n  - _self_\nhf_model: {tiny_hf}\nbase_model: /other\n")
    with pytest.raises(ConfigError) as refused:
        compose("both", [], tmp_path)
    assert (refused.value.key, refused.value.where) == ("base_model.alias_disagrees", "hf_model")


@pytest.mark.slow
def test_resume_from_base_without_training_state_is_refused_before_training(tiny_hf, tmp_path):
    """`nemo-topr train`'s config check refuses it in one line, before Megatron's import, the data
    (absent here) or the run directory."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "nemo_topr.cli", "train", "--config-name",
                           "tiny_cpu", f"base_model={tiny_hf}", "resume_from_base=true", f"run_dir={tmp_path / 'run'}",
                           f"dataset.train_path={tmp_path / 'absent.jsonl'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 1 and lines == [
        "nemo-topr train: resume_from_base=true needs a checkpoint saved by training, with optimizer state; "
        f"Hugging Face directory {tiny_hf} has none (start from it without resume_from_base)"], lines
    assert "| megatron" not in proc.stderr  # -X importtime lists every module imported
    assert not (tmp_path / "run").exists()


HF_KIND = "a Hugging Face model directory (config.json, *.safetensors, tokenizer.json)"
MEGATRON_KINDS = ("a Megatron distributed checkpoint (latest_checkpointed_iteration.txt and iter_*/, with "
                  "hf_artifacts/ beside them, as `nemo-topr import` writes); one iter_* directory of it; a nemo-topr "
                  "run directory (config.yaml and checkpoints/); or RUN@ITERATION")
MISSING_MODEL = {  # verb: its arguments, with the model missing; how its errors name the model; the kinds it takes
    "train": (["base_model={model}", "dataset.train_path={data}", "run_dir={out}/run", "device=cpu"], "base_model=",
              f"one of: {HF_KIND}; {MEGATRON_KINDS}"),
    "score-logprobs": (["--model", "{model}", "--data", "{data}", "--out", "{out}/s.jsonl", "--device", "cpu"],
                       "--model ", f"one of: {HF_KIND}; {MEGATRON_KINDS}"),
    "generate": (["--model", "{model}", "--prompts", "gsm8k-test", "--limit", "1", "--out", "{out}/g.jsonl",
                  "--device", "cpu"], "--model ", HF_KIND),
    "eval": (["--model", "{model}", "--benchmark", "gsm8k", "--limit", "1", "--samples-out", "{out}/s.jsonl",
              "--out", "{out}/e.json", "--device", "cpu"], "--model ", HF_KIND),
    "verifier": (["score", "--model", "{model}", "--records", "{data}", "--out", "{out}/v.jsonl", "--device", "cpu"],
                 "--model ", HF_KIND),
    "export": (["--ckpt", "{model}", "--hf-out", "{out}/hf", "--device", "cpu"], "--ckpt ",
               f"one of: {MEGATRON_KINDS}"),
    "import": (["{model}", "{out}/ckpt"], "", HF_KIND),
}


@pytest.mark.parametrize("verb", list(MISSING_MODEL))
def test_each_verb_names_a_missing_model_by_its_own_option_and_makes_nothing(verb, tmp_path, capsys):
    """`eval --model typo` said "base model typo: no such directory", a key eval does not have, and
    left --out's new directory behind: the option the user typed, and nothing made. The kinds named
    are those the verb takes: import, generate, eval and verifier listed Megatron checkpoints and
    run directories, which they refuse, and export a Hugging Face directory."""
    import importlib

    from nemo_topr.cli import VERBS

    data = tmp_path / "graded.jsonl"
    shutil.copy(REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl", data)
    args, named, kinds = MISSING_MODEL[verb]
    model, out = tmp_path / "nothere", tmp_path / "out"
    argv = [arg.format(model=model, data=data, out=out) for arg in args]
    try:
        status = importlib.import_module(VERBS[verb][0]).main(argv)
        message = capsys.readouterr().err
    except UserError as error:  # rendered by cli.main
        status, message = error.exit_code, f"nemo-topr {verb}: {error}"
    assert status == 1
    expected = f"{named}{model}: no such directory (expected {kinds})"
    assert message.removeprefix(f"nemo-topr {verb}: ").strip() == expected
    assert [p.name for p in tmp_path.iterdir()] == ["graded.jsonl"]


ONLY_LLAMA = ("; nemo-topr converts, trains and exports LlamaForCausalLM models only (Llama 3 and 3.1 and their "
              "fine-tunes), the architecture its tests run")


@pytest.mark.parametrize("config", ['{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}',
                                    '{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}',
                                    '{"model_type": "llama"}'], ids=["gpt2", "qwen2", "no-architectures"])
def test_a_model_of_another_architecture_is_refused_for_megatron_and_kept_for_sampling(tmp_path, config):
    """Unchecked, GPT-2 would reach AutoBridge's multi-line ValueError after Megatron's imports;
    Qwen2, which Bridge converts, would run packing and export paths no test has run."""
    from nemo_topr.model.source import require_hugging_face

    model = placeholder_hf_model(tmp_path / "model", config)
    with pytest.raises(ModelSourceError) as refused:
        resolve(model)
    assert refused.value.key == "model.architecture.unsupported"
    assert require_hugging_face(model) == model  # generate / eval / verifier sample any causal LM with transformers


@pytest.mark.parametrize("verb", ["score-logprobs", "import", "export"])
def test_each_megatron_verb_refuses_another_architecture_in_one_line(verb, tmp_path, capsys):
    import importlib

    from nemo_topr.cli import VERBS

    data = tmp_path / "graded.jsonl"
    shutil.copy(REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl", data)
    model = placeholder_hf_model(tmp_path / "gpt2", '{"architectures": ["GPT2LMHeadModel"]}')
    args, named, _ = MISSING_MODEL[verb]
    argv = [arg.format(model=model, data=data, out=tmp_path / "out") for arg in args]
    try:
        status = importlib.import_module(VERBS[verb][0]).main(argv)
        message = capsys.readouterr().err.strip()
    except UserError as error:  # rendered by cli.main
        status, message = error.exit_code, f"nemo-topr {verb}: {error}"
    assert status == 1 and message == (f"nemo-topr {verb}: {named}{model}: {model / 'config.json'} names architecture "
                                       f"GPT2LMHeadModel{ONLY_LLAMA}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2", "graded.jsonl"]


def test_train_refuses_another_architecture_before_importing_megatron(tmp_path):
    model = placeholder_hf_model(tmp_path / "gpt2", '{"architectures": ["GPT2LMHeadModel"]}')
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "nemo_topr.cli", "train", "--config-name",
                           "tiny_cpu", f"base_model={model}", f"run_dir={tmp_path / 'run'}",
                           f"dataset.train_path={tmp_path / 'absent.jsonl'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 1 and lines == [
        f"nemo-topr train: base_model={model}: {model / 'config.json'} names architecture GPT2LMHeadModel"
        f"{ONLY_LLAMA}"], lines
    assert "| megatron" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_cut_short_since_its_save_is_named_by_every_verb_that_reads_it(tiny_hf, tmp_path, megatron_world):
    """A shard truncated after the save (a full disk, an interrupted copy): `score-logprobs`,
    `export` and `train` from it ended in torch's bare EOFError after Megatron's start-up; only a
    resume of the run itself said so (tests/training/test_checkpoint_repair.py)."""
    from tests.conftest import torch_dist_save

    from nemo_topr.model.source import check_intact
    from nemo_topr.training import export

    root = tmp_path / "ckpt"
    shutil.copytree(tiny_hf, root / "hf_artifacts", ignore=shutil.ignore_patterns("*.safetensors"))
    iteration = torch_dist_save(root / "iter_0000002", size=1000)
    (iteration / "metadata.json").write_text("{}\n")
    (iteration / "run_config.yaml").write_text("model: {}\n")
    (root / "latest_checkpointed_iteration.txt").write_text("2")
    check_intact(resolve(root))  # whole: nothing to say
    shard = next(iteration.glob("*.distcp"))
    whole = shard.stat().st_size
    with shard.open("r+b") as cut:
        cut.truncate(100)
    problem = (f"{root}: iteration 2 is damaged, cut short: {shard} (100 of {whole} bytes); restore it from a copy, "
               "or choose another saved iteration (saved: [2])")
    with pytest.raises(ModelSourceError) as refused:
        check_intact(resolve(root))
    assert str(refused.value) == f"base_model={problem}"
    with pytest.raises(ModelSourceError) as stopped:
        export.main(["--ckpt", str(root), "--hf-out", str(tmp_path / "hf"), "--device", "cpu"])
    assert str(stopped.value) == f"--ckpt {problem}" and not (tmp_path / "hf").exists()
    from nemo_topr.training.scoring import score_logprobs

    with pytest.raises(ModelSourceError) as refused:  # before the records (none here) or the model are read
        score_logprobs(root, tmp_path / "absent.jsonl", tmp_path / "scored.jsonl", device="cpu")
    assert str(refused.value) == f"--model {problem}"
    raw = compose("tiny_cpu", [f"base_model={root}", f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError) as refused:
        build_training_run(raw)
    assert str(refused.value) == f"base_model={problem}" and not (tmp_path / "run").exists()


def _edited_copy(tiny_hf, directory, **config_changes):
    copy = shutil.copytree(tiny_hf, directory)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, **config_changes}))
    return copy


TINY_LAYOUT = "hidden_size=64, intermediate_size=172"  # tiny_hf's (nemo_topr.model.providers.build_tiny_hf_llama)


@pytest.mark.parametrize("change, problem", [
    ({"num_hidden_layers": 3}, f"(num_hidden_layers=3, {TINY_LAYOUT}, tie_word_embeddings=False): missing: "
     "model.layers.2.input_layernorm.weight, model.layers.2.post_attention_layernorm.weight, "
     "model.layers.2.self_attn.q_proj.weight and 6 more"),
    ({"num_hidden_layers": 1}, f"(num_hidden_layers=1, {TINY_LAYOUT}, tie_word_embeddings=False): not in config.json's "
     "model: model.layers.1.input_layernorm.weight, model.layers.1.mlp.down_proj.weight, "
     "model.layers.1.mlp.gate_proj.weight and 6 more"),
    ({"tie_word_embeddings": True}, f"(num_hidden_layers=2, {TINY_LAYOUT}, tie_word_embeddings=True): not in "
     "config.json's model: lm_head.weight"),
    ({"intermediate_size": 128}, "(num_hidden_layers=2, hidden_size=64, intermediate_size=128, tie_word_embeddings="
     "False): other shapes: model.layers.0.mlp.gate_proj.weight [172, 64] where config.json gives [128, 64], "
     "model.layers.0.mlp.up_proj.weight [172, 64] where config.json gives [128, 64], "
     "model.layers.0.mlp.down_proj.weight [64, 172] where config.json gives [64, 128] and 3 more"),
], ids=["a-layer-more", "a-layer-fewer", "tied", "narrower"])
def test_hf_weights_that_are_not_config_jsons_model_are_refused(tiny_hf, tmp_path, change, problem):
    """A config.json with a layer more than the weights scored every record NaN, and `import`
    wrote uninitialised memory as that layer, both with exit 0; a layer fewer, or tied embeddings,
    dropped weights without a word (transformers calls them MISSING and UNEXPECTED); a narrower
    MLP ended in Bridge's traceback after the start-up."""
    from nemo_topr.model.source import check_intact

    copy = _edited_copy(tiny_hf, tmp_path / "edited", **change)
    with pytest.raises(ModelSourceError) as refused:
        check_intact(resolve(copy))
    assert str(refused.value) == (f"base_model={copy}: its weights are not the model its config.json describes "
                                  f"{problem}. Is config.json another model's, or a shard missing?")
    check_intact(resolve(tiny_hf))  # the model as saved: nothing to say


def test_train_score_logprobs_and_import_refuse_weights_config_json_does_not_describe(tiny_hf, tmp_path):
    from nemo_topr.training.import_checkpoint import import_hf
    from nemo_topr.training.scoring import score_logprobs

    copy = _edited_copy(tiny_hf, tmp_path / "edited", num_hidden_layers=1)
    with pytest.raises(ModelSourceError) as refused:
        score_logprobs(copy, tmp_path / "absent.jsonl", tmp_path / "scored.jsonl", device="cpu")
    assert (refused.value.key, refused.value.where) == ("model.weights.not_the_config", "--model")
    raw = compose("tiny_cpu", [f"base_model={copy}", f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError) as refused:
        build_training_run(raw)
    assert (refused.value.key, refused.value.where) == ("base_model.damaged", "base_model")
    with pytest.raises(ModelSourceError) as refused:
        import_hf(copy, tmp_path / "imported")
    assert (refused.value.key, refused.value.where) == ("model.weights.not_the_config", "HF_DIR")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edited"]


def test_hf_weights_bridge_cannot_read_or_cut_short_are_named(tiny_hf, tmp_path):
    """pytorch_model.bin alone passed for weights, then Bridge's FileNotFoundError traceback ("No
    .safetensors files or index found"); a shard the index names but not there, or one cut short,
    failed inside the load."""
    import torch
    from safetensors.torch import load_file

    from nemo_topr.model.source import check_intact

    def refusal(directory):
        with pytest.raises(ModelSourceError) as refused:
            check_intact(resolve(directory))
        return refused.value.key

    pickled = shutil.copytree(tiny_hf, tmp_path / "pickled")
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    assert refusal(pickled) == "model.weights.no_safetensors"
    sharded = shutil.copytree(tiny_hf, tmp_path / "sharded")
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "model.safetensors", "lm_head.weight": "model-2-of-2.safetensors"}}))
    assert refusal(sharded) == "model.weights.shards_missing"
    cut = shutil.copytree(tiny_hf, tmp_path / "cut")
    whole = (cut / "model.safetensors").stat().st_size
    with (cut / "model.safetensors").open("r+b") as shard:
        shard.truncate(whole - 1)
    assert refusal(cut) == "model.weights.cut_short"


@pytest.mark.parametrize("tied", [False, True])
def test_the_expected_llama_tensors_are_those_transformers_saves(tmp_path, tied):
    """A second implementation: the names and shapes transformers' LlamaForCausalLM writes (read
    with the safetensors library), for a head_dim apart from hidden/heads and grouped queries."""
    from safetensors import safe_open
    from transformers import LlamaConfig, LlamaForCausalLM

    from nemo_topr.model.hf_weights import llama_weight_shapes

    config = LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=tied)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as saved:
        shapes = {name: list(saved.get_slice(name).get_shape()) for name in saved.keys()}
    written = json.loads((tmp_path / "config.json").read_text())
    assert llama_weight_shapes(written) == shapes
    assert ("lm_head.weight" in shapes) is not tied and shapes["model.layers.1.self_attn.k_proj.weight"] == [16, 48]


def _checkpoint_with_config(tiny_hf, root, run_config):
    from tests.conftest import torch_dist_save

    shutil.copytree(tiny_hf, root / "hf_artifacts", ignore=shutil.ignore_patterns("*.safetensors"))
    iteration = torch_dist_save(root / "iter_0000000")
    (iteration / "metadata.json").write_text("{}\n")
    (iteration / "run_config.yaml").write_text(run_config)
    (root / "latest_checkpointed_iteration.txt").write_text("0")
    return root


def test_a_checkpoints_hf_config_with_other_numerics_than_its_save_is_refused(tiny_hf, tmp_path):
    """Only the six shape keys were compared: a hf_artifacts/config.json with another rope base and
    norm epsilon (a Llama 3 config copied beside a Llama 3.1 checkpoint, as the missing-hf_artifacts
    message advises) scored every record differently, with exit 0."""
    saved = ("model:\n  num_layers: 2\n  layernorm_epsilon: 1.0e-05\n  rotary_base: 500000.0\n  rope_scaling: false\n"
             "  share_embeddings_and_output_weights: false\n  kv_channels: 16\n")
    root = _checkpoint_with_config(tiny_hf, tmp_path / "ckpt", saved)
    assert resolve(root).iteration == 0  # the config as imported: nothing to say
    config_path = root / "hf_artifacts" / "config.json"
    config = json.loads(config_path.read_text())
    config.update(rms_norm_eps=0.01, rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0})
    config_path.write_text(json.dumps(config))
    with pytest.raises(ModelSourceError) as refused:
        resolve(root)
    assert str(refused.value) == (
        f"base_model={root}: architecture mismatch between {root / 'iter_0000000'} and its HF config: "
        f"layernorm_epsilon: checkpoint 1e-05, {root / 'hf_artifacts'}/config.json rms_norm_eps=0.01; "
        f"rotary_base: checkpoint 500000.0, {root / 'hf_artifacts'}/config.json rope_theta=10000.0; "
        f"rope_scaling: checkpoint False, {root / 'hf_artifacts'}/config.json rope_type=True")


@pytest.mark.parametrize("file, content, key", [
    ("hf_artifacts/config.json", '{"architectures": ["LlamaForCausalLM"], ', "model.config_json.not_json"),
    ("iter_0000000/run_config.yaml", "model: [unclosed\n", "model.run_config.not_yaml"),
    ("iter_0000000/run_config.yaml", "model: 3\n", "model.run_config.not_a_mapping"),
])
def test_a_checkpoints_unreadable_config_is_refused(tiny_hf, tmp_path, file, content, key):
    """Both ended in a traceback (JSONDecodeError, yaml's ParserError) from every verb."""
    root = _checkpoint_with_config(tiny_hf, tmp_path / "ckpt", "model:\n  num_layers: 2\n")
    (root / file).write_text(content)
    with pytest.raises(ModelSourceError) as refused:
        resolve(root)
    assert (refused.value.key, refused.value.where) == (key, "base_model")


def test_a_folder_of_exported_iterations_is_named_as_one(tiny_hf, tmp_path):
    """`export --all-iterations` writes HF_OUT/iter_NNNNNNN, each a Hugging Face model; given as a
    model, the folder was called an unfinished Megatron save ("no latest_checkpointed_iteration.txt")."""
    for iteration in ("iter_0000002", "iter_0000010"):
        shutil.copytree(tiny_hf, tmp_path / "exports" / iteration)
    with pytest.raises(ModelSourceError) as refused:
        resolve(tmp_path / "exports", named="--model ")
    assert (refused.value.key, refused.value.where) == ("model.exports_folder", "--model")
    assert str(refused.value).endswith(str(tmp_path / "exports" / "iter_0000010"))  # the latest, offered
    assert resolve(tmp_path / "exports" / "iter_0000010").kind == "huggingface"
    # export reads Megatron checkpoints: "give one of them" led on to "already a Hugging Face directory"
    with pytest.raises(ModelSourceError) as refused:
        export.main(["--ckpt", str(tmp_path / "exports"), "--hf-out", str(tmp_path / "again"), "--device", "cpu"])
    assert (refused.value.key, refused.value.where) == ("model.exports_folder.nothing_to_export", "--ckpt")
