"""Section 7: shared-prefix packing against today's packing, on the paper's GSM8K setup.

Workloads (`workload`): GSM8K train questions, each with `samples` completions sampled from one
prompt, in two prompt formats: ``gsm8k_8shot`` (the paper's 8-shot prompt, `gsm8k_prompt`) and
``gsm8k_zero_shot_chat`` (the question alone in the Llama 3 chat template). Lengths in Llama 3
tokens by the packing section's length model: the prompt and each completion are tokenized
with the tiny tokenizer (through the project's records and tokenization) and scaled by
`bench.packing.LLAMA3_TOKEN_RATIO` (measured on whole sequences; applied here to each part).
The completions of question i are the gold solutions of questions i .. i+samples-1: real
GSM8K solution lengths, varied within a group. Token *ids* are random (lengths decide cost).

Figures, all from one run:
* tokens: row positions (padding included) the model processes for the same sequences,
  unshared (`pack_sequences` at `UNSHARED_LENGTH`) over shared (`pack_shared` at the row
  length chosen below), and the shared rows' padding share; a row-length sweep beside it.
* step time, at the timing row length (the shortest swept length holding a whole group: the
  local attention's [L, L] scores of a 16k row do not fit a CPU benchmark): one TOPR optimizer
  step (forward + backward of every micro-batch through Megatron's schedule and the project's
  `ToprForwardStep`, one row per micro-batch) over the same sequences, unshared / shared, CPU
  time, interleaved (bench.common.interleaved).
* mu scoring: score-logprobs' forward (`scoring_forward_step`, forward only), same pairing.

The model is bench.step's tiny Llama (local attention; FlexCoreAttention: bench.shared_prefix_gpu). On
CPU the local attention materialises the full [L, L] scores of every row, so a longer shared
row pays attention for positions its mask blocks; the GPU plan (docs/performance.md) avoids that.
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
from pathlib import Path

import torch

UNSHARED_LENGTH = 2048  # the Llama 3 recipes' seq_length (conf/llama31_8b_bf16.yaml)
SWEEP_LENGTHS = (2048, 3072, 4096, 6144, 8192, 12288, 16384)
# name -> (prompt format, completion length scale). GSM8K's gold solutions average ~75 Llama 3
# tokens; the setup assumes ~150-token sampled completions, modelled as gold x 2.
WORKLOADS = {"gsm8k_8shot": ("8shot", 1.0), "gsm8k_8shot_completions_x2": ("8shot", 2.0),
             "gsm8k_zero_shot_chat": ("chat", 1.0)}
TINY_MODEL = dict(num_layers=2, hidden_size=64, ffn_hidden_size=172, num_attention_heads=4, num_query_groups=2,
                  vocab_size=512)


def workload(prompt_format: str, questions: int, samples: int, completion_scale: float = 1.0
             ) -> list[tuple[int, list[int]]]:
    """[(prompt length, completion lengths incl. EOS)] per question, in modelled Llama 3 tokens;
    `prompt_format` "8shot" (the paper's prompt) or "chat" (the question alone, chat template)
    (completions also times `completion_scale`)."""
    from bench.common import gsm8k_rows, tiny_tokenizer, write_records
    from bench.packing import LLAMA3_TOKEN_RATIO
    from nemo_topr.data.prompts import gsm8k_exemplars, gsm8k_gold_completion, gsm8k_prompt
    from nemo_topr.data.records import load_records
    from nemo_topr.data.tokenization import tokenize_records

    train = gsm8k_rows()
    rows = train[:questions + samples]
    golds = [gsm8k_gold_completion(row["answer"]) for row in rows]
    if prompt_format == "8shot":
        exemplars = gsm8k_exemplars(train)
        prompts, ratio = [gsm8k_prompt(row["question"], exemplars) for row in rows[:questions]], "gsm8k_8shot"
    else:
        prompts, ratio = [row["question"] for row in rows[:questions]], "gsm8k_qa"
    # one record per question (prompt + its first completion) gives the prompt lengths; one per
    # gold solution (behind the first prompt) gives the completion lengths
    texts = (prompts + [prompts[0]] * len(golds), golds[:questions] + golds)
    with tempfile.TemporaryDirectory() as tmp:
        records = load_records(write_records(Path(tmp) / "records.jsonl", *texts))
        seqs = tokenize_records(records, tiny_tokenizer()).sequences
    scale = LLAMA3_TOKEN_RATIO[ratio]
    prompt_lengths = [max(2, round(seq.loss_mask.index(1) * scale)) for seq in seqs[:questions]]
    completion_lengths = [max(1, round(sum(seq.loss_mask) * scale * completion_scale)) for seq in seqs[questions:]]
    return [(prompt_lengths[i], completion_lengths[i:i + samples]) for i in range(questions)]


def sequences(groups: list[tuple[int, list[int]]], seed: int = 0):
    """TokenizedSequences of these lengths: random ids, one random prompt per group, +-1 rewards."""
    from nemo_topr.data.packing import TokenizedSequence, set_group_mean_rewards

    generator = torch.Generator().manual_seed(seed)
    seqs = []
    for prompt_id, (prompt_length, completions) in enumerate(groups):
        prompt = torch.randint(1, TINY_MODEL["vocab_size"], (prompt_length,), generator=generator).tolist()
        for n in completions:
            ids = torch.randint(1, TINY_MODEL["vocab_size"], (n,), generator=generator).tolist()
            seqs.append(TokenizedSequence(prompt + ids, [0] * prompt_length + [1] * n,
                                          reward=-1.0 if len(seqs) % 3 == 0 else 1.0,
                                          behavior_logprob=-6.2 * n, prompt_id=prompt_id, sample_id=len(seqs)))
    set_group_mean_rewards(seqs)
    return seqs


def token_figures(seqs, shared_length: int) -> dict:
    """Row positions and padding, unshared at UNSHARED_LENGTH (or the longest sequence, when
    longer) against shared at `shared_length`."""
    from nemo_topr.data.packing import pack_sequences, padding_share
    from nemo_topr.data.shared_prefix import pack_shared, shared_padding_share, shared_positions

    unshared_length = max(UNSHARED_LENGTH, max(len(seq.input_ids) for seq in seqs))
    unshared_rows = pack_sequences(seqs, unshared_length, 0)
    shared_rows = pack_shared(seqs, shared_length)
    blocks = [block for row in shared_rows for block in row]
    groups = len({seq.prompt_id for seq in seqs})
    return {
        "unshared_seq_length": unshared_length, "shared_seq_length": shared_length,
        "sequences": len(seqs), "sequence_tokens": sum(len(seq.input_ids) for seq in seqs),
        "unshared_rows": len(unshared_rows), "unshared_positions": len(unshared_rows) * unshared_length,
        "unshared_padding_share": padding_share(seqs, unshared_rows, unshared_length),
        "shared_rows": len(shared_rows), "shared_positions": len(shared_rows) * shared_length,
        "shared_tokens": shared_positions(seqs, shared_rows),
        "shared_padding_share": shared_padding_share(seqs, shared_rows, shared_length),
        "prompt_copies_per_group": len(blocks) / groups,
        "positions_ratio": len(unshared_rows) * unshared_length / (len(shared_rows) * shared_length),
    }


def choose_shared_length(seqs, target_ratio: float = 5.0, padding_target: float = 0.03) -> int:
    """The shortest swept row length whose shared rows reach `target_ratio` fewer positions with
    at most `padding_target` padding (attention cost per row grows with L^2 on the local path);
    the sweep's best ratio when none does."""
    longest = max(len(seq.input_ids) for seq in seqs)
    figures = {L: token_figures(seqs, L) for L in SWEEP_LENGTHS if L >= longest}
    good = [L for L, f in figures.items()
            if f["positions_ratio"] >= target_ratio and f["shared_padding_share"] <= padding_target]
    return min(good) if good else max(figures, key=lambda L: figures[L]["positions_ratio"])


def _model(seq_length: int, flex: bool = False):
    from bench.step import build_model

    return build_model(TINY_MODEL, seq_length, flex=flex)


def _microbatches(seqs, shared: bool, seq_length: int):
    """One row per micro-batch, as Bridge's micro_batch_size=1."""
    from nemo_topr.data.packing import collate_packed, pack_sequences
    from nemo_topr.data.shared_prefix import collate_shared, pack_shared

    if shared:
        return [collate_shared(seqs, [row], seq_length, 0) for row in pack_shared(seqs, seq_length)]
    return [collate_packed(seqs, [row], seq_length, 0) for row in pack_sequences(seqs, seq_length, 0)]


def time_step(seqs, shared_length: int, reps: int, warmup: int = 1) -> dict:
    """Step and scoring CPU time, unshared (a) against shared (b), on the same weights, each after
    `warmup` untimed runs."""
    from bench.common import interleaved
    from bench.step import run_step
    from nemo_topr.objective import ObjectiveConfig
    from nemo_topr.training.scoring import scoring_forward_step
    from nemo_topr.training.step import ToprForwardStep

    unshared_length = max(UNSHARED_LENGTH, max(len(seq.input_ids) for seq in seqs))
    chunks = _model(max(unshared_length, shared_length))
    batches = {"unshared": _microbatches(seqs, False, unshared_length),
               "shared": _microbatches(seqs, True, shared_length)}
    step = functools.partial(ToprForwardStep(ObjectiveConfig()), None)
    train = {name: functools.partial(run_step, chunks, step, b) for name, b in batches.items()}
    scores = {name: {} for name in batches}
    score = {name: functools.partial(run_step, chunks, scoring_forward_step(scores[name], chunks[0].config), b,
                                     forward_only=True) for name, b in batches.items()}
    step_times = interleaved(train["unshared"], train["shared"], reps, warmup)
    scoring_times = interleaved(score["unshared"], score["shared"], reps, warmup)
    worst = max(abs(scores["shared"][k] / scores["unshared"][k] - 1) for k in scores["unshared"])
    # the shared rows again, through FlexCoreAttention (eager on CPU: it materialises the scores too)
    flex_chunks = _model(max(unshared_length, shared_length), flex=True)
    flex_scores: dict[int, float] = {}
    run_step(flex_chunks, scoring_forward_step(flex_scores, flex_chunks[0].config), batches["shared"],
             forward_only=True)
    flex_step_times = interleaved(functools.partial(run_step, flex_chunks, step, batches["shared"]),
                                  train["shared"], reps, warmup)
    flex_worst = max(abs(flex_scores[k] / scores["unshared"][k] - 1) for k in scores["unshared"])
    return {"microbatches": {name: len(b) for name, b in batches.items()},
            "step": step_times, "scoring": scoring_times, "scoring_max_relative_difference": worst,
            "step_flex_vs_local_shared": flex_step_times, "flex_scoring_max_relative_difference": flex_worst}


def timing_length(seqs) -> int:
    """The shortest swept row length that holds every prompt group whole."""
    from nemo_topr.data.shared_prefix import block_length, prompt_groups

    longest = max(block_length(seqs, group) for group in prompt_groups(seqs))
    return min(L for L in SWEEP_LENGTHS if L >= longest)


def measure(questions: int, samples: int, reps: int, time_questions: int, warmup: int = 1) -> dict:
    results = {}
    for name, (prompt_format, completion_scale) in WORKLOADS.items():
        groups = workload(prompt_format, questions, samples, completion_scale)
        seqs = sequences(groups)
        prompts = [p for p, _ in groups]
        completions = [n for _, ns in groups for n in ns]
        longest = max(len(seq.input_ids) for seq in seqs)
        entry = {
            "prompt_format": prompt_format, "completion_scale": completion_scale,
            "questions": questions, "samples_per_question": samples,
            "prompt_tokens_mean": sum(prompts) / len(prompts),
            "completion_tokens_mean": sum(completions) / len(completions),
            "tokens": token_figures(seqs, choose_shared_length(seqs)),
            "sweep": {L: {k: token_figures(seqs, L)[k] for k in ("positions_ratio", "shared_padding_share")}
                      for L in SWEEP_LENGTHS if L >= longest},
        }
        timed = sequences(groups[:time_questions])
        length = timing_length(seqs)
        entry["timing"] = {"questions": time_questions, "tokens": token_figures(timed, length),
                           **time_step(timed, length, reps, warmup)}
        results[name] = entry
    return results


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.shared_prefix --out FILE`` (one process, TP=1)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", type=int, default=64, help="GSM8K questions for the token figures")
    parser.add_argument("--samples", type=int, default=16, help="completions per question")
    parser.add_argument("--time-questions", type=int, default=1, help="questions in the timed optimizer step")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each side before the timed ones")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from nemo_topr.model.device import use_device
    from nemo_topr.utils.distributed import destroy_model_parallel, initialize_model_parallel

    use_device("cpu", where="bench.shared_prefix")
    initialize_model_parallel(1, 1)
    from bench.common import environment

    env = environment()
    results = {**measure(args.questions, args.samples, args.reps, args.time_questions, args.warmup),
               "environment": {key: env[key] for key in ("date_utc", "git_commit", "git_dirty_tracked_files",
                                                         "cpu_model", "torch", "megatron_core")}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    destroy_model_parallel()


if __name__ == "__main__":
    main()
