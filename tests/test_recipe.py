"""nemo_topr/training/recipe.py: how a stopped run's ranks leave."""

from __future__ import annotations

import threading
import time

from nemo_topr.training.recipe import wait_for_marker


def test_a_rank_waits_until_rank_zero_has_left_the_marker(tmp_path):
    """A rank that exits 75 before rank 0 writes STOPPED would have srun's --kill-on-bad-exit
    terminate rank 0 first, and the job script would read a failure instead of a pre-emption."""
    marker = tmp_path / "STOPPED"
    written_at = []

    def rank_zero():
        time.sleep(0.3)
        written_at.append(time.monotonic())
        marker.write_text("stopped at iteration 3 of 6\n")

    writer = threading.Thread(target=rank_zero)
    writer.start()
    assert wait_for_marker(marker, timeout=10)
    returned_at = time.monotonic()
    writer.join()
    assert written_at and returned_at >= written_at[0]  # not before rank 0 began to write it


def test_a_missing_marker_is_reported_after_the_timeout(tmp_path, capsys):
    started = time.monotonic()
    assert not wait_for_marker(tmp_path / "STOPPED", timeout=0.2)
    assert time.monotonic() - started >= 0.2
    assert f"{tmp_path / 'STOPPED'} not written by rank 0 within 0 s" in capsys.readouterr().err
