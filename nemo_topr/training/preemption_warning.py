"""Slurm's pre-emption warning (SIGUSR1, slurm/topr_job.sh) while a training rank starts.

SIGUSR1's default action terminates, and Bridge installs its handler only once training is set
up, so `nemo-topr train` holds the warning (blocks it: it stays pending) from its first line until
training starts (`release_the_warning`, from the recipe's on_train_start), when Bridge's handler
takes it and the rank saves.

The ranks reach that first line a fraction of a second apart. A warning that falls in between
kills the ranks not yet holding it, and srun's --kill-on-bad-exit then sends SIGTERM to the ones
holding it. srun exits 128 + the highest signal that killed a task: dying of that SIGTERM made it
143, a failed job, where the ranks killed by the warning alone give 138, which topr_job.sh
requeues. So a rank holding the warning answers SIGTERM by dying of the warning it holds; with no
warning pending it dies of SIGTERM, as it would without the handler.

How early the warning comes is each preset's: as long as its checkpoint takes to write. The
slurm/*.sbatch scripts, which `sbatch` takes as they are, hold it (`preset_warning_s`), and
`nemo-topr submit` renders the same.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

SBATCH_DIR = Path(__file__).resolve().parents[2] / "slurm"
DEFAULT_WARNING_S = 600


def hold_the_warning() -> None:
    """Keep SIGUSR1 pending from now on, and have SIGTERM end this process by it if it came."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    signal.signal(signal.SIGTERM, _die_of_the_held_warning)


def release_the_warning() -> None:
    """SIGUSR1 delivered again (to Bridge's handler, installed by now), SIGTERM's default back
    unless Bridge has put its own handler there (train.exit_signal=SIGTERM)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    if signal.getsignal(signal.SIGTERM) is _die_of_the_held_warning:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _die_of_the_held_warning(signum: int, frame) -> None:
    dying_of = signal.SIGUSR1 if signal.SIGUSR1 in signal.sigpending() else signal.SIGTERM
    signal.signal(dying_of, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {dying_of})  # a pending SIGUSR1 is delivered here
    os.kill(os.getpid(), dying_of)


def preset_warning_s(config_file: Path, conf_dir: Path) -> int:
    """The `#SBATCH --signal=USR1@SECONDS` of the slurm/*.sbatch script that runs the preset
    `config_file` is or builds on (the nearest in its defaults lists, found beside it or in
    `conf_dir`), else DEFAULT_WARNING_S."""
    scripts = {}
    for script in sorted(SBATCH_DIR.glob("*.sbatch")):
        text = script.read_text()
        preset = re.search(r"NEMO_TOPR_CONFIG:-([\w.-]+)}", text)
        seconds = re.search(r"^#SBATCH --signal=USR1@(\d+)", text, re.MULTILINE)
        if preset and seconds:
            scripts[preset[1]] = int(seconds[1])
    return next((scripts[name] for name in _built_on(config_file, conf_dir) if name in scripts), DEFAULT_WARNING_S)


def _built_on(config_file: Path, conf_dir: Path) -> list[str]:
    """`config_file`'s name, then those its defaults lists name, nearest first (breadth first)."""
    import yaml

    names, queue = [], [config_file]
    while queue:
        path = queue.pop(0)
        names.append(path.stem)
        try:
            defaults = (yaml.safe_load(path.read_text()) or {}).get("defaults") or []
        except (OSError, yaml.YAMLError, AttributeError):  # composing it names the problem, not this
            continue
        for name in defaults:
            if isinstance(name, str) and name != "_self_" and name not in names:
                found = [d / f"{name}.yaml" for d in (path.parent, conf_dir) if (d / f"{name}.yaml").is_file()]
                queue += found[:1]
    return names
