"""`nemo-topr submit`'s check of a bare venv (no container image): the ranks' python runs and finds what
they import, found before the queue wait rather than at the job's start."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from nemo_topr.errors import UserError

# what every rank imports (besides the checkout's nemo_topr and its light dependencies)
RANK_PACKAGES = ("torch", "megatron.core", "megatron.bridge", "transformers", "hydra", "omegaconf")
_FIND_PACKAGES = """import importlib.util, json, sys
def found(name):
    try:  # megatron.core without megatron: ModuleNotFoundError
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
print(json.dumps([name for name in sys.argv[1:] if not found(name)]))"""


def check_venv(venv: Path, cfg: dict[str, Any]) -> tuple[list[UserError], list[str]]:
    """(problems, warnings) of the venv the ranks will run, found before the queue wait rather than
    at the job's start: its python runs and finds the packages the ranks import (a venv made for
    vLLM, requirements-vllm.txt, has none of Megatron), and Transformer Engine where the run needs it."""
    python = venv / "bin" / "python"
    try:
        found = subprocess.run([str(python), "-c", _FIND_PACKAGES, *RANK_PACKAGES, "transformer_engine"],
                               capture_output=True, text=True, timeout=120)
        missing = json.loads(found.stdout) if found.returncode == 0 else None
        why = (found.stderr.strip().splitlines() or ["no output"])[-1]
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as error:
        missing, why = None, str(error)
    if missing is None:
        return [UserError(f"--venv {venv}: {python} does not run ({why})", key="--venv.python_does_not_run",
                          where="--venv")], []
    if lacking := [name for name in RANK_PACKAGES if name in missing]:
        return [UserError(f"--venv {venv} lacks {', '.join(lacking)}, which every rank imports: use a venv made by "
                          "`make venv` (scripts/setup_venv.sh)", key="--venv.lacks_rank_packages", where="--venv")], []
    if "transformer_engine" not in missing or cfg.get("device") == "cpu":
        return [], []
    if (cfg.get("model") or {}).get("fp8"):
        return [UserError(f"model.fp8={cfg['model']['fp8']} needs Transformer Engine, which --venv {venv} lacks: "
                          "install requirements-gpu.txt there (docs/cluster.md, the venv route) or drop FP8 "
                          "(model.fp8=null)", key="model.fp8.needs_transformer_engine", where="model.fp8")], []
    return [], [f"--venv {venv} has no Transformer Engine: the ranks build Megatron's local layers (BF16, no fused "
                "kernels), slower than the presets are sized for; install requirements-gpu.txt there"]
