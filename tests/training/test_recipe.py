"""nemo_topr/training/recipe.py: how a stopped run's ranks leave."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from nemo_topr.training.recipe import _not_a_clean_stop, wait_for_marker


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


@pytest.mark.parametrize("raised, shown", [
    (SystemExit(0), False),  # Bridge's own exit after a signal-triggered save
    (KeyboardInterrupt(), False),  # a second Ctrl-C: `nemo-topr train: interrupted` says it
    (SystemExit(1), True),
    (RuntimeError("NCCL timeout"), True),
], ids=["clean-stop", "second-ctrl-c", "exit-1", "error"])
def test_bridge_logs_failures_but_not_stops(raised, shown, caplog):
    """Bridge's "Pretrain failed" line and traceback, logged as pretrain() does it, with the filter
    that `train` puts on that logger: kept for a failure, dropped for a stop."""
    log = logging.getLogger("megatron.bridge.training.pretrain")
    log.addFilter(_not_a_clean_stop)
    try:
        with caplog.at_level(logging.ERROR, logger=log.name):
            try:
                raise raised
            except BaseException as error:
                log.exception("Pretrain failed on rank=%s with %s: %s.", 0, type(error).__name__, error)
    finally:
        log.removeFilter(_not_a_clean_stop)
    assert [record.message.startswith("Pretrain failed") for record in caplog.records] == ([True] if shown else [])
