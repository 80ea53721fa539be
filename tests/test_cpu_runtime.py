"""The CPU runtime: explicit, documented, scoped, reversible, and a no-op with CUDA."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, WORKERS, checkout_env
from nemo_topr import cpu_runtime


def test_importing_the_package_imports_no_megatron_and_patches_nothing():
    code = ("import sys, torch; before = torch.cuda.current_device; import nemo_topr, nemo_topr.cli; "
            "assert not [m for m in sys.modules if m.startswith(('megatron', 'transformer_engine'))]; "
            "assert torch.cuda.current_device is before; print('clean')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr


def test_noop_when_cuda_is_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    was_enabled = cpu_runtime.is_enabled()
    before = torch.cuda.synchronize
    assert cpu_runtime.enable_cpu_runtime() == ()
    assert torch.cuda.synchronize is before and cpu_runtime.is_enabled() == was_enabled

    class Provider:
        transformer_impl = "transformer_engine"
        apply_rope_fusion = True

    provider = Provider()
    assert cpu_runtime.cpu_model_overrides(provider) is provider
    assert provider.transformer_impl == "transformer_engine" and provider.apply_rope_fusion


@pytest.mark.slow
def test_enable_then_disable_restores_everything():
    out = subprocess.run([sys.executable, str(WORKERS / "cpu_runtime_reversible.py")],
                         capture_output=True, text=True, cwd=REPO, env=checkout_env(), timeout=300)
    assert out.returncode == 0 and "REVERSIBLE OK" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]


def test_device_mode_redirects_cuda_to_cpu_only_inside():
    with cpu_runtime.CudaToCpuMode():
        assert torch.ones(3, device="cuda").device.type == "cpu"
        assert torch.empty(2, device=torch.device("cuda", 0)).device.type == "cpu"
        x = torch.arange(4)
        assert x.cuda() is x
        assert x.to("cuda").device.type == "cpu"
        assert x.to(torch.float64).dtype == torch.float64  # non-device .to() untouched
    # (that nothing is redirected once the runtime is disabled is checked in a fresh
    # interpreter by test_enable_then_disable_restores_everything)


def test_bridge_import_does_not_fool_megatron_core_about_te(megatron_world):
    import megatron.bridge  # noqa: F401 - imported by the fixture through import_bridge()
    import megatron.core.extensions.transformer_engine as mcore_te  # noqa: F401

    leaked = [name for name, module in list(sys.modules.items())
              if name.startswith("megatron.core") and vars(module).get("HAVE_TE")]
    assert not leaked
    assert not [name for name in sys.modules if name.split(".")[0] == "transformer_engine"]
    with pytest.raises(ImportError):
        import transformer_engine  # noqa: F401


def test_every_patch_names_upstream_lines_that_exist():
    import megatron

    site = Path(megatron.__path__[0])
    for patch in cpu_runtime.PATCHES:
        locations = re.findall(r"((?:core|bridge|training)/[\w/]+\.py):(\d+)", patch.upstream)
        assert locations, f"{patch.name}: no file:line in {patch.upstream!r}"
        for path, line in locations:
            source = site / path
            assert source.is_file(), f"{patch.name}: {source} missing"
            assert int(line) <= len(source.read_text().splitlines()), f"{patch.name}: {path}:{line} past EOF"
