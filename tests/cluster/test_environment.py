"""nemo_topr/cluster/environment.py: the GPU ranks' environment read from slurm/environment.sh."""

import re

import pytest

from tests.conftest import REPO
from nemo_topr.cluster.environment import ENVIRONMENT_SCRIPT, training_environment


def test_the_script_exports_what_docs_cluster_md_tabulates():
    """The page's table, written by hand, against the file the job sources and iterate reads."""
    page = (REPO / "docs" / "cluster.md").read_text()
    section = page[page.index("## Environment set by the job"):page.index("## Generation on GPU nodes")]
    table = dict(re.findall(r"^\| `(\w+)` \| `?([^`|]+?)`? \|", section, re.MULTILINE))
    assert training_environment() == table
    assert list(training_environment())[:2] == ["CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_NVLS_ENABLE"]


@pytest.mark.parametrize("line", ["export NCCL_DEBUG=INFO", "export NCCL_DEBUG=${NCCL_ALGO:-Ring}"])
def test_an_export_that_would_not_keep_a_value_set_already_is_named(tmp_path, line):
    """Every variable must yield to one the user set (the job's `${NAME:-value}`): iterate reads
    the file, and a line it cannot read so is an error naming file and line, not skipped."""
    script = tmp_path / "environment.sh"
    script.write_text(f"# shellcheck shell=bash\nexport OMP_NUM_THREADS=${{OMP_NUM_THREADS:-8}}\n{line}\n")
    with pytest.raises(ValueError) as error:
        training_environment(script)
    assert (error.value.key, error.value.where) == ("environment.export.overrides_a_set_value", f"{script}:3")
    assert ENVIRONMENT_SCRIPT == REPO / "slurm" / "environment.sh"
