"""Section 3: padding share of packed rows against padded batches, on the paper's benchmarks.

Datasets (prompt -> completion, through the project's validation and tokenization with the
tiny tokenizer and its Llama 3 chat template):

* ``gsm8k_qa``: GSM8K train question -> gold completion (`gsm8k_gold_completion`), 7,473.
* ``gsm8k_8shot``: the paper's 8-shot prompt (`gsm8k_prompt`) -> gold completion, for the
  first 2,000 train questions (the fixed 8 exemplars dominate every length; tokenizing all
  7,473 prompts of ~13k characters would triple the section's time for the same figure).
* ``math500_boxed``: MATH-500 prompt (`math500_prompt`) -> "The final answer is $\\boxed{A}$."
  (MATH-500 ships final answers only: this is the shortest possible completion).
* ``math500_reasoning``: MATH-500 prompt -> a stand-in solution: the gold GSM8K solutions of
  `level` (1-5) GSM8K train rows (deterministic), then the boxed answer. Real MATH solutions
  are not in the data; this gives completions whose length grows with difficulty.

Lengths in Llama 3 tokens: the tiny 512-token tokenizer is trained on GSM8K and yields about
1.8-2x *more* tokens than Llama 3's 128K tokenizer (not 3-4x). `LLAMA3_TOKEN_RATIO` holds the
ratio of total Llama 3 tokens to total tiny tokens per dataset, measured once (see
bench/README.md) with the real Llama 3 tokenizer; the length model scales each sequence's
tiny length by it. With ``--llama3-tokenizer PATH`` (a Llama 3 tokenizer.json) the section
tokenizes with the real tokenizer instead and also reports the model's error.
"""

from __future__ import annotations

import math
import random
import tempfile
import time
from pathlib import Path

from bench.common import gsm8k_rows, write_records

SEQ_LENGTHS = (2048, 4096)
SWEEP_LENGTHS = tuple(range(2048, 8193, 512))  # row lengths tried for the Llama-3 length model
EIGHT_SHOT_ROWS = 2000  # 8-shot prompts are ~13k characters each: the first 2,000 questions suffice
PADDED_BATCH_ROWS = 8  # rows per batch for "padded to the batch's longest sequence"
# Llama 3 tokens / tiny-tokenizer tokens over each whole dataset (prompt with the Llama 3 chat
# template + completion + EOS), measured with Meta's Llama 3.x tokenizer.json (128,256 tokens)
# on 2026-11-22; see bench/README.md. Per-sequence ratios spread about +-15 % around these.
LLAMA3_TOKEN_RATIO = {"gsm8k_qa": 0.5704, "gsm8k_8shot": 0.5356, "math500_boxed": 0.5006,
                      "math500_reasoning": 0.5780}


def benchmark_texts(limit: int | None = None) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (prompts, completions) of each dataset (the first `limit` rows when given)."""
    from nemo_topr.data.prompts import (gsm8k_exemplars, gsm8k_gold_completion, gsm8k_prompt, load_math500,
                                        math500_prompt)

    train = gsm8k_rows()
    rows = train[:limit] if limit else train
    gold = [gsm8k_gold_completion(row["answer"]) for row in rows]
    exemplars = gsm8k_exemplars(train)
    math_rows = load_math500()[:limit] if limit else load_math500()
    boxed = [f"The final answer is $\\boxed{{{row['answer']}}}$." for row in math_rows]
    reasoning = []
    for i, (row, answer) in enumerate(zip(math_rows, boxed)):
        level = int(row["metadata"]["level"])
        steps = [gsm8k_gold_completion(train[(7 * i + j) % len(train)]["answer"]).strip() for j in range(level)]
        reasoning.append(" " + "\n".join(steps) + "\n" + answer)
    math_prompts = [math500_prompt(row["question"]) for row in math_rows]
    return {
        "gsm8k_qa": ([row["question"] for row in rows], gold),
        "gsm8k_8shot": ([gsm8k_prompt(row["question"], exemplars) for row in rows[:EIGHT_SHOT_ROWS]],
                        gold[:EIGHT_SHOT_ROWS]),
        "math500_boxed": (math_prompts, boxed),
        "math500_reasoning": (math_prompts, reasoning),
    }


def sequence_lengths(prompts: list[str], completions: list[str], tokenizer) -> list[int]:
    """Token counts (prompt + completion + EOS) through `load_records` + `tokenize_records`."""
    from nemo_topr.data.records import load_records
    from nemo_topr.data.tokenization import tokenize_records

    with tempfile.TemporaryDirectory() as tmp:
        records = load_records(write_records(Path(tmp) / "records.jsonl", prompts, completions, scored=False))
        return [len(seq.input_ids) for seq in tokenize_records(records, tokenizer).sequences]


def padding_shares(lengths: list[int], seq_length: int) -> dict:
    """Packed (the project's best-fit decreasing) vs padded rows, on sequences that fit."""
    from nemo_topr.data.packing import TokenizedSequence, pack_sequences, padding_share

    fits = [n for n in lengths if n <= seq_length]
    seqs = [TokenizedSequence([0] * n, [0] * (n - 1) + [1], 1.0, math.nan, 0, i) for i, n in enumerate(fits)]
    start = time.process_time()
    rows = pack_sequences(seqs, seq_length, 0)
    pack_seconds = time.process_time() - start
    order = list(range(len(fits)))
    random.Random(0).shuffle(order)
    batches = [order[b:b + PADDED_BATCH_ROWS] for b in range(0, len(order), PADDED_BATCH_ROWS)]
    dynamic_positions = sum(len(batch) * max(fits[i] for i in batch) for batch in batches)
    packed = padding_share(seqs, rows, seq_length)
    return {
        "seq_length": seq_length, "sequences": len(fits), "dropped_too_long": len(lengths) - len(fits),
        "packed_rows": len(rows), "packed_padding_share": packed,
        "padded_rows": len(fits), "padded_padding_share": padding_share(seqs, [[i] for i in range(len(fits))],
                                                                        seq_length),
        "padded_to_batch_max_padding_share": 1.0 - sum(fits) / dynamic_positions if fits else 0.0,
        "packed_over_padded_rows": len(rows) / len(fits) if fits else 0.0,
        "lower_bound_rows": math.ceil(sum(fits) / seq_length),
        "pack_cpu_seconds": pack_seconds,
    }


def length_stats(lengths: list[int]) -> dict:
    ordered = sorted(lengths)
    return {"count": len(ordered), "mean": sum(ordered) / len(ordered), "p50": ordered[len(ordered) // 2],
            "p95": ordered[int(0.95 * (len(ordered) - 1))], "max": ordered[-1]}


def measure(limit: int | None = None, llama3_tokenizer: str | None = None) -> dict:
    from bench.common import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    llama = _llama3(llama3_tokenizer) if llama3_tokenizer else None
    results = {}
    for name, (prompts, completions) in benchmark_texts(limit).items():
        tiny = sequence_lengths(prompts, completions, tokenizer)
        modelled = [max(2, round(n * LLAMA3_TOKEN_RATIO[name])) for n in tiny]
        entry = {"tiny_tokenizer": {"lengths": length_stats(tiny), "by_seq_length": [
                     padding_shares(tiny, L) for L in SEQ_LENGTHS]},
                 "llama3_length_model": {"ratio": LLAMA3_TOKEN_RATIO[name], "lengths": length_stats(modelled),
                                         "by_seq_length": [padding_shares(modelled, L) for L in SEQ_LENGTHS],
                                         "row_length_sweep": {L: padding_shares(modelled, L)["packed_padding_share"]
                                                              for L in SWEEP_LENGTHS}}}
        if llama is not None:
            real = sequence_lengths(prompts, completions, llama)
            entry["llama3_tokenizer"] = {"lengths": length_stats(real), "measured_ratio": sum(real) / sum(tiny),
                                         "by_seq_length": [padding_shares(real, L) for L in SEQ_LENGTHS]}
        results[name] = entry
    return results


def _llama3(path: str):
    """A Llama 3 tokenizer from a tokenizer.json, with the tiny tokenizer's Llama 3 chat template."""
    from transformers import PreTrainedTokenizerFast

    from nemo_topr.data.tiny_tokenizer import BOS, EOS, LLAMA3_CHAT_TEMPLATE

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=path, bos_token=BOS, eos_token=EOS)
    tokenizer.chat_template = LLAMA3_CHAT_TEMPLATE
    return tokenizer
