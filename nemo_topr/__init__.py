"""nemo_topr: Tapered Off-Policy REINFORCE (TOPR) on NVIDIA's Megatron stack.

Importing the package is cheap and side-effect free: it imports neither Megatron nor
Bridge and patches nothing. The Megatron-facing modules import them when used, and the
CPU runtime (`nemo_topr.model.cpu_runtime.enable_cpu_runtime`) is always applied explicitly.
"""

import importlib.metadata

__version__ = "0.1.0"


def installed_version(*names: str) -> str | None:
    """The installed version of the first of `names` found (package metadata, nothing imported);
    None when none is installed."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
