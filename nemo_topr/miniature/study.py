"""`python -m nemo_topr.miniature.study` (`make miniature-study`): the pre-registered miniature study
of issue 19 (docs/miniature.md, "Pre-registered study (issue 19)"). `--dry-run` prints the plan
(runs, sizes, estimated time) without training anything. `--design study2` (`make miniature-study2`)
runs study 2 instead (study2.py, docs/miniature/study2_preregistration.md), `--design study3`
(`make miniature-study3`) study 3 (study3.py, docs/miniature/study3_preregistration.md); what the
drivers share is in study_run.py.

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
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from nemo_topr.errors import UserError, run_refusing
from nemo_topr.utils.arguments import Parser
from nemo_topr.miniature import study2, study3
from nemo_topr.miniature.pipeline import VARIANTS
from nemo_topr.miniature.study_run import SharedDesign, StudyRun, deviations

TIE_TOLERANCE = 0.005  # validation pass@1 within this of the best counts as tied (lr selection)

# Unit costs for the time estimate, from the timings recorded in docs/miniature.md (2 idle cores):
ITERATION_S = 0.29          # pretraining log: 448 iterations in 128 s
RUN_OVERHEAD_S = 28.0       # a variant run's 41 s slot minus its 46 x 0.29 s of iterations ...
EVAL_SAMPLE_S = 28.0 / 4800  # ... charged again per evaluated sample (3 x 1,600): an upper bound
DATASET_RECORD_S = 29.0 / 1024  # dataset stage: 1,024 records sampled, scored, mu evaluated
RECORDS_PER_ITERATION = 1024 * 3 / 46  # today's packing: 16 rows of 256 tokens per step
PROBE_SAMPLES = 8


@dataclass(frozen=True)
class Design(SharedDesign):
    """Study 1's pre-registered design (docs/miniature.md)."""

    mu_target: float = 0.60
    tuning_seeds: tuple[int, ...] = (101, 102)
    lr_grid: tuple[float, ...] = (3e-5, 1e-4, 3e-4, 1e-3)
    warmup_grid: tuple[int, ...] = (0, 12)
    variants: tuple[str, ...] = VARIANTS
    p_tilde: tuple[float, ...] = (0.05, 0.1, 0.2, 0.5, 0.8, 0.95)


PREREGISTERED = Design()



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


def run_study(design: Design, out: Path, docs: Path | None, resume: bool = False) -> dict:
    import torch

    from nemo_topr.miniature import pipeline, study_report
    from nemo_topr.objective import baseline_for_share

    study = StudyRun(design, out, estimate(design), resume)
    results = study.results

    # 1-2. task, model, mu
    if "mu" in results:
        study.resume_task()
        mu = Path(results["mu"]["path"])
    else:
        model = study.build_task()
        mu, results["pretrain"], results["mu_target_met"] = pipeline.pretrain_mu(
            out, study.splits, model, lr=design.pretrain_lr, epochs=design.pretrain_epochs,
            save_interval=design.pretrain_save_interval, target=design.mu_target,
            probe_prompts=design.probe_prompts, max_new_tokens=design.max_new_tokens)
        results["mu"] = {"path": str(mu), "test": study.evaluate(mu, "test"),
                         "validation": study.evaluate(mu, "validation")}
        study.stage_done("pretraining")

    # 3. one offline dataset per seed, saved as it is made
    scored = {seed: study.dataset(str(seed), mu, seed, out / "data" / f"seed{seed}")
              for seed in (*design.tuning_seeds, *design.seeds)}
    study.stage_done("datasets")

    # 4. lr / warm-up selection with positives-only on validation. From here on this process only
    #    evaluates, beside `design.jobs` training subprocesses: one thread (oversubscribed OpenMP
    #    threads slowed the miniature's evaluation ~8x on 2 cores)
    torch.set_num_threads(1)
    study.train_all([{"name": f"tune_lr{lr:g}_wu{warmup}_s{seed}", "stage": "tuning", "key": "sft_positive",
                      "seed": seed, "lr": lr, "warmup": warmup, "mu": mu, "data": scored[seed],
                      "overrides": pipeline.variant_overrides("sft_positive")}
                     for lr, warmup, seed in tuning_runs(design)], ("validation",))
    validation: dict[tuple[float, int], list[float]] = {}
    for run in results["runs"].values():
        validation.setdefault((run["lr"], run["warmup"]), []).append(run["validation"]["pass@1"])
    lr, warmup = select_settings(validation)
    results["selected"] = {"lr": lr, "warmup": warmup}
    pipeline.log(f"selected lr {lr:g}, warm-up {warmup} iterations")
    study.stage_done("tuning")

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
                         "lr": lr, "warmup": warmup, "mu": mu, "data": scored[seed], "overrides": overrides})
    if skipped:
        results["skipped"] = skipped
    study.train_all(jobs, ("test", "validation"))
    study.stage_done("study")
    return study.finish(study_report.write_report, docs)


def _parser(design_class: type) -> argparse.ArgumentParser:
    """The command line of one design: its fields as options, defaulting to its pre-registration."""
    parser = Parser(prog="python -m nemo_topr.miniature.study", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--design", choices=DESIGNS, default="study1",
                        help="which pre-registered study: study1 (issue 19), study2 (issue 32) or study3 (issue 96)")
    parser.add_argument("--out", help="results directory (default results/miniature_study[2|3]; emptied first if an "
                        "earlier study made it, another non-empty one is refused)")
    parser.add_argument("--docs", help="copy the report and plots here ('' to skip; default docs/miniature/study[2|3])")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the time estimate; train nothing")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted study in --out (same options): keep mu, datasets, finished runs")
    registered = design_class()
    for field in dataclasses.fields(design_class):
        default = getattr(registered, field.name)
        flag = "--" + field.name.replace("_", "-")
        if isinstance(default, tuple):
            parser.add_argument(flag, type=type(default[0]), nargs="+", default=list(default),
                                help=f"pre-registered: {' '.join(map(str, default))}")
        else:
            parser.add_argument(flag, type=type(default), default=default, help=f"pre-registered: {default}")
    return parser


# --design: (design class, plan text, driver, default --out, default --docs)
DESIGNS = {
    "study1": (Design, plan_text, run_study, "results/miniature_study", "docs/miniature/study"),
    "study2": (study2.Study2Design, study2.plan_text, study2.run_study2, "results/miniature_study2",
               "docs/miniature/study2"),
    "study3": (study3.Study3Design, study3.plan_text, study3.run_study3, "results/miniature_study3",
               "docs/miniature/study3"),
}


def main(argv: list[str] | None = None) -> int:
    chooser = argparse.ArgumentParser(add_help=False)  # the design decides the other options' defaults
    chooser.add_argument("--design", choices=DESIGNS, default="study1")
    design_class, plan, run, out_default, docs_default = DESIGNS[chooser.parse_known_args(argv)[0].design]
    args = vars(_parser(design_class).parse_args(argv))
    args.pop("design")
    out = Path(args.pop("out") or out_default).resolve()
    docs = args.pop("docs")
    docs = docs_default if docs is None else docs
    dry_run, resume = args.pop("dry_run"), args.pop("resume")
    design = design_class(**{k: tuple(v) if isinstance(v, list) else v for k, v in args.items()})
    unknown = sorted({*getattr(design, "variants", ()), *getattr(design, "token_sum_variants", ())} - set(VARIANTS))
    if unknown:
        raise UserError(f"unknown --variants {unknown}; known: {list(VARIANTS)}", key="--variants.unknown",
                        where="--variants")
    print(plan(design), flush=True)
    if not dry_run:
        run(design, out, Path(docs) if docs else None, resume=resume)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_refusing("python -m nemo_topr.miniature.study", main, sys.argv[1:]))
