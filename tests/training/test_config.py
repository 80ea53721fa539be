"""Run configs: YAML + key=value overrides onto Bridge's ConfigContainer, typos rejected."""

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import REPO
from nemo_topr.errors import UserError
from nemo_topr.training.config import build_training_run, compose
from nemo_topr.training.config_error import ConfigError
from nemo_topr.training.validation import check_config
from nemo_topr.training.validation import check_own_values


@contextlib.contextmanager
def raises_problem(key: str, where: str) -> Iterator[pytest.ExceptionInfo[ConfigError]]:
    """Expects the ConfigError of problem `key` about config key `where` (its words:
    tests/golden/refusals.txt)."""
    with pytest.raises(ConfigError) as raised:
        yield raised
    assert (raised.value.key, raised.value.where) == (key, where)


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory, megatron_world):
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    return build_tiny_hf_llama(tmp_path_factory.mktemp("hf") / "tiny", build_tiny_tokenizer())


@pytest.fixture(scope="module")
def tiny_hf_8_layers(tmp_path_factory, megatron_world):
    """A base model deep enough for 2 pipeline stages x 2 virtual stages."""
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    return build_tiny_hf_llama(tmp_path_factory.mktemp("hf8") / "tiny", build_tiny_tokenizer(), num_layers=8)


def _run(tiny_hf, tmp_path, *overrides):
    raw = compose("tiny_cpu", [f"hf_model={tiny_hf}", f"run_dir={tmp_path}", *overrides])
    return build_training_run(raw)


def test_a_resume_reads_an_unset_key_as_the_value_the_container_holds(tiny_hf, tmp_path):
    """run_state.UNSET_MEANS, which a resume compares an unset key as, against Bridge's container
    built from the preset, where those keys are unset."""
    from omegaconf import OmegaConf

    from nemo_topr.training.run_state import UNSET_MEANS

    run = _run(tiny_hf, tmp_path)
    for key, value in UNSET_MEANS.items():
        assert OmegaConf.select(run.raw, key, default=None) is None, key
        section, name = key.split(".")
        assert getattr(getattr(run.container, section), name) == value, key


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


def _megatron_base(hf_dir, root):
    """A checkpoint root shaped as `nemo-topr import` writes one, with `hf_dir`'s config and tokenizer
    in hf_artifacts/ (what model_source inspects; its one tensor is no model's)."""
    import shutil

    from tests.conftest import torch_dist_save

    saved = torch_dist_save(root / "iter_0000000")
    (saved / "metadata.json").write_text("{}\n")
    (saved / "run_config.yaml").write_text("model: {}\n")
    (root / "latest_checkpointed_iteration.txt").write_text("0")
    shutil.copytree(hf_dir, root / "hf_artifacts", ignore=shutil.ignore_patterns("*.safetensors"))
    return root


@pytest.mark.parametrize("kind", ["huggingface", "megatron"])
def test_an_architecture_key_other_than_the_base_models_is_refused_before_anything_is_written(
        tiny_hf, tmp_path, monkeypatch, capsys, kind):
    """model.num_layers=1 from a 2-layer base: from a Hugging Face directory train exited 0 having
    trained a 1-layer model (layer 1 dropped), whose checkpoints export refused (architecture
    mismatch); from a Megatron base it ended in a 431-line traceback (CheckpointingException: Global
    shape mismatch) after the run directory was written. plan, which reads the base's config, took
    the override as the architecture. The base model's own value is no change."""
    from nemo_topr import cli
    from nemo_topr.training.recipe import main

    if kind == "huggingface":
        base, described = tiny_hf, f"Hugging Face directory {tiny_hf}"
    else:
        base = _megatron_base(tiny_hf, tmp_path / "imported")
        described = (f"Megatron distributed checkpoint {base}, iteration 0 ({base / 'iter_0000000'}; HF config from "
                     f"{base / 'hf_artifacts'})")
    expected = (f"model.num_layers=1 differs from the base model's num_layers=2 ({described}): a run trains the base "
                "model's weights, whose shapes these keys set, so it would drop or misshape some of them; drop the "
                "override (the architecture comes from base_model)")
    data = _graded_data(tmp_path / "scored.jsonl", records=2)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(UserError) as stop:
        main(["--config-name", "tiny_cpu", f"base_model={base}", f"dataset.train_path={data}",
              f"run_dir={tmp_path / 'run'}", "model.num_layers=1"])
    assert str(stop.value) == expected
    assert not (tmp_path / "run").exists()
    assert cli.main(["plan", "tiny_cpu", f"base_model={base}", "model.num_layers=1", "--gpus-per-node", "1"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == f"nemo-topr plan: {expected}"
    with pytest.raises(ConfigError, match=r"^model.num_layers=3, model.num_query_groups=4 differ from the base "
                                          r"model's num_layers=2, num_query_groups=2 \("):
        _run(base, tmp_path / "run", "model.num_layers=3", "model.num_query_groups=4")
    model = _run(base, tmp_path / "run", "model.num_layers=2", "model.hidden_size=64").container.model
    assert (model.num_layers, model.hidden_size) == (2, 64)


@pytest.mark.parametrize("overrides, batched, overlapped", [
    (["model.pipeline_model_parallel_size=2"], True, False),  # no virtual stages: Megatron's defaults
    (["model.pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size=2"], False, True),
    (["model.pipeline_model_parallel_size=4", "model.virtual_pipeline_model_parallel_size=2"], False, True),
    (["model.pipeline_model_parallel_size=4", "model.virtual_pipeline_model_parallel_size=2",
      "model.batch_p2p_comm=true"], True, False),  # two neighbours: a config's own choice is kept
    (["model.pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size=2",
      "model.overlap_p2p_comm=false"], False, False),
])
def test_an_interleaved_pipeline_gets_unbatched_p2p(tiny_hf_8_layers, tmp_path, overrides, batched, overlapped):
    """Megatron's batched p2p crosses activations and gradients at PP = 2 with virtual stages
    (tests/training/test_step.py::test_the_interleaved_pipeline_gives_the_reference_loss_metrics_and_gradients
    runs the step so); the recipe chooses unbatched p2p for any interleaved layout, as Bridge's
    CommOverlapConfig does, and refuses batched p2p at PP = 2."""
    model = _run(tiny_hf_8_layers, tmp_path, *overrides).container.model
    assert (model.batch_p2p_comm, model.overlap_p2p_comm) == (batched, overlapped)


def test_batched_p2p_at_pp2_with_virtual_stages_is_refused(tiny_hf_8_layers, tmp_path):
    with pytest.raises(ConfigError, match=r"^model.batch_p2p_comm=true with model.pipeline_model_parallel_size=2 "
                                          r"and virtual pipeline stages: .*NVIDIA/Megatron-LM#750"):
        _run(tiny_hf_8_layers, tmp_path, "model.pipeline_model_parallel_size=2",
             "model.virtual_pipeline_model_parallel_size=2", "model.batch_p2p_comm=true")


@pytest.mark.parametrize("overrides, problem", [
    (["model.pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size=1"], "below_2"),
    (["model.virtual_pipeline_model_parallel_size=2"], "without_pipeline"),
])
def test_virtual_stages_need_two_chunks_and_a_pipeline(tiny_hf, tmp_path, overrides, problem):
    """Through `finetune()` on CPU these failed after the data was prepared: VP=1 at PP=2 in
    Megatron's interleaved schedule at the first step (AssertionError: a data iterator per model
    chunk), VP=2 at PP=1 in its set-up (RuntimeError: pipeline-model-parallel size should be
    greater than 1); `train` refuses both before."""
    vp = "model.virtual_pipeline_model_parallel_size"
    with raises_problem(f"{vp}.{problem}", vp):
        _run(tiny_hf, tmp_path, *overrides)
    assert not list(tmp_path.iterdir())  # nothing of the run was written


def test_a_cpu_run_whose_attention_cannot_fit_in_memory_is_refused(tiny_hf, tmp_path):
    """Unchecked, the first forward would end in the CPU allocator's traceback, after the data was
    prepared and the run directory written (`DefaultCPUAllocator: can't allocate memory: you tried
    to allocate 10000000000000000 bytes`, the [L, L] mask alone)."""
    with pytest.raises(ConfigError, match=r"^model.seq_length=100000000 with train.micro_batch_size=2 on the CPU: one "
                                          r"layer's attention takes at least 600,266.50 TiB per rank"):
        _run(tiny_hf, tmp_path, "model.seq_length=100000000")
    assert not list(tmp_path.iterdir())


def test_cpu_scoring_whose_attention_cannot_fit_in_memory_is_refused(tiny_hf, tmp_path):
    """score-logprobs holds the same attention per row of a batch: 4 rows x 100,000² x 33 B =
    1.20 TiB, refused before the model is built."""
    from nemo_topr.training.scoring import score_logprobs

    data = _graded_data(tmp_path / "graded.jsonl", records=2)
    with pytest.raises(ConfigError, match=r"^--seq-length 100000 with --rows-per-batch 4 on the CPU: one layer's "
                                          r"attention takes at least 1.20 TiB per rank .* or use a GPU$"):
        score_logprobs(tiny_hf, data, tmp_path / "out.jsonl", seq_length=100_000, rows_per_batch=4, device="cpu")
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("override, expected", [
    ("optimizer.lrr=0.1", "optimizer.lrr.*did you mean optimizer.lr"),
    ("optimiser.lr=0.1", "unknown config section 'optimiser'.*optimizer"),
    ("objective.variantt=tis", "objective.variantt.*did you mean objective.variant"),
    ("model.calculate_per_token_loss=false", "calculate_per_token_loss must stay true"),
    ("dataset.seq_length=128", r"dataset.seq_length \(128\) must equal model.seq_length"),
    # the checks `plan` and `submit --dry-run` share (tests/cluster/test_plan.py, MISTYPED_OVERRIDES)
    ("optimizer.lr=abc", r"optimizer.lr='abc' is not a valid value"),
    ("train.global_batch_size=0", "train.global_batch_size=0 must be at least 1"),
    ("model.tensor_model_parallel_size=0", "model.tensor_model_parallel_size=0 must be at least 1"),
    # a non-finite value passed the bounds (NaN compares false); Adam's decay rates had none
    ("optimizer.lr=.inf", r"^optimizer.lr=inf must be a finite number$"),
    ("model.init_method_std=.nan", r"^model.init_method_std=nan must be a finite number$"),
    ("optimizer.adam_beta1=1.0", r"^optimizer.adam_beta1=1.0 must be below 1$"),
    ("scheduler.lr_warmup_iters=-5", r"^scheduler.lr_warmup_iters=-5 must be at least 0$"),
    # a word outside a choice: too_long=foo is refused, not read as drop
    ("dataset.too_long=foo", r"^dataset.too_long='foo' is not a valid value: expected 'error' or 'drop' or None$"),
    ("dataset.extra_columns=metadata", r"^dataset.extra_columns='metadata' is not a valid value: expected 'error' or "
                                       r"'meta'$"),
    # named where it was written, not as the dataset.seq_length that interpolates it
    ("model.seq_length=abc", r"^model.seq_length='abc' is not a valid value: expected int$"),
    # records carry sum log mu per completion: the per-token ratio used to fail at the first step
    ("objective.ratio_level=token", r"^objective.ratio_level=token needs log mu of every completion token, and "
                                    r"records carry one behavior_logprob per completion"),
    # any other value was taken for true: "maybe" resumed the base run's optimizer and iteration count
    ("resume_from_base=maybe", r"^resume_from_base='maybe' must be true or false$"),
    ("resume_from_base='false'", r"^resume_from_base='false' must be true or false$"),
    # below tiny_cpu's min_lr (3e-3): Megatron's scheduler asserted it after the data was prepared
    ("optimizer.lr=1e-3", r"^optimizer.lr=0.001 is below optimizer.min_lr=0.003, where the schedule decays to; set "
                          r"optimizer.min_lr=0.001 too"),
    # a whole section replaced: a TypeError traceback from the checks, or Bridge's after the data
    ("train=5", r"^train=5: train is a section; set its keys, as train.KEY=VALUE$"),
    ("objective=5", r"^objective=5: objective is a section; set its keys, as objective.KEY=VALUE$"),
    ("logger=abc", r"^logger='abc': logger is a section; set its keys, as logger.KEY=VALUE$"),
    # a key of a section, or a typo of ours, given at the top: unknown, with the key it may mean
    ("epochs=2", r"^unknown config key epochs\b.*did you mean dataset\.epochs\b"),
    ("lr=0.1", r"^unknown config key lr\b.*did you mean optimizer\.lr\b"),
    ("run-dir=x", r"^unknown config key run-dir\b.*did you mean run_dir\b"),
    ("foo=1", r"^unknown config key foo\b"),
    # Bridge's and Megatron's own set-up checks, which raised on every rank after the run dir was written
    ("rng.seed=0", r"^rng.seed=0 must be at least 1$"),
    ("model.recompute_granularity=full", r"^model.recompute_granularity=full needs model.recompute_method=block or "
                                         r"uniform \(and model.recompute_num_layers\); got recompute_method=None$"),
    ("device=gpu", r"^device must be one of cuda, cpu; got 'gpu'$"),
    # names Bridge converts by its tables: the dtype was kept as a string, the activation raised on every rank
    ("model.params_dtype=bf17", r"^model.params_dtype='bf17' is not a dtype Bridge knows: .*\bbf16\b.*\bfp32\b"),
    ("model.activation_func=gelu_typo", r"^model.activation_func='gelu_typo' is not an activation function Bridge "
                                        r"knows: "
                                        r".*\bgelu\b.*\bsilu\b"),
])
def test_bad_keys_are_clear_errors(tiny_hf, tmp_path, override, expected):
    with pytest.raises(ConfigError, match=expected):
        _run(tiny_hf, tmp_path, override)


def test_the_weight_decay_given_is_the_one_megatrons_scheduler_applies(tiny_hf, tmp_path):
    """Megatron's parameter scheduler sets every group's weight decay from the scheduler's start
    and end values at each step (optimizer_param_scheduler.py, get_wd), never from
    optimizer.weight_decay: with our defaults (0 both) optimizer.weight_decay=0.1 trained with none.
    A constant style takes optimizer.weight_decay, as Megatron-LM's arguments do; a schedule
    needs both ends; a constant style with other ends is refused rather than one of them dropped."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    def decay(*overrides):
        scheduler = _run(tiny_hf, tmp_path, *overrides).container.scheduler
        built = OptimizerParamScheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), init_lr=0.0,
                                        max_lr=1.0, min_lr=1.0, lr_warmup_steps=0, lr_decay_steps=10,
                                        lr_decay_style="constant", start_wd=scheduler.start_weight_decay,
                                        end_wd=scheduler.end_weight_decay, wd_incr_steps=10,
                                        wd_incr_style=scheduler.weight_decay_incr_style)
        built.step(5)
        return built.get_wd()

    assert decay() == 0.0
    assert decay("optimizer.weight_decay=0.1") == 0.1
    assert decay("scheduler.weight_decay_incr_style=linear", "scheduler.start_weight_decay=0.0",
                 "scheduler.end_weight_decay=0.2") == pytest.approx(0.1)  # half way
    with raises_problem("scheduler.weight_decay_ends.unset", "scheduler.end_weight_decay"):
        _run(tiny_hf, tmp_path, "scheduler.weight_decay_incr_style=linear", "scheduler.start_weight_decay=0.0")
    with raises_problem("scheduler.weight_decay_ends.with_constant_style", "scheduler.start_weight_decay"):
        _run(tiny_hf, tmp_path, "scheduler.start_weight_decay=0.1")


def test_bad_values_and_names_are_clear_errors(tiny_hf, tmp_path):
    with pytest.raises(ValueError, match="variant must be one of"):
        _run(tiny_hf, tmp_path, "objective.variant=grpo")
    with raises_problem("config.not_found", "config"):
        compose("nope")
    with raises_problem("overrides.not_key_value", "optimizer.lr"):
        compose("tiny_cpu", ["optimizer.lr"])
    with pytest.raises(ConfigError, match="not a model directory; expected one of"):  # nemo_topr.model.source
        _run(tmp_path, tmp_path)
    # each missing key with its own example (run_dir's named base_model's)
    with raises_problem("config.required_unset", "base_model, run_dir"):
        check_config(compose("tiny_cpu", ["base_model=null", "run_dir=null"]))


@pytest.mark.parametrize("overrides, expected", [
    (["dataset.split="], "dataset.split=: an empty value (an unset shell variable?); give one, or dataset.split=null "
                         "for none"),
    (["train.global_batch_size="], "train.global_batch_size=: an empty value (an unset shell variable?); give one"),
    (["hf_model=/models/b", "base_model=/models/a"], "base_model=/models/a and hf_model=/models/b disagree; hf_model "
                                                     "is an alias of base_model: set one"),
], ids=["empty", "empty-needs-a-value", "alias-and-key"])
def test_an_empty_override_or_the_model_named_twice_is_refused(overrides, expected):
    """OmegaConf read `KEY=` as null: plan planned its own default batch of 8 for the preset's 64,
    train ended in a TypeError. `base_model=A hf_model=B` trained whichever came last (the alias),
    where a YAML holding both is refused. Another key given twice keeps its last value, as in Hydra."""
    with pytest.raises(ConfigError) as refused:
        compose("tiny_cpu", overrides)
    assert str(refused.value) == expected
    twice = compose("tiny_cpu", ["train.global_batch_size=64", "optimizer.lr=1e-5", "train.global_batch_size=8"])
    assert twice.train.global_batch_size == 8
    assert compose("tiny_cpu", ["base_model=/models/a", "hf_model=/models/a"]).base_model == "/models/a"


@pytest.mark.parametrize("key, expected", [
    ("dataset.shared_prefix", "dataset.shared_prefix=: an empty value (an unset shell variable?); give one"),
    ("dataset.packed", "dataset.packed=: an empty value (an unset shell variable?); give one"),
    ("objective.baseline", "objective.baseline=: an empty value (an unset shell variable?); give one"),
    ("resume_from_base", "resume_from_base=: an empty value (an unset shell variable?); give one"),
    ("dataset.too_long", "dataset.too_long=: an empty value (an unset shell variable?); give one, or "
                         "dataset.too_long=null for none"),
    ("objective.pos_lower", "objective.pos_lower=: an empty value (an unset shell variable?); give one, or "
                            "objective.pos_lower=null for none"),
    ("model.fp8", "model.fp8=: an empty value (an unset shell variable?); give one, or model.fp8=null for none"),
], ids=["shared_prefix", "packed", "baseline", "resume_from_base", "too_long", "pos_lower", "fp8"])
def test_an_empty_override_offers_null_only_for_a_key_that_takes_it(key, expected):
    """`dataset.shared_prefix=` was answered "give one, or dataset.shared_prefix=null for none", and
    that null was then refused (expected bool): null is offered where the key's annotation admits
    it, and the checks `train`, `plan` and `submit` share accept what is offered."""
    from nemo_topr.training.config import check_values

    with pytest.raises(ConfigError) as refused:
        compose("tiny_cpu", [f"{key}="])
    assert str(refused.value) == expected
    values = OmegaConf.to_container(compose("tiny_cpu", [f"{key}=null"]), resolve=True)
    if expected.endswith("null for none"):
        check_values(values)
    else:
        with raises_problem(f"{key}.not_boolean" if key == "resume_from_base" else f"{key}.wrong_type", key):
            check_values(values)


def test_shared_prefix_with_unpacked_rows_is_refused_before_megatron_and_by_plan(tmp_path):
    """`train` ended in a 20-line traceback (ToprDatasetConfig.prepare's ValueError, after Megatron's
    import and the data), and `plan` passed the config."""
    from nemo_topr.training.config import check_values

    run_dir = tmp_path / "run"
    raw = compose("tiny_cpu", ["dataset.shared_prefix=true", "dataset.packed=false", f"run_dir={run_dir}"])
    expected = ("dataset.shared_prefix=true packs each row with a prompt and several of its completions; it cannot be "
                "combined with dataset.packed=false (one sequence per row): drop one of them")
    with pytest.raises(ConfigError) as refused:
        check_config(raw)  # train's, before Megatron's import
    assert str(refused.value) == expected
    with pytest.raises(ConfigError) as planned:
        check_values(OmegaConf.to_container(raw, resolve=True))  # plan's and submit's
    assert str(planned.value) == expected
    assert not run_dir.exists()
    check_own_values({"dataset": {"shared_prefix": True}})  # packed by default
    check_own_values({"dataset": {"shared_prefix": False, "packed": False}})


@pytest.mark.parametrize("key", ["train.global_batch_size", "train.micro_batch_size", "optimizer.lr",
                                 "optimizer.min_lr"])
def test_a_value_the_run_needs_set_to_null_is_refused_before_anything_is_written(key, tmp_path):
    """Bridge's dataclasses take None for these (derived elsewhere); this recipe cannot: `KEY=null`
    ended train in a TypeError traceback (the optimizer's after the run directory was written),
    and plan planned its own default batch. A section the config does not have is not asked for
    (score-logprobs --train-config checks a model section alone)."""
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as refused:
        check_config(compose("tiny_cpu", [f"{key}=null", f"run_dir={run_dir}"]))
    assert str(refused.value) == f"{key} is unset (null): a run needs a value; set {key}=VALUE"
    assert not run_dir.exists()
    check_own_values({"model": {"num_layers": 2}})


@pytest.mark.parametrize("world_size, overrides, expected", [
    (1, ["train.global_batch_size=3"], "train.global_batch_size=3 is not a multiple of train.micro_batch_size x "
     "data-parallel size = 2 x 1 = 2 (data-parallel size = WORLD_SIZE 1 / TP*PP*CP 1): use a multiple, e.g. 2 or 4"),
    (4, ["model.tensor_model_parallel_size=2", "train.global_batch_size=6"], "train.global_batch_size=6 is not a "
     "multiple of train.micro_batch_size x data-parallel size = 2 x 2 = 4 (data-parallel size = WORLD_SIZE 4 / "
     "TP*PP*CP 2): use a multiple, e.g. 4 or 8"),
    (4, ["train.global_batch_size=1", "train.micro_batch_size=1"], "train.global_batch_size=1 is not a multiple of "
     "train.micro_batch_size x data-parallel size = 1 x 4 = 4 (data-parallel size = WORLD_SIZE 4 / TP*PP*CP 1): use "
     "a multiple, e.g. 4"),
    # read before Bridge's classes check the types: a string was a TypeError traceback
    (1, ["train.global_batch_size=abc"], "train.global_batch_size='abc' is not a valid value: expected int"),
    (2, ["model.tensor_model_parallel_size=two"], "model.tensor_model_parallel_size='two' is not a valid value: "
     "expected int"),
    (2, ["model.pipeline_model_parallel_size=0"], "model.pipeline_model_parallel_size=0 must be at least 1"),
    (3, ["model.tensor_model_parallel_size=2"], "WORLD_SIZE 3 (ranks launched) is not a multiple of "
     "model.tensor_model_parallel_size=2 x model.pipeline_model_parallel_size=1 x model.context_parallel_size=1 = 2: "
     "launch a multiple of it, or change the model-parallel sizes"),
])
def test_a_batch_or_world_that_does_not_divide_stops_train_before_anything_is_written(
        tiny_hf, tmp_path, monkeypatch, world_size, overrides, expected):
    """Bridge asserts these inside finetune(), after the run directory is set up, as a traceback
    (eval_global_batch_size (3) must be divisible by ...); train now says it first, in one line."""
    from nemo_topr.training.recipe import main

    monkeypatch.setenv("WORLD_SIZE", str(world_size))  # before any rendezvous: nothing is launched
    with pytest.raises(UserError) as stop:
        main(["--config-name", "tiny_cpu", f"base_model={tiny_hf}", f"run_dir={tmp_path / 'run'}", *overrides])
    assert str(stop.value) == expected
    assert list(tmp_path.iterdir()) == []


def test_batch_sizes_that_divide_pass_the_division_check():
    from nemo_topr.training.validation import check_batch_division

    layout = {"model": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2},
              "train": {"global_batch_size": 12, "micro_batch_size": 3}}
    check_batch_division(layout, 8)  # DP = 8 / 4 = 2, 12 = 2 micro-batches of 3 on each DP rank
    with pytest.raises(ConfigError, match=r"= 3 x 4 = 12 \(data-parallel size = WORLD_SIZE 16 "):
        check_batch_division({**layout, "train": {"global_batch_size": 6, "micro_batch_size": 3}}, 16)


def test_a_users_own_yaml_extends_a_preset_and_a_file_beside_it(tmp_path, monkeypatch):
    """`--config-name my_runs/exp1.yaml` (train, plan, submit): the file's own directory is searched
    first, then conf/, so its defaults list can name a preset and the user's own base."""
    mine = tmp_path / "my_runs"
    mine.mkdir()
    (mine / "lab_base.yaml").write_text("defaults:\n  - tiny_cpu\n  - _self_\noptimizer:\n  lr: 0.125\n")
    (mine / "exp1.yaml").write_text("defaults:\n  - lab_base\n  - _self_\ntrain:\n  global_batch_size: 8\n")
    monkeypatch.chdir(tmp_path)
    for spelled in ("my_runs/exp1.yaml", str(mine / "exp1.yaml")):
        cfg = compose(spelled, ["objective.baseline=0.5"])
        # exp1's own key, lab_base's, tiny_cpu's (micro batch 2, seq 512) and topr's (ratio_level), the override
        assert (cfg.train.global_batch_size, cfg.optimizer.lr, cfg.train.micro_batch_size, cfg.model.seq_length,
                cfg.objective.ratio_level, cfg.objective.baseline) == (8, 0.125, 2, 512, "sequence", 0.5)
    assert compose("tiny_cpu.yaml").train.global_batch_size == 4  # a preset's name with its suffix
    (mine / "typo.yaml").write_text("defaults:\n  - tiny_cpux\n  - _self_\n")
    with pytest.raises(ConfigError, match=rf"^config {mine}/typo.yaml: its defaults name 'tiny_cpux', found neither "
                                          rf"in {mine} nor in {REPO}/conf; the presets: \['iterate_tiny_cpu', "):
        compose("my_runs/typo.yaml")
    with pytest.raises(ConfigError, match=r"^config my_runs/exp2.yaml: no such file$"):
        compose("my_runs/exp2.yaml")
    # no defaults list: it said "device must be one of cuda, cpu; got None", or named dataset.seq_length, unset
    # by the user; the iterate driver's config, a training config's name by mistake, likewise
    (mine / "alone.yaml").write_text("optimizer:\n  lr: 1.0e-3\n")
    for name, path in (("my_runs/alone.yaml", mine / "alone"), ("iterate_tiny_cpu", REPO / "conf/iterate_tiny_cpu")):
        with pytest.raises(ConfigError, match=rf"^config {path}.yaml composes nothing from conf/topr.yaml, the "
                                              r"recipe's settings \(device, objective, run_dir, ...\): begin it with "
                                              r"a defaults list naming topr or a preset, as `defaults: \[topr, "
                                              r"_self_\]`"):
            compose(name, ["device=cpu"])
    # a file meant in the working directory: named as a file, not looked up as the preset 'exp3' alone
    with pytest.raises(ConfigError, match=rf"^config exp3.yaml: no such file, here \({tmp_path}\) or among the "
                                          rf"configs in {REPO}/conf$"):
        compose("exp3.yaml")
    with pytest.raises(ConfigError, match=r"^config my_runs/exp1.yml: Hydra reads configs only from .yaml files; "
                                          r"rename it my_runs/exp1.yaml$"):
        compose("my_runs/exp1.yml")


def test_a_yaml_that_does_not_parse_or_a_failing_interpolation_is_one_line_naming_file_and_key(tmp_path,
                                                                                                monkeypatch):
    """Each was a traceback from Hydra or OmegaConf (`train`, `plan`; `submit` for a file that does
    not parse), naming neither the file nor, for an interpolation, the key."""
    monkeypatch.delenv("NEMO_TOPR_TEST_UNSET", raising=False)
    (tmp_path / "bad.yaml").write_text("defaults:\n  - tiny_cpu\n  - _self_\nrun_dir: [a\n")
    (tmp_path / "env.yaml").write_text("defaults:\n  - tiny_cpu\n  - _self_\n"
                                       "run_dir: ${oc.env:NEMO_TOPR_TEST_UNSET}/run\n")
    with pytest.raises(ConfigError, match=rf'^config {tmp_path}/bad.yaml does not parse as YAML: while parsing a '
                                          rf'flow sequence in "{tmp_path}/bad.yaml", line 4, column 10 '):
        compose(str(tmp_path / "bad.yaml"))
    with pytest.raises(ConfigError, match=rf"^config {tmp_path}/env.yaml: run_dir: KeyError raised while resolving "
                                          r"interpolation: \"Environment variable 'NEMO_TOPR_TEST_UNSET' not found\"$"):
        compose(str(tmp_path / "env.yaml"))
    for override, problem in (("run_dir=${oops", r"run_dir: no viable alternative at input '\$\{oops'"),
                              ("optimizer.lr=${nope}", r"optimizer.lr: Interpolation key 'nope' not found")):
        with pytest.raises(ConfigError, match=rf"^config {REPO}/conf/tiny_cpu.yaml with overrides: {problem}$"):
            compose("tiny_cpu", [override])
    # an interpolation that resolves is kept, resolved
    assert compose("tiny_cpu", ["run_dir=${base_model}_run", "base_model=/m"]).run_dir == "/m_run"


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


def _graded_data(path, records=4, **changes):
    from nemo_topr.demo import build_graded_records

    rows = [{**r, "behavior_logprob": -50.0, **changes} for r in build_graded_records(records)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _fake_checkpoint(run_dir, iteration):
    """What ensure_latest_complete accepts as a complete checkpoint at `iteration`."""
    import torch

    from tests.conftest import torch_dist_save

    saved = torch_dist_save(run_dir / "checkpoints" / f"iter_{iteration:07d}")
    torch.save({"step": iteration}, saved / "train_state.pt")
    (saved / "run_config.yaml").write_text(
        "model:\n  tensor_model_parallel_size: 1\n  pipeline_model_parallel_size: 1\n"
        "checkpoint:\n  save_rng: true\n  save_optim: true\n  fully_parallel_save: false\n")
    (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(str(iteration))


def test_resume_from_base_needs_the_bases_data_and_iterations_left(tiny_hf, tmp_path):
    """Unchecked, resume_from_base=true from a base run goes wrong through finetune() (by hand): on
    100 of its 144 records, Megatron's scheduler asserts (48 iterations, checkpoint 72); on its
    records with rewards negated, the first 20 samples are skipped untrained; from its last
    iteration, nothing trains and the start exits 75 with STOPPED, which a Slurm job requeues forever."""
    from nemo_topr.training.recipe import prepare
    from nemo_topr.training.run_state import RunStateError

    data = _graded_data(tmp_path / "graded.jsonl", records=16)
    base = tmp_path / "base"
    train_iters = prepare(_run(tiny_hf, base, f"dataset.train_path={data}"))["train_iters"]
    assert train_iters >= 2

    def saved(iteration):  # a finished save, as model_source reads one
        _fake_checkpoint(base, iteration)
        (base / "checkpoints" / f"iter_{iteration:07d}" / "metadata.json").write_text("{}\n")

    saved(1)

    def resume_from_base(run: str, data_path, *overrides):
        return prepare(build_training_run(compose("tiny_cpu", [
            f"base_model={base}", f"run_dir={tmp_path / run}", f"dataset.train_path={data_path}",
            "resume_from_base=true", *overrides])))

    def refusal(run: str, data_path, *overrides) -> RunStateError:
        with pytest.raises(RunStateError) as refused:
            resume_from_base(run, data_path, *overrides)
        assert not (tmp_path / run / "fingerprint.json").exists()  # refused before anything of the run was written
        return refused.value

    assert resume_from_base("same", data)["train_iters"] == train_iters  # the base's data: it continues
    negated = [{**json.loads(line), "reward": -json.loads(line)["reward"]} for line in data.read_text().splitlines()]
    (tmp_path / "negated.jsonl").write_text("".join(json.dumps(row) + "\n" for row in negated))
    assert refusal("negated", tmp_path / "negated.jsonl").key == "resume_from_base.data_or_settings_changed"
    reordered = refusal("reordered", data, "dataset.shuffle_seed=7")
    assert reordered.key == "resume_from_base.data_or_settings_changed" and "dataset.shuffle_seed" in str(reordered)
    saved(train_iters)  # the base trained to the end of this data
    assert refusal("finished", data).key == "resume_from_base.base_finished"
    (base / "fingerprint.json").unlink()  # a base with no record of its data (another trainer's checkpoint)
    assert refusal("unrecorded", data).key == "resume_from_base.no_fingerprint"


def test_a_resume_onto_changed_data_or_lr_is_refused_and_keeps_the_config_that_trained(tiny_hf, tmp_path):
    from nemo_topr.training.recipe import prepare
    from nemo_topr.training.run_state import RunStateError

    data = _graded_data(tmp_path / "graded.jsonl")
    run_dir = tmp_path / "run"
    prepare(_run(tiny_hf, run_dir, f"dataset.train_path={data}", "optimizer.lr=0.02"))
    _fake_checkpoint(run_dir, 1)
    prepare(_run(tiny_hf, run_dir, f"dataset.train_path={data}", "optimizer.lr=0.02"))  # the same run resumes
    _graded_data(data, behavior_logprob=-40.0)
    with pytest.raises(RunStateError, match=r"Changed: the training data .*optimizer.lr: 0.02 -> 0.03.*"
                                            r"resume_from_base=true"):
        prepare(_run(tiny_hf, run_dir, f"dataset.train_path={data}", "optimizer.lr=0.03"))
    # the refused start left no trace: config.yaml and the per-start configs are the two accepted ones
    assert OmegaConf.load(run_dir / "config.yaml").optimizer.lr == 0.02
    assert [OmegaConf.load(p).optimizer.lr for p in sorted((run_dir / "configs").iterdir())] == [0.02, 0.02]


def test_a_refused_resume_leaves_the_data_report_of_the_data_that_trained(tiny_hf, tmp_path):
    from nemo_topr.training.recipe import prepare
    from nemo_topr.training.run_state import RunStateError

    run_dir = tmp_path / "run"
    prepare(_run(tiny_hf, run_dir, f"dataset.train_path={_graded_data(tmp_path / 'four.jsonl', records=4)}"))
    _fake_checkpoint(run_dir, 1)
    trained = (run_dir / "data_report.json").read_text()
    assert json.loads(trained)["records_in"] == 12  # build_graded_records: 3 samples of each prompt
    with pytest.raises(RunStateError, match="Changed: the training data"):
        prepare(_run(tiny_hf, run_dir, f"dataset.train_path={_graded_data(tmp_path / 'two.jsonl', records=2)}"))
    assert (run_dir / "data_report.json").read_text() == trained


# p~ = sum_pos |R - c| / sum |R - c| by hand: every prompt has rewards +1, -1, -1 (group mean -1/3)
@pytest.mark.parametrize("overrides, record_baseline, expected, p_tilde", [
    ((), None, "objective.baseline (0.0) for every record", 1 / 3),
    (("objective.baseline=-0.25",), None, "objective.baseline (-0.25) for every record", 1.25 / (1.25 + 2 * 0.75)),
    (("objective.variant=sft_positive",), None, "objective.baseline (0.0) for every record", 1 / 3),
    # c = -1/3 + 0.2 = -2/15: positives 17/15, each negative 13/15
    (("objective.variant=asymre", "objective.asymre_delta_v=0.2"), None,
     "the whole-group mean reward of the records used + objective.asymre_delta_v (0.2)", 17 / (17 + 2 * 13)),
    # c = 0.5 - 0.1 = 0.4: positives 0.6, each negative 1.4
    (("objective.variant=asymre",), 0.5, "the records' own baseline field + objective.asymre_delta_v (-0.1)",
     0.6 / (0.6 + 2 * 1.4)),
    (("objective.variant=tis",), 0.5, "the records' own baseline field", 0.5 / (0.5 + 2 * 1.5)),
])
def test_the_data_report_says_which_baseline_the_objective_uses(tiny_hf, tmp_path, overrides, record_baseline,
                                                                expected, p_tilde):
    """Only asymre takes the whole group's mean reward (nemo_topr/objective.py, "Baselines"), and
    the report's p~ is the data's at the c each record gets (the scalar formula only for a scalar)."""
    from nemo_topr.training.recipe import prepare

    extra = {} if record_baseline is None else {"baseline": record_baseline}
    data = _graded_data(tmp_path / "graded.jsonl", **extra)
    summary = prepare(_run(tiny_hf, tmp_path / "run", f"dataset.train_path={data}", *overrides))
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert report["baselines"] == summary["baselines"] == expected
    assert report["record_baselines"] is (record_baseline is not None)
    assert report["p_tilde"] == summary["p_tilde"] == round(p_tilde, 4)


def test_a_resume_with_another_objective_or_base_model_is_refused(tiny_hf, tmp_path):
    """The objective decides what every iteration trains towards, and a resume never reads
    base_model: either changed would be trained, or ignored, without a word."""
    import shutil

    from nemo_topr.training.recipe import prepare
    from nemo_topr.training.run_state import RunStateError

    data = _graded_data(tmp_path / "graded.jsonl")
    run_dir = tmp_path / "run"
    prepare(_run(tiny_hf, run_dir, f"dataset.train_path={data}"))
    _fake_checkpoint(run_dir, 1)
    # the objective's defaults written out are no change
    prepare(_run(tiny_hf, run_dir, f"dataset.train_path={data}", "objective.baseline=0", "objective.variant=topr"))
    for override, change in (("objective.baseline=0.5", "objective.baseline: 0.0 -> 0.5"),
                             ("objective.variant=tis", "objective.variant: 'topr' -> 'tis'"),
                             ("objective.neg_upper=2", "objective.neg_upper: None -> 2")):
        with pytest.raises(RunStateError, match=rf"Changed: {re.escape(change)}\. Either restore"):
            prepare(_run(tiny_hf, run_dir, f"dataset.train_path={data}", override))
    other = shutil.copytree(tiny_hf, tmp_path / "other_model")  # the same weights, another model to the user
    with pytest.raises(RunStateError, match=rf"began from {tiny_hf}; .* so {other} would not be trained"):
        prepare(_run(other, run_dir, f"dataset.train_path={data}"))
    assert len(list((run_dir / "configs").iterdir())) == 2  # the two accepted starts


def test_a_run_dir_that_cannot_hold_one_checkpoint_is_refused_before_anything_is_written(tiny_hf, tmp_path,
                                                                                        monkeypatch):
    """A full filesystem fails the first save deep in torch's writer, without a word of space
    (nemo_topr/training/disk_space.py), after the iterations before it."""
    import shutil
    from collections import namedtuple

    from nemo_topr.training.recipe import train
    from nemo_topr.training.run_state import RunStateError

    run = _run(tiny_hf, tmp_path / "runs" / "run", f"dataset.train_path={_graded_data(tmp_path / 'graded.jsonl')}")
    from safetensors.torch import load_file

    parameters = sum(tensor.numel() for tensor in load_file(tiny_hf / "model.safetensors").values())
    needed = parameters * 12  # fp32 weights and Adam's two moments
    monkeypatch.setattr(shutil, "disk_usage", lambda path: namedtuple("Usage", "total used free")(0, 0, needed - 1))
    with pytest.raises(RunStateError, match=rf"one checkpoint of this run takes {needed / 2**20:.1f} MiB \(estimated "
                                            r"from the parameter count\): its first save would fail"):
        train(run)
    assert not (tmp_path / "runs").exists()  # nor the folders its lock made


def test_a_failed_save_on_a_full_filesystem_ends_with_a_line_that_says_so(tiny_hf, tmp_path, monkeypatch):
    """torch's CheckpointException, as a full tmpfs gave it (a BaseException naming only a
    "Worker failure"), raised by finetune() after the disk filled up during the run."""
    import shutil
    from collections import namedtuple

    import megatron.bridge.training.finetune as bridge_finetune
    from torch.distributed.checkpoint.api import CheckpointException

    from nemo_topr.training.recipe import train

    free = {"bytes": 2**40, "after": 4096}
    monkeypatch.setattr(shutil, "disk_usage", lambda path: namedtuple("Usage", "total used free")(0, 0, free["bytes"]))

    def finetune_until_the_disk_is_full(*args, **kwargs):
        free["bytes"] = free["after"]
        raise CheckpointException("write", {0: RuntimeError("Worker failure: An error is caught while starting worker")})

    monkeypatch.setattr(bridge_finetune, "finetune", finetune_until_the_disk_is_full)
    run = _run(tiny_hf, tmp_path / "run", f"dataset.train_path={_graded_data(tmp_path / 'graded.jsonl')}")
    with pytest.raises(UserError, match=rf"^{tmp_path / 'run' / 'checkpoints'}: 0.0 MiB free, less "
                                         r"than one checkpoint \(.* MiB, estimated from the parameter count\): a save "
                                         r"most likely failed for space\. .* it resumes from the start$"):
        train(run)
    free["bytes"] = free["after"] = 2**40  # with room, the same failure is left as it was
    with pytest.raises(CheckpointException):
        train(_run(tiny_hf, tmp_path / "run", f"dataset.train_path={tmp_path / 'graded.jsonl'}"))


@pytest.mark.parametrize("override, shown, use", [
    ("train.train_iters=5", "5", "Use dataset.epochs"), ("train.train_iters=abc", "'abc'", "Use dataset.epochs"),
    # Bridge asserted "Cannot specify more than one of train_iters, train_samples, or num_epochs" in a traceback,
    # after config.yaml recorded it
    ("train.train_samples=40", "40", "Use dataset.epochs"), ("train.num_epochs=2", "2", "Use dataset.epochs"),
    # said "stopped at iteration 0 of 18 with a checkpoint saved" (exit 75) with none: a job requeued for ever
    ("train.skip_train=true", "True", "has no validation data"),
    ("validation.skip_train=true", "True", "has no validation data"),
    # accepted and echoed, and nothing was ever evaluated
    ("validation.eval_interval=2", "2", "has no validation data"), ("train.eval_iters=2", "2", "has no validation data"),
    # wrote over another run's checkpoints, past the lock and every resume check; loaded another run's state
    ("checkpoint.save=/elsewhere", "'/elsewhere'", "run_dir sets it"),
    ("checkpoint.load=/elsewhere", "'/elsewhere'", "run_dir sets it"),
    ("logger.tensorboard_dir=/elsewhere", "'/elsewhere'", "run_dir sets it"),
    ("checkpoint.pretrained_checkpoint=/elsewhere", "'/elsewhere'", "base_model sets it"),
])
def test_keys_the_recipe_sets_or_cannot_honour_are_refused_naming_what_to_use(tiny_hf, tmp_path, override, shown, use):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}={re.escape(shown)} is not a setting: .*{use}"):
        _run(tiny_hf, tmp_path / "run", override)
    assert not (tmp_path / "run").exists()


def test_a_model_given_as_run_dir_is_refused_and_left_as_it_was(tiny_hf, tmp_path):
    """base_model and run_dir swapped, or an export named as the run: a run would write its
    checkpoints, configs and ledgers into the model. An empty directory, or one holding only a
    Slurm job's logs, is a new run's."""
    before = {path: path.read_bytes() for path in tiny_hf.rglob("*") if path.is_file()}
    with raises_problem("run_dir.is_a_model", "run_dir"):
        _run(tiny_hf, tiny_hf)
    assert {path: path.read_bytes() for path in tiny_hf.rglob("*") if path.is_file()} == before
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    with raises_problem("run_dir.is_a_file", "run_dir"):
        _run(tiny_hf, notes)
    # below a file: a NotADirectoryError traceback from the run's lock
    with raises_problem("run_dir.under_a_file", "run_dir"):
        _run(tiny_hf, notes / "run")
    assert notes.read_text() == "mine"
    (tmp_path / "slurm_run" / "logs" / "job-7-start-0").mkdir(parents=True)
    assert _run(tiny_hf, tmp_path / "slurm_run").run_dir == tmp_path / "slurm_run"


def test_a_run_dir_holding_names_the_run_writes_but_no_start_of_it_is_refused(tiny_hf, tmp_path):
    """A user's own config.yaml, in the directory given as run_dir too, was replaced by the composed
    config at the start (its comments and defaults list lost); a file named STOPPED was deleted."""
    experiment = tmp_path / "my_experiment"
    experiment.mkdir()
    (experiment / "config.yaml").write_text("# my notes\ndefaults:\n  - tiny_cpu\n")
    (experiment / "STOPPED").write_text("mine")
    with raises_problem("run_dir.holds_others", "run_dir") as holding:
        _run(tiny_hf, experiment)
    assert "config.yaml, STOPPED," in str(holding.value)  # the names, which the run would replace
    assert (experiment / "config.yaml").read_text().startswith("# my notes")
    (experiment / "samples_dp0.jsonl").write_text("")
    (experiment / "STOPPED").unlink()
    with pytest.raises(ConfigError, match=r"holds config.yaml, samples_dp0.jsonl, which no start"):
        _run(tiny_hf, experiment)
    started = tmp_path / "started"  # a first start that stopped before its first checkpoint: its own again
    (started / "configs").mkdir(parents=True)
    (started / "configs" / "start_001.yaml").write_text("{}\n")
    (started / "config.yaml").write_text("{}\n")
    assert _run(tiny_hf, started).run_dir == started
    killed = tmp_path / "killed"  # killed between the fingerprint and the configs
    killed.mkdir()
    (killed / "fingerprint.json").write_text("{}\n")
    (killed / "samples_dp0.jsonl").write_text("")
    assert _run(tiny_hf, killed).run_dir == killed


def test_negative_sequence_length_is_a_clear_error(tiny_hf, tmp_path):
    with raises_problem("model.seq_length.below_bound", "model.seq_length"):
        _run(tiny_hf, tmp_path, "model.seq_length=-8")


def _scored(tmp_path, records):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({**r, "behavior_logprob": -50.0}) + "\n" for r in records))
    return data


@pytest.mark.parametrize("baseline", [1.0, -1.5])
def test_baseline_outside_unit_interval_for_pm1_rewards_is_rejected(tiny_hf, tmp_path, baseline, monkeypatch):
    """By `train` before Megatron is imported and anything is written, and by `prepare` for a
    run built in code (the rule itself: tests/data/test_cli.py)."""
    from nemo_topr.demo import build_graded_records
    from nemo_topr.training.recipe import main, prepare

    data = _scored(tmp_path, build_graded_records(2))
    overrides = [f"hf_model={tiny_hf}", f"run_dir={tmp_path / 'run'}", f"dataset.train_path={data}",
                 f"objective.baseline={baseline}"]
    monkeypatch.setenv("WORLD_SIZE", "1")  # main's rendezvous settings stay out of this process
    with pytest.raises(UserError) as refused:
        main(["--config-name", "tiny_cpu", *overrides])
    assert refused.value.key == "objective.baseline.flips_signs"
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError) as refused:
        prepare(build_training_run(compose("tiny_cpu", overrides)))
    assert refused.value.key == "objective.baseline.flips_signs"


def test_non_strict_run_report_accounts_for_every_record(tiny_hf, tmp_path):
    from nemo_topr.training.recipe import prepare

    fixture = Path(__file__).parents[1] / "fixtures" / "data" / "malformed.jsonl"
    run = _run(tiny_hf, tmp_path / "run", f"dataset.train_path={fixture}", "dataset.strict=false",
               "model.seq_length=256")
    summary = prepare(run)
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert report["records_in"] == 16
    assert report["records_in"] == report["records_used"] + report["records_dropped"]
    assert report["records_dropped"] == sum(report["dropped"].values()) == 13
    assert {"invalid_json", "invalid_utf8", "missing_field", "wrong_type", "nonfinite_reward",
            "invalid_behavior_logprob", "empty_completion", "duplicate_id", "schema_mismatch",
            "too_long"} == set(report["dropped"])
    assert summary["sequences"] == report["records_used"] == 3


def test_missing_tokenizer_directory_is_a_clear_error(tmp_path):
    from nemo_topr.data.records import DataError
    from nemo_topr.data.tokenization import load_tokenizer

    with pytest.raises(DataError, match=r"no_such_dir: tokenizer: directory does not exist"):
        load_tokenizer(tmp_path / "no_such_dir")


def test_micro_batch_above_one_with_pipeline_parallel_is_rejected_for_packed_streams(tiny_hf, tmp_path):
    """tiny_cpu has micro_batch_size 2. With Transformer Engine the step sends a micro-batch as one
    packed THD stream, which PP stages would receive in [seq, MBS, hidden] order."""
    with raises_problem("train.micro_batch_size.above_1_with_pipeline", "train.micro_batch_size"):
        _run(tiny_hf, tmp_path, "model.pipeline_model_parallel_size=2", "model.transformer_impl=transformer_engine")
    # the local layers (CPU) take [MBS, seq] batches as they are: allowed
    assert _run(tiny_hf, tmp_path, "model.pipeline_model_parallel_size=2").container.model.transformer_impl == "local"


@pytest.mark.slow
def test_train_reports_config_and_data_errors_in_one_line_before_importing_megatron(tiny_hf, tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO

    malformed = REPO / "tests" / "fixtures" / "data" / "malformed.jsonl"
    from nemo_topr.demo import build_graded_records

    unscored = tmp_path / "graded.jsonl"  # graded, not scored yet: no behavior_logprob
    unscored.write_text("".join(json.dumps(record) + "\n" for record in build_graded_records(2)))
    refusals = ((["train.train_iters=abc"], "nemo-topr train: train.train_iters='abc' is not a setting"),
                ([f"dataset.train_path={malformed}"], f"nemo-topr train: {malformed}:2: record: invalid JSON"),
                ([f"dataset.train_path={unscored}"],
                 f"nemo-topr train: {unscored}: behavior_logprob: absent: score the data first (`nemo-topr score-"))
    for overrides, message in refusals:
        # an override before --config-name, as a user may write it: options and overrides are intermixed
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "nemo_topr.cli", "train",
                               f"hf_model={tiny_hf}", "--config-name", "tiny_cpu", f"run_dir={tmp_path / 'run'}",
                               *overrides],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and proc.stdout == "", proc.stderr[-2000:]
        lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
        assert len(lines) == 1 and lines[0].startswith(message), lines
        assert "| megatron" not in proc.stderr  # -X importtime lists every module imported
    assert not (tmp_path / "run").exists()  # nothing written for a refused start


@pytest.mark.slow
def test_a_new_run_refused_for_its_data_after_megatrons_import_leaves_no_run_directory(tiny_hf, tmp_path):
    """Too long for model.seq_length is found while tokenizing, after the import and the lock: the
    base model's HF artifacts are written only after every check, so nothing is left."""
    from tests import forked

    data = _graded_data(tmp_path / "scored.jsonl", records=2)
    proc = forked.run(["-m", "nemo_topr.cli", "train", "--config-name", "tiny_cpu", f"base_model={tiny_hf}",
                       f"dataset.train_path={data}", f"run_dir={tmp_path / 'run'}", "model.seq_length=64"],
                      timeout=300)
    assert proc.returncode == 1 and proc.stderr.startswith(f"nemo-topr train: {data}:1: prompt: "), proc.stderr[-2000:]
    assert "> max_seq_length 64" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_record_beyond_the_base_models_context_is_refused_by_train_and_score_logprobs(megatron_world, tmp_path):
    """model.seq_length may exceed the model's max_position_embeddings (packed rows restart positions
    per sequence); a record longer than it would be trained and scored at positions the model never saw."""
    from nemo_topr.data.records import DataError
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer
    from nemo_topr.training.scoring import score_logprobs

    short_context = build_tiny_hf_llama(tmp_path / "hf", build_tiny_tokenizer(), max_position_embeddings=128)
    assert json.loads((short_context / "config.json").read_text())["max_position_embeddings"] == 128
    data = _graded_data(tmp_path / "scored.jsonl", records=2)
    run = _run(short_context, tmp_path / "run", f"dataset.train_path={data}")
    assert run.container.dataset.model_context == 128 and run.container.model.seq_length == 512
    beyond = rf"^{data}:1: completion: \d+ tokens .* > the model's context 128 \(max_position_embeddings"
    with pytest.raises(DataError, match=beyond):
        run.container.dataset.prepare(global_batch_size=4)
    with pytest.raises(DataError, match=beyond):
        score_logprobs(short_context, data, tmp_path / "out.jsonl", seq_length=512, device="cpu")
    assert not (tmp_path / "out.jsonl").exists()
    # a run that extends the context on purpose says so
    extended = _run(short_context, tmp_path / "extended", f"dataset.train_path={data}", "dataset.model_context=512")
    report = extended.container.dataset.prepare(global_batch_size=4).dataset.report
    assert report.records_used == report.records_in == len(data.read_text().splitlines())


def test_rendered_prompts_train_and_score_as_their_plain_text(megatron_world, tiny_hf, tmp_path):
    """dataset.rendered_prompts / --rendered-prompts: prompts stored rendered (chat template written
    out) give the sequences and the log mu of the same records with the user's text."""
    from nemo_topr.data.records import DataError, load_records
    from nemo_topr.data.tokenization import load_tokenizer
    from nemo_topr.training.recipe import _records_of
    from nemo_topr.training.scoring import score_logprobs

    plain = _graded_data(tmp_path / "plain.jsonl", records=4)
    tokenizer = load_tokenizer(tiny_hf)
    rows = [json.loads(line) for line in plain.read_text().splitlines()]
    for row in rows:
        row["prompt"] = tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}], tokenize=False,
                                                      add_generation_prompt=True)
    rendered = tmp_path / "rendered.jsonl"
    rendered.write_text("".join(json.dumps(row) + "\n" for row in rows))

    def sequences(data, *overrides):
        run = _run(tiny_hf, tmp_path / data.stem, f"dataset.train_path={data}", *overrides)
        run.container.dataset.use_records(_records_of(run.raw))  # as `nemo-topr train` reads them
        prepared = run.container.dataset.prepare(global_batch_size=4)
        return [(s.input_ids, s.loss_mask) for s in prepared.dataset.sequences]

    assert sequences(rendered, "dataset.rendered_prompts=true") == sequences(plain)
    with pytest.raises(DataError, match=rf"^{rendered}:1: prompt: holds the tokenizer's special token "
                                        r"'<\|begin_of_text\|>'.*dataset.rendered_prompts=true"):
        sequences(rendered)
    scores = {}
    for data, source in ((plain, {}), (rendered, {"rendered_prompts": True})):
        score_logprobs(tiny_hf, data, tmp_path / f"{data.stem}_scored.jsonl", seq_length=512, device="cpu",
                       source=source)
        scores[data.stem] = [r.behavior_logprob for r in load_records(tmp_path / f"{data.stem}_scored.jsonl").records]
    assert scores["rendered"] == scores["plain"]


@pytest.mark.parametrize("config, overrides", [
    ("tiny_cpu", ["model.bf16=true"]),
    ("llama31_8b_bf16", ["device=cpu", "model.tensor_model_parallel_size=1", "model.sequence_parallel=false",
                         "train.global_batch_size=4", "model.seq_length=512",
                         "optimizer.use_distributed_optimizer=false", "ddp.use_distributed_optimizer=false"]),
], ids=["bf16-override", "bf16-preset"])
def test_half_precision_on_the_cpu_is_refused_naming_the_keys_to_set(tiny_hf, tmp_path, config, overrides):
    """The CPU runtime trains in fp32: model.bf16=true ended at the first step in "attempting to
    assign a gradient with dtype 'float' to a tensor with dtype 'c10::BFloat16'", a BF16 preset at
    the optimizer's set-up ("Wrapped parameters must be one of torch.cuda.FloatTensor"), tracebacks
    after the run directory was written (found by probing). The keys the message says to set build."""
    compose_run = lambda *extra: build_training_run(compose(  # noqa: E731
        config, [f"hf_model={tiny_hf}", f"run_dir={tmp_path / 'run'}", *overrides, *extra]))
    with pytest.raises(ConfigError, match=r" with device=cpu: the CPU runtime trains in fp32 \(docs/cpu_runtime.md\); "
                                          r"set (.*)$") as refused:
        compose_run()
    keys = str(refused.value).split(" with device=cpu")[0].split(", ")
    expected = ["model.bf16"] if config == "tiny_cpu" else ["model.bf16", "optimizer.bf16", "model.params_dtype",
                                                           "optimizer.params_dtype", "model.pipeline_dtype"]
    assert keys == expected
    fix = str(refused.value).rsplit("; set ", 1)[1].split()
    run = compose_run(*fix)
    assert not run.container.model.bf16 and run.container.model.params_dtype == torch.float32
    assert run.container.optimizer.params_dtype == torch.float32


def test_a_decay_ending_at_lr_zero_before_the_run_ends_is_warned_of(tiny_hf, tmp_path):
    """cosine to min_lr=0 over lr_decay_iters=5 of an 18-iteration run: iterations 6 to 18 trained at
    lr 0, without a word (found by probing). Megatron holds min_lr after lr_decay_iters, so only a
    zero min_lr idles; the whole-run decay (lr_decay_iters unset) and a constant rate do not."""
    from nemo_topr.training.validation import idle_schedule_warning

    def warning(*overrides, iters=18):
        container = _run(tiny_hf, tmp_path, "optimizer.min_lr=0", *overrides).container
        return idle_schedule_warning(container.scheduler, container.optimizer.min_lr, iters)

    assert warning("scheduler.lr_decay_style=cosine", "scheduler.lr_decay_iters=5") == (
        "scheduler.lr_decay_iters=5 of 18 iterations decays to optimizer.min_lr=0: iterations 6 to 18 train at "
        "learning rate 0, changing nothing; leave lr_decay_iters unset to decay over the whole run, or set "
        "optimizer.min_lr above 0")
    assert warning("scheduler.lr_decay_style=linear", "scheduler.lr_decay_iters=17").startswith(
        "scheduler.lr_decay_iters=17 of 18 iterations")
    assert warning("scheduler.lr_decay_style=cosine", "scheduler.lr_decay_iters=18") is None  # ends with the run
    assert warning("scheduler.lr_decay_style=cosine") is None  # unset: Megatron decays over train_iters
    assert warning("scheduler.lr_decay_style=constant", "scheduler.lr_decay_iters=5") is None
    container = _run(tiny_hf, tmp_path, "optimizer.min_lr=1e-4", "scheduler.lr_decay_style=cosine",
                     "scheduler.lr_decay_iters=5").container
    assert idle_schedule_warning(container.scheduler, container.optimizer.min_lr, 18) is None


def test_the_distributed_optimizer_is_refused_where_it_cannot_train_or_resume(tiny_hf, tmp_path, monkeypatch):
    """Megatron's distributed optimizer needs CUDA tensors (on CPU its set-up raises a TypeError),
    and without TE's or Apex's FusedAdam (Megatron-Core's HAVE_APEX_OR_TE) it falls back to torch's
    Adam, whose checkpoint it cannot load: on an H200 without TE the first run saved and its resume
    stopped at distrib_optimizer.py:839 (bench/results/gpu_verbs_h200_2026-11-26_968e888.json). Refused before
    the first step; on such a GPU the default is off."""
    import torch
    from megatron.core.optimizer import distrib_optimizer

    on = ("optimizer.use_distributed_optimizer=true", "ddp.use_distributed_optimizer=true")
    assert not _run(tiny_hf, tmp_path).container.optimizer.use_distributed_optimizer  # CPU default
    with raises_problem("use_distributed_optimizer.on_cpu", "optimizer.use_distributed_optimizer"):
        _run(tiny_hf, tmp_path, *on)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for fused_adam in (True, False):
        monkeypatch.setattr(distrib_optimizer, "HAVE_APEX_OR_TE", fused_adam)
        container = _run(tiny_hf, tmp_path, "device=cuda").container
        assert container.optimizer.use_distributed_optimizer is container.ddp.use_distributed_optimizer is fused_adam
    with raises_problem("use_distributed_optimizer.without_fused_adam", "optimizer.use_distributed_optimizer"):
        _run(tiny_hf, tmp_path, "device=cuda", *on)
    with raises_problem("use_distributed_optimizer.without_fused_adam", "ddp.use_distributed_optimizer"):
        _run(tiny_hf, tmp_path, "device=cuda", on[1])


def test_te_attention_is_refused_at_set_up_where_its_backward_needs_a_newer_cudnn(tiny_hf, tmp_path, monkeypatch):
    """On an H200 (2026-11-26) TE 2.17.1's PyPI library, built against cuDNN >= 9.22, failed every
    attention backward with the cuDNN 9.19 torch brought; its library holds the 9.22 attribute's
    name. `train` refuses that pairing on the GPU before it loads the model; scoring (forward only),
    unfused/flash attention, local layers, a newer cuDNN or a library without the name pass."""
    import types

    import torch
    from megatron.core.optimizer import distrib_optimizer
    from megatron.core.transformer.enums import AttnBackend

    from nemo_topr.model import settings as model_settings
    from nemo_topr.training import config

    needs_922, older = tmp_path / "needs_922.so", tmp_path / "older.so"
    needs_922.write_bytes(b"\0" * 4096 + b"detail::set_attribute(op, CUDNN_ATTR_OPERATION_RESHAPE_MODE, ...)\0")
    older.write_bytes(b"\0" * 4096 + b"CUDNN_ATTR_OPERATION_RESHAPE_XDESC\0")  # an attribute cuDNN 9.0 has
    found = {"library": needs_922, "cudnn": 91900}

    def cudnn_version():
        if isinstance(found["cudnn"], Exception):
            raise found["cudnn"]
        return found["cudnn"]

    monkeypatch.setattr(model_settings, "transformer_engine_available", lambda: True)
    monkeypatch.setattr(model_settings, "te_core_library", lambda: found["library"])
    monkeypatch.setattr(torch.backends.cudnn, "version", cudnn_version)

    def check(impl="transformer_engine", backend=AttnBackend.auto):
        model = types.SimpleNamespace(transformer_impl=impl, attention_backend=backend)
        config._check_te_attention_cudnn(types.SimpleNamespace(model=model))

    for backend in (AttnBackend.auto, AttnBackend.fused, "fused"):
        with pytest.raises(ConfigError, match=rf"\({needs_922}\) was built against cuDNN >= 9.22 .* loaded cuDNN 91900"
                                              r".*nvidia-cudnn-cu12 \(or -cu13\) >= 9.22.*model.attention_backend=unfused"):
            check(backend=backend)
    for impl, backend in (("transformer_engine", AttnBackend.unfused), ("transformer_engine", "flash"),
                          ("local", AttnBackend.auto)):
        check(impl, backend)
    for library, cudnn in ((needs_922, 92200), (older, 91900), (None, 91900)):
        found.update(library=library, cudnn=cudnn)
        check()
    found["cudnn"] = RuntimeError("cuDNN version incompatibility: PyTorch was compiled  against (9, 19, 0) but found "
                                  "runtime version (9, 14, 0).\nOne option ...")
    with pytest.raises(ConfigError, match=r"cuDNN other than its own \(cuDNN version incompatibility.*\(9, 14, 0\)\.\); "
                                          r"put torch's own cuDNN first: export LD_LIBRARY_PATH=\S+:\$LD_LIBRARY_PATH"):
        check()
    monkeypatch.setattr(model_settings, "transformer_engine_available", lambda: False)
    check()

    # `train` on a GPU asks it of the container it built; a login node (no CUDA) does not
    asked = []
    monkeypatch.setattr(config, "_check_te_attention_cudnn", asked.append)
    _run(tiny_hf, tmp_path)
    assert asked == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(distrib_optimizer, "HAVE_APEX_OR_TE", True)
    run = _run(tiny_hf, tmp_path, "device=cuda")
    assert asked == [run.container]


def test_batches_are_pinned_only_for_a_gpu(tiny_hf, tmp_path):
    """torch's DataLoader warns "'pin_memory' argument is set as true but no accelerator is found"
    at every CPU run with Bridge's default (DatasetProvider.pin_memory=True)."""
    assert _run(tiny_hf, tmp_path).container.dataset.pin_memory is False
    assert _run(tiny_hf, tmp_path, "device=cuda").container.dataset.pin_memory is True
    assert _run(tiny_hf, tmp_path, "dataset.pin_memory=true").container.dataset.pin_memory is True  # the user's


def test_fp8_is_refused_where_no_transformer_engine_layer_would_run_it(tiny_hf, tmp_path, monkeypatch):
    """FP8 runs only in TE's layers on a GPU. The CPU runtime (fp32, local layers) and a GPU
    without TE (local layers) would train without it and say nothing: on a CPU copy of an H200
    node's stack (TE 2.17.1 installed), the doctor's `train fp8` on CPU trained fp32 and reported
    its scores 0.00e+00 apart from BF16's. Refused at set-up, naming the key."""
    import torch

    from nemo_topr.model import settings as model_settings

    with raises_problem("model.fp8.on_cpu", "model.fp8"):
        _run(tiny_hf, tmp_path, "model.fp8=hybrid")
    assert _run(tiny_hf, tmp_path).container.model.fp8 is None  # the CPU default trains

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(model_settings, "transformer_engine_available", lambda: False)
    with raises_problem("model.fp8.without_transformer_engine", "model.fp8"):
        _run(tiny_hf, tmp_path, "device=cuda", "model.fp8=e4m3")
    _run(tiny_hf, tmp_path, "device=cuda")  # BF16 on such a GPU is not refused


def test_train_given_a_config_as_a_word_names_the_option(capsys):
    """`nemo-topr train tiny_cpu` (plan's spelling) said only "overrides must be key=value"."""
    from nemo_topr.training.recipe import parse_args

    for word in ("tiny_cpu", "my_run.yaml"):
        with pytest.raises(SystemExit) as exit_:
            parse_args([word, "run_dir=runs/x"])
        assert exit_.value.code == 2
        assert capsys.readouterr().err.endswith(
            f"nemo-topr train: error: {word} is a config, not a key=value override: choose it with --config-name "
            f"{word}\n")
    assert parse_args(["--config-name", "tiny_cpu", "run_dir=runs/x"]).overrides == ["run_dir=runs/x"]


def test_data_whose_every_advantage_is_zero_is_refused_before_the_run_directory(tiny_hf, tmp_path):
    """0/1 grades with no correct answer at c = 0: every R - c = 0, so the loss and its gradients
    are 0. Such a run trained its iterations, printed a loss of 0 and saved, exit 0. Refused by
    `main` before Megatron's import (a scalar c), and by `prepare` for any c as the step takes it
    (here the records' own, each equal to its reward)."""
    from nemo_topr.demo import build_graded_records
    from nemo_topr.training.recipe import main, prepare, train

    zeros = _graded_data(tmp_path / "zeros.jsonl", reward=0.0)
    with pytest.raises(UserError) as stop:
        main(["--config-name", "tiny_cpu", f"base_model={tiny_hf}", f"run_dir={tmp_path / 'run'}",
              f"dataset.train_path={zeros}"])
    assert str(stop.value).startswith("objective.baseline=0.0: every record's advantage R - c is 0 "
                                      "(each reward equals its baseline c): the loss and its gradients are 0")
    own = tmp_path / "own.jsonl"
    own.write_text("".join(json.dumps({**r, "behavior_logprob": -50.0, "baseline": r["reward"]}) + "\n"
                           for r in build_graded_records(4)))
    with pytest.raises(ConfigError, match=r"^dataset: every record's advantage R - c is 0 "):
        train(_run(tiny_hf, tmp_path / "run", f"dataset.train_path={own}"))
    # no run directory; the data's prepared set stays beside it for the next start (docs/data.md)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["own.jsonl", "prepared_data", "zeros.jsonl"]
    # one record whose reward is off its baseline trains: refused is every A = 0, not most
    rows = [json.loads(line) for line in own.read_text().splitlines()]
    own.write_text("".join(json.dumps({**r, "baseline": 0.5 if i == 0 else r["baseline"]}) + "\n"
                           for i, r in enumerate(rows)))
    assert prepare(_run(tiny_hf, tmp_path / "run", f"dataset.train_path={own}"))["p_tilde"] is not None
