"""The data-order rule: the same seed gives the same row order in any process (whatever its hash
seed), another seed another order, and a run resumed after k rows continues that very order."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, WORKERS, checkout_env

DATA = REPO / "tests" / "fixtures" / "data" / "gsm8k_scored.jsonl"
SEQ_LENGTH, EPOCHS, GLOBAL_BATCH = 512, 2, 2


def _order(tokenizer_dir, seed: int) -> list[list[int]]:
    """Sample ids of each row, in training order, prepared in this process."""
    from nemo_topr.training.data import ToprDatasetConfig

    config = ToprDatasetConfig(train_path=str(DATA), tokenizer_dir=str(tokenizer_dir), seq_length=SEQ_LENGTH,
                               shuffle_seed=seed, epochs=EPOCHS)
    prepared = config.prepare(global_batch_size=GLOBAL_BATCH)
    return [[prepared.dataset.sequences[k].sample_id for k in row] for row in prepared.rows]


@pytest.mark.guards_data_order
@pytest.mark.slow  # one fresh interpreter importing Bridge (~20 s)
def test_same_seed_same_order_in_any_process_and_a_resume_continues_it(tmp_path, megatron_world):
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    build_tiny_tokenizer(tmp_path / "tokenizer")
    order = _order(tmp_path / "tokenizer", seed=5)
    epoch_rows = len(order) // EPOCHS
    assert epoch_rows >= 6 and sorted(map(sorted, order[:epoch_rows])) == sorted(map(sorted, order[epoch_rows:]))
    assert order[:epoch_rows] != order[epoch_rows:]  # each epoch reshuffled
    assert _order(tmp_path / "tokenizer", seed=5) == order  # a second preparation, same process
    assert _order(tmp_path / "tokenizer", seed=6) != order  # the seed matters

    # another process, another hash seed, resumed after 3 global batches (into the second epoch
    # when the epoch is short; the sampler's consumed_samples, as a checkpoint restores it)
    consumed = 3 * GLOBAL_BATCH
    proc = subprocess.run([sys.executable, str(WORKERS / "data_order.py"), str(DATA), str(tmp_path / "tokenizer"),
                           str(SEQ_LENGTH), "5", str(EPOCHS), str(GLOBAL_BATCH), str(consumed)],
                          env=checkout_env(PYTHONHASHSEED="12345"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == order[consumed:]
