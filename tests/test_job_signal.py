"""The pre-emption warning and the handler agree: the signal every sbatch script (slurm/*.sbatch
and the one `nemo-topr submit` renders) asks Slurm to send is the one slurm/topr_job.sh tells
the training ranks to checkpoint on (`train.exit_signal`). Fast: the job script runs with a
recording `srun` and `scontrol`; the real-Slurm and fake-srun tests are in test_slurm.py."""

import os
import re
import stat
import subprocess

import pytest

from conftest import REPO
from nemo_topr.cluster.submit import ClusterJob

SRUN = """#!/usr/bin/env bash
# records its arguments; the training "finishes" (topr_job.sh then exits 0)
printf '%s\\n' "$@" > "$SRUN_ARGS"
for arg in "$@"; do [[ $arg == run_dir=* ]] && touch "${arg#run_dir=}/COMPLETED"; done
exit 0
"""
SCONTROL = '#!/usr/bin/env bash\n[[ $1 == show ]] && echo localhost\n'


def _warning_signal(script: str) -> str:
    """The signal name of the script's `#SBATCH --signal=[R:]SIG@SECONDS`, which must go to the
    ranks (no `B:`: the batch shell would get it, not the training processes)."""
    found = re.findall(r"^#SBATCH --signal=(\w+:)?(\w+)@\d+$", script, flags=re.MULTILINE)
    assert len(found) == 1, f"one --signal line expected: {found}"
    prefix, name = found[0]
    assert prefix in ("", "R:"), f"--signal={prefix}{name}: the training ranks must receive it"
    return name.removeprefix("SIG")


@pytest.fixture(scope="module")
def exit_signals(tmp_path_factory) -> list[str]:
    """The `train.exit_signal=` arguments topr_job.sh hands srun (for every rank)."""
    tmp_path = tmp_path_factory.mktemp("job")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(stat.S_IRWXU)
    run_dir = tmp_path / "run"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SRUN_ARGS": str(tmp_path / "srun_args"),
           "NEMO_TOPR_ROOT": str(REPO), "NEMO_TOPR_RUN_DIR": str(run_dir), "SLURM_JOB_ID": "7"}
    proc = subprocess.run(["bash", str(REPO / "slurm" / "topr_job.sh"), "tiny_cpu"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "training completed" in proc.stdout, proc.stdout + proc.stderr
    return [arg for arg in (tmp_path / "srun_args").read_text().splitlines() if arg.startswith("train.exit_signal=")]


SCRIPTS = {path.name: path.read_text() for path in sorted((REPO / "slurm").glob("*.sbatch"))}
SCRIPTS["nemo-topr submit"] = ClusterJob("llama31_8b_bf16").sbatch_script()


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_warning_signal_is_the_one_the_ranks_checkpoint_on(name, exit_signals):
    script = SCRIPTS[name]
    assert "slurm/topr_job.sh" in script  # the job body that starts the ranks
    assert exit_signals == [f"train.exit_signal=SIG{_warning_signal(script)}"]
