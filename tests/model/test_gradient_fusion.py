"""gradient_accumulation_fusion follows what is importable, not Bridge's "TE imports" guess.

Bridge's GPTModelProvider defaults the fusion to on whenever transformer_engine.pytorch imports
(megatron/bridge/utils/fusions.py:34-53), but Megatron-Core's ColumnParallelLinear -- the output
layer, also under Transformer Engine -- raises without Apex's fused_weight_gradient_mlp_cuda
(megatron/core/tensor_parallel/layers.py:1070). Every verb's model settings
(`nemo_topr.model.settings.device_model_settings`) therefore turn it on only when that extension
can be imported and the model is wrapped in DDP. CUDA is mocked available (nothing runs on a GPU)."""

from __future__ import annotations

import pytest
import torch

from nemo_topr.model.settings import device_model_settings, gradient_accumulation_fusion_available


@pytest.fixture
def provider(tmp_path, megatron_world, monkeypatch):
    from nemo_topr.model.providers import build_tiny_hf_llama, hf_llama_provider
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    _, provider = hf_llama_provider(build_tiny_hf_llama(tmp_path / "tiny", build_tiny_tokenizer()),
                                    load_weights=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    provider.transformer_impl = "local"  # no TE on this machine; the fusion rule does not depend on it
    provider.gradient_accumulation_fusion = True  # what Bridge's default gives when TE imports
    return provider


def test_fusion_is_off_without_apex_even_when_the_provider_asked_for_it(provider):
    assert not gradient_accumulation_fusion_available()  # no Apex CUDA extension on this machine
    assert device_model_settings(provider).gradient_accumulation_fusion is False


def test_fusion_is_on_when_apex_extension_is_importable(provider, tmp_path, monkeypatch):
    extension_dir = tmp_path / "site"
    extension_dir.mkdir()
    (extension_dir / "fused_weight_gradient_mlp_cuda.py").write_text("")  # importable by that name
    monkeypatch.syspath_prepend(str(extension_dir))
    assert gradient_accumulation_fusion_available()
    provider.gradient_accumulation_fusion = False
    assert device_model_settings(provider).gradient_accumulation_fusion is True
    assert device_model_settings(provider, wrapped_in_ddp=False).gradient_accumulation_fusion is False
