"""The GPU path built on CPU with CUDA mocked: what Bridge and Megatron would construct on a GPU
(flags, layer spec, which core attention and softmax run), and the traps in their sources that
would stop the first GPU run or let attention cross packed-sequence boundaries.

`torch.cuda.is_available` is monkeypatched to True and the presence of Transformer Engine / Apex
is chosen per case; no test here runs anything on a GPU. Transformer Engine is not installed on
this machine (Megatron's `TEDotProductAttention` is then a placeholder), so its layer spec is
stood in by a spec whose core attention is a class of that module and name (what
`get_gpt_layer_with_transformer_engine_spec` puts there with TE installed).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.conftest import REPO
from nemo_topr.model import settings as model_settings
from nemo_topr.model.attention_check import FLEX, MASK, THD, AttentionError, check_attention, core_attention_of_spec


@pytest.mark.slow
def test_bridge_setup_uses_the_prebuilt_dataset_helpers_on_cuda():
    """Bridge's set-up calls compile_helpers() (`make` in megatron/core/datasets; the wheel has no
    Makefile, so sys.exit(1)). On the CUDA path, before any CPU runtime, it must compile nothing.
    A fresh process: the CPU runtime of other tests must not be what makes it pass."""
    script = textwrap.dedent("""
        import subprocess, torch
        torch.cuda.is_available = lambda: True
        from nemo_topr.model.device import use_device
        assert use_device("cuda", where="--device") == "cuda"
        def no_make(*args, **kwargs):
            raise SystemExit(f"compile_helpers ran {args}")
        subprocess.run = no_make
        import megatron.bridge.training.initialize as bridge_initialize
        bridge_initialize.compile_helpers()
        print("compiled nothing")
    """)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "compiled nothing" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


TE_DOT_PRODUCT_ATTENTION = type("TEDotProductAttention", (), {"__module__": "megatron.core.extensions.transformer_engine"})


@pytest.fixture
def gpu(monkeypatch):
    """CUDA mocked available; returns a function choosing whether TE and Apex are installed."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def machine(*, te: bool, apex: bool) -> None:
        monkeypatch.setattr(model_settings, "transformer_engine_available", lambda: te)
        monkeypatch.setattr(model_settings, "gradient_accumulation_fusion_available", lambda: apex)
        if te:  # the spec Bridge's default_layer_spec would get from TE
            import megatron.bridge.models.gpt_provider as gpt_provider

            def te_spec(config):
                spec = gpt_provider.local_layer_spec(config)
                spec.submodules.self_attention.submodules.core_attention = TE_DOT_PRODUCT_ATTENTION
                return spec

            monkeypatch.setattr(gpt_provider, "transformer_engine_layer_spec", te_spec)

    return machine


def _gpu_provider(transformer_impl: str):
    """A provider as a verb gets it on the GPU (settings applied at creation), then the YAML's
    model.transformer_impl, then the settings again (`build_training_run` order)."""
    from nemo_topr.model.providers import tiny_llama_provider

    provider = tiny_llama_provider()
    provider.transformer_impl = transformer_impl
    provider.masked_softmax_fusion = True  # Bridge's default when the Apex kernel is there
    return model_settings.device_model_settings(provider)


CASES = list(itertools.product((True, False), (True, False), ("transformer_engine", "local"), (False, True)))


@pytest.mark.parametrize("te, apex, impl, shared", CASES,
                         ids=[f"te={t}-apex={a}-{i}-shared={s}" for t, a, i, s in CASES])
def test_each_gpu_combination_runs_an_attention_that_honours_the_mask_or_is_refused(megatron_world, gpu,
                                                                                     te, apex, impl, shared):
    from nemo_topr.training.flex_attention import FlexCoreAttention, prepare_shared_prefix_attention

    gpu(te=te, apex=apex)
    provider = _gpu_provider(impl)
    if shared:  # build_training_run's order: the device settings, then the shared-prefix attention
        prepare_shared_prefix_attention(provider)
    spec = provider.transformer_layer_spec(provider)
    attention, mask_type = core_attention_of_spec(spec)
    assert provider.gradient_accumulation_fusion is apex  # trained with DDP: only with Apex's kernel
    assert provider.masked_softmax_fusion is False or provider.transformer_impl != "local"
    if not te:  # the supported GPU route without TE: local layers, TE/Apex fusions off
        assert provider.transformer_impl == "local"
        assert not (provider.apply_rope_fusion or provider.persist_layer_norm or provider.masked_softmax_fusion)
    route = check_attention(attention, mask_type, provider, shared_prefix=shared)
    if provider.transformer_impl == "local":
        assert (attention.__name__, route) == ("DotProductAttention", MASK)
    elif shared:  # TE's layers keep their linears; only the core attention is FlexCoreAttention
        assert (attention, route) == (FlexCoreAttention, FLEX)
        assert spec.submodules.self_attention.submodules.linear_qkv == _gpu_provider(impl).transformer_layer_spec(
            provider).submodules.self_attention.submodules.linear_qkv
    else:
        assert (attention.__name__, route) == ("TEDotProductAttention", THD)
        with pytest.raises(AttentionError, match="shared-prefix rows need"):
            check_attention(attention, mask_type, provider, shared_prefix=True)


def test_a_flex_attention_spec_is_refused_unless_the_step_gives_it_the_block_mask(megatron_world, gpu):
    """FlexCoreAttention reads only the FlexAttention block mask: under a provider whose layer spec
    does not carry the mark (the step would give it a dense mask or cu_seqlens) it is refused, and
    TE's attention is refused where the step would give it the block mask."""
    from nemo_topr.training.flex_attention import FlexCoreAttention, use_flex_attention

    gpu(te=True, apex=False)
    for impl in ("transformer_engine", "local"):
        with pytest.raises(AttentionError, match="which it does not read.*use_flex_attention"):
            check_attention(FlexCoreAttention, None, _gpu_provider(impl), shared_prefix=False)
    flex_provider = use_flex_attention(_gpu_provider("transformer_engine"))
    with pytest.raises(AttentionError, match="FlexAttention block mask, which it does not read"):
        check_attention(TE_DOT_PRODUCT_ATTENTION, None, flex_provider, shared_prefix=False)


def test_the_two_silent_cross_sequence_cases_of_the_old_path_are_refused(megatron_world, gpu):
    """What the GPU path built before: transformer_impl=local changed a string and kept TE's spec;
    local layers kept the fused causal softmax. Both ignore the packed mask: both are refused."""
    gpu(te=True, apex=True)
    from megatron.bridge.models.gpt_provider import default_layer_spec
    from nemo_topr.model.providers import tiny_llama_provider

    provider = tiny_llama_provider()
    provider.transformer_impl = "local"  # the string alone
    te_spec = default_layer_spec(provider)
    with pytest.raises(AttentionError, match="dense block mask, which it does not read"):
        check_attention(*core_attention_of_spec(te_spec), provider, shared_prefix=False)
    provider = _gpu_provider("local")
    provider.masked_softmax_fusion = True
    with pytest.raises(AttentionError, match="fused causal softmax kernel ignores the packed mask"):
        check_attention(*core_attention_of_spec(provider.transformer_layer_spec(provider)), provider,
                        shared_prefix=False)


def test_transformer_engine_asked_for_without_it_is_a_clear_error(megatron_world, gpu):
    gpu(te=False, apex=False)
    provider = _gpu_provider("local")
    provider.transformer_impl = "transformer_engine"
    with pytest.raises(ValueError) as refused:
        model_settings.follow_transformer_impl(provider)
    assert (refused.value.key, refused.value.where) == ("model.transformer_impl.without_transformer_engine",
                                                        "model.transformer_impl")


def test_builds_without_ddp_never_fuse_gradient_accumulation(megatron_world, gpu):
    """Apex present: a model built with wrap_with_ddp=False (scoring, import, bench/gpu.py) has no
    param.main_grad for the fused kernel; without Apex the output layer raises at construction.
    Either way: off."""
    gpu(te=True, apex=True)
    provider = _gpu_provider("transformer_engine")
    assert provider.gradient_accumulation_fusion is True
    assert model_settings.device_model_settings(provider, wrapped_in_ddp=False).gradient_accumulation_fusion is False


def test_the_step_refuses_a_built_model_whose_attention_ignores_its_input(megatron_world):
    """On the model that runs: local attention handed cu_seqlens (transformer_impl says TE), and
    local attention with the fused causal softmax, are refused before the forward."""
    from tests.workers.topr_step_parallel import PAD_ID, SEQ_LENGTH, VOCAB, build_sequences

    from nemo_topr.data.packing import collate_packed
    from nemo_topr.model.providers import tiny_llama_provider
    from nemo_topr.training.step import forward_packed

    provider = tiny_llama_provider(vocab_size=VOCAB, seq_length=SEQ_LENGTH)
    provider.finalize()
    model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)[0]
    seqs = build_sequences([20, 30, 40], seed=0)
    batch = collate_packed(seqs, [[0, 1], [2]], SEQ_LENGTH, PAD_ID)
    assert torch.isfinite(forward_packed(model, batch, model.config)).all()  # the local route runs
    for setting, value, message in (("transformer_impl", "transformer_engine", "cu_seqlens, which it does not read"),
                                    ("masked_softmax_fusion", True, "fused causal softmax")):
        model.__dict__.pop("_topr_attention_checked")
        original = getattr(model.config, setting)
        setattr(model.config, setting, value)
        try:
            with pytest.raises(AttentionError, match=message):
                forward_packed(model, batch, model.config)
        finally:
            setattr(model.config, setting, original)


def test_config_only_sources_get_a_seeded_cuda_rng_tracker(megatron_world, monkeypatch):
    """Building a model with perform_initialization=True forks "model-parallel-rng"; on CUDA the
    process-group set-up of scoring/export/iterate must have added it (Bridge's finetune does it
    for training). With CUDA mocked the tracker is seeded through the CPU runtime's RNG patches."""
    from megatron.core import tensor_parallel

    from nemo_topr.utils.distributed import initialize_model_parallel

    tracker = tensor_parallel.get_cuda_rng_tracker()
    tracker.reset()
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda seed: None)  # CUDA's own generator: absent here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    try:
        initialize_model_parallel(1, 1)
        assert "model-parallel-rng" in tracker.get_states()
    finally:
        tracker.reset()


def _packed_batch():
    from tests.workers.topr_step_parallel import PAD_ID, build_sequences

    from nemo_topr.data.packing import collate_packed

    seqs = build_sequences([6, 5, 5, 9, 6], seed=1)
    return collate_packed(seqs, [[0, 1, 2], [3, 4]], 18, PAD_ID)  # both rows end in padding


def _segment_of(cu_seqlens: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """Segment number of every position of the flattened stream [rows, length]."""
    return (torch.searchsorted(cu_seqlens, torch.arange(rows * length, dtype=torch.int32), right=True) - 1).view(
        rows, length)


@pytest.mark.guards_packing
def test_thd_boundaries_are_computed_on_the_host_and_give_the_packed_mask():
    """THD attention with cu_seqlens (causal within a segment) sees exactly what the local path's
    packed_attention_mask lets it see; the boundaries come from the CPU batch, and a device
    batch without them is refused rather than read back from the device."""
    from nemo_topr.training.step import packed_attention_mask, packed_seq_params, thd_cu_seqlens, with_thd_boundaries

    batch = _packed_batch()
    rows, length = batch["tokens"].shape
    cu_seqlens = thd_cu_seqlens(batch)
    assert cu_seqlens.tolist() == [0, 6, 11, 16, 18, 27, 33, 36]  # hand-counted: 6+5+5 then pad, 9+6 then pad
    segment = _segment_of(cu_seqlens, rows, length)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    visible = (segment[:, :, None] == segment[:, None, :]) & causal
    assert torch.equal(~visible[:, None], packed_attention_mask(batch))

    config = type("Config", (), {"transformer_impl": "transformer_engine"})()
    params = packed_seq_params(with_thd_boundaries(batch, config))
    assert torch.equal(params.cu_seqlens_q, cu_seqlens) and params.max_seqlen_q == length  # fixed, not data's max
    local = type("Config", (), {"transformer_impl": "local"})()
    assert "cu_seqlens" not in with_thd_boundaries(batch, local)
    with pytest.raises(ValueError, match="no cu_seqlens"):
        packed_seq_params(batch)


def test_rope_restarting_per_segment_gives_the_attention_of_row_positions(megatron_world):
    """TE's THD attention restarts RoPE at each cu_seqlens segment; the local path rotates at row
    positions. RoPE is relative, and the mask keeps each query in its segment, so both give the
    same attention output (Megatron's own RoPE tables and rotation)."""
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from nemo_topr.training.step import packed_attention_mask, thd_cu_seqlens

    batch = _packed_batch()
    rows, length = batch["tokens"].shape
    heads, dim = 2, 8
    angles = RotaryEmbedding(kv_channels=dim, rotary_percent=1.0, rotary_base=10_000).forward(length)  # [L,1,1,D]
    cu_seqlens = thd_cu_seqlens(batch)
    stream = torch.arange(rows * length)
    in_segment = (stream - cu_seqlens[_segment_of(cu_seqlens, rows, length).flatten()]).view(rows, length)
    real = batch["seq_index"] >= 0
    assert torch.equal(in_segment[real], batch["position_ids"][real])  # segment restarts = position ids

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(length, rows, heads, dim, generator=generator, dtype=torch.float64) for _ in range(3))
    blocked = packed_attention_mask(batch)  # [R, 1, L, L]

    def attention(positions: torch.Tensor) -> torch.Tensor:  # positions [R, L]
        table = angles.to(torch.float64)[positions.t()].flatten(2, 3)  # [L, R, 1, D]
        rq, rk = _apply_rotary_pos_emb_bshd(q, table), _apply_rotary_pos_emb_bshd(k, table)
        scores = torch.einsum("qrhd,krhd->rhqk", rq, rk).masked_fill(blocked, float("-inf"))
        return torch.einsum("rhqk,krhd->qrhd", scores.softmax(-1), v)

    rows_positions = torch.arange(length).expand(rows, length)
    row_out, segment_out = attention(rows_positions), attention(in_segment)
    # Megatron's angle table is fp32: an angle p*theta is rounded at ~6e-8 of itself, so positions
    # up to 18 differ from their in-segment twins by ~1e-6 rad at most
    assert torch.allclose(row_out, segment_out, rtol=1e-6, atol=1e-6)  # measured: 5e-8
    # the control: a mask that let queries cross segments would tell the two apart
    blocked = torch.zeros_like(blocked)
    assert not torch.allclose(attention(rows_positions), attention(in_segment), rtol=1e-3)


@pytest.mark.parametrize("impl, pipeline, requested, expected", [
    ("transformer_engine", 2, 4, 1),  # THD stream + pipeline: one row per micro-batch, as training
    ("transformer_engine", 1, 4, 4),
    ("local", 2, 4, 4),  # [rows, L] tensors: the pipeline's [L, rows, h] order holds
])
def test_scoring_follows_the_training_micro_batch_rule(impl, pipeline, requested, expected):
    import types

    from nemo_topr.training.config_error import ConfigError
    from nemo_topr.training.validation import _check_packed_stream_pipeline
    from nemo_topr.training.scoring import scoring_rows_per_batch

    model = types.SimpleNamespace(transformer_impl=impl, pipeline_model_parallel_size=pipeline)
    assert scoring_rows_per_batch(model, requested) == expected
    container = types.SimpleNamespace(model=model, train=types.SimpleNamespace(micro_batch_size=requested))
    if expected == requested:
        _check_packed_stream_pipeline(container)
    else:
        with pytest.raises(ConfigError, match="train.micro_batch_size=4"):
            _check_packed_stream_pipeline(container)


def test_scoring_takes_the_training_presets_model_section(megatron_world, tmp_path):
    """`score-logprobs --train-config llama31_8b_fp8`: mu is scored with the FP8 recipe and the
    TP/SP layout training uses (so log rho = 0 at step 0 up to FP8's own run-to-run noise)."""
    from nemo_topr.model.providers import build_tiny_hf_llama, hf_llama_provider
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer
    from nemo_topr.training.config_error import ConfigError
    from nemo_topr.training.scoring import apply_training_model_section

    _, provider = hf_llama_provider(build_tiny_hf_llama(tmp_path / "tiny", build_tiny_tokenizer()),
                                    load_weights=False, seq_length=512)
    apply_training_model_section(provider, "llama31_8b_fp8")
    assert (provider.fp8, provider.fp8_recipe, provider.first_last_layers_bf16) == ("hybrid", "tensorwise", True)
    assert (provider.tensor_model_parallel_size, provider.sequence_parallel, provider.bf16) == (2, True, True)
    assert provider.params_dtype == torch.bfloat16 and provider.seq_length == 512  # the scoring command's
    # the 70B preset's pipeline without its virtual stages, which scoring's world does not make
    apply_training_model_section(provider, "llama31_70b_bf16")
    assert (provider.pipeline_model_parallel_size, provider.virtual_pipeline_model_parallel_size) == (4, None)
    typo = tmp_path / "typo.yaml"
    typo.write_text("model:\n  fp8_recipee: tensorwise\n")
    with pytest.raises(ConfigError, match="model.fp8_recipee"):
        apply_training_model_section(provider, str(typo))


def test_scoring_flags_that_contradict_the_training_config_are_refused(megatron_world, tmp_path, capsys):
    """On cuda `--train-config` sets precision and TP/PP; a `--tp`, `--pp` or `--precision` given
    with it would be silently overridden, so it is refused. On CPU the config is not applied
    (said on stdout) and the flags hold, but it is read: a config that is not there is named."""
    from nemo_topr.model.providers import build_tiny_hf_llama, hf_llama_provider
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer
    from nemo_topr.training.config_error import ConfigError
    from nemo_topr.training.scoring import apply_scoring_layout

    hf_dir = build_tiny_hf_llama(tmp_path / "tiny", build_tiny_tokenizer())

    def layout(device, train_config=None, precision=None, tensor_parallel=None, pipeline_parallel=None):
        _, provider = hf_llama_provider(hf_dir, load_weights=False, seq_length=512)
        applied = apply_scoring_layout(provider, device, train_config=train_config, precision=precision,
                                       tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel)
        # what scoring_model_settings then checks FP8 against: the config only where it was applied
        assert applied == (train_config if device == "cuda" else None)
        return (provider.tensor_model_parallel_size, provider.pipeline_model_parallel_size, provider.params_dtype)

    with pytest.raises(ConfigError, match=r"^--train-config llama31_8b_bf16 takes the precision and TP/PP from its "
                                          r"model section; drop --tp, or drop --train-config"):
        layout("cuda", "llama31_8b_bf16", tensor_parallel=1)
    with pytest.raises(ConfigError, match="; drop --precision, --pp, or"):
        layout("cuda", "llama31_8b_bf16", precision="fp32", pipeline_parallel=2)
    assert layout("cuda", "llama31_8b_bf16") == (2, 1, torch.bfloat16)  # conf/llama31_8b_bf16.yaml: TP 2
    assert capsys.readouterr().out == ""
    assert layout("cpu", "llama31_8b_bf16", tensor_parallel=2) == (2, 1, torch.float32)
    assert "--train-config llama31_8b_bf16 is not applied (CPU scoring is fp32)" in capsys.readouterr().out
    # not applied, yet read: a CPU dry run scored with a misspelled config, and the GPU run then failed on it
    with pytest.raises(ConfigError, match=r"^no config 'llama31_8b_bf61' in .*; available: \["):
        layout("cpu", "llama31_8b_bf61")
    with pytest.raises(ConfigError, match=r"^config .*/nope\.yaml: no such file$"):
        layout("cpu", str(tmp_path / "nope.yaml"))
    assert layout("cuda") == (1, 1, torch.bfloat16) and layout("cpu") == (1, 1, torch.float32)
    assert layout("cuda", precision="fp32", pipeline_parallel=2) == (1, 2, torch.float32)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_scoring_refuses_a_training_config_that_reshapes_the_model(megatron_world, tmp_path, device):
    """A training config whose model section sets a key of the weights' shapes other than the scored
    model's (num_layers 5 over a model of 2) scored a model other than the one on disk; it is
    refused where it would be applied (cuda) and on the CPU dry run that reads it."""
    from nemo_topr.model.providers import build_tiny_hf_llama, hf_llama_provider
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer
    from nemo_topr.training.config_error import ConfigError
    from nemo_topr.training.scoring import apply_scoring_layout

    hf_dir = build_tiny_hf_llama(tmp_path / "tiny", build_tiny_tokenizer())
    assert json.loads((hf_dir / "config.json").read_text())["num_hidden_layers"] == 2
    reshaped = tmp_path / "reshaped.yaml"
    reshaped.write_text("model:\n  num_layers: 5\n  tensor_model_parallel_size: 1\n")
    _, provider = hf_llama_provider(hf_dir, load_weights=False, seq_length=512)
    with pytest.raises(ConfigError) as refused:
        apply_scoring_layout(provider, device, train_config=str(reshaped), precision=None, tensor_parallel=None,
                             pipeline_parallel=None)
    assert str(refused.value) == (
        f"--train-config {reshaped}: model.num_layers=5 differs from the scored model's num_layers=2: scoring reads "
        "--model's weights, whose shapes these keys set; drop them from the config's model section (the "
        "architecture comes from --model)")
    assert provider.num_layers == 2
    reshaped.write_text("model:\n  num_layers: 2\n  tensor_model_parallel_size: 1\n")  # the model's own value
    assert apply_scoring_layout(provider, device, train_config=str(reshaped), precision=None, tensor_parallel=None,
                                pipeline_parallel=None) == (str(reshaped) if device == "cuda" else None)


@pytest.mark.parametrize("te", [True, False])
def test_scoring_refuses_a_training_configs_fp8_on_a_gpu_without_te(megatron_world, gpu, tmp_path, te):
    """Without Transformer Engine the GPU route has local layers, which ignore model.fp8: scoring
    `--train-config llama31_8b_fp8` would write BF16 scores as if they were the FP8 ones. Training
    refuses that config there (`check_fp8`); scoring must refuse it too, and say how to go on."""
    from nemo_topr.model.providers import build_tiny_hf_llama, hf_llama_provider
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer
    from nemo_topr.training.config_error import ConfigError
    from nemo_topr.training.scoring import apply_training_model_section, scoring_model_settings

    gpu(te=te, apex=False)
    hf_dir = build_tiny_hf_llama(tmp_path / "tiny", build_tiny_tokenizer())

    def provider(train_config):
        _, built = hf_llama_provider(hf_dir, load_weights=False, seq_length=512)
        if train_config:
            apply_training_model_section(built, train_config)
        return built

    fp8 = provider("llama31_8b_fp8")
    if te:
        scoring_model_settings(fp8, "llama31_8b_fp8")
        assert (fp8.transformer_impl, fp8.fp8) == ("transformer_engine", "hybrid")
    else:
        with pytest.raises(ConfigError) as refused:
            scoring_model_settings(fp8, "llama31_8b_fp8")
        assert str(refused.value) == (
            "--train-config llama31_8b_fp8: model.fp8=hybrid with model.transformer_impl='local': FP8 runs only in "
            "Transformer Engine's layers, which this run does not build (TE not installed, or transformer_impl=local); "
            "install Transformer Engine (requirements-gpu.txt) or score in BF16 on purpose: --precision bf16 without "
            "--train-config")
    for bf16_config in ("llama31_8b_bf16", None):  # BF16 needs no TE: local layers score it
        built = provider(bf16_config)
        scoring_model_settings(built, bf16_config)
        assert built.transformer_impl == ("transformer_engine" if te else "local") and not built.fp8


def test_an_unknown_attention_is_refused_even_under_a_known_name():
    """Transformer Engine has its own class named DotProductAttention (inside its full-layer spec);
    it is not Megatron's local attention and takes no dense mask: only registered kinds pass."""
    import types

    te_own = type("DotProductAttention", (), {"__module__": "transformer_engine.pytorch.attention"})
    config = types.SimpleNamespace(transformer_impl="local", masked_softmax_fusion=False)
    with pytest.raises(AttentionError, match="not known to honour packed-sequence boundaries"):
        check_attention(te_own, "causal", config, shared_prefix=False)


def test_the_transformer_engine_pin_builds_against_this_torch_and_megatron():
    """Item 9: TE 2.20+ needs cuDNN >= 9.12 headers, TE 2.19+ a cudnn-frontend newer than
    megatron-core[dev]'s pin; the cuDNN that torch brings and that pin come from the installed
    wheels' metadata, so upgrading torch or Megatron re-decides this test, not a comment."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement
    from packaging.version import Version

    pins = [Requirement(line.split("#")[0]) for line in (REPO / "requirements-gpu.txt").read_text().splitlines()
            if line.split("#")[0].strip()]
    te = next(r for r in pins if r.name == "transformer-engine")
    assert len(te.specifier) == 1 and next(iter(te.specifier)).operator == "==", te  # exact, as the docs say
    te_version = Version(next(iter(te.specifier)).version)

    def pinned(package: str, dependency: str) -> Version:
        [req] = [Requirement(r) for r in requires(package) if Requirement(r).name == dependency]
        return Version(next(iter(req.specifier)).version)

    cudnn = pinned("torch", "nvidia-cudnn-cu12")
    frontend = pinned("megatron-core", "nvidia-cudnn-frontend")
    assert cudnn >= Version("9.12") or te_version < Version("2.20"), (te_version, cudnn)
    assert frontend > Version("1.26.0") or te_version < Version("2.19"), (te_version, frontend)
    assert te_version >= Version("2.17.1")  # the TE that Megatron-Core 0.19 and Bridge 0.6 are released against
    # TE 2.17.1's PyPI library sets a cuDNN 9.22 attribute in attention's backward (H200, 2026-11-26;
    # docs/cluster.md): while torch brings an older cuDNN, the route's install steps replace it
    route = (REPO / "requirements-gpu.txt").read_text() + (REPO / "docs" / "cluster.md").read_text()
    assert cudnn >= Version("9.22") or route.count('pip install --no-deps "nvidia-cudnn-cu12>=9.22"') == 2, cudnn
