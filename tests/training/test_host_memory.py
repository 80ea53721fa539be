"""The CPU runtime's attention against the host's available memory (nemo_topr/training/host_memory.py)."""

from types import SimpleNamespace

import pytest

from nemo_topr.training.config_error import ConfigError
from nemo_topr.training.host_memory import attention_bytes, available_bytes, check_cpu_attention


def test_attention_bytes_are_two_fp32_score_tensors_and_the_mask():
    # micro-batch 2, 4 heads, L = 4096: 2 x 4096² x (2 x 4 B x 4 heads + 1 B of mask) = 2 x 16,777,216 x 33
    assert attention_bytes(2, 4, 4096) == 1_107_296_256
    assert attention_bytes(1, 1, 10) == 100 * 9


def test_available_memory_is_the_kernels_mem_available(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24576000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n")
    assert available_bytes(meminfo) == 20_000_000 * 1024
    meminfo.write_text("MemTotal:       24576000 kB\n")
    assert available_bytes(meminfo) is None
    assert available_bytes(tmp_path / "absent") is None


def _model(seq_length: int, heads: int = 4, tp: int = 1) -> SimpleNamespace:
    return SimpleNamespace(seq_length=seq_length, num_attention_heads=heads, tensor_model_parallel_size=tp)


def test_a_start_whose_attention_cannot_fit_is_refused():
    needed = 1_107_296_256  # the case above
    check_cpu_attention(_model(4096), 2, available=needed, local_ranks=1)  # just fits
    with pytest.raises(ConfigError) as refused:
        check_cpu_attention(_model(4096), 2, available=needed - 1, local_ranks=1)
    assert (refused.value.key, refused.value.where) == ("model.seq_length.attention_above_host_memory",
                                                        "model.seq_length")
    with pytest.raises(ConfigError):  # one rank would fit in 1.5 GiB, two do not
        check_cpu_attention(_model(4096), 2, available=3 * 2**29, local_ranks=2)
    # TP=2 halves the heads: 2 x 4096² x (8 x 2 + 1) = 570,425,344 B for each of the two ranks
    check_cpu_attention(_model(4096, tp=2), 2, available=2 * 570_425_344, local_ranks=2)
    check_cpu_attention(_model(10**8), 2, available=None)  # no MemAvailable: nothing to judge by


def test_ranks_on_the_host_come_from_the_launcher(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    check_cpu_attention(_model(4096), 2, available=4 * 1_107_296_256)
    with pytest.raises(ConfigError):
        check_cpu_attention(_model(4096), 2, available=4 * 1_107_296_256 - 1)
