"""The training data order as a fresh process sees it (tests/data/test_order.py).

    python data_order.py TRAIN_PATH TOKENIZER_DIR SEQ_LENGTH SEED EPOCHS GLOBAL_BATCH CONSUMED

Prepares the dataset as `nemo-topr train` does and prints, as JSON, the sample ids of each row
Bridge's sampler hands out after CONSUMED rows (a run resumed at that point), in order."""

import json
import sys

from nemo_topr.model import cpu_runtime


def main(train_path: str, tokenizer_dir: str, seq_length: str, seed: str, epochs: str, global_batch: str,
         consumed: str) -> None:
    cpu_runtime.enable_cpu_runtime()  # Bridge imports Transformer Engine's stand-in
    from megatron.bridge.data.samplers import MegatronPretrainingSampler

    from nemo_topr.training.data import ToprDatasetConfig

    config = ToprDatasetConfig(train_path=train_path, tokenizer_dir=tokenizer_dir, seq_length=int(seq_length),
                               shuffle_seed=int(seed), epochs=int(epochs))
    prepared = config.prepare(global_batch_size=int(global_batch))
    sequences, rows = prepared.dataset.sequences, prepared.rows
    sampler = MegatronPretrainingSampler(len(rows), int(consumed), 1, 0, 1)  # micro-batch 1 row, DP 1
    print(json.dumps([[sequences[k].sample_id for k in rows[i]] for batch in sampler for i in batch]))


if __name__ == "__main__":
    main(*sys.argv[1:])
