"""gradient_accumulation_fusion follows what is importable, not Bridge's "TE imports" guess.

Bridge's GPTModelProvider defaults the fusion to on whenever transformer_engine.pytorch imports
(megatron/bridge/utils/fusions.py:34-53), but Megatron-Core's ColumnParallelLinear -- the output
layer, also under Transformer Engine -- raises without Apex's fused_weight_gradient_mlp_cuda
(megatron/core/tensor_parallel/layers.py:1070). The training config therefore turns it on only
when that extension can be imported."""

from __future__ import annotations

import pytest

from nemo_topr.training.config import default_container, gradient_accumulation_fusion_available


@pytest.fixture
def provider(tmp_path, megatron_world):
    from nemo_topr.model import build_tiny_hf_llama, hf_llama_provider
    from nemo_topr.tiny_tokenizer import build_tiny_tokenizer

    _, provider = hf_llama_provider(build_tiny_hf_llama(tmp_path / "tiny", build_tiny_tokenizer()),
                                    load_weights=False)
    provider.gradient_accumulation_fusion = True  # what Bridge's default gives when TE imports
    return provider


def _dataset():
    from nemo_topr.training.data import ToprDatasetConfig

    return ToprDatasetConfig()


def test_fusion_is_off_without_apex_even_when_the_provider_asked_for_it(provider):
    assert not gradient_accumulation_fusion_available()  # no Apex CUDA extension on this machine
    assert default_container(provider, _dataset()).model.gradient_accumulation_fusion is False


def test_fusion_is_on_when_apex_extension_is_importable(provider, tmp_path, monkeypatch):
    extension_dir = tmp_path / "site"
    extension_dir.mkdir()
    (extension_dir / "fused_weight_gradient_mlp_cuda.py").write_text("")  # importable by that name
    monkeypatch.syspath_prepend(str(extension_dir))
    assert gradient_accumulation_fusion_available()
    provider.gradient_accumulation_fusion = False
    assert default_container(provider, _dataset()).model.gradient_accumulation_fusion is True
