"""`nemo-topr plan` and the Llama 3.1 cluster presets: parameter counts, per-GPU memory against
hand arithmetic, every broken layout rejected by name, and the shipped presets both passing the
planner and mapping onto Bridge's dataclasses (and Megatron-Core's own validation)."""

from __future__ import annotations

import dataclasses
import re

import pytest
from tests.conftest import placeholder_hf_model, refusal

from nemo_topr.model.architecture import REFERENCE_ARCHITECTURES, Architecture
from nemo_topr.cluster.checks import check_layout
from nemo_topr.cluster.layout import Layout
from nemo_topr.cluster.memory import activation_bytes_per_layer, chunk_forwards_in_flight, estimate_memory
from nemo_topr import cli
from nemo_topr.cluster import plan
from nemo_topr.cluster.plan import resolve_architecture

LLAMA_8B = REFERENCE_ARCHITECTURES["llama31_8b"]
LLAMA_70B = REFERENCE_ARCHITECTURES["llama31_70b"]


def main(argv: list[str]) -> int:
    """`nemo-topr plan ARGV` as the command line runs it: `nemo_topr.cli` renders its refusals."""
    return cli.main(["plan", *argv])
# preset -> (architecture, nodes of 8 GPUs it is meant for)
PRESETS = {
    "llama31_8b_bf16": (LLAMA_8B, 1),
    "llama31_8b_fp8": (LLAMA_8B, 1),
    "llama31_70b_bf16": (LLAMA_70B, 4),
    "llama31_70b_fp8": (LLAMA_70B, 4),
}


# ------------------------------------------------------------------------- parameter counts

def test_llama31_parameter_counts():
    """By hand, with V = 128256, head dim 128, 8 KV groups (K and V are 8·128 = 1024 wide), untied
    output layer; per layer: QKV h·(h + 2·1024) + output projection h·h + SwiGLU 3·h·ffn + 2 norms 2h.

    8B:  2·128256·4096 + 32·(4096·6144 + 4096² + 3·4096·14336 + 2·4096) + 4096
       = 1,050,673,152 + 32·218,112,000 + 4,096 = 8,030,261,248
    70B: 2·128256·8192 + 80·(8192·10240 + 8192² + 3·8192·28672 + 2·8192) + 8192
       = 2,101,346,304 + 80·855,654,400 + 8,192 = 70,553,706,496
    """
    def by_hand(h, ffn, layers):
        return 2 * 128256 * h + layers * (h * (h + 2 * 1024) + h * h + 3 * h * ffn + 2 * h) + h

    assert LLAMA_8B.total_params == by_hand(4096, 14336, 32) == 8_030_261_248
    assert LLAMA_70B.total_params == by_hand(8192, 28672, 80) == 70_553_706_496
    assert LLAMA_8B.total_params == pytest.approx(8.03e9, rel=0.005)
    assert LLAMA_70B.total_params == pytest.approx(70.6e9, rel=0.005)


# ------------------------------------------------------------------------- memory arithmetic

SMALL = Architecture(name="small", num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                     num_query_groups=2, vocab_size=256, kv_channels=16)
# 8 GPUs = TP 2 x PP 2 x DP 2; 8 rows per step / (2 rows x DP 2) = 2 micro-batches per DP rank
SMALL_LAYOUT = Layout(nodes=1, gpus_per_node=8, tp=2, pp=2, sequence_parallel=True, seq_length=32,
                      micro_batch=2, global_batch=8, recompute="selective")


def _bytes(estimate, stage: str) -> dict[str, int]:
    return {line.name.split(" (")[0]: line.bytes for line in estimate.lines[stage]}


def test_per_gpu_memory_matches_hand_arithmetic():
    """Small model, TP=2, PP=2, DP=2, SP, selective recompute, bf16, fp32 grads, distributed Adam.

    per layer: attention 64·(64 + 2·32) + 64·64 = 12,288; MLP 3·64·128 = 24,576; norms 2·64 = 128
    per GPU:   (12,288 + 24,576)/2 + 128 = 18,560 per layer; 2 layers per stage = 37,120
    first:     37,120 + embedding 256·64/2 = 8,192            = 45,312 params
    last:      37,120 + final norm 64 + output 256·64/2 8,192 = 45,376 params
    weights 2 B, grads 4 B, Adam 12 B / DP 2 = 6 B per param
    activations per layer: s·b·h·34/t = 32·2·64·34/2 = 69,632 B
      first stage: 1F1B holds min(PP, micro-batches) = 2 micro-batches x 2 layers
      last stage:  1 micro-batch x 2 layers
    logits (last stage): s·b·V/t·4 = 32·2·128·4 = 32,768 B
    """
    estimate = estimate_memory(SMALL, SMALL_LAYOUT, gpu_memory_gib=80, reserve_gib=0)
    assert [s.params for s in estimate.stages] == [45_312, 45_376]
    first, last = _bytes(estimate, "first"), _bytes(estimate, "last")
    assert first == {"weights": 2 * 45_312, "main grads": 4 * 45_312, "Adam states": 12 * 45_312 // 2,
                     "activations": 2 * 2 * 69_632, "logits": 0, "runtime reserve": 0}
    assert last == {"weights": 2 * 45_376, "main grads": 4 * 45_376, "Adam states": 12 * 45_376 // 2,
                    "activations": 1 * 2 * 69_632, "logits": 32_768, "runtime reserve": 0}
    assert estimate.total("first") == 2 * 45_312 + 4 * 45_312 + 6 * 45_312 + 278_528
    assert estimate.worst.name == "first"


def test_activation_formulas_and_pipeline_in_flight():
    """Korthikanti et al. 2022, s=32 b=2 h=64 a=4 t=2 (s·b·h = 4,096):
    no recompute, unfused attention, no SP: 4,096·(10 + 24/2 + 5·4·32/(64·2)) = 4,096·27 = 110,592
    no recompute, unfused attention, SP:    4,096·(34 + 5·4·32/64)/2         = 4,096·22 =  90,112
    no recompute, fused attention, SP:      4,096·34/2 (no a·s² scores)      = 4,096·17 =  69,632
    full, SP:                               2·4,096/2                                  =   4,096
    Interleaved 1F1B on the first of PP=4 stages, VP=5: 2·3 + 4·4 + 1 = 23 chunks of 4 layers
    = 92 layers' worth = L·(1 + (PP-1)/(PP·VP)) = 80·(1 + 3/20)."""
    unfused = dataclasses.replace(SMALL_LAYOUT, fused_attention=False)
    assert activation_bytes_per_layer(SMALL, dataclasses.replace(unfused, sequence_parallel=False), None)[0] == 110_592
    assert activation_bytes_per_layer(SMALL, unfused, None)[0] == 90_112
    assert activation_bytes_per_layer(SMALL, SMALL_LAYOUT, None)[0] == 69_632
    assert activation_bytes_per_layer(SMALL, SMALL_LAYOUT, "full")[0] == 4_096
    interleaved = Layout(nodes=4, tp=8, pp=4, vp=5, global_batch=64)
    assert chunk_forwards_in_flight(interleaved, rank=0) * 80 // (4 * 5) == 92 == 80 * (1 + 3 / 20)
    assert chunk_forwards_in_flight(interleaved, rank=3) == 4 * 4 + 1


def test_distributed_optimizer_and_fp32_weights():
    """Without the distributed optimizer Adam's 12 B/param are not divided by DP; weights without
    model.bf16 are fp32 (4 B) and then need no separate master copy (8 B/param of Adam)."""
    replicated = dataclasses.replace(SMALL_LAYOUT, distributed_optimizer=False)
    assert _bytes(estimate_memory(SMALL, replicated), "first")["Adam states"] == 12 * 45_312
    fp32 = dataclasses.replace(SMALL_LAYOUT, half_precision_weights=False)
    first = _bytes(estimate_memory(SMALL, fp32), "first")
    assert (first["weights"], first["Adam states"]) == (4 * 45_312, 8 * 45_312 // 2)


# ------------------------------------------------------------------------- broken layouts

GOOD_8B = Layout(nodes=1, gpus_per_node=8, tp=2, sequence_parallel=True, seq_length=2048, global_batch=64,
                 recompute="selective")


@pytest.mark.parametrize("arch, changes, rule", [
    (LLAMA_8B, dict(tp=3), "world size = TP·PP·CP·DP"),
    (LLAMA_8B, dict(gpus_per_node=6, tp=2, pp=3), "layers % PP"),
    (LLAMA_70B, dict(nodes=4, tp=8, pp=4, vp=3), "layers % (PP·VP)"),
    (LLAMA_70B, dict(nodes=4, tp=8, pp=4, vp=1), "VP >= 2 with PP > 1"),
    (LLAMA_8B, dict(vp=2), "VP >= 2 with PP > 1"),
    (LLAMA_8B, dict(gpus_per_node=6, tp=6, seq_length=2052), "attention heads % TP"),
    (LLAMA_8B, dict(gpus_per_node=6, tp=6, seq_length=2052), "query groups % TP"),
    (LLAMA_8B, dict(global_batch=10), "global batch % (micro batch·DP)"),
    (LLAMA_70B, dict(nodes=4, tp=8, pp=4, vp=5, global_batch=6), "micro-batches % PP (interleaved schedule)"),
    (LLAMA_70B, dict(nodes=2, tp=8, pp=2, vp=5, global_batch=64, batched_p2p=True),
     "unbatched p2p at PP = 2 with VP (Megatron)"),
    (LLAMA_8B, dict(gpus_per_node=8, cp=2, seq_length=2050), "sequence % 2·CP"),
    (LLAMA_8B, dict(seq_length=2049), "sequence % TP (sequence parallel)"),
    (LLAMA_8B, dict(fp8="hybrid", fp8_recipe="tensorwise", seq_length=2056), "FP8 GEMM dimensions % 16"),
    (LLAMA_8B, dict(fp8="hybrid", fp8_recipe="delayed", first_last_layers_bf16=True), "FP8 recipe"),
    (LLAMA_8B, dict(cp=2), "CP = 1 (TOPR step)"),
])
def test_broken_layouts_are_rejected_by_rule(arch, changes, rule):
    assert not [f for f in check_layout(arch, GOOD_8B) if f.blocking]  # the unchanged layout is fine
    failed = {f.rule: f for f in check_layout(arch, dataclasses.replace(GOOD_8B, **changes)) if f.blocking}
    assert any(name.startswith(rule) for name in failed), f"{rule!r} not in {list(failed)}"


def test_sequence_parallel_without_tp_is_a_warning():
    """Bridge's finalize switches sequence_parallel off at TP = 1, so the plan warns but passes."""
    findings = check_layout(LLAMA_8B, dataclasses.replace(GOOD_8B, tp=1))
    warning = next(f for f in findings if f.rule == "sequence parallel needs TP > 1")
    assert not warning.passed and not warning.blocking and warning.format().startswith("  WARN")
    assert not [f for f in findings if f.blocking]


def test_rejection_messages_carry_the_numbers():
    def failures(**changes) -> dict[str, str]:
        layout = dataclasses.replace(GOOD_8B, **changes)
        return {f.rule: f.detail for f in check_layout(LLAMA_8B, layout) if f.blocking}

    assert failures(tp=3)["world size = TP·PP·CP·DP"] == \
        "1 node(s) x 8 GPUs = 8; TP·PP·CP = 3·1·1 = 3, so DP = 8/3 = 2.67, not a positive integer"
    assert failures(tp=3)["attention heads % TP"] == "heads per TP rank = 32 / 3 leaves remainder 2"
    # SP splits 2056 tokens over TP=2: 1028 = 16·64 + 4
    assert failures(fp8="hybrid", fp8_recipe="tensorwise", seq_length=2056)[
        "FP8 GEMM dimensions % 16 (Transformer Engine)"] == "not multiples of 16: tokens per micro-batch 1028"


def test_cli_rejects_a_bad_override_and_says_why(capsys):
    assert main(["llama31_8b_bf16", "model.context_parallel_size=2"]) == 1  # TP 2 x CP 2 x DP 2 = 8 GPUs
    out = capsys.readouterr().out
    assert "ok    world size" in out and "FAIL  CP = 1 (TOPR step): CP = 2" in out
    assert "LAYOUT REJECTED (CP = 1 (TOPR step))" in out


# the same overrides are refused by `nemo-topr submit --dry-run` (tests/slurm/test_scripts.py)
MISTYPED_OVERRIDES = [
    ("optimizer.lrr=1e-4", r"unknown config key optimizer.lrr \(OptimizerConfig\); did you mean optimizer.lr"),
    ("optimizer.lr=abc", r"optimizer.lr='abc' is not a valid value: expected float or None$"),
    ("model.tensor_model_parallel_size=0", "model.tensor_model_parallel_size=0 must be at least 1"),
    ("train.global_batch_size=0", "train.global_batch_size=0 must be at least 1"),
    ("model.sequence_parallel=maybe", r"model.sequence_parallel='maybe' is not a valid value: expected bool$"),
    ("objective.variant=grpo", "objective: variant must be one of"),
    # NaN passed every bound; these three queued and failed (or trained a step on NaN) at the job's start
    ("optimizer.lr=.nan", r"optimizer.lr=nan must be a finite number$"),
    ("optimizer.adam_beta2=1.5", r"optimizer.adam_beta2=1.5 must be below 1$"),
    ("train.train_iters=100", r"train.train_iters=100 is not a setting: .* Use dataset.epochs"),
    # honoured, these wrote over another run's checkpoints, or requeued a job for ever (schema.NOT_SETTINGS)
    ("checkpoint.save=/elsewhere", r"checkpoint.save='/elsewhere' is not a setting: run_dir sets it"),
    ("train.skip_train=true", r"train.skip_train=True is not a setting: nemo-topr train has no validation data"),
    # a sweep below the preset's min_lr (5e-7) queued, then Megatron's scheduler asserted at the start
    ("optimizer.lr=1e-7", r"optimizer.lr=1e-07 is below optimizer.min_lr=5e-07, where the schedule decays to"),
    # plan said FITS to these; train refused them, or (the last four) raised after writing the run dir
    ("device=gpu", r"device must be one of cuda, cpu; got 'gpu'$"),
    ("resume_from_base=maybe", r"resume_from_base='maybe' must be true or false$"),
    ("dataset.seq_length=1024", r"dataset.seq_length \(1024\) must equal model.seq_length \(2048\)$"),
    ("train.global_batch_size=", r"train.global_batch_size=: an empty value \(an unset shell variable\?\)"),
    # Hydra's add prefix: "unknown config section '+optimizer'"
    ("+optimizer.weight_decay=0.1", r"\+optimizer.weight_decay=0.1: Hydra's \+ and ~ prefixes are not read here; set "
                                    r"any key of the config as is \(optimizer.weight_decay=VALUE"),
    ("train.global_batch_size=null", r"train.global_batch_size is unset \(null\): a run needs a value; set "
                                     r"train.global_batch_size=VALUE$"),
    ("train=5", r"train=5: train is a section; set its keys, as train.KEY=VALUE$"),
    # a key of a section given at the top is unknown there, with the key it may mean
    ("epochs=2", r"unknown config key epochs\b.*did you mean dataset\.epochs\b"),
    ("lr=0.1", r"unknown config key lr\b.*did you mean optimizer\.lr\b"),
    ("run-dir=x", r"unknown config key run-dir\b.*did you mean run_dir\b"),
    ("foo=1", r"unknown config key foo\b"),
    ("rng.seed=0", r"rng.seed=0 must be at least 1$"),
    ("model.fp16=true", r"model.fp16 and model.bf16 are both true"),
    ("model.recompute_granularity=full", r"model.recompute_granularity=full needs model.recompute_method"),
]


@pytest.mark.parametrize("override, message", MISTYPED_OVERRIDES)
def test_plan_runs_the_key_type_and_range_checks_of_train(override, message, capsys):
    """`plan` checks the config as `train` does (`check_values`), before any arithmetic."""
    import re

    assert main(["llama31_8b_bf16", override]) == 1
    err = capsys.readouterr().err
    assert re.search(message, err), err


@pytest.mark.parametrize("argv, flag", [
    (["llama31_70b_bf16"], "--nodes 4"),  # TP8·PP4 = 32 GPUs, 8 a node
    (["llama31_70b_fp8", "--nodes", "3"], "--nodes 4"),
    (["llama31_70b_bf16", "--nodes", "5"], "--nodes 8"),
    (["llama31_70b_bf16", "--gpus-per-node", "4"], "--nodes 8"),
    # the layout's own numbers, not the preset's: TP8·PP2 = 16 GPUs
    (["llama31_70b_bf16", "model.pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size=null"],
     "--nodes 2"),
])
def test_a_layout_that_does_not_divide_the_gpus_names_the_node_count_that_does(argv, flag, capsys):
    """The verdict said LAYOUT REJECTED (world size) and left the fix to the preset's YAML header."""
    assert main(argv) == 1
    verdict = capsys.readouterr().out.splitlines()[-1]
    assert verdict.startswith("verdict: LAYOUT REJECTED") and re.search(rf"{flag}\b", verdict), verdict


def test_micro_batch_above_one_with_pipeline_parallel_is_rejected(capsys):
    """Packed THD streams [1, MBS·seq] against pipeline buffers [seq, MBS, hidden]: only MBS = 1
    keeps the token order; local attention (no THD stream) is unaffected."""
    seventy_b = Layout(nodes=4, gpus_per_node=8, tp=8, pp=4, vp=5, sequence_parallel=True, global_batch=64)
    assert not [f for f in check_layout(LLAMA_70B, seventy_b) if f.blocking]
    failed = {f.rule: f.detail for f in check_layout(LLAMA_70B, dataclasses.replace(seventy_b, micro_batch=2))
              if f.blocking}
    assert "set train.micro_batch_size=1" in failed["micro batch = 1 with PP > 1 (TOPR step)"]
    local = dataclasses.replace(seventy_b, micro_batch=2, fused_attention=False)
    assert not [f for f in check_layout(LLAMA_70B, local) if f.blocking]
    assert main(["llama31_70b_bf16", "--nodes", "4", "train.micro_batch_size=2"]) == 1
    assert "FAIL  micro batch = 1 with PP > 1 (TOPR step): micro batch 2, PP = 4" in capsys.readouterr().out


def test_batched_p2p_at_pp2_with_virtual_stages_fails_the_plan(capsys):
    """The rule `train` enforces (nemo_topr/training/config.py, choose_pipeline_p2p), from the
    config: the 70B preset (VP=5) on two nodes at PP=2."""
    pp2 = ["llama31_70b_bf16", "--nodes", "2", "model.pipeline_model_parallel_size=2"]
    main([*pp2, "model.batch_p2p_comm=true"])
    assert ("FAIL  unbatched p2p at PP = 2 with VP (Megatron): model.batch_p2p_comm=true: Megatron's batched sends "
            "to the one neighbour arrive crossed (NVIDIA/Megatron-LM#750): leave it unset") in capsys.readouterr().out
    main(pp2)
    assert "ok    unbatched p2p at PP = 2 with VP (Megatron): overlapped, unbatched p2p" in capsys.readouterr().out


def test_one_virtual_stage_or_virtual_stages_without_a_pipeline_fail_the_plan(capsys):
    """VP = 1 runs Megatron's interleaved schedule, which fails at the first step; VP at PP = 1
    fails in Megatron's set-up (both met through `finetune()` on CPU, 2026-11-30)."""
    seventy_b = ["llama31_70b_bf16", "--nodes", "4"]
    assert main([*seventy_b, "model.virtual_pipeline_model_parallel_size=1"]) == 1
    assert ("FAIL  VP >= 2 with PP > 1: VP = 1: one chunk per stage; Megatron's interleaved schedule fails at the "
            "first step: leave VP unset") in capsys.readouterr().out
    assert main(["llama31_8b_bf16", "model.virtual_pipeline_model_parallel_size=2"]) == 1
    assert ("FAIL  VP >= 2 with PP > 1: VP = 2 at PP = 1: Megatron refuses virtual stages without a pipeline"
            in capsys.readouterr().out)
    assert main(seventy_b) == 0
    assert "ok    VP >= 2 with PP > 1: VP = 5 chunks per stage of PP = 4" in capsys.readouterr().out


def test_cli_reports_does_not_fit(capsys):
    """8B at TP=1 without the distributed optimizer: bf16 weights, fp32 grads and Adam states are
    2 + 4 + 12 = 18 B/param x 8.03e9 = 135 GiB per GPU before any activation."""
    assert main(["llama31_8b_bf16", "model.tensor_model_parallel_size=1", "model.sequence_parallel=false",
                 "optimizer.use_distributed_optimizer=false", "ddp.use_distributed_optimizer=false"]) == 1
    assert "verdict: DOES NOT FIT" in capsys.readouterr().out


def test_a_rejected_layout_leads_the_verdict_and_its_estimated_dp_is_named(capsys):
    """70B (TP8·PP4 = 32 GPUs) on one node: the layout line said DP=1 beside a check saying
    DP = 8/32 = 0.25, and the verdict began "FITS: 48.18 GiB", read as a yes (found by probing)."""
    assert main(["llama31_70b_bf16", "--nodes", "1"]) == 1
    out = capsys.readouterr().out.splitlines()
    layout = next(line for line in out if line.startswith("layout "))
    assert "DP=1 (estimated: 8 GPUs do not divide into TP·PP·CP = 32)" in layout
    assert out[-1].startswith("verdict: LAYOUT REJECTED (world size = TP·PP·CP·DP: --nodes 4 gives DP = 1); memory, "
                              "were it accepted: FITS: ")
    assert main(["llama31_70b_bf16", "--nodes", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "DP=1 (VP=5" in next(line for line in out if line.startswith("layout "))
    assert out[-1].startswith("verdict: FITS: ") and out[-1].endswith("; layout OK")


@pytest.mark.parametrize("options, key", [
    (["--nodes", "0"], "--nodes.below_1"),
    (["--gpus-per-node", "-2"], "--gpus-per-node.below_1"),
    (["--gpu-memory-gb", "0"], "--gpu-memory-gb.not_positive"),
    (["--gpu-memory-gb", "nan"], "--gpu-memory-gb.not_positive"),
    (["--reserve-gb", "-1"], "--reserve-gb.out_of_range"),
    (["--gpu-memory-gb", "40", "--reserve-gb", "40"], "--reserve-gb.out_of_range"),
])
def test_a_machine_that_cannot_exist_is_a_usage_error_not_a_verdict(options, key, capsys):
    """--gpu-memory-gb 0 (a typo for 80) is a usage error, not a whole report ending "DOES NOT FIT"."""
    assert refusal(plan.main, ["llama31_8b_bf16", *options]) == (2, key, key.partition(".")[0])
    assert capsys.readouterr().out == ""


def test_the_config_is_taken_as_submit_and_train_spell_it_too(capsys):
    """`plan --config X` read --config as an abbreviation of --config-path and asked for a config;
    train's `--config-name X` was unrecognized. Both now plan X, as its first word does."""
    assert main(["llama31_8b_bf16", "--nodes", "1"]) == 0
    report = capsys.readouterr().out
    for argv in (["--config", "llama31_8b_bf16", "--nodes", "1"], ["--nodes", "1", "--config-name=llama31_8b_bf16"]):
        assert main(argv) == 0
        assert capsys.readouterr().out == report
    for argv in (["--config"], ["--config", "--nodes", "1"], ["--config", "train.micro_batch_size=1"]):
        assert refusal(plan.main, argv) == (2, "--config.value.missing", "--config")
    # a second one was read as --config-path: "no config 'llama31_8b_bf16' in .../llama31_70b_bf16"
    for argv, second in ((["--config", "llama31_8b_bf16", "--config", "llama31_70b_bf16"], "--config"),
                         (["--config-name=llama31_8b_bf16", "--nodes", "1", "--config-name=x.yaml"], "--config-name")):
        assert refusal(plan.main, argv) == (2, "--config.twice", second)


# ------------------------------------------------------------------------- the shipped presets

@pytest.mark.parametrize("name", PRESETS)
def test_presets_pass_the_planner_at_their_cluster_size(name, capsys):
    arch, nodes = PRESETS[name]
    assert main([name, "--nodes", str(nodes), "--gpus-per-node", "8", "--gpu-memory-gb", "80"]) == 0
    out = capsys.readouterr().out
    assert f"{arch.total_params:,} parameters" in out and "FAIL" not in out
    assert "verdict: FITS" in out and "layout OK" in out


def write_hf_config(arch: Architecture, directory) -> str:
    """A placeholder Hugging Face model whose `config.json` is a Llama 3.1's, enough for AutoBridge's provider."""
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": arch.hidden_size, "intermediate_size": arch.ffn_hidden_size,
        "num_hidden_layers": arch.num_layers, "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_query_groups, "head_dim": arch.kv_channels,
        "vocab_size": arch.vocab_size, "tie_word_embeddings": arch.share_embeddings_and_output_weights,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
        "bos_token_id": 128000, "eos_token_id": 128001,
    }
    return str(placeholder_hf_model(directory, config))


def test_planner_reads_hf_config_json(tmp_path):
    hf = write_hf_config(LLAMA_70B, tmp_path / "Llama-3.1-70B")
    arch, source = resolve_architecture({"base_model": hf, "model": {}}, "anything", None)
    assert source.endswith("config.json") and arch.total_params == LLAMA_70B.total_params
    arch, _ = resolve_architecture({"base_model": hf, "model": {"num_layers": 40}}, "anything", None)
    assert arch.num_layers == 40  # the arithmetic applies model.* keys; check_values refuses this one first



def test_a_config_json_without_a_size_or_with_a_text_one_is_named_not_a_traceback(tmp_path, capsys):
    """`plan` and `submit` ended in a KeyError or TypeError traceback from the architecture arithmetic."""
    import json

    model = placeholder_hf_model(tmp_path / "m", {"architectures": ["LlamaForCausalLM"]})
    assert main(["llama31_8b_bf16", f"base_model={model}"]) == 1
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        f"nemo-topr plan: {model}/config.json: no num_hidden_layers, hidden_size, intermediate_size, "
        "num_attention_heads, vocab_size (a Llama's")
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": "4096",
              "intermediate_size": 64, "num_attention_heads": 0, "vocab_size": 100, "head_dim": None}
    (model / "config.json").write_text(json.dumps(config))
    assert main(["llama31_8b_bf16", f"base_model={model}"]) == 1
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        f"nemo-topr plan: {model}/config.json: hidden_size='4096', num_attention_heads=0: not a positive integer")
    config.update(hidden_size=64, num_attention_heads=4)  # head_dim null: HF's default, hidden // heads
    (model / "config.json").write_text(json.dumps(config))
    arch, _ = resolve_architecture({"base_model": str(model), "model": {}}, "anything", None)
    assert (arch.kv_channels, arch.num_query_groups) == (16, 4)


@pytest.fixture(scope="module")
def cpu_bridge():
    from nemo_topr.model import cpu_runtime

    cpu_runtime.enable_cpu_runtime()


def _build(name: str, tmp_path, *overrides: str):
    from nemo_topr.training.config import build_training_run, compose

    arch = PRESETS[name][0]
    hf = write_hf_config(arch, tmp_path / "hf")
    return build_training_run(compose(name, [f"hf_model={hf}", f"run_dir={tmp_path / 'run'}",
                                             "dataset.train_path=unused.jsonl", *overrides]))


@pytest.mark.slow  # importing Bridge takes 13-25 s on CPU machines
@pytest.mark.parametrize("name", PRESETS)
def test_preset_keys_exist_on_bridge_and_pass_megatron_validation(name, tmp_path, cpu_bridge):
    """check_values checks every section strictly (`check_section` against Bridge's
    ConfigContainer dataclasses and GPTModelProvider); finalize() runs Megatron-Core's own
    TransformerConfig checks (VP split, FP8 recipe and BF16 layer counts, pipeline dtype)."""
    import torch
    from omegaconf import OmegaConf

    from nemo_topr.training.config import compose

    raw = compose(name)
    assert OmegaConf.is_missing(raw, "base_model")  # a local path must be given; never a hub id
    run = _build(name, tmp_path)
    container, model = run.container, run.container.model
    assert (model.num_layers, model.hidden_size) == (PRESETS[name][0].num_layers, PRESETS[name][0].hidden_size)
    assert model.bf16 and model.context_parallel_size == 1
    optimizer = container.optimizer
    assert (optimizer.optimizer, optimizer.lr, optimizer.min_lr, optimizer.weight_decay, optimizer.clip_grad) == \
        ("adam", 5e-7, 5e-7, 0.0, 1.0)
    assert container.scheduler.lr_decay_style == "constant" and container.dataset.epochs == 1
    assert optimizer.use_distributed_optimizer and container.ddp.use_distributed_optimizer
    model.finalize()  # also resolves dtype strings ("bf16") Bridge could not convert while applying the YAML
    assert model.params_dtype == model.pipeline_dtype == torch.bfloat16


@pytest.mark.slow
def test_delayed_scaling_switch_documented_in_the_presets(tmp_path, cpu_bridge):
    """The switch docs/cluster.md gives passes Megatron-Core; leaving the BF16 first/last
    layers on is rejected by Megatron-Core and by the planner alike."""
    delayed = ["model.fp8_recipe=delayed", "model.fp8_amax_history_len=1024", "model.fp8_amax_compute_algo=max"]
    _build("llama31_8b_fp8", tmp_path / "ok", *delayed, "model.first_last_layers_bf16=false").container.model.finalize()
    with pytest.raises(ValueError, match="Delayed scaling does not support"):
        _build("llama31_8b_fp8", tmp_path / "bad", *delayed).container.model.finalize()
    assert main(["llama31_8b_fp8", *delayed]) == 1
