"""The CPU runtime: explicit, documented, scoped, reversible, and a no-op with CUDA."""

import gc
import json
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, WORKERS, checkout_env, with_cuda_only_packages
from nemo_topr.model import cpu_runtime


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


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_without_cuda_installed_te_and_apex_are_hidden_so_megatron_builds_torch_norms(tmp_path):
    """With TE importable, Megatron-Core gives a block of local layers TE's norm as its final norm
    (core/transformer/transformer_block.py:53-56): on an H200 node with TE 2.17.1 the doctor's CPU
    scoring failed there ("CUDAGuardImpl initialized with non-CUDA DeviceType: cpu"). Without CUDA,
    both packages look absent to every importer and to find_spec, as on this project's CPU machines."""
    env = with_cuda_only_packages(tmp_path)
    hidden = _python("""
        import importlib.util
        from nemo_topr.model.device import use_device
        assert use_device("cpu", where="--device") == "cpu"
        from megatron.core.transformer import transformer_block
        from megatron.core.transformer.torch_norm import WrappedTorchNorm
        from nemo_topr.model.settings import transformer_engine_available
        for name in ("transformer_engine", "apex"):
            assert importlib.util.find_spec(name) is None, name
            try:
                __import__(name)
            except ModuleNotFoundError as error:
                assert "hidden" in str(error) or "halted" in str(error), error
            else:
                raise AssertionError(f"{name} imported")
        assert not transformer_engine_available()
        assert transformer_block.LayerNormImpl is WrappedTorchNorm, transformer_block.LayerNormImpl
        print("hidden")
    """, env)
    assert hidden.returncode == 0 and "hidden" in hidden.stdout, hidden.stderr[-3000:]
    # where CUDA is there, nothing is hidden: Megatron's own probe imports the installed package
    seen = _python("""
        import torch
        torch.cuda.is_available = lambda: True
        from nemo_topr.model import cpu_runtime
        cpu_runtime.import_bridge()
    """, env)
    assert seen.returncode != 0 and "RuntimeError: transformer_engine.pytorch was imported" in seen.stderr, seen.stderr[-3000:]


def test_a_cuda_only_package_imported_before_it_could_be_hidden_is_an_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "transformer_engine", types.ModuleType("transformer_engine"))
    with pytest.raises(RuntimeError, match=r"\['transformer_engine'\] imported in a process without CUDA before "
                                           r"nemo_topr.model.cpu_runtime.import_bridge\(\) could hide it"):
        cpu_runtime.import_bridge(modules=())


def test_bridge_is_imported_with_the_collector_paused_and_then_frozen(tmp_path, monkeypatch):
    """What import_bridge imports, it imports with the cyclic collector off, and then freezes; an
    import with nothing new, or one that fails, freezes nothing, and the collector ends as it was."""
    (tmp_path / "gc_probe.py").write_text("import gc\nCOLLECTING = gc.isenabled()\n")
    (tmp_path / "gc_probe_broken.py").write_text("raise ImportError('broken')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("gc_probe", "gc_probe_broken"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    frozen_at: list[bool] = []  # whether the collector was on at each gc.freeze()
    monkeypatch.setattr(gc, "freeze", lambda: frozen_at.append(gc.isenabled()))

    cpu_runtime.import_bridge(modules=("gc_probe",))
    assert sys.modules["gc_probe"].COLLECTING is False
    assert gc.isenabled() and frozen_at == [True]
    cpu_runtime.import_bridge(modules=("gc_probe",))  # already imported
    assert frozen_at == [True]
    with pytest.raises(ImportError, match="broken"):
        cpu_runtime.import_bridge(modules=("gc_probe_broken",))
    assert gc.isenabled() and frozen_at == [True]
    gc.disable()  # a caller that manages the collector itself keeps it off
    try:
        monkeypatch.delitem(sys.modules, "gc_probe")
        cpu_runtime.import_bridge(modules=("gc_probe",))
        assert not gc.isenabled() and frozen_at == [True]
    finally:
        gc.enable()


@pytest.mark.slow
def test_cpu_scoring_on_a_node_with_te_and_apex_installed_never_imports_them(tmp_path):
    """The H200 doctor's `score vs cpu` route: `score-logprobs --device cpu` with both installed
    must not let Megatron import either (it imported Megatron before hiding them, and failed)."""
    from nemo_topr.demo import build_graded_records
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    env = with_cuda_only_packages(tmp_path / "site")
    model_dir = build_tiny_hf_llama(tmp_path / "tiny", build_tiny_tokenizer())
    graded, scored = tmp_path / "graded.jsonl", tmp_path / "scored.jsonl"
    graded.write_text("".join(json.dumps(r) + "\n" for r in build_graded_records(2)))
    proc = subprocess.run([sys.executable, "-m", "nemo_topr.cli", "score-logprobs", "--model", str(model_dir),
                           "--data", str(graded), "--out", str(scored), "--seq-length", "512", "--device", "cpu"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in scored.read_text().splitlines()]
    assert len(rows) == len(graded.read_text().splitlines()) and all(r["behavior_logprob"] < 0 for r in rows)
    # stdout is the summary alone, for `| jq`: Gloo's 24 lines and Megatron's prints went before it
    assert json.loads(proc.stdout)["records_used"] == len(rows)
