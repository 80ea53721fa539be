"""The process environment of GPU training ranks (NCCL, CUDA, allocator, threads), which
slurm/environment.sh exports for the ranks of a Slurm job: read here for the ranks that
`nemo-topr iterate` starts itself, so that both get the same one from one file."""

from __future__ import annotations

import re
from pathlib import Path

from nemo_topr.errors import UserError

ENVIRONMENT_SCRIPT = Path(__file__).resolve().parents[2] / "slurm" / "environment.sh"
# every export keeps a value set already: `export NAME=${NAME:-value}`
_EXPORT = re.compile(r"export (\w+)=\$\{\1:-([^}]*)\}")


class EnvironmentScriptError(UserError, ValueError):
    """A line of the environment script that does not keep a value set already."""


def training_environment(script: Path = ENVIRONMENT_SCRIPT) -> dict[str, str]:
    """The variables `script` exports and their values, in its order."""
    values = {}
    for number, line in enumerate(script.read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("export "):
            continue
        match = _EXPORT.fullmatch(line)
        if match is None:
            raise EnvironmentScriptError(f"{script}:{number}: {line!r} is not of the form "
                                         "`export NAME=${NAME:-value}`", key="environment.export.overrides_a_set_value",
                                         where=f"{script}:{number}")
        values[match[1]] = match[2]
    return values
