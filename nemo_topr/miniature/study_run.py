"""What the pre-registered miniature studies' drivers share (study.py, study2.py, study3.py): the
options every design has, results.json new or resumed (`--resume`), the task's splits, offline
datasets and trainings two at a time with each final checkpoint evaluated in this process."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from nemo_topr.errors import UserError
from nemo_topr.utils.outputs import fresh_output_dir

OUTCOMES = "outcomes.json.gz"  # per-problem outcomes of every evaluation (study 3)
FINAL_ONLY = 100_000   # checkpoint.save_interval beyond any run's length: only the final one is saved


@dataclass(frozen=True)
class SharedDesign:
    """The options both studies have, at the values both pre-registrations fixed; every field of a
    design is a command-line option."""

    task_seed: int = 0
    pretrain_problems: int = 2000
    train_prompts: int = 512
    validation_prompts: int = 200
    test_prompts: int = 500
    pretrain_lr: float = 3e-3
    pretrain_epochs: int = 30
    pretrain_save_interval: int = 30
    probe_prompts: int = 64
    k: int = 16
    seeds: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
    epochs: int = 1
    eval_samples: int = 8
    hidden_size: int = 128
    vocab_size: int = 384
    max_new_tokens: int = 40
    jobs: int = 2



def deviations(design: SharedDesign) -> dict[str, dict]:
    """Options that differ from the design's pre-registered defaults ({} for the study as registered)."""
    registered = type(design)()
    return {f.name: {"registered": getattr(registered, f.name), "used": getattr(design, f.name)}
            for f in dataclasses.fields(design) if getattr(design, f.name) != getattr(registered, f.name)}


def _commit() -> str | None:
    """HEAD, with "+uncommitted changes" when tracked files differ from it (None outside git)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return None
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], capture_output=True).returncode != 0
    return head.stdout.strip() + (" +uncommitted changes" if dirty else "")


def resumable_results(out: Path, design: SharedDesign) -> dict:
    """The results.json of an interrupted study in `out`, checked to be of this design."""
    path = out / "results.json"
    if not path.is_file():
        raise UserError(f"--resume: {path} does not exist; start the study without --resume",
                        key="--resume.no_results", where="--resume")
    results = json.loads(path.read_text())
    registered = json.loads(json.dumps(dataclasses.asdict(design)))  # tuples -> lists, as stored
    differing = sorted(k for k in registered.keys() | results["design"].keys()
                       if registered.get(k) != results["design"].get(k))
    if differing:
        raise UserError(f"--resume: {path} is a study with other options ({', '.join(differing)}); "
                         "resume it with the options it started with", key="--resume.other_options", where="--resume")
    mus = [results["mu"]] if "mu" in results else list(results.get("mus", {}).values())  # study 1 / study 2
    for mu in mus:
        if not Path(mu["path"]).is_dir():
            raise UserError(f"--resume: mu {mu['path']} recorded in {path} is missing", key="--resume.mu_missing",
                            where="--resume")
    return results


def read_outcomes(directory: Path) -> dict:
    """{evaluation: {split: {"correct": [...], "malformed": [...]}}} of a study that saves them ({} if none yet)."""
    path = directory / OUTCOMES
    return json.loads(gzip.decompress(path.read_bytes())) if path.is_file() else {}


class StudyRun:
    """One study's run in `out`, what the studies' drivers share: results.json, new or resumed
    (`--resume`: the design must be the one it started with; the clock continues from the last save),
    the task's splits, evaluation of a model on a split, offline datasets saved as they are made, and
    trainings `design.jobs` at a time with each final checkpoint evaluated here. With `per_problem`,
    every named evaluation's per-problem outcomes go to out/outcomes.json.gz as they are measured
    (before results.json records the run, so a recorded run always has them)."""

    def __init__(self, design: SharedDesign, out: Path, estimate_s: dict[str, float], resume: bool,
                 per_problem: bool = False):
        from nemo_topr.miniature import pipeline

        self.design, self.out = design, out
        started = time.time()
        if resume:
            self.results = resumable_results(out, design)
            # Time between the processes is not counted, nor a killed process's unsaved work (it is
            # redone here and counted again).
            started -= self.results.get("wall_time_s", 0.0)
            self.results.setdefault("resumed", []).append({"after_s": self.results.get("wall_time_s", 0.0),
                                                           "commit": _commit(), "runs_kept": len(self.results["runs"])})
            pipeline.log(f"resuming {out}: {len(self.results['datasets'])} datasets and "
                         f"{len(self.results['runs'])} runs kept")
        else:
            fresh_output_dir(out, "nemo_topr.miniature.study")
            (out / "data").mkdir()
            self.results = {"design": dataclasses.asdict(design), "deviations": deviations(design), "commit": _commit(),
                            "estimate_s": estimate_s, "stage_seconds": {}, "datasets": {}, "runs": {}}
        self.started = started
        self.save, self.stage_done = pipeline.results_file(out / "results.json", self.results, started)
        self.sizes = {"pretrain": design.pretrain_problems, "train": design.train_prompts,
                      "validation": design.validation_prompts, "test": design.test_prompts}
        self.splits: dict = {}
        self.outcomes = read_outcomes(out) if per_problem else None

    def build_task(self) -> Path:
        """Splits, tokenizer and the random initial model (a new study); returns the model."""
        from nemo_topr.miniature import pipeline

        self.splits, model = pipeline.build_task_and_model(self.out, self.sizes, self.design.task_seed,
                                                           self.design.vocab_size, self.design.hidden_size)
        return model

    def resume_task(self) -> None:
        """A resumed study's splits: a function of the task seed (the models are on disk)."""
        from nemo_topr.miniature.task import make_splits

        self.splits = make_splits(self.sizes, seed=self.design.task_seed)

    def evaluate(self, model: Path, split: str, name: str | None = None) -> dict:
        """The model's metrics on a split; its per-problem outcomes are saved under `name`."""
        from nemo_topr.miniature import pipeline

        result = pipeline.evaluate(model, self.splits[split], split, self.design.eval_samples, 0,
                                   self.design.max_new_tokens)
        if name is not None and self.outcomes is not None:
            self.record_outcomes(name, split, result["per_problem"])
        return result["metrics"]

    def record_outcomes(self, name: str, split: str, per_problem: dict[str, list[int]]) -> None:
        """Save one evaluation's per-problem outcomes (a no-op for a study that does not keep them);
        written whole to a temporary file and renamed, so a killed process leaves the last good one."""
        if self.outcomes is None:
            return
        self.outcomes.setdefault(name, {})[split] = per_problem
        partial = self.out / (OUTCOMES + ".partial")
        partial.write_bytes(gzip.compress(json.dumps(self.outcomes, separators=(",", ":")).encode(), mtime=0))
        os.replace(partial, self.out / OUTCOMES)

    def dataset(self, key: str, mu: Path, seed: int, directory: Path) -> Path:
        """The scored offline dataset `key` (k samples per train prompt from mu, sampling seed `seed`),
        made and saved unless a resumed study already has it."""
        from nemo_topr.miniature import pipeline

        if key in self.results["datasets"] and (directory / "scored.jsonl").is_file():
            return directory / "scored.jsonl"
        scored, self.results["datasets"][key] = pipeline.offline_dataset(
            mu, self.splits["train"], self.design.k, seed, directory, self.design.max_new_tokens)
        self.save()
        return scored

    def train_all(self, jobs: list[dict], splits_to_evaluate: tuple[str, ...], *,
                  second_failure_scored: bool = False) -> None:
        """Train jobs (dicts with name, seed, lr, warmup, overrides, mu, data and what the run records)
        `design.jobs` at a time in subprocesses; evaluate each final checkpoint here, in order. A
        failed training stops the study; with `second_failure_scored` (study 2's rule) a run that
        already failed once is recorded as failed and scored as degenerated on every split instead
        (pass@1 and maj@n 0, malformed rate 1)."""
        from concurrent.futures import ThreadPoolExecutor

        from nemo_topr.miniature import pipeline

        design, results = self.design, self.results

        def train(job: dict) -> tuple[Path, dict[int, Path]]:
            return pipeline.train_variant(job["name"], job["mu"], job["data"], job["overrides"], self.out,
                                          epochs=design.epochs, lr=job["lr"], warmup=job["warmup"],
                                          save_interval=FINAL_ONLY, seed=job["seed"], jobs=design.jobs)

        jobs = [job for job in jobs if job["name"] not in results["runs"]]  # kept by --resume
        with ThreadPoolExecutor(max(1, design.jobs)) as pool:
            for job, future in [(job, pool.submit(train, job)) for job in jobs]:
                run = {k: v for k, v in job.items() if k not in ("overrides", "mu", "data")}
                try:
                    run_dir, checkpoints = future.result()
                except SystemExit as error:
                    if not (second_failure_scored and job["name"] in results.get("failed_once", {})):
                        if second_failure_scored:
                            results.setdefault("failed_once", {})[job["name"]] = str(error)
                            self.save()
                        pool.shutdown(cancel_futures=True)
                        raise
                    failed = {"pass@1": 0.0, f"maj@{design.eval_samples}": 0.0, "malformed_rate": 1.0}
                    run.update({"failed": str(error), **{split: dict(failed) for split in splits_to_evaluate}})
                    for split in splits_to_evaluate:  # every problem 0 correct, every sample malformed
                        size = len(self.splits[split])
                        self.record_outcomes(job["name"], split, {"correct": [0] * size,
                                                                  "malformed": [design.eval_samples] * size})
                else:
                    final = max(checkpoints)
                    run.update({"iterations": final, "telemetry": pipeline.telemetry(run_dir),
                                **{split: self.evaluate(checkpoints[final], split, job["name"])
                                   for split in splits_to_evaluate}})
                    shutil.rmtree(run_dir / "checkpoints")
                results["runs"][job["name"]] = run
                pipeline.log(f"{job['name']}: " + ("FAILED twice, scored as degenerated; " if "failed" in run else "")
                             + ", ".join(f"{split} pass@1 {run[split]['pass@1']:.3f}" for split in splits_to_evaluate))
                self.save()

    def finish(self, write_report, docs: Path | None) -> dict:
        """Write the report with `write_report(out, results, docs)` and print it."""
        from nemo_topr.miniature import pipeline

        print(write_report(self.out, self.results, docs))
        pipeline.log(f"done in {time.time() - self.started:.0f} s -> {self.out / 'results.md'}")
        return self.results
