"""Study 3 (issue 96; docs/miniature/study3_preregistration.md): are the negatives informative?
`python -m nemo_topr.miniature.study --design study3` (`make miniature-study3`); `--dry-run` prints
the plan and its time estimate, `--resume` continues an interrupted study (study_run.py).

1. task, tokenizer and model as studies 1-2; one pretraining run probed until train pass@1 >= 0.2:
   mu is the first such checkpoint (none: nothing else runs, the report says so); mu evaluated once;
2. one offline dataset per study seed, then each one's placebo (study3_placebo.py), re-scored;
3. seed by seed, lr by lr, the five arms (positives-only under sequence_mean and token_sum, TOPR
   c = 0, TOPR p~ = 0.8 on the real and on the placebo data); final checkpoints evaluated on test
   and validation, every evaluation's per-problem outcomes saved (outcomes.json.gz). A training
   that fails stops the study; one that fails again after --resume is scored as degenerated;
4. study3_report.py: the lr selected per arm on validation, the manipulation check, H8-H10 by the
   registered rules (sign test over seeds, bootstrap over problems), the checks and the figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nemo_topr.miniature import study3_report
from nemo_topr.miniature.study3_report import PLACEBO, POSITIVES, POSITIVES_TS, REAL, TOPR
from nemo_topr.miniature.study_run import SharedDesign, StudyRun, deviations

# Unit costs from study 2's committed timings at mu 0.2, as the pre-registration's "Time budget" rounds them:
PRETRAINING_S = 197.0       # pretraining, probes and mu's evaluation (an upper figure)
DATASET_S = 42.8            # a dataset at mu 0.2 (257 s for six): sampled, graded, scored
PLACEBO_S = DATASET_S       # a placebo: regraded and scored, charged a whole dataset
RUN_S = 32.4                # a run at mu 0.2 (1,168 s for 36), two at a time, evaluation included
ANALYSIS_S = 60.0           # the bootstraps, the report and the figure
MARGIN = 1.3                # the budget: central estimate x 1.3


@dataclass(frozen=True)
class Study3Design(SharedDesign):
    """Study 3's pre-registered design (docs/miniature/study3_preregistration.md)."""

    seeds: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 9)
    mu_target: float = 0.2
    lr_grid: tuple[float, ...] = (5e-5, 1e-4, 2e-4)
    warmup: int = 0
    p_tilde: float = 0.8


def arms(design: Study3Design) -> list[tuple[str, str]]:
    """(key, label) of the five arms in the registration's table order."""
    t = f"{design.p_tilde:g}"
    return [(POSITIVES, "sft_positive"), (POSITIVES_TS, "sft_positive token_sum"), (TOPR, "topr"),
            (REAL + t, f"topr p~={t}"), (PLACEBO + t, f"placebo p~={t}")]


def run_name(key: str, lr: float, seed: int) -> str:
    return f"{key}_lr{lr:g}_s{seed}"


def plan(design: Study3Design) -> list[tuple[int, float, str]]:
    """(seed, lr, arm key) of every run in the registered order: seed by seed, lr by lr, arms in order."""
    return [(seed, lr, key) for seed in design.seeds for lr in design.lr_grid for key, _ in arms(design)]


def estimate(design: Study3Design) -> dict[str, float]:
    """Central seconds per stage on 2 idle cores (the pre-registration's table)."""
    return {"pretraining": PRETRAINING_S, "datasets": len(design.seeds) * DATASET_S,
            "placebo datasets": len(design.seeds) * PLACEBO_S, "runs": len(plan(design)) * RUN_S,
            "analysis": ANALYSIS_S}


def plan_text(design: Study3Design) -> str:
    records = design.train_prompts * design.k
    seconds = estimate(design)
    central = sum(seconds.values())
    seeds, lrs, labels = len(design.seeds), len(design.lr_grid), [label for _, label in arms(design)]
    units = {"pretraining": "study 2's stage", "datasets": f"{seeds} x {DATASET_S:.1f} s",
             "placebo datasets": f"{seeds} x {PLACEBO_S:.1f} s", "runs": f"{len(plan(design))} x {RUN_S:.1f} s",
             "analysis": "report, bootstraps and figure"}
    lines = [
        "Pre-registered design of study 3 (docs/miniature/study3_preregistration.md)" if not deviations(design)
        else f"NOT the pre-registered design of study 3; differs in: {', '.join(deviations(design))}",
        f"splits (task seed {design.task_seed}): pretrain {design.pretrain_problems}, train {design.train_prompts}, "
        f"validation {design.validation_prompts}, test {design.test_prompts}",
        f"mu: SFT from scratch, lr {design.pretrain_lr:g}, {design.pretrain_epochs} epochs, a checkpoint every "
        f"{design.pretrain_save_interval} iterations probed on {design.probe_prompts} train prompts x 8; the first "
        f"with train pass@1 >= {design.mu_target} (none: the study stops)",
        f"offline datasets: {design.train_prompts} prompts x k={design.k} = {records} records each, one per seed "
        f"{list(design.seeds)}; then each seed's placebo (negatives moved to other prompts, repaired, re-scored)",
        f"arms ({len(labels)}): {', '.join(labels)}",
        f"lr grid {list(design.lr_grid)}, constant, warm-up {design.warmup}, {design.epochs} epoch(s); selected per arm: "
        f"the best mean validation pass@1 over the seeds (exact ties: the smaller lr)",
        f"runs: {len(labels)} arms x {lrs} lrs x {seeds} seeds = {len(plan(design))}, seed by seed, lr by lr; each "
        f"evaluated at its end on test ({design.test_prompts} x {design.eval_samples}) and validation "
        f"({design.validation_prompts} x {design.eval_samples}), per-problem outcomes saved",
        f"trainings {design.jobs} at a time",
        "estimated wall time on 2 idle cores (unit costs from study 2's committed timings at mu 0.2):",
        *[f"  {stage}: {units[stage]} = {s:,.0f} s" for stage, s in seconds.items()],
        f"  total: {central:,.0f} s = {central / 3600:.2f} h; budget (x {MARGIN}): {central * MARGIN:,.0f} s "
        f"= {central * MARGIN / 3600:.2f} h",
    ]
    return "\n".join(lines) + "\n"


def _mu_stage(study: StudyRun, design: Study3Design) -> Path | None:
    """Pretraining and mu (kept by a resumed study); None when no checkpoint reached the target."""
    from nemo_topr.miniature import pipeline

    results, out = study.results, study.out
    if "pretrain" in results:
        study.resume_task()
    else:
        model = study.build_task()
        mus, probes, _ = pipeline.pretrain_mus(
            out, study.splits, model, lr=design.pretrain_lr, epochs=design.pretrain_epochs,
            save_interval=design.pretrain_save_interval, targets=(design.mu_target,),
            probe_prompts=design.probe_prompts, max_new_tokens=design.max_new_tokens)
        for probe in probes:
            study.record_outcomes(f"probe_iter{probe['iteration']}", "train", probe.pop("per_problem"))
        results["pretrain"], results["mu_target_met"] = probes, design.mu_target in mus
        if results["mu_target_met"]:
            mu = mus[design.mu_target]
            probe = next(p for p in probes if p["pass@1"] >= design.mu_target)
            results["mu"] = {"path": str(mu), "iteration": probe["iteration"], "probe_pass@1": probe["pass@1"],
                             "test": study.evaluate(mu, "test", "mu"),
                             "validation": study.evaluate(mu, "validation", "mu")}
            pipeline.log(f"mu: iteration {probe['iteration']}, train pass@1 {probe['pass@1']:.3f}, test pass@1 "
                         f"{results['mu']['test']['pass@1']:.3f}")
        else:
            pipeline.log(f"no pretraining checkpoint reached train pass@1 {design.mu_target}: the study stops")
        study.stage_done("pretraining")
    return Path(results["mu"]["path"]) if results["mu_target_met"] else None


def run_study3(design: Study3Design, out: Path, docs: Path | None, resume: bool = False) -> dict:
    import torch

    from nemo_topr.miniature import pipeline, study3_placebo
    from nemo_topr.objective import baseline_for_share

    study = StudyRun(design, out, estimate(design), resume, per_problem=True)
    results = study.results
    mu = _mu_stage(study, design)
    if mu is None:
        return study.finish(study3_report.write_report, docs)

    # 2. the real datasets, then the placebos (each saved as it is made)
    real = {seed: study.dataset(str(seed), mu, seed, out / "data" / f"seed{seed}") for seed in design.seeds}
    study.stage_done("datasets")
    placebos, skipped = results.setdefault("placebos", {}), []
    scored = {(REAL, seed): path for seed, path in real.items()}
    for seed in design.seeds:
        p, directory = results["datasets"][str(seed)]["positive_share"], out / "data" / f"seed{seed}_placebo"
        if not 0.0 < p < 1.0:  # no baseline changes the share of a one-sided dataset: no p~ arm to feed
            skipped.append(f"the p~ arms on seed {seed}: positive share p = {p}")
        elif str(seed) in placebos and (directory / "scored.jsonl").is_file():
            scored[PLACEBO, seed] = directory / "scored.jsonl"
        else:
            scored[PLACEBO, seed], placebos[str(seed)] = study3_placebo.placebo_dataset(
                real[seed], mu, seed, design.k, directory)
            study.save()
    if "dataset_checks" not in results:
        results["dataset_checks"] = study3_placebo.dataset_checks(
            {seed: (real[seed], scored[PLACEBO, seed]) for seed in design.seeds if (PLACEBO, seed) in scored}, mu)
    study.stage_done("placebo datasets")

    # 3. the runs, seed by seed, lr by lr, arm by arm. This process only evaluates beside the training
    #    subprocesses: one thread (as studies 1-2)
    torch.set_num_threads(1)
    labels, jobs = dict(arms(design)), []
    for seed, lr, key in plan(design):
        p = results["datasets"][str(seed)]["positive_share"]
        label = labels[key]
        if key in (POSITIVES, TOPR):
            overrides, data = pipeline.variant_overrides(key), scored[REAL, seed]
        elif key == POSITIVES_TS:
            overrides, data = [*pipeline.variant_overrides(POSITIVES), "objective.normalization=token_sum"], scored[REAL, seed]
        elif not 0.0 < p < 1.0:
            continue  # listed in `skipped`
        else:
            c = baseline_for_share(p, design.p_tilde)
            overrides, label = ["objective.variant=topr", f"objective.baseline={c}"], f"{label} (c={c:+.3f})"
            data = scored[PLACEBO if key.startswith(PLACEBO) else REAL, seed]
        jobs.append({"name": run_name(key, lr, seed), "stage": "study", "key": key, "label": label, "seed": seed,
                     "lr": lr, "warmup": design.warmup, "mu": mu, "data": data, "overrides": overrides})
    if skipped:
        results["skipped"] = skipped
    study.train_all(jobs, ("test", "validation"), second_failure_scored=True)
    study.stage_done("runs")
    return study.finish(study3_report.write_report, docs)
