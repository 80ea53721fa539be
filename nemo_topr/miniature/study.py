"""`python -m nemo_topr.miniature.study` (`make miniature-study`): the pre-registered miniature study
of issue 19 (docs/miniature.md, "Pre-registered study (issue 19)"). `--dry-run` prints the plan
(runs, sizes, estimated time) without training anything.

Stages, each with the miniature pipeline's own functions (pipeline.py):
1. task splits pretrain / train / validation / test, tokenizer, random tiny Llama;
2. mu: SFT from scratch, the first probed checkpoint with train pass@1 >= --mu-target;
   mu evaluated once on test and validation;
3. one offline dataset per seed (tuning and study seeds): --k samples per train prompt from mu
   with the seed as sampling seed, graded, log mu scored;
4. lr / warm-up selection: sft_positive for each grid point on each tuning seed, final validation
   pass@1, mean over tuning seeds; ties (within 0.005 of the best) -> smallest lr, then warm-up;
5. on each study seed's dataset, with the selected settings: the variants and the TOPR p~ grid,
   one epoch each, final checkpoint evaluated on test and validation;
6. study_report.py: the manipulation check, paired sign tests and the H1-H3 decisions.

Every option defaults to the pre-registered design; results.json and results.md say whether
the run used it (`preregistered`) and list any option that differs.

`--resume` continues an interrupted study in --out: mu, the offline datasets and every run that
reached results.json are kept; the rest is run as it would have been. The design must be the
one the study started with; the report says that it was resumed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from nemo_topr.miniature.pipeline import VARIANTS

TIE_TOLERANCE = 0.005  # validation pass@1 within this of the best counts as tied (lr selection)
FINAL_ONLY = 100_000   # checkpoint.save_interval beyond any run's length: only the final one is saved

# Unit costs for the time estimate, from the timings recorded in docs/miniature.md (2 idle cores):
ITERATION_S = 0.29          # pretraining log: 448 iterations in 128 s
RUN_OVERHEAD_S = 28.0       # a variant run's 41 s slot minus its 46 x 0.29 s of iterations ...
EVAL_SAMPLE_S = 28.0 / 4800  # ... charged again per evaluated sample (3 x 1,600): an upper bound
DATASET_RECORD_S = 29.0 / 1024  # dataset stage: 1,024 records sampled, scored, mu evaluated
RECORDS_PER_ITERATION = 1024 * 3 / 46  # today's packing: 16 rows of 256 tokens per step
PROBE_SAMPLES = 8


@dataclass(frozen=True)
class Design:
    """The pre-registered design (docs/miniature.md); every field is a command-line option."""

    task_seed: int = 0
    pretrain_problems: int = 2000
    train_prompts: int = 512
    validation_prompts: int = 200
    test_prompts: int = 500
    pretrain_lr: float = 3e-3
    pretrain_epochs: int = 30
    pretrain_save_interval: int = 30
    mu_target: float = 0.60
    probe_prompts: int = 64
    k: int = 16
    seeds: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
    tuning_seeds: tuple[int, ...] = (101, 102)
    lr_grid: tuple[float, ...] = (3e-5, 1e-4, 3e-4, 1e-3)
    warmup_grid: tuple[int, ...] = (0, 12)
    epochs: int = 1
    variants: tuple[str, ...] = VARIANTS
    p_tilde: tuple[float, ...] = (0.05, 0.1, 0.2, 0.5, 0.8, 0.95)
    eval_samples: int = 8
    hidden_size: int = 128
    vocab_size: int = 384
    max_new_tokens: int = 40
    jobs: int = 2


PREREGISTERED = Design()


def deviations(design: Design) -> dict[str, dict]:
    """Options that differ from the pre-registered design ({} for the study as registered)."""
    return {f.name: {"registered": getattr(PREREGISTERED, f.name), "used": getattr(design, f.name)}
            for f in dataclasses.fields(Design) if getattr(design, f.name) != getattr(PREREGISTERED, f.name)}


def study_runs(design: Design) -> list[tuple[str, str]]:
    """(key, label) of the runs on each study seed: the variants, then the p~ grid."""
    return [(v, v) for v in design.variants] + [(f"topr_ptilde{t:g}", f"topr p~={t:g}") for t in design.p_tilde]


def tuning_runs(design: Design) -> list[tuple[float, int, int]]:
    """(lr, warm-up, tuning seed) of every sft_positive selection run."""
    return [(lr, w, s) for lr in design.lr_grid for w in design.warmup_grid for s in design.tuning_seeds]


def estimate(design: Design) -> dict[str, float]:
    """Upper-bound seconds per stage on 2 idle cores (the pre-registration's arithmetic)."""
    records = design.train_prompts * design.k
    iterations = records * design.epochs / RECORDS_PER_ITERATION
    pretrain_iterations = design.pretrain_problems * design.pretrain_epochs / RECORDS_PER_ITERATION
    probes = pretrain_iterations // design.pretrain_save_interval
    test, validation = design.test_prompts * design.eval_samples, design.validation_prompts * design.eval_samples
    per_run = RUN_OVERHEAD_S + iterations * ITERATION_S
    return {
        "pretraining": pretrain_iterations * ITERATION_S + RUN_OVERHEAD_S
        + probes * design.probe_prompts * PROBE_SAMPLES * EVAL_SAMPLE_S,
        "mu evaluation": (test + validation) * EVAL_SAMPLE_S,
        "datasets": (len(design.seeds) + len(design.tuning_seeds)) * records * DATASET_RECORD_S,
        "tuning runs": len(tuning_runs(design)) * (per_run + validation * EVAL_SAMPLE_S),
        "study runs": len(design.seeds) * len(study_runs(design)) * (per_run + (test + validation) * EVAL_SAMPLE_S),
    }


def plan_text(design: Design) -> str:
    records = design.train_prompts * design.k
    runs = study_runs(design)
    seconds = estimate(design)
    lines = [
        "Pre-registered design (docs/miniature.md)" if not deviations(design)
        else f"NOT the pre-registered design; differs in: {', '.join(deviations(design))}",
        f"splits (task seed {design.task_seed}): pretrain {design.pretrain_problems}, train {design.train_prompts}, "
        f"validation {design.validation_prompts}, test {design.test_prompts}",
        f"mu: SFT from scratch, lr {design.pretrain_lr:g}, {design.pretrain_epochs} epochs, a checkpoint every "
        f"{design.pretrain_save_interval} iterations probed on {design.probe_prompts} train prompts x {PROBE_SAMPLES}; "
        f"the first with train pass@1 >= {design.mu_target} (else the last)",
        f"offline datasets: {design.train_prompts} prompts x k={design.k} = {records} records each, one per seed: "
        f"tuning {list(design.tuning_seeds)}, study {list(design.seeds)}",
        f"runs: {design.epochs} epoch(s) each, about {records * design.epochs / RECORDS_PER_ITERATION:.0f} iterations",
        f"lr selection: sft_positive x lr {list(design.lr_grid)} x warm-up {list(design.warmup_grid)} x tuning seeds "
        f"= {len(tuning_runs(design))} runs; final validation pass@1 ({design.validation_prompts} x "
        f"{design.eval_samples}), mean over tuning seeds; ties within {TIE_TOLERANCE} -> smallest lr, then warm-up",
        f"study runs per seed ({len(runs)}): {', '.join(label for _, label in runs)}",
        f"study runs in all: {len(design.seeds) * len(runs)}; each evaluated at its end on test "
        f"({design.test_prompts} x {design.eval_samples}) and validation",
        f"trainings {design.jobs} at a time",
        "estimated wall time on 2 idle cores (upper bound):",
        *[f"  {stage}: {s:,.0f} s" for stage, s in seconds.items()],
        f"  total: {sum(seconds.values()):,.0f} s = {sum(seconds.values()) / 3600:.2f} h",
    ]
    return "\n".join(lines) + "\n"


def select_settings(validation: dict[tuple[float, int], list[float]]) -> tuple[float, int]:
    """(lr, warm-up) with the best mean validation pass@1; those within TIE_TOLERANCE of the best are
    tied, and among them the smallest lr wins, then the longer warm-up."""
    means = {config: statistics.fmean(values) for config, values in validation.items()}
    best = max(means.values())
    tied = [config for config, mean in means.items() if mean >= best - TIE_TOLERANCE]
    return min(tied, key=lambda config: (config[0], -config[1]))


def _commit() -> str | None:
    """HEAD, with "+uncommitted changes" when tracked files differ from it (None outside git)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return None
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], capture_output=True).returncode != 0
    return head.stdout.strip() + (" +uncommitted changes" if dirty else "")


def resumable_results(out: Path, design: Design) -> dict:
    """The results.json of an interrupted study in `out`, checked to be of this design."""
    path = out / "results.json"
    if not path.is_file():
        raise SystemExit(f"--resume: {path} does not exist; start the study without --resume")
    results = json.loads(path.read_text())
    registered = json.loads(json.dumps(dataclasses.asdict(design)))  # tuples -> lists, as stored
    differing = sorted(k for k in registered.keys() | results["design"].keys()
                       if registered.get(k) != results["design"].get(k))
    if differing:
        raise SystemExit(f"--resume: {path} is a study with other options ({', '.join(differing)}); "
                         "resume it with the options it started with")
    if "mu" in results and not Path(results["mu"]["path"]).is_dir():
        raise SystemExit(f"--resume: mu {results['mu']['path']} recorded in {path} is missing")
    return results


def run_study(design: Design, out: Path, docs: Path | None, resume: bool = False) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from nemo_topr.miniature import pipeline, study_report
    from nemo_topr.miniature.task import make_splits
    from nemo_topr.objective import baseline_for_share

    started = time.time()
    if resume:
        results = resumable_results(out, design)
        # The clock continues from the last save: time between the processes is not counted, nor a
        # killed process's unsaved work (it is redone here and counted again).
        started -= results.get("wall_time_s", 0.0)
        results.setdefault("resumed", []).append({"after_s": results.get("wall_time_s", 0.0), "commit": _commit(),
                                                  "runs_kept": len(results["runs"])})
        pipeline.log(f"resuming {out}: mu {'kept' if 'mu' in results else 'to train'}, "
                     f"{len(results['datasets'])} datasets and {len(results['runs'])} runs kept")
    else:
        shutil.rmtree(out, ignore_errors=True)
        (out / "data").mkdir(parents=True)
        results = {"design": dataclasses.asdict(design), "deviations": deviations(design), "commit": _commit(),
                   "estimate_s": estimate(design), "stage_seconds": {}, "datasets": {}, "runs": {}}

    save, stage_done = pipeline.results_file(out / "results.json", results, started)

    def evaluate(model: Path, split: str) -> dict:
        return pipeline.evaluate(model, splits[split], split, design.eval_samples, 0, design.max_new_tokens)["metrics"]

    def train_all(jobs: list[dict], splits_to_evaluate: tuple[str, ...]) -> None:
        """Train jobs `design.jobs` at a time (subprocesses); evaluate each final checkpoint here, in order."""
        def train(job: dict) -> tuple[Path, dict[int, Path]]:
            return pipeline.train_variant(job["name"], mu, scored[job["seed"]], job["overrides"], out,
                                          epochs=design.epochs, lr=job["lr"], warmup=job["warmup"],
                                          save_interval=FINAL_ONLY, seed=job["seed"], jobs=design.jobs)

        jobs = [job for job in jobs if job["name"] not in results["runs"]]  # kept by --resume
        with ThreadPoolExecutor(max(1, design.jobs)) as pool:
            for job, future in [(job, pool.submit(train, job)) for job in jobs]:
                run_dir, checkpoints = future.result()
                final = max(checkpoints)
                run = {k: v for k, v in job.items() if k != "overrides"}
                run.update({"iterations": final, "telemetry": pipeline.telemetry(run_dir),
                            **{split: evaluate(checkpoints[final], split) for split in splits_to_evaluate}})
                shutil.rmtree(run_dir / "checkpoints")
                results["runs"][job["name"]] = run
                pipeline.log(f"{job['name']}: " + ", ".join(f"{split} pass@1 {run[split]['pass@1']:.3f}"
                                                             for split in splits_to_evaluate))
                save()

    # 1-2. task, model, mu
    sizes = {"pretrain": design.pretrain_problems, "train": design.train_prompts,
             "validation": design.validation_prompts, "test": design.test_prompts}
    if "mu" in results:  # resumed: the splits are a function of the task seed; mu is on disk
        splits, mu = make_splits(sizes, seed=design.task_seed), Path(results["mu"]["path"])
    else:
        splits, model = pipeline.build_task_and_model(out, sizes, design.task_seed, design.vocab_size,
                                                      design.hidden_size)
        mu, results["pretrain"], results["mu_target_met"] = pipeline.pretrain_mu(
            out, splits, model, lr=design.pretrain_lr, epochs=design.pretrain_epochs,
            save_interval=design.pretrain_save_interval, target=design.mu_target,
            probe_prompts=design.probe_prompts, max_new_tokens=design.max_new_tokens)
        results["mu"] = {"path": str(mu), "test": evaluate(mu, "test"), "validation": evaluate(mu, "validation")}
        stage_done("pretraining")

    # 3. one offline dataset per seed, saved as it is made
    scored = {}
    for seed in (*design.tuning_seeds, *design.seeds):
        directory = out / "data" / f"seed{seed}"
        if str(seed) in results["datasets"] and (directory / "scored.jsonl").is_file():
            scored[seed] = directory / "scored.jsonl"
            continue
        scored[seed], results["datasets"][str(seed)] = pipeline.offline_dataset(
            mu, splits["train"], design.k, seed, directory, design.max_new_tokens)
        save()
    stage_done("datasets")

    # 4. lr / warm-up selection with positives-only on validation. From here on this process only
    #    evaluates, beside `design.jobs` training subprocesses: one thread (oversubscribed OpenMP
    #    threads slowed the miniature's evaluation ~8x on 2 cores)
    torch.set_num_threads(1)
    train_all([{"name": f"tune_lr{lr:g}_wu{warmup}_s{seed}", "stage": "tuning", "key": "sft_positive", "seed": seed,
                "lr": lr, "warmup": warmup, "overrides": pipeline.variant_overrides("sft_positive")}
               for lr, warmup, seed in tuning_runs(design)], ("validation",))
    validation: dict[tuple[float, int], list[float]] = {}
    for run in results["runs"].values():
        validation.setdefault((run["lr"], run["warmup"]), []).append(run["validation"]["pass@1"])
    lr, warmup = select_settings(validation)
    results["selected"] = {"lr": lr, "warmup": warmup}
    pipeline.log(f"selected lr {lr:g}, warm-up {warmup} iterations")
    stage_done("tuning")

    # 5. the variants and the p~ grid on every study seed, with the selected settings
    jobs, skipped = [], []
    for seed in design.seeds:
        p = results["datasets"][str(seed)]["positive_share"]
        for key, label in study_runs(design):
            overrides = pipeline.variant_overrides(key) if key in VARIANTS else None
            if overrides is None:
                target = float(key.removeprefix("topr_ptilde"))
                if not 0.0 < p < 1.0:  # no baseline changes the share of a one-sided dataset
                    skipped.append(f"{key} on seed {seed}: positive share p = {p}")
                    continue
                c = baseline_for_share(p, target)
                overrides, label = ["objective.variant=topr", f"objective.baseline={c}"], f"{label} (c={c:+.3f})"
            jobs.append({"name": f"{key}_s{seed}", "stage": "study", "key": key, "label": label, "seed": seed,
                         "lr": lr, "warmup": warmup, "overrides": overrides})
    if skipped:
        results["skipped"] = skipped
    train_all(jobs, ("test", "validation"))
    stage_done("study")

    text = study_report.write_report(out, results, docs)
    print(text)
    pipeline.log(f"done in {time.time() - started:.0f} s -> {out / 'results.md'}")
    return results


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m nemo_topr.miniature.study", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/miniature_study", help="results directory (recreated)")
    parser.add_argument("--docs", default="docs/miniature/study", help="copy the report and plots here ('' to skip)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the time estimate; train nothing")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted study in --out (same options): keep mu, datasets, finished runs")
    for field in dataclasses.fields(Design):
        default = getattr(PREREGISTERED, field.name)
        flag = "--" + field.name.replace("_", "-")
        if isinstance(default, tuple):
            parser.add_argument(flag, type=type(default[0]), nargs="+", default=list(default),
                                help=f"pre-registered: {' '.join(map(str, default))}")
        else:
            parser.add_argument(flag, type=type(default), default=default, help=f"pre-registered: {default}")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = vars(_parser().parse_args(argv))
    out, docs, dry_run, resume = Path(args.pop("out")).resolve(), args.pop("docs"), args.pop("dry_run"), args.pop("resume")
    design = Design(**{k: tuple(v) if isinstance(v, list) else v for k, v in args.items()})
    unknown = sorted(set(design.variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown --variants {unknown}; known: {list(VARIANTS)}")
    print(plan_text(design), flush=True)
    if not dry_run:
        run_study(design, out, Path(docs) if docs else None, resume=resume)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
