"""`base_model=`: kind detection of a Hugging Face directory and the errors for what is not a
model (the Megatron kinds, from a real `nemo-topr import`, are in test_checkpoint_route.py)."""

import shutil
import subprocess
import sys

import pytest
from conftest import REPO, placeholder_hf_model

from nemo_topr.model_source import ModelSourceError, resolve
from nemo_topr.training.config import ConfigError, build_training_run, compose


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    from nemo_topr.model import build_tiny_hf_llama
    from nemo_topr.tiny_tokenizer import build_tiny_tokenizer

    corpus = ["Question: 12 apples and 30 more?\nAnswer: 42", "The answer is 7."] * 20
    return build_tiny_hf_llama(tmp_path_factory.mktemp("hf") / "tiny", build_tiny_tokenizer(corpus=corpus, vocab_size=300))


def test_a_hugging_face_directory_is_detected(tiny_hf):
    source = resolve(tiny_hf)
    assert (source.kind, source.hf_dir, source.checkpoint, source.is_megatron) == ("huggingface", tiny_hf, None, False)
    assert source.describe() == f"Hugging Face directory {tiny_hf}"


def test_a_hugging_face_directory_without_tokenizer_is_an_error(tiny_hf, tmp_path):
    copy = shutil.copytree(tiny_hf, tmp_path / "no_tokenizer")
    (copy / "tokenizer.json").unlink()
    with pytest.raises(ModelSourceError, match=r"no_tokenizer: no tokenizer \(tokenizer.json or tokenizer.model"):
        resolve(copy)


def test_a_config_without_weights_is_not_a_model(tiny_hf, tmp_path):
    copy = shutil.copytree(tiny_hf, tmp_path / "config_only")
    (copy / "model.safetensors").unlink()
    with pytest.raises(ModelSourceError, match=r"has config.json but no weights"):
        resolve(copy)


@pytest.mark.parametrize("make, message", [
    (lambda d: None, "no such directory"),
    (lambda d: d.mkdir(), "not a model directory; expected one of: a Hugging Face model directory"),
    (lambda d: (d / "data").mkdir(parents=True), "not a model directory"),
])
def test_a_directory_of_no_known_kind_names_what_was_expected(tmp_path, make, message):
    target = tmp_path / "somewhere"
    make(target)
    with pytest.raises(ModelSourceError, match=message) as error:
        resolve(target)
    assert "RUN@ITERATION" in str(error.value)  # the message lists every accepted kind


def test_a_hub_id_is_named_as_one_with_how_to_fetch_it(tmp_path, monkeypatch):
    """Nothing is downloaded; the first thing a user tries is often the model's hub ID."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSourceError, match=r"^--model meta-llama/Llama-3.1-8B: no such directory \(expected .*\)\. "
                                               r"If meta-llama/Llama-3.1-8B is a Hugging Face hub ID: .*never downloads.*"
                                               r"`huggingface-cli download meta-llama/Llama-3.1-8B --local-dir DIR`"):
        resolve("meta-llama/Llama-3.1-8B", named="--model ")
    (tmp_path / "runs").mkdir()
    for local in ("runs/round1", "./round1", str(tmp_path / "round1"), "round1"):
        with pytest.raises(ModelSourceError, match="no such directory") as error:
            resolve(local)
        assert "hub ID" not in str(error.value), local  # a path under an existing directory is a typo, not an ID


def test_a_file_given_as_the_model_is_named_a_file(tiny_hf):
    with pytest.raises(ModelSourceError, match=rf"base_model={tiny_hf / 'config.json'}: a file, not a directory; "
                                               rf"give the directory that holds it \({tiny_hf}\?\)"):
        resolve(tiny_hf / "config.json")


def test_a_nemo2_checkpoint_fails_with_the_conversion_route(tmp_path):
    for sub in ("context", "weights"):
        (tmp_path / "nemo2" / sub).mkdir(parents=True)
    with pytest.raises(ModelSourceError, match=r"NeMo 2 checkpoint.*llm.export_ckpt.*nemo-topr import HF_DIR OUT"):
        resolve(tmp_path / "nemo2")


def test_run_at_iteration_needs_a_run_directory(tmp_path):
    with pytest.raises(ModelSourceError, match=r"not a nemo-topr run directory \(config.yaml and checkpoints/"):
        resolve(f"{tmp_path}@100")


def test_hf_model_is_an_alias_of_base_model(tiny_hf, tmp_path):
    # on the command line, over a YAML that sets base_model
    assert compose("tiny_cpu", [f"hf_model={tiny_hf}"]).base_model == str(tiny_hf)
    assert "hf_model" not in compose("tiny_cpu", [f"hf_model={tiny_hf}"])
    # in a user's own YAML written before the rename (topr.yaml leaves base_model missing)
    (tmp_path / "old.yaml").write_text(f"defaults:\n  - topr\n  - _self_\nhf_model: {tiny_hf}\n")
    from nemo_topr.training.config import CONF_DIR

    shutil.copy(CONF_DIR / "topr.yaml", tmp_path / "topr.yaml")
    assert compose("old", [], tmp_path).base_model == str(tiny_hf)
    (tmp_path / "both.yaml").write_text(f"defaults:\n  - topr\n  - _self_\nhf_model: {tiny_hf}\nbase_model: /other\n")
    with pytest.raises(ConfigError, match="base_model=/other and hf_model=.* disagree"):
        compose("both", [], tmp_path)


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
MEGATRON_KINDS = ("a Megatron distributed checkpoint (latest_checkpointed_iteration.txt and iter_*/, with hf_artifacts/ "
                  "beside them, as `nemo-topr import` writes); one iter_* directory of it; a nemo-topr run directory "
                  "(config.yaml and checkpoints/); or RUN@ITERATION")
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
    except SystemExit as stop:
        status, message = 1, str(stop.code)
    assert status == 1
    assert message.removeprefix(f"nemo-topr {verb}: ").strip() == f"{named}{model}: no such directory (expected {kinds})"
    assert [p.name for p in tmp_path.iterdir()] == ["graded.jsonl"]


ONLY_LLAMA = ("; nemo-topr converts, trains and exports LlamaForCausalLM models only (Llama 3 and 3.1 and their "
              "fine-tunes), the architecture its tests run")


@pytest.mark.parametrize("config, found", [
    ('{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}', "names architecture GPT2LMHeadModel"),
    ('{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}', "names architecture Qwen2ForCausalLM"),
    ('{"model_type": "llama"}', 'names no architecture ("architectures")'),
])
def test_a_model_of_another_architecture_is_refused_for_megatron_and_kept_for_sampling(tmp_path, config, found):
    """GPT-2 used to reach AutoBridge's multi-line ValueError after Megatron's imports; Qwen2,
    which Bridge converts, would run packing and export paths no test has run."""
    from nemo_topr.model_source import require_hugging_face

    model = placeholder_hf_model(tmp_path / "model", config)
    with pytest.raises(ModelSourceError) as refused:
        resolve(model)
    assert str(refused.value) == f"base_model={model}: {model / 'config.json'} {found}{ONLY_LLAMA}"
    assert require_hugging_face(model) == model  # generate / eval / verifier sample any causal LM with transformers


def test_a_config_json_that_is_not_an_object_is_named(tmp_path):
    model = placeholder_hf_model(tmp_path / "model", '["LlamaForCausalLM"]')
    with pytest.raises(ModelSourceError, match=r"config.json is not a JSON object"):
        resolve(model)


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
    except SystemExit as stop:
        status, message = 1, str(stop.code)
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
    resume of the run itself said so (tests/test_checkpoint_repair.py)."""
    from conftest import torch_dist_save

    from nemo_topr.model_source import check_intact
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
    with pytest.raises(SystemExit) as stopped:
        export.main(["--ckpt", str(root), "--hf-out", str(tmp_path / "hf"), "--device", "cpu"])
    assert stopped.value.code == f"nemo-topr export: --ckpt {problem}" and not (tmp_path / "hf").exists()
    from nemo_topr.training.scoring import score_logprobs

    with pytest.raises(ModelSourceError) as refused:  # before the records (none here) or the model are read
        score_logprobs(root, tmp_path / "absent.jsonl", tmp_path / "scored.jsonl", device="cpu")
    assert str(refused.value) == f"--model {problem}"
    raw = compose("tiny_cpu", [f"base_model={root}", f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError) as refused:
        build_training_run(raw)
    assert str(refused.value) == f"base_model={problem}" and not (tmp_path / "run").exists()
