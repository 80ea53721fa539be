"""`python -m nemo_topr.miniature` (`make miniature`): the CPU miniature of the TOPR paper.

Every stage uses the project's real pipeline: `nemo-topr train` (Megatron-Bridge finetune loop)
followed by `nemo-topr export`'s code in one subprocess per run (`training/train_export.py`), and
`nemo-topr score-logprobs` as a subprocess exactly as a user runs it; generation + grading
(`sample_and_grade`, the code behind `nemo-topr generate` / `eval`) run in this process to save
the start-up per command.

1. task: synthetic 2-3 step arithmetic word problems (`task.py`), splits pretrain / train / test;
   a byte-level BPE tokenizer trained on the task text and a tiny Llama, both built offline;
2. pretraining from scratch: one SFT run (`objective.variant=sft_positive`) on gold solutions
   of the pretrain split with a checkpoint every --pretrain-save-interval iterations, each
   sampled on train prompts. Stopping rule, fixed before any result was seen: the first
   checkpoint whose train pass@1 is >= 0.30 is the starting model mu (else the last one);
3. the offline dataset: k samples per train prompt from mu (temperature 1), graded +-1, log mu
   scored with `nemo-topr score-logprobs`;
4. from mu and that data: sft_positive, reinforce, tis, topr, asymre (dV = -0.1), ppo_clip, and
   TOPR at several effective positive shares p~ (baseline from `baseline_for_share`), each for
   --epochs epochs at one fixed lr, per seed, with a checkpoint every --eval-interval iterations;
5. every checkpoint of every run is exported and evaluated on the test split (pass@1, maj@k,
   invalid and malformed rates, length): curves over training; telemetry from TensorBoard;
6. `report.py` writes results.md and PNG plots.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from nemo_topr.utils.arguments import Parser
from nemo_topr.utils.outputs import fresh_output_dir

VARIANTS = ("sft_positive", "reinforce", "tis", "topr", "asymre", "ppo_clip")
TELEMETRY = ("topr_loss", "positive_nll", "negative_nll", "negative_weight_mean", "positive_weight_mean",
             "effective_positive_share", "negative_truncated_share", "log_ratio_abs_mean", "log_ratio_abs_max")
PRETRAIN_TARGET = 0.30


def log(text: str) -> None:
    print(f"[miniature {time.strftime('%H:%M:%S')}] {text}", flush=True)


def _records(problems, prefix: str) -> list[dict]:
    """Gold solutions as pre-scored records. behavior_logprob is a placeholder 0.0: with
    sft_positive every record is a positive of weight 1 whatever rho is, so log mu is unused."""
    return [{"prompt": p.prompt, "completion": p.solution, "reward": 1.0, "prompt_id": f"{prefix}-{i}",
             "sample_id": 0, "behavior_logprob": 0.0} for i, p in enumerate(problems)]


def _write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _gen_problems(problems, prefix: str):
    from nemo_topr.evaluation.samples import Problem

    from nemo_topr.miniature.task import TASK
    return [Problem(f"{prefix}-{i}", p.prompt, str(p.answer), TASK) for i, p in enumerate(problems)]


def sample(model_dir: Path, problems, prefix: str, num_samples: int, seed: int, max_new_tokens: int):
    """(samples.Problem list, graded samples) with the project's sampler and GSM8K grader."""
    from nemo_topr.evaluation.sampling import SamplingSettings, sample_and_grade

    gen_problems = _gen_problems(problems, prefix)
    settings = SamplingSettings(num_samples=num_samples, temperature=1.0, top_p=1.0, top_k=500,
                                max_new_tokens=max_new_tokens, seed=seed, stop_strings=("\nQuestion:",))
    return gen_problems, sample_and_grade(model_dir, gen_problems, settings, backend="transformers")


def batched_sample(model_dir: Path, problems, prefix: str, num_samples: int, seed: int, max_new_tokens: int):
    """Like `sample` (same settings, tokenization, stop string and grader) but one `generate`
    call per prompt *length* instead of per prompt: prompts of equal token length need no
    padding, so positions match training exactly. Used for evaluation only (the offline
    training data comes from `sample`, the project's sampler); about 10x faster on CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    from nemo_topr.data.tokenization import load_tokenizer, pad_id_of, prompt_token_ids
    from nemo_topr.evaluation.samples import Completion, grade_completions
    from nemo_topr.evaluation.sampling import trim_at_stop

    gen_problems = _gen_problems(problems, prefix)
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype="auto").eval()
    ids = prompt_token_ids(tokenizer, [p.prompt for p in gen_problems])
    by_length: dict[int, list[int]] = {}
    for index, row in enumerate(ids):
        by_length.setdefault(len(row), []).append(index)
    texts: dict[int, list[str]] = {}
    for length, indices in sorted(by_length.items()):
        torch.manual_seed(seed * 100_003 + length)
        input_ids = torch.tensor([ids[i] for i in indices])
        with torch.no_grad():
            output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
                                    temperature=1.0, top_p=1.0, top_k=500, max_new_tokens=max_new_tokens,
                                    num_return_sequences=num_samples, pad_token_id=pad_id_of(tokenizer))
        decoded = tokenizer.batch_decode(output[:, length:], skip_special_tokens=True)
        for j, i in enumerate(indices):
            texts[i] = [trim_at_stop(t, ("\nQuestion:",)) for t in decoded[j * num_samples:(j + 1) * num_samples]]
    graded = [grade_completions(p, [Completion(t) for t in texts[i]]) for i, p in enumerate(gen_problems)]
    return gen_problems, graded


def evaluate(model_dir: Path, problems, prefix: str, num_samples: int, seed: int, max_new_tokens: int) -> dict:
    """pass@1, pass@N, maj@N and the grader's invalid rate (`nemo-topr eval`'s metrics), plus
    `malformed_rate` (no "The answer is N." statement: no parseable answer or degenerate text)
    and the mean completion length in characters; `per_problem`: for each problem in order, its
    correct and its malformed samples out of `num_samples`."""
    from nemo_topr.evaluation.evaluate import benchmark_results, outcomes_of_completions
    from nemo_topr.miniature.task import TASK, is_well_formed

    _, graded = batched_sample(model_dir, problems, prefix, num_samples, seed, max_new_tokens)
    results = benchmark_results(outcomes_of_completions(graded), TASK, [1, num_samples])
    texts = [s.completion.text for samples in graded for s in samples]
    results["metrics"]["malformed_rate"] = sum(not is_well_formed(t) for t in texts) / len(texts)
    results["metrics"]["mean_chars"] = sum(map(len, texts)) / len(texts)
    results["per_problem"] = {"correct": [sum(s.grade == "correct" for s in samples) for samples in graded],
                              "malformed": [sum(not is_well_formed(s.completion.text) for s in samples)
                                            for samples in graded]}
    results["examples"] = texts[:3]
    return results


def _run_logged(command: list[str], log_path: Path, what: str, env: dict[str, str] | None = None) -> None:
    """Run a nemo-topr subprocess with its output in `log_path` only (runs go two at a time)."""
    import subprocess

    with log_path.open("w") as log_file:
        if subprocess.run(command, stdout=log_file, stderr=subprocess.STDOUT, env=env).returncode != 0:
            raise SystemExit(f"{what} failed; full log: {log_path}")


def telemetry(run_dir: Path) -> dict[str, list[float]]:
    from nemo_topr.demo import _tensorboard_series

    return {tag: _tensorboard_series(run_dir, tag) for tag in TELEMETRY}


def train(name: str, hf_model: Path, data: Path, overrides: list[str], out: Path, hf_root: Path,
          threads: int | None = None) -> tuple[Path, dict[int, Path]]:
    """`nemo-topr train --config-name miniature` into out/runs/NAME, then every saved checkpoint
    exported to hf_root/iter_NNNNNNN (recreated), in one subprocess (`train_export.py`; Megatron's
    process-group state is per process). Returns (run directory, {iteration: HF directory})."""
    from nemo_topr.training.checkpoints import iteration_dir_name, saved_iterations

    run_dir = out / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(hf_root, ignore_errors=True)
    run_dir.mkdir(parents=True)
    command = [sys.executable, "-m", "nemo_topr.training.train_export", str(hf_root), "--config-name", "miniature",
               f"hf_model={hf_model}", f"run_dir={run_dir}", f"dataset.train_path={data}", *overrides]
    log("$ " + " ".join(command))
    _run_logged(command, run_dir / "train.log", f"training {name}",
                env={**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})})
    log(f"trained and exported {name}")
    return run_dir, {i: hf_root / iteration_dir_name(i) for i in saved_iterations(run_dir / "checkpoints")}


def results_file(path: Path, results: dict, started: float):
    """(save, stage_done) for a driver's results.json: `save()` rewrites it with the wall time so far,
    `stage_done(name)` records the seconds since the previous stage under results["stage_seconds"]
    and saves, so an interrupted run keeps what it measured. A stage already recorded (passed again
    by a resumed run) keeps its time."""
    def save() -> None:
        results["wall_time_s"] = round(time.time() - started, 1)
        path.write_text(json.dumps(results, indent=2) + "\n")

    def stage_done(name: str) -> None:
        if name not in results["stage_seconds"]:
            results["stage_seconds"][name] = round(time.time() - started - sum(results["stage_seconds"].values()), 1)
        save()

    return save, stage_done


def build_task_and_model(out: Path, sizes: dict[str, int], task_seed: int, vocab_size: int,
                         hidden_size: int) -> tuple[dict, Path]:
    """Splits of the given sizes (disjoint, drawn in order), the tiny BPE tokenizer trained on the
    pretraining split, and a randomly initialised tiny Llama in HF format at out/init_hf."""
    from nemo_topr.miniature.task import corpus, make_splits
    from nemo_topr.model.providers import build_tiny_hf_llama
    from nemo_topr.data.tiny_tokenizer import build_tiny_tokenizer

    splits = make_splits(sizes, seed=task_seed)
    tokenizer = build_tiny_tokenizer(vocab_size=vocab_size, chat_template=False, corpus=corpus(splits["pretrain"]))
    model = build_tiny_hf_llama(out / "init_hf", tokenizer, num_layers=2, hidden_size=hidden_size,
                                intermediate_size=int(hidden_size * 8 / 3) // 8 * 8, num_heads=4,
                                num_kv_heads=2, max_position_embeddings=256)
    lengths = [len(tokenizer(p.prompt + p.solution)["input_ids"]) for p in splits["pretrain"][:200]]
    log(f"task: {'/'.join(str(n) for n in sizes.values())} problems ({'/'.join(sizes)}); tokenizer "
         f"{len(tokenizer)} tokens; problem length {min(lengths)}-{max(lengths)} tokens")
    return splits, model


def pretrain_mus(out: Path, splits: dict, model: Path, *, lr: float, epochs: int, save_interval: int,
                 targets: tuple[float, ...], probe_prompts: int,
                 max_new_tokens: int) -> tuple[dict[float, Path], list[dict], Path]:
    """Pretraining from scratch = one SFT run on the pretraining split's gold solutions, a checkpoint
    every `save_interval` iterations. Checkpoints are probed in order on the first `probe_prompts`
    train prompts x 8 samples until every target is met; each target's mu is the first checkpoint
    with train pass@1 >= target. Returns ({target met: mu}, probes (metrics and `per_problem`),
    the last probed checkpoint)."""
    sft_data = _write_jsonl(_records(splits["pretrain"], "pre"), out / "data" / "pretrain.jsonl")
    run_dir, exports = train("pretrain", model, sft_data,
                             ["objective.variant=sft_positive", f"optimizer.lr={lr}", f"optimizer.min_lr={lr}",
                              f"dataset.epochs={epochs}", f"checkpoint.save_interval={save_interval}"], out,
                             out / "pretrain_hf")
    probes, mus = [], {}
    for iteration, hf in exports.items():
        probe = evaluate(hf, splits["train"][:probe_prompts], "train", 8, 0, max_new_tokens)
        probes.append({"iteration": iteration, **probe["metrics"], "per_problem": probe["per_problem"]})
        log(f"pretraining iteration {iteration}: train pass@1 {probe['metrics']['pass@1']:.3f}; "
             f"e.g. {probe['examples'][0]!r}")
        last = hf
        mus.update({t: hf for t in targets if t not in mus and probe["metrics"]["pass@1"] >= t})
        if len(mus) == len(targets):
            break
    shutil.rmtree(run_dir / "checkpoints")
    return mus, probes, last


def pretrain_mu(out: Path, splits: dict, model: Path, *, lr: float, epochs: int, save_interval: int,
                target: float, probe_prompts: int, max_new_tokens: int) -> tuple[Path, list[dict], bool]:
    """`pretrain_mus` with one target: mu is the first checkpoint with train pass@1 >= target, else
    the last one. Returns (mu, probes, target met)."""
    mus, probes, last = pretrain_mus(out, splits, model, lr=lr, epochs=epochs, save_interval=save_interval,
                                     targets=(target,), probe_prompts=probe_prompts, max_new_tokens=max_new_tokens)
    return mus.get(target, last), probes, target in mus


def offline_dataset(mu: Path, problems, k: int, seed: int, directory: Path, max_new_tokens: int) -> tuple[Path, dict]:
    """k samples per prompt from mu with sampling seed `seed` (the project's sampler), graded +-1,
    log mu scored with `nemo-topr score-logprobs`. Returns (scored records, counts)."""
    from nemo_topr.data.records import write_jsonl
    from nemo_topr.evaluation.samples import graded_records

    directory.mkdir(parents=True, exist_ok=True)
    gen_problems, graded = sample(mu, problems, "train", k, seed, max_new_tokens)
    records = graded_records(gen_problems, graded)
    write_jsonl(records, directory / "graded.jsonl")
    grades = [s.grade for samples in graded for s in samples]
    stats = {"records": len(records), "positive_share": sum(r.reward > 0 for r in records) / len(records),
             **{g: grades.count(g) for g in ("correct", "wrong", "invalid")},
             "prompts_with_both": sum(0 < sum(s.grade == "correct" for s in samples) < len(samples)
                                      for samples in graded)}
    scored = score_logprobs(mu, directory)
    log(f"offline dataset (seed {seed}): {stats}")
    return scored, stats


def score_logprobs(mu: Path, directory: Path) -> Path:
    """directory/graded.jsonl scored for log mu by `nemo-topr score-logprobs` into directory/scored.jsonl."""
    scored = directory / "scored.jsonl"
    _run_logged([sys.executable, "-m", "nemo_topr.cli", "score-logprobs", "--model", str(mu), "--data",
                 str(directory / "graded.jsonl"), "--out", str(scored), "--seq-length", "256", "--device", "cpu"],
                directory / "score.log", f"scoring {directory}")
    return scored


def train_variant(name: str, mu: Path, data: Path, overrides: list[str], out: Path, *, epochs: int, lr: float,
                  warmup: int, save_interval: int, seed: int, jobs: int) -> tuple[Path, dict[int, Path]]:
    """One run from mu: `epochs` over `data` at lr (linear warm-up from 0 over `warmup` iterations,
    constant after), seed for init RNG and data order; exported checkpoints {iteration: HF dir}.
    The run's OpenMP threads are the cores shared out over `jobs` concurrent runs."""
    return train(name, mu, data,
                 [*overrides, f"dataset.epochs={epochs}", f"optimizer.lr={lr}", f"optimizer.min_lr={lr}",
                  f"scheduler.lr_warmup_iters={warmup}", f"checkpoint.save_interval={save_interval}",
                  f"rng.seed={seed}", f"dataset.shuffle_seed={seed}"], out, out / "exports" / name,
                 threads=max(1, (os.cpu_count() or 1) // max(1, jobs)))


def variant_overrides(variant: str) -> list[str]:
    return [f"objective.variant={variant}"] + (["objective.asymre_delta_v=-0.1"] if variant == "asymre" else [])


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m nemo_topr.miniature", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/miniature", help="results directory (emptied first if an earlier "
                        "run made it; another non-empty one is refused)")
    parser.add_argument("--docs", default="docs/miniature", help="copy the table and plots here ('' to skip)")
    parser.add_argument("--task-seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="training seeds of the variant runs")
    parser.add_argument("--pretrain-problems", type=int, default=2000)
    parser.add_argument("--train-prompts", type=int, default=128)
    parser.add_argument("--test-prompts", type=int, default=200)
    parser.add_argument("--probe-prompts", type=int, default=32, help="train prompts sampled at each pretraining checkpoint")
    parser.add_argument("--k", type=int, default=8, help="samples per train prompt in the offline dataset")
    parser.add_argument("--eval-samples", type=int, default=8, help="samples per test prompt (maj@N)")
    parser.add_argument("--pretrain-epochs", type=int, default=15, help="most epochs over the pretrain split")
    parser.add_argument("--pretrain-save-interval", type=int, default=30, help="iterations between pretraining "
                        "checkpoints (each is probed; the first reaching the target becomes mu)")
    parser.add_argument("--pretrain-lr", type=float, default=3e-3)
    parser.add_argument("--lr", type=float, default=1e-3, help="lr of every variant run")
    parser.add_argument("--epochs", type=int, default=3, help="epochs over the offline dataset per variant run")
    parser.add_argument("--eval-interval", type=int, default=16, help="iterations between evaluated checkpoints "
                        "of the variant runs (the last iteration is always evaluated)")
    parser.add_argument("--p-tilde", type=float, nargs="*", default=[0.05, 0.1, 0.2, 0.5, 0.8],
                        help="TOPR positive-share sweep (baseline_for_share)")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--mu", help="skip pretraining and use this exported model as mu (it must come from a "
                        "run of this pipeline with the same task seed and sizes; its tokenizer is reused)")
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=384)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=2, help="variant trainings run this many at a time")
    args = parser.parse_args(argv)

    from concurrent.futures import ThreadPoolExecutor

    from nemo_topr.objective import baseline_for_share

    started = time.time()
    out = fresh_output_dir(args.out, "nemo_topr.miniature")
    (out / "data").mkdir()
    results: dict = {"args": vars(args), "pretrain": [], "runs": {}, "stage_seconds": {}}

    save, stage_done = results_file(out / "results.json", results, started)

    # 1. task, tokenizer, model
    splits, model = build_task_and_model(out, {"pretrain": args.pretrain_problems, "train": args.train_prompts,
                                               "test": args.test_prompts}, args.task_seed, args.vocab_size,
                                         args.hidden_size)

    # 2. pretraining from scratch: one SFT run on gold solutions, a checkpoint every
    #    --pretrain-save-interval iterations; mu = the first checkpoint with train pass@1 >= 0.30
    if args.mu:
        mu = out / "mu_given_hf"
        shutil.copytree(args.mu, mu)
        results["pretrain_skipped"] = f"--mu {args.mu}"
    else:
        mu, results["pretrain"], results["pretrain_target_met"] = pretrain_mu(
            out, splits, model, lr=args.pretrain_lr, epochs=args.pretrain_epochs,
            save_interval=args.pretrain_save_interval, target=PRETRAIN_TARGET, probe_prompts=args.probe_prompts,
            max_new_tokens=args.max_new_tokens)
    results["mu"] = str(mu)
    stage_done("pretrain")

    # 3. the offline dataset: k samples per train prompt from mu, graded +-1, log mu scored
    scored, results["dataset"] = offline_dataset(mu, splits["train"], args.k, 1, out / "data", args.max_new_tokens)
    p = results["dataset"]["positive_share"]
    start_eval = evaluate(mu, splits["test"], "test", args.eval_samples, 0, args.max_new_tokens)
    results["runs"]["mu"] = {"name": "mu (start)", "seed": None, "eval": start_eval["metrics"],
                             "examples": start_eval["examples"]}
    stage_done("dataset")

    # 4. variants and the p~ sweep, from mu on the same data, per seed
    plan = [(v, v, variant_overrides(v)) for v in args.variants]
    if not 0.0 < p < 1.0 and args.p_tilde:  # no c changes the share of a one-sided dataset
        results["p_tilde_skipped"] = f"positive share p = {p}: the p~ sweep needs both positives and negatives"
        log(results["p_tilde_skipped"])
    for target in args.p_tilde if 0.0 < p < 1.0 else []:
        c = baseline_for_share(p, target)
        plan.append((f"topr_ptilde{target:g}", f"topr p~={target:g} (c={c:+.3f})",
                     ["objective.variant=topr", f"objective.baseline={c}"]))
    jobs = [(seed, key, label, overrides) for seed in args.seeds for key, label, overrides in plan]

    def train_and_export(job) -> tuple[Path, dict[int, Path]]:
        seed, key, _, overrides = job
        return train_variant(f"{key}_s{seed}", mu, scored, overrides, out, epochs=args.epochs, lr=args.lr, warmup=0,
                             save_interval=args.eval_interval, seed=seed, jobs=args.jobs)

    # 5. evaluate every saved checkpoint of every run on the test split (this process) while
    #    the next runs train (subprocesses). One thread each: oversubscribed OpenMP threads
    #    slow the evaluation ~8x on 2 cores.
    import torch

    torch.set_num_threads(1)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = [pool.submit(train_and_export, job) for job in jobs]
        for (seed, key, label, _), future in zip(jobs, futures):
            run_dir, checkpoints = future.result()
            curve = [{"iteration": 0, **start_eval["metrics"]}]
            for iteration, hf in checkpoints.items():
                final = evaluate(hf, splits["test"], "test", args.eval_samples, 0, args.max_new_tokens)
                curve.append({"iteration": iteration, **final["metrics"]})
            shutil.rmtree(run_dir / "checkpoints")  # keep results small: the exports stay
            name = f"{key}_s{seed}"
            results["runs"][name] = {"name": label, "key": key, "seed": seed, "eval": final["metrics"],
                                     "curve": curve, "examples": final["examples"], "telemetry": telemetry(run_dir)}
            log(f"{name}: test pass@1 {curve[1]['pass@1']:.3f} -> {final['metrics']['pass@1']:.3f} (iterations "
                 f"{curve[1]['iteration']}, {curve[-1]['iteration']}), maj@{args.eval_samples} "
                 f"{final['metrics'][f'maj@{args.eval_samples}']:.3f}, malformed "
                 f"{final['metrics']['malformed_rate']:.3f}")
            save()
    stage_done("variants")

    from nemo_topr.miniature import report

    table = report.write_report(out, results, docs=Path(args.docs) if args.docs else None)
    print(table)
    log(f"done in {time.time() - started:.0f} s -> {out / 'results.md'}")
    return 0
