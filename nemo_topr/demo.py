"""`make demo`: the whole TOPR recipe on CPU in a few minutes, offline.

    python -m nemo_topr.demo [--out runs/demo] [--prompts 48] [--epochs 3]

1. builds a tiny Llama 3-style model and tokenizer (Hugging Face format) in code;
2. builds a graded dataset from real (shorter) GSM8K train rows: per question the gold solution
   (reward +1) and two wrong ones (reward -1): the gold reasoning with a wrong final answer,
   and a degenerate loop (the first step repeated, then a wrong answer);
3. scores log mu(y|x) with the starting model (`nemo-topr score-logprobs`);
4. trains with TOPR through Megatron-Bridge's finetune() loop (`nemo-topr train`);
5. exports the last checkpoint to Hugging Face format (`nemo-topr export`);
6. reloads it with `transformers` and measures, independently of Megatron, how the mean
   per-token log-likelihood of positives and negatives moved; prints a summary.

Each stage runs the user-facing command in a subprocess, exactly as a user would, each on the
CPU by explicit choice (`--device cpu`; the tiny_cpu training config has `device: cpu`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

from nemo_topr.errors import run_refusing
from nemo_topr.utils.arguments import Parser

STAGES = 6
MAX_CHARS = 600  # question + answer, so that prompt + completion fit 512 tiny-tokenizer tokens


def _stage(number: int, text: str) -> None:
    print(f"\n[{number}/{STAGES}] {text}", flush=True)


def _wrong_final(answer: str, rng: random.Random) -> str:
    """The gold completion with a different final answer."""
    from nemo_topr.data.prompts import gsm8k_final_answer, gsm8k_gold_completion

    final = gsm8k_final_answer(answer)
    wrong = str(int(float(final.replace(",", ""))) + rng.choice([-3, -2, -1, 1, 2, 5, 10]))
    return gsm8k_gold_completion(answer).rsplit(f"The answer is {final}.", 1)[0] + f"The answer is {wrong}."


def _degenerate_loop(answer: str, rng: random.Random) -> str:
    """The failure mode the paper reports for naive REINFORCE: the first step of the reasoning
    repeated in a loop, then a wrong final answer."""
    from nemo_topr.data.prompts import gsm8k_gold_completion

    first_step = gsm8k_gold_completion(answer).strip().split("\n")[0]
    return " " + "\n".join([first_step] * rng.randint(3, 5)) + "\n" + _wrong_final(answer, rng).rsplit("\n", 1)[-1]


def build_graded_records(num_prompts: int, seed: int = 0) -> list[dict]:
    """Records in the pre-scored schema (no behavior_logprob yet) from GSM8K train rows."""
    from nemo_topr.data.prompts import gsm8k_gold_completion, load_gsm8k

    rng = random.Random(seed)
    # shorter problems keep the CPU demo within minutes at sequence length 512
    short = [row for row in load_gsm8k("train") if len(row["question"]) + len(row["answer"]) < MAX_CHARS]
    rows = rng.sample(short, num_prompts)
    records = []
    for prompt_index, row in enumerate(rows):
        prompt = f"Question: {row['question']}\nAnswer:"
        completions = [(gsm8k_gold_completion(row["answer"]), 1.0, "gold"),
                       (_wrong_final(row["answer"], rng), -1.0, "wrong_final_answer"),
                       (_degenerate_loop(row["answer"], rng), -1.0, "degenerate_loop")]
        for sample_index, (completion, reward, kind) in enumerate(completions):
            records.append({"prompt": prompt, "completion": completion, "reward": reward,
                            "prompt_id": f"gsm8k-train-{prompt_index}", "sample_id": sample_index,
                            "meta": {"kind": kind}})
    return records


def completion_logprob_means(model_dir: Path, records: list[dict]) -> dict[str, float]:
    """Mean per-token log-likelihood of positive and negative completions under an HF model
    (plain `transformers`, independent of the Megatron code that trained it)."""
    import torch
    from transformers import AutoModelForCausalLM

    from nemo_topr.data.records import is_positive
    from nemo_topr.data.tokenization import load_tokenizer, prompt_token_ids

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    sums = {"positive": [], "negative": []}
    with torch.no_grad():
        for record in records:
            prompt_ids = prompt_token_ids(tokenizer, [record["prompt"]])[0]
            completion_ids = tokenizer(record["completion"], add_special_tokens=False)["input_ids"]
            completion_ids.append(tokenizer.eos_token_id)
            ids = torch.tensor([prompt_ids + completion_ids])
            logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
            targets = ids[0, 1:]
            token_logprobs = logprobs.gather(-1, targets[:, None])[:, 0][len(prompt_ids) - 1:]
            side = "positive" if is_positive(record["reward"]) else "negative"
            sums[side].append(token_logprobs.mean().item())
    return {side: sum(values) / len(values) for side, values in sums.items()}


def _run(command: list[str], log: Path) -> None:
    """Run a nemo-topr command, streaming its output and keeping a copy in `log`."""
    print("$ " + " ".join(command), flush=True)
    with log.open("w") as log_file:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in process.stdout:
            log_file.write(line)
            if _worth_showing(line):
                print("  " + line.rstrip(), flush=True)
        if process.wait() != 0:
            raise SystemExit(f"command failed (exit {process.returncode}); full log: {log}")


def _worth_showing(line: str) -> bool:
    """Progress lines only: Bridge's per-iteration log, checkpoint saves and our own messages."""
    return any(key in line for key in ("iteration ", "saving checkpoint", "[nemo-topr]", "exported", '"records_'))


def _tensorboard_series(run_dir: Path, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    values = [event.value for event in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []
    return [value for value in values if math.isfinite(value)]  # NaN: no such sequences that step


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m nemo_topr.demo", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/demo", help="demo directory (emptied first if an earlier demo made "
                        "it; another non-empty one is refused)")
    parser.add_argument("--prompts", type=int, default=48, help="GSM8K train questions to use")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=3e-3,
                        help="a randomly initialised tiny model needs a far larger step than the paper's 5e-7")
    args = parser.parse_args(argv)

    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.utils.outputs import MARK, fresh_output_dir
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    started = time.time()
    earlier = Path(args.out).is_dir() and any(path.name != MARK for path in Path(args.out).iterdir())
    out = fresh_output_dir(args.out, "nemo_topr.demo")
    if earlier:  # what the tour left elsewhere (runs/tour) stays
        print(f"python -m nemo_topr.demo: emptied {out}, an earlier demo's, to run again (--out DIR: another "
              "directory)", flush=True)
    (out / "data").mkdir()
    nemo_topr = [sys.executable, "-m", "nemo_topr.cli"]

    _stage(1, "building a tiny Llama (2 layers, GQA, SwiGLU, RoPE) and a 512-token BPE tokenizer offline")
    model_dir = build_tiny_hf_llama(out / "tiny_llama_hf", build_tiny_tokenizer())
    print(f"  {model_dir}")

    _stage(2, f"grading data from {args.prompts} real GSM8K train questions (1 gold + 2 wrong per question)")
    records = build_graded_records(args.prompts)
    (out / "data" / "graded.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"  {len(records)} records, {sum(r['reward'] > 0 for r in records)} positive -> {out / 'data/graded.jsonl'}")

    _stage(3, "scoring behaviour log-probs log mu(y|x) with the starting model")
    scored = out / "data" / "scored.jsonl"
    _run([*nemo_topr, "score-logprobs", "--model", str(model_dir), "--data", str(out / "data/graded.jsonl"),
          "--out", str(scored), "--seq-length", "512", "--device", "cpu"], out / "score.log")

    _stage(4, "training with TOPR on Megatron-Bridge's finetune() loop (CPU, gloo)")
    run_dir = out / "run"
    _run([*nemo_topr, "train", "--config-name", "tiny_cpu", f"base_model={model_dir}", f"run_dir={run_dir}",
          f"dataset.train_path={scored}", f"dataset.epochs={args.epochs}",
          f"optimizer.lr={args.lr}", f"optimizer.min_lr={args.lr}"], out / "train.log")

    _stage(5, "exporting the last checkpoint to Hugging Face format")
    hf_out = out / "hf_export"
    _run([*nemo_topr, "export", "--ckpt", str(run_dir), "--hf-out", str(hf_out), "--device", "cpu"], out / "export.log")

    _stage(6, "reloading the export with transformers and measuring log-likelihood movement")
    before = completion_logprob_means(model_dir, records)
    after = completion_logprob_means(hf_out, records)
    losses = _tensorboard_series(run_dir, "topr_loss")
    truncated = _tensorboard_series(run_dir, "negative_truncated_share")
    summary = {
        "iterations": len(losses),
        "topr_loss_first": losses[0] if losses else None,
        "topr_loss_last": losses[-1] if losses else None,
        "positive_logprob_per_token": {"before": before["positive"], "after": after["positive"]},
        "negative_logprob_per_token": {"before": before["negative"], "after": after["negative"]},
        "truncated_negative_share_last": truncated[-1] if truncated else None,
        "checkpoint_dir": str(run_dir / "checkpoints"),
        "hf_export": str(hf_out),
        "wall_time_s": round(time.time() - started, 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"""
TOPR demo summary ({summary['iterations']} iterations)
  TOPR loss                     {summary['topr_loss_first']:+.4f} -> {summary['topr_loss_last']:+.4f}
  positives, log-prob / token   {before['positive']:+.4f} -> {after['positive']:+.4f}  ({after['positive'] - before['positive']:+.4f})
  negatives, log-prob / token   {before['negative']:+.4f} -> {after['negative']:+.4f}  ({after['negative'] - before['negative']:+.4f})
  negatives with weight < 1     {summary['truncated_negative_share_last']:.2f} (last iteration)
  wall time                     {summary['wall_time_s']} s
  checkpoints                   {summary['checkpoint_dir']}
  Hugging Face export           {hf_out}  (loads with transformers.AutoModelForCausalLM)
  summary                       {out / 'summary.json'}
next: the tour of README.md ("Five-minute tour of the data flow") runs each verb on this model and data;
  the curves: tensorboard --logdir {run_dir / 'tensorboard'}""")
    return 0


if __name__ == "__main__":
    sys.exit(run_refusing("python -m nemo_topr.demo", main, sys.argv[1:]))
