"""Which device a command runs on: always the user's explicit choice, never a silent fallback.

Every command that runs a model takes the device from its config (`device: cpu|cuda`, `nemo-topr
train`) or from `--device {cuda,cpu,auto}` (the other verbs; default cuda):

    cuda  CUDA must be available, else the command stops with an error naming the key or flag
          and how to choose the CPU. A GPU job never turns into a CPU job by itself.
    cpu   the CPU runtime (`nemo_topr.model.cpu_runtime`: fp32, local layers, gloo). GPUs are hidden
          from the process first (CUDA_VISIBLE_DEVICES=""), so CPU really means CPU.
    auto  cuda when available, else cpu: an explicit opt-in to the fallback.

:func:`resolve_device` is the pure decision; :func:`select_device` applies it to the process,
and :func:`use_device` also starts Megatron for it (the CPU runtime, or nothing patched).
"""

from __future__ import annotations

import os

import torch

from nemo_topr.errors import UserError

DEVICES = ("cuda", "cpu")
CHOICES = (*DEVICES, "auto")


class DeviceError(UserError, ValueError):
    """The requested device is not one this process can run on."""


def _choose_cpu(where: str) -> str:
    return f"{where} cpu" if where.startswith("--") else f"{where}=cpu"


def resolve_device(requested: str, *, cuda_available: bool, where: str, choices: tuple[str, ...] = CHOICES) -> str:
    """"cuda" or "cpu" for `requested`, given whether CUDA is available; `where` names the config
    key or flag the value came from, for the error messages."""
    if requested not in choices:
        raise DeviceError(f"{where} must be one of {', '.join(choices)}; got {requested!r}",
                          key="device.invalid", where=where)
    if requested == "auto":
        return "cuda" if cuda_available else "cpu"
    if requested == "cuda" and not cuda_available:
        raise DeviceError(f"{where} is cuda, but CUDA is not available on this machine (torch.cuda.is_available() "
                          f"is False: no GPU, no driver, or a CPU-only torch). To run on the CPU, choose it "
                          f"explicitly: {_choose_cpu(where)}", key="device.cuda_unavailable", where=where)
    return requested


def select_device(requested: str, *, where: str, choices: tuple[str, ...] = CHOICES) -> str:
    """Resolve `requested` for this process; returns "cuda" or "cpu". For cpu, first hides the
    GPUs (possible only before CUDA starts in this process; otherwise an error)."""
    if requested == "cpu":
        # CUDA reads CUDA_VISIBLE_DEVICES when it starts; afterwards the GPUs stay visible.
        # Never run on a machine with a GPU (docs/cpu_runtime.md).
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        if torch.cuda.is_available():
            raise DeviceError(f"{where} is cpu, but CUDA had already started in this process, so its GPUs cannot "
                              "be hidden; run the command with CUDA_VISIBLE_DEVICES= (empty)",
                              key="device.cuda_started", where=where)
    return resolve_device(requested, cuda_available=torch.cuda.is_available(), where=where, choices=choices)


def use_device(requested: str, *, where: str, choices: tuple[str, ...] = CHOICES) -> str:
    """:func:`select_device`, then Megatron for it: the CPU runtime on cpu, a plain import of
    Megatron-Bridge (nothing patched) on cuda."""
    from nemo_topr.model import cpu_runtime

    device = select_device(requested, where=where, choices=choices)
    if device == "cpu":
        cpu_runtime.enable_cpu_runtime()
    else:
        cpu_runtime.import_bridge()
    return device


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an allocation that failed: torch's on a GPU, its CPU allocator's
    (a RuntimeError naming "can't allocate memory"), or Python's."""
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error))


def add_device_argument(parser) -> None:  # noqa: ANN001 - an argparse parser
    """`--device {cuda,cpu,auto}`, default cuda: the flag every model-running verb shares."""
    parser.add_argument("--device", choices=CHOICES, default="cuda",
                        help="where to run (default: cuda; cuda without CUDA is an error, cpu must be chosen; "
                             "auto: cuda when available, else cpu)")
