"""The driver: the start (the base model exported when it is a Megatron checkpoint, and evaluated),
then each round's stages in order (generate, curate, score, train, export, eval, and with a
verifier its scoring and vote), each run unless done; the plot and the summary at the end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_topr.data.records import Record, is_positive
from nemo_topr.data.tokenization import too_long_policy
from nemo_topr.iterate.base_model import BASE_MODEL_RECORD, check_same_base_model
from nemo_topr.iterate.config import CurateOptions, IterateConfig, sampling_flags
from nemo_topr.iterate.processes import Ranks, check_launch
from nemo_topr.iterate.rounds import RoundFiles, RoundResult, read_graded, wrote_no_records
from nemo_topr.iterate.stages import Stage, run_stage
from nemo_topr.iterate.summary import num_problems, summary_row, write_summary
from nemo_topr.iterate.validation import eval_prompt_note, test_split_warning, training_config
from nemo_topr.model import source as model_source
from nemo_topr.utils.outputs import claimed_output_dir, write_whole


def curation_flags(options: CurateOptions, records: list[Record] | None,
                   baseline: float) -> tuple[list[str], str | None]:
    """`data curate` options for this round's records (None: not generated yet), and a note when
    a sub-sampling had to go. `baseline` is the training's objective.baseline, target_p_tilde's c.

    Sub-sampling to a target share needs both positives and negatives; a round without one
    side (a weak model's: no correct answer at all) trains on all its records instead.
    """
    if options.mode == "anna_karenina":
        return ["--anna-karenina"], None
    if options.mode == "none":
        return [], None
    if records is not None:
        positives = sum(is_positive(record.reward) for record in records)
        if positives in (0, len(records)):
            return [], (f"curate.mode {options.mode} skipped: {positives} positives and "
                        f"{len(records) - positives} negatives (sub-sampling needs both); trained on every record")
    target = ["--target-p", str(options.target)] if options.mode == "target_p" else [
        "--target-p-tilde", str(options.target), "--baseline", str(baseline)]
    return [*(["--per-prompt"] if options.per_prompt else []), *target], None


def zero_shot_prompts(benchmark: str, path: Path) -> None:
    """A GSM8K split as a prompt file of "Question: q\\nAnswer:" prompts (the benchmark's prompt ids)."""
    from nemo_topr.data.prompts import gsm8k_final_answer, gsm8k_prompt, load_gsm8k

    rows = load_gsm8k(benchmark.removeprefix("gsm8k-"))
    write_whole(path, "".join(
        json.dumps({"prompt": gsm8k_prompt(row["question"], []), "reference_answer": gsm8k_final_answer(row["answer"]),
                    "prompt_id": f"{benchmark}-{index}"}) + "\n" for index, row in enumerate(rows)))


class Driver:
    """Walks every stage of every round in order, running those not done yet."""

    def __init__(self, config: IterateConfig, *, dry_run: bool = False):
        self.config, self.dry_run = config, dry_run
        self.out = Path(config.out).resolve()
        train = config.train
        # score mu at the training sequence length, so that exactly the sequences training accepts are scored
        values, objective = training_config(train, Ranks.of(config).total)
        self.seq_length, self.baseline = int(values["model"]["seq_length"]), objective.baseline
        # where training drops over-long records, scoring must too, not stop at the first
        dataset = values.get("dataset") or {}
        too_long = too_long_policy(dataset.get("too_long"), dataset.get("strict", True))
        self.score_flags = ["--no-strict"] if too_long == "drop" else []
        self.device_flag = ("--device", config.device)
        # its absolute path, as base_model's, in the verify stages' recorded arguments
        self.verifier_model = (None if config.verifier.model is None
                               else model_source.require_hugging_face(config.verifier.model))

    def run(self) -> list[RoundResult]:
        if not self.dry_run:
            check_launch(self.config)
        claimed_output_dir(self.out, "nemo-topr iterate", make=not self.dry_run)
        check_same_base_model(self.out / BASE_MODEL_RECORD, self.config.base_model, write=not self.dry_run)
        for note in (eval_prompt_note(self.config), test_split_warning(self.config)):
            if note:
                print(note, flush=True)
        start = self.start()
        results = [start]
        for index in range(self.config.rounds):
            results.append(self.run_round(index, results[-1]))
        evaluated = [self.plotted_results(result.directory) for result in results if result.evaluated]
        run_stage(Stage("plot", self.out, ("eval", "--plot", *map(str, evaluated), "--out", str(self.out / "rounds.png")),
                        (self.out / "rounds.png",), redo_if_changed=True), dry_run=self.dry_run)
        if not self.dry_run:
            write_summary(self.out, self.summary_rows(results))
        return results

    def summary_rows(self, results: list[RoundResult]) -> list[dict[str, Any]]:
        return [summary_row(result, verified=self.verifier_model is not None) for result in results]

    def plotted_results(self, directory: Path) -> Path:
        """With a verifier, the verified results (eval's metrics and the weighted vote) when they
        cover eval's problems; else eval's own (see verified_vote)."""
        verified, results = RoundFiles(directory).verified_results, RoundFiles(directory).eval_results
        if self.verifier_model is None:
            return results
        if not verified.is_file():  # not evaluated yet (a dry run), or no sample to score
            return verified if self.dry_run else results
        return verified if num_problems(verified) == num_problems(results) else results

    def start(self) -> RoundResult:
        """The base model, exported to HF first when it is a Megatron checkpoint; evaluated."""
        directory, base = self.out / "start", model_source.resolve(self.config.base_model)
        model, weights = base.path, str(base.checkpoint or base.path)
        if base.is_megatron:
            model = RoundFiles(directory).model
            run_stage(Stage("export", directory, ("export", "--ckpt", weights, "--hf-out", str(model), *self.device_flag),
                            (model,)), dry_run=self.dry_run)
        return RoundResult("start", directory, model, weights, note=self.evaluate(directory, model, "start"))

    def run_round(self, index: int, previous: RoundResult) -> RoundResult:
        model, weights = previous.model, previous.weights
        directory = self.out / f"round_{index}"
        files = RoundFiles(directory)
        graded, curated, scored = files.graded, files.curated, files.scored
        run_dir, exported = files.run_dir, files.model
        generate = self.generate_stage(directory, model, index, graded)
        run_stage(generate, dry_run=self.dry_run)
        records = read_graded(graded) if generate.is_done() else None  # None: not generated yet (dry run)
        if records == []:
            print(f"[{directory.name}] generation wrote no records (every completion empty): nothing to train on; "
                  f"the next round starts from {model} again", flush=True)
            return RoundResult(directory.name, directory, model, weights, evaluated=False,
                               note="no records generated: training skipped")
        flags, note = curation_flags(self.config.curate, records, self.baseline)
        if note:
            print(f"[{directory.name}] {note}", flush=True)
        train, rendered, ranks = self.config.train, self.config.generate.rendered_prompts, Ranks.of(self.config)
        stages = [
            Stage("curate", directory, ("data", "curate", str(graded), *flags, "--seed", str(self.config.curate.seed),
                                        "--out", str(curated)), (curated, curated.with_suffix(".stats.json"))),
            Stage("score", directory, ("score-logprobs", "--model", weights, "--data", str(curated),
                                       "--out", str(scored), "--seq-length", str(self.seq_length), *self.score_flags,
                                       *self.device_flag,
                                       *(["--rendered-prompts"] if rendered else [])), (scored,), ranks=ranks),
            Stage("train", directory, ("train", "--config-name", train.config_name, *train.overrides,
                                       f"base_model={weights}", f"run_dir={run_dir}", f"dataset.train_path={scored}",
                                       *(["dataset.rendered_prompts=true"] if rendered else []),
                                       f"device={self.config.device}"), (run_dir,), overwrite=False, ranks=ranks),
            Stage("export", directory, ("export", "--ckpt", str(run_dir), "--hf-out", str(exported), *self.device_flag),
                  (exported,)),
        ]
        for stage in stages:
            run_stage(stage, dry_run=self.dry_run)
        notes = [note, self.evaluate(directory, exported, directory.name)]
        return RoundResult(directory.name, directory, exported, str(run_dir), note="; ".join(filter(None, notes)) or None)

    def zero_shot_file(self, split: str) -> str:
        """OUT/prompts/SPLIT-zero-shot.jsonl, written once (not in a dry run)."""
        path = self.out / "prompts" / f"{split}-zero-shot.jsonl"
        if not self.dry_run and not path.is_file():
            zero_shot_prompts(split, path)
        return str(path)

    def generate_stage(self, directory: Path, model: Path, index: int, graded: Path) -> Stage:
        options = self.config.generate
        prompts, task = options.prompts, options.task
        if options.zero_shot:
            prompts, task = self.zero_shot_file(options.prompts), "gsm8k"
        prompt_flags = [] if task is None else ["--task", task]
        prompt_flags += ["--rendered-prompts"] if options.rendered_prompts else []
        return Stage("generate", directory, ("generate", "--model", str(model), "--prompts", prompts, *prompt_flags,
                                             *sampling_flags(options, options.seed + index), *self.device_flag,
                                             "--out", str(graded)),
                     (graded,))

    def evaluate(self, directory: Path, model: Path, label: str) -> str | None:
        """`eval` of the model; with a verifier, its samples scored and evaluated again, adding the
        verifier-weighted vote (the same samples, so the other metrics are eval's). Returns a note
        when eval wrote no sample to score (every completion empty)."""
        from nemo_topr.evaluation import evaluate

        stage = self.eval_stage(directory, model, label)
        run_stage(stage, dry_run=self.dry_run)
        if self.verifier_model is None:
            return None
        files = RoundFiles(directory)
        samples, scored, results = files.eval_samples, files.verified_samples, files.verified_results
        if stage.is_done() and samples.is_file() and wrote_no_records(samples):
            note = "verifier: eval wrote no sample to score (every completion empty); weighted maj is 0"
            print(f"[{directory.name}] {note}", flush=True)
            return note
        ks = evaluate.build_parser().parse_args(stage.args[1:]).k  # eval's own --k, if eval.args give one
        for verification in (
                Stage("verify", directory, ("verifier", "score", "--model", str(self.verifier_model), "--records",
                                            str(samples), "--out", str(scored), *self.config.verifier.args,
                                            *self.device_flag), (scored, scored.with_suffix(".report.json")),
                      read_later=(scored,)),
                Stage("eval-verified", directory, ("eval", "--records", str(scored),
                                                   *(["--k", *map(str, ks)] if ks else []), "--label", label,
                                                   "--out", str(results)),
                      (results, results.with_suffix(".md")), read_later=(results,))):
            run_stage(verification, dry_run=self.dry_run)
        return None

    def eval_stage(self, directory: Path, model: Path, label: str) -> Stage:
        options = self.config.eval
        results, samples = RoundFiles(directory).eval_results, RoundFiles(directory).eval_samples
        prompts = options.prompt_flags(self.zero_shot_file("gsm8k-test") if options.zero_shot else "")
        return Stage("eval", directory, ("eval", "--model", str(model), *prompts,
                                         *sampling_flags(options, options.seed), *self.device_flag, "--label", label,
                                         "--samples-out", str(samples), "--out", str(results)),
                     (results, results.with_suffix(".md"), samples),
                     read_later=(results, samples) if self.verifier_model is not None else (results,))
