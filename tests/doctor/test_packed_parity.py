"""The doctor's packed parity check (nemo_topr/doctor/packed_parity.py) on CPU: its comparison, its
bounds and its naming. TE itself runs only on a GPU; here the candidate is Megatron's local
layers in BF16 (what the bounds were calibrated on) or with attention crossing sequences (what
the check exists to catch)."""

from __future__ import annotations

import math
import os

import pytest
import torch

from nemo_topr.doctor import packed_parity as doctor_parity
from nemo_topr.doctor.runner import CheckFailed, result_line
from nemo_topr.doctor.packed_parity import BOUNDS, Measured, compare

NCCL_AT_EXIT = ("[rank0]:[W1126 14:39:43.242621781 ProcessGroupNCCL.cpp:1575] Warning: WARNING: "
                "destroy_process_group() was not called before program exit, which can leak resources.")


def test_the_result_is_the_marked_line_not_what_the_process_printed_after_it(tmp_path):
    # packed parity's log on the H200 (bench/results/gpu_h200_2026-11-26_stage2c_log.txt) ended so
    log = tmp_path / "packed_parity.log"
    log.write_text("doctor result: TE THD vs local layers on 235 packed tokens: ...\n" + NCCL_AT_EXIT + "\n")
    assert result_line(str(log)) == "TE THD vs local layers on 235 packed tokens: ..."
    log.write_text("TE THD vs local layers\n" + NCCL_AT_EXIT + "\n")
    with pytest.raises(CheckFailed, match="printed no result line"):
        result_line(str(log))


def test_te_names_of_the_fused_norms_map_back_to_the_local_names():
    assert (doctor_parity._local_name("decoder.layers.1.self_attention.linear_qkv.layer_norm_weight")
            == "decoder.layers.1.input_layernorm.weight")
    assert doctor_parity._local_name("decoder.layers.0.mlp.linear_fc1.layer_norm_weight") == \
        "decoder.layers.0.pre_mlp_layernorm.weight"
    for unchanged in ("decoder.layers.0.mlp.linear_fc1.weight", "decoder.final_layernorm.weight",
                      "output_layer.weight"):
        assert doctor_parity._local_name(unchanged) == unchanged
    local = {"decoder.layers.3.input_layernorm.weight": 1, "embedding.word_embeddings.weight": 2}
    assert {doctor_parity._local_name(k) for k in doctor_parity._as_te_state(local)} == set(local)


def _measured(ce: list[float], log_pi: list[float], **gradients: list[float]) -> Measured:
    return Measured(torch.tensor([ce]), torch.tensor(log_pi, dtype=torch.float64),
                    {name: torch.tensor(values) for name, values in gradients.items()})


def test_compare_by_hand():
    reference = _measured([1.0, 2.0, 0.0], [-10.0, -20.0], a=[3.0, 4.0], b=[0.0, 12.0])
    candidate = _measured([1.5, 1.9, 0.0], [-10.3, -19.9], a=[3.0, 4.5], b=[0.0, 12.0])
    found = compare(reference, candidate)
    assert found["per-token CE"] == pytest.approx(0.5)
    assert found["per-sequence log pi"] == pytest.approx(0.3)
    # ||(0, 0.5, 0, 0)|| / ||(3, 4, 0, 12)|| = 0.5 / 13; a is the worst weight, 0.5 / 5 = 1.00e-01
    assert found["TOPR gradient"] == pytest.approx(0.5 / 13)
    assert found["worst weight"] == "a 1.00e-01"
    with pytest.raises(ValueError, match="not of the same weights"):
        compare(reference, _measured([1.0, 2.0, 0.0], [-10.0, -20.0], a=[3.0, 4.0]))


def _tiny_model(bf16: bool):
    from nemo_topr.model.cpu_runtime import cpu_model_overrides
    from nemo_topr.model.providers import tiny_llama_provider

    provider = cpu_model_overrides(tiny_llama_provider(seq_length=doctor_parity.SEQ_LENGTH))
    if bf16:
        provider.bf16, provider.params_dtype, provider.pipeline_dtype = True, torch.bfloat16, torch.bfloat16
    provider.finalize()
    return provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)[0].eval()


@pytest.fixture(scope="module")
def fp32_and_bf16(megatron_world):
    """The same BF16-representable weights in an fp32 and a BF16 model; the batch with its log mu."""
    from megatron.core.utils import unwrap_model

    torch.manual_seed(0)
    reference, bf16 = _tiny_model(False), _tiny_model(True)
    state = {k: v.to(torch.bfloat16) for k, v in unwrap_model(reference).state_dict().items()
             if isinstance(v, torch.Tensor) and v.is_floating_point()}
    unwrap_model(reference).load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    unwrap_model(bf16).load_state_dict(state, strict=False)
    batch = doctor_parity._packed_batch()
    return reference, bf16, doctor_parity.with_behavior(batch, doctor_parity.measure(reference, batch).log_pi)


def test_the_batch_takes_every_branch_of_topr(fp32_and_bf16):
    """Positives, negatives with rho < 1 and one with rho > 1 (truncated): the gradient goes
    through both weights. rho = exp(log pi - log mu) = exp(-offset)."""
    reference, _, batch = fp32_and_bf16
    log_pi = doctor_parity.measure(reference, batch).log_pi
    rho = torch.exp(log_pi - batch["behavior_logprobs"].to(torch.float64))
    negative = batch["rewards"] < 0
    assert 0 < int((~negative).sum()) and int((negative & (rho < 1)).sum()) == 2
    assert int((negative & (rho > 1)).sum()) == 1
    assert rho[negative].tolist() == pytest.approx([math.exp(0.5), math.exp(-0.5), math.exp(-0.5)], rel=1e-5)


def test_bf16_against_fp32_stays_well_inside_the_bounds_and_reaches_every_weight(fp32_and_bf16):
    reference, bf16, batch = fp32_and_bf16
    exact, rounded = doctor_parity.measure(reference, batch), doctor_parity.measure(bf16, batch)
    names = {name for name, _ in reference.named_parameters()}
    assert len(exact.gradients) == len(names) > 0
    assert all(float(g.abs().sum()) > 0 for g in exact.gradients.values())
    found = compare(exact, rounded)
    # measured on 2026-11-26 (CPU, this fixture): 2.3e-03, 5.1e-03 and 4.8e-03, a tenth of each bound or less
    for name, bound in BOUNDS.items():
        assert 0 < found[name] <= bound / 5, (name, found)
    assert compare(exact, doctor_parity.measure(reference, batch))["TOPR gradient"] == 0


def test_attention_across_sequences_breaks_every_bound(fp32_and_bf16, monkeypatch):
    """What the check exists for: a backend that drops the boundaries of packed sequences (here
    local attention given a plain causal mask over each whole row)."""
    from nemo_topr.training import step

    reference, _, batch = fp32_and_bf16
    exact = doctor_parity.measure(reference, batch)
    length = batch["tokens"].shape[1]
    causal_rows = ~torch.ones(length, length, dtype=torch.bool).tril()[None, None].expand(len(batch["tokens"]), 1,
                                                                                           -1, -1)
    monkeypatch.setattr(step, "packed_attention_mask", lambda _: causal_rows)
    found = compare(exact, doctor_parity.measure(reference, batch))
    for name, bound in BOUNDS.items():
        assert found[name] > bound, (name, found)


def test_both_models_get_the_same_attention_backend(megatron_world, monkeypatch):
    """`--attention-backend unfused` (TE without cuDNN attention): Megatron sets TE's NVTE_*_ATTN
    variables when a model is built and refuses a build that asks for other values, so the local
    model is built with the TE model's backend."""
    for variable in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN"):
        monkeypatch.delenv(variable, raising=False)  # restored after the test: Megatron writes them
    doctor_parity._build("local", "unfused")
    assert [os.environ[v] for v in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")] == ["0", "0", "1"]
    doctor_parity._build("local", "unfused")
    with pytest.raises(AssertionError, match="NVTE_FLASH_ATTN set to 0"):
        doctor_parity._build("local", "auto")
