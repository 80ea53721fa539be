"""Section 5: data-pipeline throughput on GSM8K-sized data (7,473 records).

Stages, each the project's own function on a scored GSM8K train file (question -> gold
completion, tiny tokenizer): validate (`load_records`), tokenize (`tokenize_records`), pack
(`pack_sequences` at 2048) and collate (`collate_packed`, every row into batches of 8).
Alongside, alternating with them, the bare work the first two stages wrap: `json.loads` of
every line and one batched tokenizer call on the same texts (no chat template), so the
project's overhead is a ratio paired within each repetition.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from bench.common import gsm8k_rows, summary, tiny_tokenizer, write_records

SEQ_LENGTH = 2048
ROWS_PER_BATCH = 8


def run_pipeline(path: Path, tokenizer) -> dict:
    from nemo_topr.data.packing import collate_packed, pack_sequences
    from nemo_topr.data.records import load_records
    from nemo_topr.data.tokenization import pad_id_of, tokenize_records

    seconds = {}
    start = time.process_time()
    records = load_records(path)
    seconds["validate"] = time.process_time() - start
    start = time.process_time()
    data = tokenize_records(records, tokenizer, max_seq_length=SEQ_LENGTH)
    seconds["tokenize"] = time.process_time() - start
    start = time.process_time()
    rows = pack_sequences(data.sequences, SEQ_LENGTH, pad_id_of(tokenizer))
    seconds["pack"] = time.process_time() - start
    start = time.process_time()
    for b in range(0, len(rows), ROWS_PER_BATCH):
        collate_packed(data.sequences, rows[b:b + ROWS_PER_BATCH], SEQ_LENGTH, pad_id_of(tokenizer))
    seconds["collate"] = time.process_time() - start
    seconds["total"] = sum(seconds.values())
    return {"seconds": seconds, "records": len(records.records), "rows": len(rows)}


def measure(limit: int | None = None, reps: int = 3) -> dict:
    """`reps` pipeline runs, each between the two bare baselines (order alternating), so every
    stage's ratio to its baseline is paired within a repetition."""
    from nemo_topr.data.prompts import gsm8k_gold_completion

    tokenizer = tiny_tokenizer()
    rows = gsm8k_rows(limit)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_records(Path(tmp) / "gsm8k_scored.jsonl", [r["question"] for r in rows],
                             [gsm8k_gold_completion(r["answer"]) for r in rows])
        lines = path.read_text().splitlines()
        texts = [r["question"] for r in rows] + [gsm8k_gold_completion(r["answer"]) for r in rows]
        baselines = {"json_loads": lambda: [json.loads(line) for line in lines],
                     "bare_tokenizer": lambda: tokenizer(texts, add_special_tokens=False)["input_ids"]}
        runs, bare = [], {name: [] for name in baselines}
        run_pipeline(path, tokenizer)  # warm-up
        for rep in range(reps):
            for name, baseline in (baselines.items() if rep % 2 == 0 else reversed(baselines.items())):
                start = time.process_time()
                baseline()
                bare[name].append(time.process_time() - start)
                if name == "json_loads":
                    runs.append(run_pipeline(path, tokenizer))
    records = runs[0]["records"]
    stages = {stage: summary([run["seconds"][stage] for run in runs]) for stage in runs[0]["seconds"]}
    return {
        "records": records, "rows": runs[0]["rows"], "seq_length": SEQ_LENGTH,
        "cpu_seconds": stages, "bare_cpu_seconds": {name: summary(t) for name, t in bare.items()},
        "records_per_cpu_second": {stage: records / s["median"] for stage, s in stages.items()},
        "validate_over_json_loads": summary([run["seconds"]["validate"] / t
                                             for run, t in zip(runs, bare["json_loads"])]),
        "tokenize_over_bare_tokenizer": summary([run["seconds"]["tokenize"] / t
                                                 for run, t in zip(runs, bare["bare_tokenizer"])]),
    }
