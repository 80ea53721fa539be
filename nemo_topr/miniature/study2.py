"""Study 2 (issue 32; docs/miniature/study2_preregistration.md): when do negatives help?
`python -m nemo_topr.miniature.study --design study2` (`make miniature-study2`); `--dry-run` prints
the plan and its time estimate, `--resume` continues an interrupted study (study.py's `StudyRun`).

1. task, tokenizer and model as study 1; one pretraining run probed until every target is met;
   mu at each strength = the first checkpoint with train pass@1 >= its target (an unreached target,
   or one whose checkpoint a lower target already took, drops that strength); each mu evaluated once;
2. one offline dataset per strength and seed;
3. at each strength and seed, from that mu with study 1's selected lr: the variants (positives-only,
   TOPR c = 0), TOPR at each curated p~, and the token_sum variants; final checkpoints evaluated on
   test and validation. A training that fails stops the study; one that fails again after --resume
   is recorded as failed and scored as degenerated;
4. study2_report.py: per-strength manipulation checks, the registered outcomes and H4-H7, the figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nemo_topr.miniature.study_run import SharedDesign, StudyRun, deviations

# Unit costs from study 1's committed results (docs/miniature/study/results.json, "stage_seconds"),
# at the registered sizes on 2 idle cores:
PRETRAINING_S = 220.2       # 900 iterations, exports, probes to 0.6, one mu evaluation
MU_EVALUATION_S = 10.0      # each further mu: test 500 x 8 + validation 200 x 8 (study 1: about 8 s)
DATASET_S = 382.0 / 8       # 8,192 records sampled, graded and scored
RUN_S = 2853.5 / 72         # one run's share of wall time, two at a time, evaluation included
MARGIN = 1.3                # the budget: central estimate x 1.3


@dataclass(frozen=True)
class Study2Design(SharedDesign):
    """Study 2's pre-registered design (docs/miniature/study2_preregistration.md)."""

    mu_targets: tuple[float, ...] = (0.2, 0.4, 0.6)
    lr: float = 1e-4  # study 1's selection, fixed for every strength
    warmup: int = 0
    variants: tuple[str, ...] = ("sft_positive", "topr")
    p_tilde: tuple[float, ...] = (0.1, 0.8)
    token_sum_variants: tuple[str, ...] = ("sft_positive", "topr")


TOKEN_SUM = "_token_sum"


def configurations(design: Study2Design) -> list[tuple[str, str]]:
    """(key, label) of the runs at each strength and seed, in the pre-registration's order."""
    return ([(v, v) for v in design.variants] + [(f"topr_ptilde{t:g}", f"topr p~={t:g}") for t in design.p_tilde]
            + [(v + TOKEN_SUM, f"{v} token_sum") for v in design.token_sum_variants])


def strength_name(target: float) -> str:
    return f"{target:g}"


def estimate(design: Study2Design) -> dict[str, float]:
    """Central seconds per stage on 2 idle cores at the registered sizes (the pre-registration's table)."""
    strengths = len(design.mu_targets)
    return {"pretraining": PRETRAINING_S, "mu evaluations": MU_EVALUATION_S * max(0, strengths - 1),
            "datasets": strengths * len(design.seeds) * DATASET_S,
            "study runs": strengths * len(design.seeds) * len(configurations(design)) * RUN_S}


def plan_text(design: Study2Design) -> str:
    records = design.train_prompts * design.k
    runs = configurations(design)
    seconds = estimate(design)
    central = sum(seconds.values())
    strengths, seeds = len(design.mu_targets), len(design.seeds)
    lines = [
        "Pre-registered design of study 2 (docs/miniature/study2_preregistration.md)" if not deviations(design)
        else f"NOT the pre-registered design of study 2; differs in: {', '.join(deviations(design))}",
        f"splits (task seed {design.task_seed}): pretrain {design.pretrain_problems}, train {design.train_prompts}, "
        f"validation {design.validation_prompts}, test {design.test_prompts}",
        f"mu: SFT from scratch, lr {design.pretrain_lr:g}, {design.pretrain_epochs} epochs, a checkpoint every "
        f"{design.pretrain_save_interval} iterations probed on {design.probe_prompts} train prompts x 8; at each target "
        f"{list(design.mu_targets)} the first checkpoint with train pass@1 >= target (unreached or duplicate: dropped)",
        f"offline datasets: {design.train_prompts} prompts x k={design.k} = {records} records each, one per strength "
        f"and seed: {strengths} x {seeds} = {strengths * seeds}",
        f"runs: {design.epochs} epoch(s) each at lr {design.lr:g}, warm-up {design.warmup}",
        f"runs per strength and seed ({len(runs)}): {', '.join(label for _, label in runs)}",
        f"runs in all: {strengths * seeds * len(runs)}; each evaluated at its end on test "
        f"({design.test_prompts} x {design.eval_samples}) and validation ({design.validation_prompts} x "
        f"{design.eval_samples})",
        f"trainings {design.jobs} at a time",
        "estimated wall time on 2 idle cores (unit costs measured in study 1, at the registered sizes):",
        *[f"  {stage}: {s:,.0f} s" for stage, s in seconds.items()],
        f"  total: {central:,.0f} s = {central / 3600:.2f} h; budget (x {MARGIN}): {central * MARGIN:,.0f} s "
        f"= {central * MARGIN / 3600:.2f} h",
    ]
    return "\n".join(lines) + "\n"


def choose_strengths(targets: tuple[float, ...], mus: dict[float, Path]) -> tuple[list[float], dict[str, str]]:
    """The registered rule: a target no checkpoint reached is dropped, and so is a target whose mu a
    lower target already took (the same model). Returns (kept targets in order, {dropped: reason})."""
    kept, dropped = [], {}
    for target in sorted(targets):
        if target not in mus:
            dropped[strength_name(target)] = "no checkpoint reached it"
        elif any(mus[lower] == mus[target] for lower in kept):
            dropped[strength_name(target)] = f"its checkpoint ({mus[target].name}) is a lower target's mu"
        else:
            kept.append(target)
    return kept, dropped


def run_study2(design: Study2Design, out: Path, docs: Path | None, resume: bool = False) -> dict:
    import torch

    from nemo_topr.miniature import pipeline, study2_report
    from nemo_topr.objective import baseline_for_share

    study = StudyRun(design, out, estimate(design), resume)
    results = study.results

    # 1. task, model, the mus
    if "mus" in results:
        study.resume_task()
    else:
        model = study.build_task()
        mus, results["pretrain"], _ = pipeline.pretrain_mus(
            out, study.splits, model, lr=design.pretrain_lr, epochs=design.pretrain_epochs,
            save_interval=design.pretrain_save_interval, targets=design.mu_targets,
            probe_prompts=design.probe_prompts, max_new_tokens=design.max_new_tokens)
        kept, results["dropped"] = choose_strengths(design.mu_targets, mus)
        results["mus"] = {}
        for target in kept:
            probe = next(p for p in results["pretrain"] if p["pass@1"] >= target)
            results["mus"][strength_name(target)] = {
                "path": str(mus[target]), "target": target, "iteration": probe["iteration"],
                "probe_pass@1": probe["pass@1"], "test": study.evaluate(mus[target], "test"),
                "validation": study.evaluate(mus[target], "validation")}
            pipeline.log(f"mu at strength {target:g}: iteration {probe['iteration']}, train pass@1 "
                         f"{probe['pass@1']:.3f}, test pass@1 {results['mus'][strength_name(target)]['test']['pass@1']:.3f}")
        for name, reason in results["dropped"].items():
            pipeline.log(f"strength {name} dropped: {reason}")
        study.stage_done("pretraining")
    mus = {name: Path(mu["path"]) for name, mu in results["mus"].items()}

    # 2. one offline dataset per strength and seed, saved as it is made
    scored = {(name, seed): study.dataset(f"{name}/{seed}", mu, seed, out / "data" / f"mu{name}" / f"seed{seed}")
              for name, mu in mus.items() for seed in design.seeds}
    study.stage_done("datasets")

    # 3. the configurations, seed by seed, strength by strength. This process only evaluates beside
    #    the training subprocesses: one thread (as study 1)
    torch.set_num_threads(1)
    jobs, skipped = [], []
    for seed in design.seeds:
        for name, mu in mus.items():
            p = results["datasets"][f"{name}/{seed}"]["positive_share"]
            for key, label in configurations(design):
                if key.startswith("topr_ptilde"):
                    if not 0.0 < p < 1.0:  # no baseline changes the share of a one-sided dataset
                        skipped.append(f"{key} at strength {name} on seed {seed}: positive share p = {p}")
                        continue
                    c = baseline_for_share(p, float(key.removeprefix("topr_ptilde")))
                    overrides, label = ["objective.variant=topr", f"objective.baseline={c}"], f"{label} (c={c:+.3f})"
                elif key.endswith(TOKEN_SUM):
                    overrides = [*pipeline.variant_overrides(key.removesuffix(TOKEN_SUM)),
                                 "objective.normalization=token_sum"]
                else:
                    overrides = pipeline.variant_overrides(key)
                jobs.append({"name": f"{key}_mu{name}_s{seed}", "stage": "study", "key": key, "label": label,
                             "strength": name, "seed": seed, "lr": design.lr, "warmup": design.warmup,
                             "mu": mu, "data": scored[name, seed], "overrides": overrides})
    if skipped:
        results["skipped"] = skipped
    study.train_all(jobs, ("test", "validation"), second_failure_scored=True)
    study.stage_done("study")
    return study.finish(study2_report.write_report, docs)
