"""Run configs: YAML + key=value overrides onto Bridge's ConfigContainer, typos rejected."""

import json

import pytest
from omegaconf import OmegaConf

from nemo_topr.training.config import ConfigError, build_training_run, compose


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory, megatron_world):
    from nemo_topr.model import build_tiny_hf_llama
    from nemo_topr.tiny_tokenizer import build_tiny_tokenizer

    return build_tiny_hf_llama(tmp_path_factory.mktemp("hf") / "tiny", build_tiny_tokenizer())


def _run(tiny_hf, tmp_path, *overrides):
    raw = compose("tiny_cpu", [f"hf_model={tiny_hf}", f"run_dir={tmp_path}", *overrides])
    return build_training_run(raw)


def test_yaml_and_overrides_land_on_the_bridge_container(tiny_hf, tmp_path):
    run = _run(tiny_hf, tmp_path, "optimizer.lr=0.01", "objective.variant=tis", "model.seq_length=256",
               "train.exit_interval=7")  # exit_interval is not in the YAML: any Bridge field works
    container = run.container
    assert container.optimizer.lr == 0.01 and container.optimizer.weight_decay == 0.0
    assert container.train.exit_interval == 7 and container.train.global_batch_size == 4
    assert container.model.seq_length == container.dataset.seq_length == 256  # interpolated
    assert container.model.calculate_per_token_loss
    assert run.objective.variant == "tis" and run.objective.ratio_level == "sequence"
    assert container.checkpoint.save == container.checkpoint.load == str(tmp_path / "checkpoints")
    assert container.checkpoint.pretrained_checkpoint == str(tiny_hf)
    assert container.model.num_query_groups == 2  # architecture from the HF directory


@pytest.mark.parametrize("override, expected", [
    ("optimizer.lrr=0.1", "optimizer.lrr.*did you mean optimizer.lr"),
    ("optimiser.lr=0.1", "unknown config section 'optimiser'.*optimizer"),
    ("objective.variantt=tis", "objective.variantt.*did you mean objective.variant"),
    ("model.calculate_per_token_loss=false", "calculate_per_token_loss must stay true"),
    ("dataset.seq_length=128", r"dataset.seq_length \(128\) must equal model.seq_length"),
])
def test_bad_keys_are_clear_errors(tiny_hf, tmp_path, override, expected):
    with pytest.raises(ConfigError, match=expected):
        _run(tiny_hf, tmp_path, override)


def test_bad_values_and_names_are_clear_errors(tiny_hf, tmp_path):
    with pytest.raises(ValueError, match="variant must be one of"):
        _run(tiny_hf, tmp_path, "objective.variant=grpo")
    with pytest.raises(ConfigError, match="no config 'nope'"):
        compose("nope")
    with pytest.raises(ConfigError, match="key=value"):
        compose("tiny_cpu", ["optimizer.lr"])
    with pytest.raises(FileNotFoundError, match="no config.json"):
        _run(tmp_path, tmp_path)


def test_resolved_config_is_saved_in_the_run_dir(tiny_hf, tmp_path):
    from nemo_topr.demo import build_graded_records
    from nemo_topr.training.recipe import prepare

    data = tmp_path / "graded.jsonl"
    records = [{**r, "behavior_logprob": -50.0} for r in build_graded_records(4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    run = _run(tiny_hf, tmp_path / "run", f"dataset.train_path={data}", "optimizer.lr=0.02")
    summary = prepare(run)
    saved = OmegaConf.load(tmp_path / "run" / "config.yaml")
    assert saved.optimizer.lr == 0.02 and saved.dataset.train_path == str(data)
    assert summary["records_in"] == 12 and run.container.train.train_iters * 4 == summary["rows"]
