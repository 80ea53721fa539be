"""A standing mutation check: plausible bugs planted one at a time, each against the tests that
should catch it. Not part of `make test`; run it before calling a test change done and record
the score and every survivor, with its reason, in docs/reliability.md.

    .venv/bin/python scripts/mutation_check.py                 # every mutant
    .venv/bin/python scripts/mutation_check.py --only rewards_permuted --list

The checkout (tracked and untracked-but-not-ignored files: `git ls-files -co --exclude-standard`)
is copied once to a scratch directory. The named tests must pass there unmutated; then each
mutant replaces one exact snippet of one file in the copy, runs its tests there (PYTHONPATH =
the copy, so the tests' subprocesses and torchrun workers import the mutant too; see
tests/conftest.py), records *caught* (a test failed) or *survived*, and restores the file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository root
    old: str  # exact snippet, present once
    new: str
    tests: tuple[str, ...]  # pytest node ids or files
    bug: str  # the real bug it stands for


HF_ORACLE = ("tests/test_hf_oracle.py",)
SAMPLING_CONTEXT_TEST = ("tests/test_generate_eval.py::"
                         "test_sampling_leaves_room_in_the_models_context_and_refuses_a_full_prompt")
BEYOND_CONTEXT_TEST = (
    "tests/test_config.py::test_a_record_beyond_the_base_models_context_is_refused_by_train_and_score_logprobs")
BASELINE_TESTS = ("tests/test_topr_step.py::test_whole_group_baselines_survive_rows_microbatches_and_dp_ranks",
                  "tests/test_topr_step.py::test_record_baselines_take_precedence_over_group_means")
CHECKPOINT_TESTS = ("tests/test_checkpoints.py::test_consistent_directory_is_left_alone",
                    "tests/test_checkpoints.py::test_killed_between_tracker_and_run_config_falls_back_to_previous",
                    "tests/test_checkpoints.py::test_incomplete_first_checkpoint_restarts_from_the_pretrained_model",
                    "tests/test_checkpoints.py::test_run_config_cut_short_counts_as_incomplete",
                    "tests/test_checkpoint_repair.py")
SOURCE_TESTS = ("tests/test_run_iterations.py", "tests/test_model_source.py")
SLURM_TESTS = ("tests/test_job_signal.py", "tests/test_slurm.py::test_scripts_pass_bash_n_and_shellcheck")
EARLY_WARNING_TEST = "tests/test_slurm.py::test_a_warning_before_the_ranks_hold_it_requeues_even_if_a_rank_held_it"
KILLED_RANK_TEST = "tests/test_slurm.py::test_a_killed_rank_fails_the_real_job_without_a_requeue"

MUTANTS = (
    # objective.py
    Mutant("zero_reward_is_negative", "nemo_topr/objective.py",
           '(advantages if config.negative_rule == "advantage" else rewards) < 0',
           '(advantages if config.negative_rule == "advantage" else rewards) <= 0',
           ("tests/test_objective.py",), "R = 0 treated as a negative (tapered) sample"),
    Mutant("topr_negatives_untruncated", "nemo_topr/objective.py",
           '"topr": (1.0, 1.0, 0.0, 1.0),', '"topr": (1.0, 1.0, 0.0, math.inf),',
           ("tests/test_objective.py",), "TOPR's negative weight min(rho, 1) without the upper bound"),
    Mutant("weights_carry_gradient", "nemo_topr/objective.py",
           "weights = _tapered_weights(log_ratio.detach(), negative, config)",
           "weights = _tapered_weights(log_ratio, negative, config)",
           ("tests/test_objective.py",), "the importance weight not detached (gradient through rho)"),
    Mutant("sequence_mean_by_mean_length", "nemo_topr/objective.py",
           "loss = -(objective / lengths).mean()", "loss = -objective.mean() / lengths.mean()",
           ("tests/test_objective.py",), "sequence_mean normalised by the batch's mean length"),
    # training/step.py
    Mutant("completion_mask_shifted", "nemo_topr/training/step.py",
           'completion = batch["loss_mask"].to(torch.float64)',
           'completion = batch["loss_mask"].roll(1, -1).to(torch.float64)',
           HF_ORACLE, "log pi summed over the completion tokens shifted by one position"),
    Mutant("rewards_permuted", "nemo_topr/training/step.py",
           'batch["behavior_logprobs"], batch["rewards"],', 'batch["behavior_logprobs"], batch["rewards"].flip(0),',
           BASELINE_TESTS, "rewards paired with the wrong sequences in the loss"),
    Mutant("record_baselines_ignored", "nemo_topr/training/step.py",
           '    if record_baselines:\n        return "records"', '    if False:\n        return "records"',
           BASELINE_TESTS, "the records' own baselines replaced by the group mean / scalar"),
    Mutant("shared_prefix_rope_at_row_positions", "nemo_topr/training/step.py",
           "return angles[position_ids.t()].flatten(2, 3)", "return angles",
           HF_ORACLE, "shared-prefix segments rotated at their row positions, not their position ids"),
    Mutant("missing_mu_not_checked", "nemo_topr/training/step.py",
           'missing = torch.isnan(batch["behavior_logprobs"])', 'missing = torch.zeros_like(batch["rewards"]) > 0',
           ("tests/test_topr_step.py::test_host_check_names_the_samples_of_a_bad_batch",),
           "a batch without behaviour log-probs trained on (NaN rho) instead of refused"),
    # data/
    Mutant("labels_not_shifted", "nemo_topr/data/packing.py",
           'batch["labels"][r, start : end - 1] = ids[1:]', 'batch["labels"][r, start : end - 1] = ids[:-1]',
           ("tests/test_data_packing.py",), "each position trained to predict itself"),
    Mutant("eos_not_trained", "nemo_topr/data/tokenization.py",
           "loss_mask=[0] * len(prompt_ids) + [1] * (len(completion_ids) + 1),",
           "loss_mask=[0] * len(prompt_ids) + [1] * len(completion_ids) + [0],",
           ("tests/test_data_tokenization.py", "tests/test_data_packing.py"), "the EOS token left out of log pi"),
    Mutant("rendered_prompt_wrapped_again", "nemo_topr/data/tokenization.py",
           "        if pattern and (problem := _special_token_problem(record, pattern)):",
           "        if False and (problem := _special_token_problem(record, pattern)):",
           ("tests/test_data_tokenization.py",),
           "a prompt rendered already gets the chat template and BOS twice, a completion ending in EOS text two EOS"),
    Mutant("group_mean_leaves_one_out", "nemo_topr/data/packing.py",
           "means = {prompt_id: math.fsum(rewards) / len(rewards)",
           "means = {prompt_id: math.fsum(rewards[1:]) / max(len(rewards) - 1, 1)",
           BASELINE_TESTS, "AsymRE's whole-group mean computed without one sample"),
    Mutant("unseeded_shuffle", "nemo_topr/training/data.py",
           "random.Random(self.shuffle_seed + epoch).shuffle(shuffled)", "random.shuffle(shuffled)",
           ("tests/test_data_order.py",), "a data order that differs per process"),
    Mutant("hash_seeded_shuffle", "nemo_topr/training/data.py",
           "random.Random(self.shuffle_seed + epoch).shuffle(shuffled)",
           "random.Random(hash(str(self.shuffle_seed)) + epoch).shuffle(shuffled)",
           ("tests/test_data_order.py",), "an order seeded from Python's per-process string hash"),
    # model_source.py, export
    Mutant("run_at_iteration_ignored", "nemo_topr/model_source.py",
           "return _run_source(Path(directory).resolve(), int(iteration[1:]), given=text, named=named)",
           "return _run_source(Path(directory).resolve(), None, given=text, named=named)",
           SOURCE_TESTS, "RUN@ITERATION loads the latest checkpoint"),
    Mutant("another_architecture_accepted", "nemo_topr/model_source.py",
           "    if ARCHITECTURE not in architectures:", "    if not architectures:",
           ("tests/test_model_source.py",),
           "a GPT-2 or Qwen2 base_model reaches AutoBridge's traceback after the imports, or trains on untested paths"),
    Mutant("unfinished_iteration_accepted", "nemo_topr/model_source.py",
           "    missing = _missing_files(checkpoint)\n", "    missing = []\n",
           SOURCE_TESTS, "a checkpoint cut short by a kill loaded as a model"),
    Mutant("export_all_from_latest", "nemo_topr/training/export.py",
           "bridge.export_ckpt(str(checkpoint.checkpoint), str(partial), show_progress=False)",
           "bridge.export_ckpt(str(source.checkpoint), str(partial), show_progress=False)",
           ("tests/test_run_iterations.py",), "--all-iterations writes the latest weights under every iteration"),
    # training/checkpoints.py
    Mutant("repair_to_oldest", "nemo_topr/training/checkpoints.py",
           "iteration, path = complete[-1]", "iteration, path = complete[0]",
           CHECKPOINT_TESTS, "repair resumes from the oldest complete checkpoint"),
    Mutant("train_state_not_required", "nemo_topr/training/checkpoints.py",
           ' and (iteration_dir / "train_state.pt").is_file()', "",
           CHECKPOINT_TESTS, "an iteration without train_state.pt counted complete"),
    Mutant("broken_checkpoint_kept_in_place", "nemo_topr/training/checkpoints.py",
           'latest_dir.rename(latest_dir.with_name(latest_dir.name + ".incomplete"))', "pass",
           CHECKPOINT_TESTS, "the incomplete checkpoint left where Bridge would load it again"),
    # slurm/
    Mutant("exit_signal_mismatch", "slurm/topr_job.sh",
           "train.exit_signal=SIGUSR1 train.exit_signal_handler", "train.exit_signal=SIGTERM train.exit_signal_handler",
           SLURM_TESTS, "the ranks checkpoint on another signal than the one Slurm sends"),
    Mutant("warning_to_batch_shell", "slurm/llama31_8b.sbatch",
           "#SBATCH --signal=USR1@600", "#SBATCH --signal=B:USR1@600",
           SLURM_TESTS, "the warning goes to the batch shell, not the training ranks"),
    Mutant("failures_requeued", "slurm/topr_job.sh",
           'if [[ -f $run_dir/STOPPED ]]; then', "if true; then",
           (*SLURM_TESTS, KILLED_RANK_TEST),
           "every unfinished run requeued, failures included"),
    Mutant("early_warning_fails", "slurm/topr_job.sh",
           "if ((status == 128 + $(kill -l USR1))); then", "if false; then",
           (*SLURM_TESTS, EARLY_WARNING_TEST), "ranks killed by a warning they could not hold yet fail the job"),
    Mutant("held_warning_dies_of_sigterm", "nemo_topr/cluster/warning.py",
           "    dying_of = signal.SIGUSR1 if signal.SIGUSR1 in signal.sigpending() else signal.SIGTERM",
           "    dying_of = signal.SIGTERM",
           (EARLY_WARNING_TEST,),
           "a rank holding the warning dies of --kill-on-bad-exit's SIGTERM: srun 143, the job fails"),
    Mutant("signal_deaths_requeued", "slurm/topr_job.sh",
           "if ((status == 128 + $(kill -l USR1))); then", "if ((status > 128)); then",
           (*SLURM_TESTS, EARLY_WARNING_TEST, KILLED_RANK_TEST),
           "a rank killed by any signal requeued, not only by the warning"),
    # what commands write, and refusals of settings that would change a run's meaning
    Mutant("unmarked_output_dir_emptied", "nemo_topr/outputs.py",
           "        if made_by != command:", "        if False:",
           ("tests/test_outputs.py::test_a_directory_the_command_did_not_make_is_refused_and_kept",),
           "make demo --out (or doctor --work-dir) deletes a directory it did not make"),
    Mutant("output_over_input_allowed", "nemo_topr/outputs.py",
           "    if any(Path(name).resolve() == target for name in inputs):", "    if False:",
           ("tests/test_outputs.py::test_each_command_refuses_to_write_its_records_over_its_input",),
           "curate or score-logprobs --out naming the input replaces it, losing what it drops"),
    Mutant("existing_output_file_replaced", "nemo_topr/outputs.py",
           "    if path.exists() and not overwrite:", "    if False:",
           ("tests/test_outputs.py::test_each_command_refuses_an_output_file_that_exists_unless_overwrite",),
           "an --out that exists (an earlier result, a user's file) is replaced without --overwrite"),
    Mutant("iterate_writes_into_any_directory", "nemo_topr/iterate.py",
           '        claimed_output_dir(self.out, "nemo-topr iterate", make=not self.dry_run)', "        pass",
           ("tests/test_iterate.py::test_an_out_the_driver_did_not_make_is_refused_before_any_stage",),
           "iterate out= naming a user's directory is written into, its files replaced by reruns"),
    Mutant("export_over_its_checkpoint", "nemo_topr/training/export.py",
           "            if target == read or target in read.parents or inside:", "            if False:",
           ("tests/test_export_outputs.py::"
            "test_the_checkpoint_being_exported_is_refused_as_its_output_even_with_overwrite",),
           "export --ckpt X --hf-out X --overwrite deletes the checkpoint it exports"),
    Mutant("records_written_under_any_name", "nemo_topr/outputs.py",
           '    if Path(path).suffix != ".jsonl":', "    if False:",
           ("tests/test_outputs.py::test_records_are_written_only_under_a_name_that_is_read_back_as_jsonl",),
           "score-logprobs --out scored.json runs, and train finds the file unreadable only afterwards"),
    Mutant("unread_files_unsaid", "nemo_topr/data/sources.py",
           "    return [_file_source(file) for file in data], note if others else None",
           "    return [_file_source(file) for file in data], None",
           ("tests/test_data_records.py::"
            "test_files_of_a_directory_or_pattern_that_are_not_read_are_named_in_the_report",),
           "a shard left compressed in a data directory is dropped from the dataset unsaid"),
    Mutant("missing_path_tried_on_the_hub", "nemo_topr/data/sources.py",
           '    raise DataError(spec, 0, "path", "does not exist" + _missing_hint(path, path))',
           '    if HUB_NAME.match(spec):\n        return [_hub_source(spec, split)], None\n'
           '    raise DataError(spec, 0, "path", "does not exist" + _missing_hint(path, path))',
           ("tests/test_data_sources.py::test_a_missing_local_path_is_never_taken_for_a_hub_name",),
           "a typo such as graded.jsnl is looked up on the hub: a download by default, 30 s of retries"),
    Mutant("submit_takes_only_a_data_file", "nemo_topr/cluster/submit.py",
           '    if data is not None and (missing := why_missing(str(data), typed=str(typed["dataset.train_path"]))):',
           '    if data is not None and (missing := None if data.is_file() else "does not exist"):',
           ("tests/test_slurm.py::test_submit_takes_data_as_train_reads_it_and_names_a_typo",),
           "submit refuses a directory of shards or a glob that train reads, as 'does not exist'"),
    Mutant("temperature_zero_sampled", "nemo_topr/evaluation/generate.py",
           "    if settings.temperature == 0:\n", "    if False:\n",
           ("tests/test_generate_eval.py::"
            "test_temperature_zero_is_greedy_decoding_whatever_the_models_generation_config",),
           "eval --temperature 0 fails after loading the weights on transformers, while vLLM decodes greedily"),
    Mutant("broken_iteration_offered", "nemo_topr/model_source.py",
           "if other != iteration and not _missing_files(root / iteration_dir_name(other))]",
           "if True]",
           ("tests/test_run_iterations.py::test_run_at_iteration_errors_name_the_saved_iterations",),
           "an unfinished or Megatron-LM checkpoint's error offers the iteration it refused as the one to use"),
    Mutant("zero_one_grades_at_zero_unsaid", "nemo_topr/data/positives.py",
           "    if baseline == min(rewards):\n", "    if False:\n",
           ("tests/test_data_cli.py",),
           "0/1 grades at the default baseline 0 train as SFT on the correct answers without a word"),
    Mutant("replaced_logprobs_unsaid", "nemo_topr/training/scoring.py",
           "    if changes:\n", "    if False:\n",
           ("tests/test_hf_oracle.py::test_score_logprobs_matches_transformers",),
           "score-logprobs replaces a sampler's behaviour log-probs without saying how far they moved"),
    Mutant("submit_hub_hint_on_the_resolved_path", "nemo_topr/cluster/submit.py",
           'why_missing(str(data), typed=str(typed["dataset.train_path"]))', "why_missing(str(data))",
           ("tests/test_slurm.py::test_submit_takes_data_as_train_reads_it_and_names_a_typo",),
           "submit with dataset.train_path=owner/name says its directory under the checkout is missing, not hub:"),
    Mutant("every_baseline_reported_as_group_means", "nemo_topr/training/recipe.py",
           '    if source == "group_means":\n        return f"the whole-group',
           '    if True:\n        return f"the whole-group',
           ("tests/test_config.py::test_the_data_report_says_which_baseline_the_objective_uses",),
           "the data report says every variant's baseline is the whole-group mean reward (only asymre's is)"),
    Mutant("zero_gpu_memory_planned", "nemo_topr/cluster/plan.py",
           "    if not (math.isfinite(args.gpu_memory_gb) and args.gpu_memory_gb > 0):\n", "    if False:\n",
           ("tests/test_plan.py::test_a_machine_that_cannot_exist_is_a_usage_error_not_a_verdict",),
           "plan --gpu-memory-gb 0 (a typo) prints a whole report ending DOES NOT FIT instead of a usage error"),
    Mutant("plain_train_noise_shown", "nemo_topr/quiet.py",
           '    r"Could not determine (rank|world size|local rank) from ",\n', "",
           ("tests/test_training_e2e.py::test_a_new_run_warns_when_mu_is_not_the_starting_models",),
           "nemo-topr train as a plain process prints Megatron's three rank-fallback UserWarnings"),
    Mutant("export_overwrites_what_it_did_not_make", "nemo_topr/training/export.py",
           "        if not (out / EXPORT_RECORD).is_file():\n", "        if False:\n",
           ("tests/test_export_outputs.py::test_overwrite_never_replaces_what_export_did_not_make",),
           "export --overwrite deletes any --hf-out, the base model named by a typo too"),
    Mutant("checkpoint_reading_noise_shown", "nemo_topr/quiet.py",
           '    r"The argument order of load has been changed",\n', "",
           ("tests/test_training_e2e.py::test_export_of_several_iterations_in_one_process",),
           "every export prints torch's note on the argument order of Megatron's checkpoint load"),
    Mutant("library_deprecations_shown", "nemo_topr/quiet.py",
           '    "megatron.core.models.gpt.gpt_model": r"GPTModel IS DEPRECATED",\n', "",
           ("tests/test_quiet.py",), "every model-building verb prints Megatron-Core's GPTModel deprecation"),
    Mutant("output_directory_made_at_check", "nemo_topr/outputs.py",
           "    unmakeable = _why_unmakeable(path.absolute().parent)\n",
           "    unmakeable = _why_unmakeable(path.absolute().parent)\n    path.parent.mkdir(parents=True, exist_ok=True)\n",
           ("tests/test_model_source.py::test_each_verb_names_a_missing_model_by_its_own_option_and_makes_nothing",),
           "eval --out new/r.json --model typo leaves an empty directory behind"),
    Mutant("users_yaml_misses_the_presets", "nemo_topr/training/config.py",
           'presets = [] if config_dir == CONF_DIR.resolve() else',
           'presets = [] if True else',
           ("tests/test_config.py::test_a_users_own_yaml_extends_a_preset_and_a_file_beside_it",),
           "a user's YAML whose defaults name llama31_8b_bf16 fails as \"no config\""),
    Mutant("batch_division_unchecked", "nemo_topr/training/config.py",
           "    if global_batch % step:", "    if False:",
           ("tests/test_config.py::test_a_batch_or_world_that_does_not_divide_stops_train_before_anything_is_written",),
           "train.global_batch_size=3 reaches Bridge's AssertionError traceback after the run directory is set up"),
    Mutant("train_config_word_unexplained", "nemo_topr/training/recipe.py",
           "    if named:\n", "    if False:\n",
           ("tests/test_config.py::test_train_given_a_config_as_a_word_names_the_option",),
           "nemo-topr train tiny_cpu says only 'overrides must be key=value'"),
    Mutant("plan_config_option_abbreviated", "nemo_topr/cluster/plan.py",
           '        if option not in ("--config", "--config-name"):', "        if True:",
           ("tests/test_plan.py::test_the_config_is_taken_as_submit_and_train_spell_it_too",),
           "plan --config X reads X as --config-path and asks for a config"),
    Mutant("nan_baseline_option_accepted", "nemo_topr/arguments.py",
           "    if not math.isfinite(value):\n", "    if False:\n",
           ("tests/test_arguments.py::test_a_baseline_length_or_iteration_out_of_range_is_a_usage_error",),
           "data validate --baseline nan is read without a word (stats refused it)"),
    Mutant("nan_config_value_accepted", "nemo_topr/training/config.py",
           "    if isinstance(value, float) and not math.isfinite(value) and", "    if False and",
           ("tests/test_config.py::test_bad_keys_are_clear_errors",),
           "optimizer.lr=.nan passes plan and submit and queues; the job fails at the optimizer's set-up"),
    Mutant("adam_beta_unbounded", "nemo_topr/training/config.py",
           "    if dotted in UPPER_BOUNDS and", "    if False and",
           ("tests/test_plan.py::test_plan_runs_the_key_type_and_range_checks_of_train",),
           "optimizer.adam_beta2=1.5 queues; TE's FusedAdam (GPUs) checks no beta: the second moment grows "
           "without bound"),
    Mutant("token_ratio_accepted", "nemo_topr/training/config.py",
           '    if objective.ratio_level == "token":', '    if False:',
           ("tests/test_config.py::test_bad_keys_are_clear_errors",),
           "objective.ratio_level=token fails at the first step on every rank"),
    Mutant("baseline_range_unchecked", "nemo_topr/data/positives.py",
           "    if high > 0 and baseline >= high:", "    if high > 0 and baseline > high:",
           ("tests/test_data_cli.py::test_train_refuses_a_baseline_that_gives_every_record_one_sign",),
           "objective.baseline equal to the largest reward (c = 1 with +-1 rewards) trains the best completions on "
           "no signal"),
    Mutant("negative_loss_unprinted", "nemo_topr/training/loss_line.py",
           "        if average >= 0.0:", "        if average >= -1e9:",
           ("tests/test_training_e2e.py::test_the_console_shows_every_iterations_loss_as_tensorboard_has_it",),
           "a negative topr_loss missing from the console, as Bridge's line leaves it out"),
    Mutant("far_start_unwarned", "nemo_topr/training/recipe.py",
           "print_negative_loss(), warn_if_far_from_start(run.objective.weights_use_ratio)])",
           "print_negative_loss()])",
           ("tests/test_training_e2e.py::test_a_new_run_warns_when_mu_is_not_the_starting_models",),
           "records whose behavior_logprob came from a sampler or another model start TOPR with damped negatives "
           "without a word"),
    Mutant("resume_objective_unrecorded", "nemo_topr/training/run_state.py",
           '    settings |= {f"objective.{key}": value for key, value in dataclasses.asdict(objective).items()}\n', "",
           ("tests/test_config.py::test_a_resume_with_another_objective_or_base_model_is_refused",),
           "a resume with objective.baseline or objective.variant changed trains the rest of the run towards another "
           "objective"),
    Mutant("queued_resume_unchecked", "nemo_topr/cluster/submit.py",
           '        if "run_dir" in on_host:\n            seen_as', '        if False:\n            seen_as',
           ("tests/test_slurm.py::"
            "test_submit_into_a_run_says_it_resumes_and_refuses_what_train_would_refuse_at_its_start",),
           "a job resubmitted into a finished run, or with another objective, waits in the queue to fail at its start"),
    Mutant("finished_run_trained_again", "nemo_topr/training/recipe.py",
           "            if step >= total:", "            if False:",
           ("tests/test_training_e2e.py::"
            "test_a_finished_run_run_again_trains_nothing_and_leaves_its_files_as_they_were",),
           "the command run again after its run finished ends in Bridge's 'no samples left' traceback on every rank"),
    Mutant("room_for_a_checkpoint_unchecked", "nemo_topr/training/recipe.py",
           "        check_room(Path(run.container.checkpoint.save), one_checkpoint(run))\n", "",
           ("tests/test_config.py::"
            "test_a_run_dir_that_cannot_hold_one_checkpoint_is_refused_before_anything_is_written",),
           "a run directory that cannot hold one checkpoint trains until its first save fails"),
    Mutant("refused_start_leaves_its_folders", "nemo_topr/training/run_state.py",
           "            remove_if_empty(self.made)\n", "",
           ("tests/test_run_state.py::"
            "test_a_released_lock_removes_the_folders_it_made_while_nothing_was_written_in_them",
            "tests/test_config.py::"
            "test_a_run_dir_that_cannot_hold_one_checkpoint_is_refused_before_anything_is_written"),
           "a start refused before it wrote anything leaves the empty run directory its lock made"),
    Mutant("records_write_on_a_full_disk_unsaid", "nemo_topr/outputs.py",
           "        if not (remedy := filesystem_remedy(error)):\n", "        if True:\n",
           ("tests/test_outputs.py::test_a_full_filesystem_ends_the_command_in_one_line_and_leaves_nothing",),
           "a command's records or results on a full disk end in an OSError traceback, naming no output"),
    Mutant("sample_log_full_disk_unsaid", "nemo_topr/evaluation/sample_log.py",
           "            if not (remedy := filesystem_remedy(error)):\n", "            if True:\n",
           ("tests/test_generate_eval.py::"
            "test_a_sample_log_the_disk_cannot_take_ends_in_one_line_and_the_rerun_resumes",),
           "generate on a full disk says '[Errno 28] No space left on device', naming no file and no resume"),
    Mutant("every_refused_write_told_to_free_space", "nemo_topr/outputs.py",
           "    return FILESYSTEM_REMEDIES.get(error.errno)", "    return FILESYSTEM_REMEDIES.get(error.errno) and "
           "FILESYSTEM_REMEDIES[errno.ENOSPC]",
           ("tests/test_outputs.py::test_a_file_over_the_shells_size_limit_is_named_with_that_limit",
            "tests/test_outputs.py::test_a_quota_or_a_failing_disk_gets_its_own_advice"),
           "over a quota, over `ulimit -f` or on a failing disk the user is told to free space"),
    Mutant("failed_write_leaves_its_folders", "nemo_topr/outputs.py",
           "        if not path.exists():\n            remove_if_empty(made)\n", "",
           ("tests/test_outputs.py::test_a_full_filesystem_ends_the_command_in_one_line_and_leaves_nothing",),
           "an output that could not be written leaves the empty folders made for it"),
    Mutant("full_filesystem_unsaid", "nemo_topr/training/recipe.py",
           '                raise SystemExit(f"nemo-topr train: {hint}") from error', "                raise",
           ("tests/test_config.py::test_a_failed_save_on_a_full_filesystem_ends_with_a_line_that_says_so",),
           "a save that failed for space ends with torch's 'Worker failure', no word of space"),
    Mutant("failed_export_left_behind", "nemo_topr/training/export.py",
           "            shutil.rmtree(partial, ignore_errors=True)\n            if isinstance(",
           "            if isinstance(",
           ("tests/test_export_outputs.py::test_an_export_that_cannot_be_written_is_removed_and_named_in_one_line",),
           "an export that failed for space leaves its partial directory taking the room"),
    Mutant("failed_import_left_behind", "nemo_topr/training/import_checkpoint.py",
           "            _remove_written(out, made)\n", "",
           ("tests/test_checkpoint_route.py::"
            "test_an_import_the_disk_cannot_hold_ends_in_one_line_and_leaves_no_checkpoint",),
           "an import that failed for space leaves a half-written OUT that the next import refuses as non-empty"),
    Mutant("iterate_training_config_unchecked", "nemo_topr/iterate.py",
           "        problems += curation_problems(config.curate, training_config(config.train, Ranks.of(config).total)[1])\n",
           "        pass\n",
           ("tests/test_iterate.py::test_config_mistakes_are_errors",),
           "iterate's config check leaves train.overrides (and the curation's baseline) unchecked"),
    Mutant("scoring_world_unchecked", "nemo_topr/training/scoring.py",
           "    if world_size % (tp * pp):", "    if False:",
           ("tests/test_tensor_parallel.py::"
            "test_a_layout_the_launched_processes_cannot_hold_is_named_before_megatron_starts",),
           "score-logprobs --tp 2 in one process ends in Megatron's traceback on every rank"),
    Mutant("fp8_scored_in_bf16_without_te", "nemo_topr/training/scoring.py",
           "    if train_config:\n        try:\n            check_fp8(", "    if False:\n        try:\n            check_fp8(",
           ("tests/test_gpu_path.py::test_scoring_refuses_a_training_configs_fp8_on_a_gpu_without_te",),
           "--train-config with FP8 on a GPU without TE scores BF16 under the FP8 name"),
    Mutant("model_accepted_as_run_dir", "nemo_topr/training/config.py",
           '    if found.kind != "run":', "    if False:",
           ("tests/test_config.py::test_a_model_given_as_run_dir_is_refused_and_left_as_it_was",),
           "a run writes its checkpoints into the model directory given as run_dir"),
    Mutant("p_tilde_at_the_scalar_baseline", "nemo_topr/training/recipe.py",
           "objective, None if column is None else columns[column])", "objective, None)",
           ("tests/test_config.py::test_the_data_report_says_which_baseline_the_objective_uses",),
           "the data report's p~ takes objective.baseline for asymre and record baselines too"),
    Mutant("negative_rule_advantage_ignored", "nemo_topr/objective.py",
           '    return advantages, (advantages if config.negative_rule == "advantage" else rewards) < 0',
           '    return advantages, rewards < 0',
           ("tests/test_objective.py",), "negative_rule=advantage still splits the sides on the reward"),
    Mutant("curated_at_another_baseline", "nemo_topr/iterate.py",
           "    if curate.baseline is not None and curate.baseline != objective.baseline:", "    if False:",
           ("tests/test_iterate.py::test_target_p_tilde_curates_at_the_baseline_training_uses",),
           "iterate curates to p~ at curate.baseline while training runs at another objective.baseline"),
    Mutant("curated_at_c_zero", "nemo_topr/iterate.py",
           '"--baseline", str(baseline)]', '"--baseline", str(options.baseline or 0.0)]',
           ("tests/test_iterate.py::test_a_round_without_positives_trains_on_its_negatives",),
           "target_p_tilde curates at c = 0 whatever the training's objective.baseline"),
    Mutant("unscored_data_refused_late", "nemo_topr/training/recipe.py",
           "        require_scored(records)  # before", "        pass  # before",
           ("tests/test_config.py::test_train_reports_config_and_data_errors_in_one_line_before_importing_megatron",),
           "unscored data refused only after Megatron's import, with the run directory begun"),
    Mutant("artifacts_written_before_the_data_checks", "nemo_topr/training/recipe.py",
           "        check_room(Path(run.container.checkpoint.save), one_checkpoint(run))\n",
           "        check_room(Path(run.container.checkpoint.save), one_checkpoint(run))\n"
           "        write_hf_artifacts(run.base_model, Path(run.container.checkpoint.save))\n",
           ("tests/test_config.py::test_a_new_run_refused_for_its_data_after_megatrons_import_leaves_no_run_directory",),
           "a new run refused for its data leaves RUN_DIR/checkpoints/hf_artifacts behind"),
    Mutant("train_beyond_the_model_context", "nemo_topr/training/data.py",
           "too_long=self.too_long, model_context=self.model_context)",
           "too_long=self.too_long, model_context=None)",
           (BEYOND_CONTEXT_TEST,),
           "train packs a record longer than the model's max_position_embeddings (unseen RoPE positions)"),
    Mutant("scored_beyond_the_model_context", "nemo_topr/training/scoring.py",
           "model_context=model_source.context_length(source_model.hf_dir))",
           "model_context=None)",
           (BEYOND_CONTEXT_TEST,),
           "score-logprobs scores a record longer than the model's max_position_embeddings"),
    Mutant("model_context_off_by_one", "nemo_topr/data/tokenization.py",
           "        if limit is not None and length > limit:\n",
           "        if limit is not None and length >= limit:\n",
           ("tests/test_data_tokenization.py::"
            "test_a_record_longer_than_the_models_context_is_refused_or_dropped_though_it_fits_a_row",),
           "a record of exactly the model's context (or max_seq_length) is refused"),
    Mutant("hub_id_hint_on_any_typo", "nemo_topr/model_source.py",
           "or Path(text).parent.exists():", "or False:",
           ("tests/test_model_source.py::test_a_hub_id_is_named_as_one_with_how_to_fetch_it",),
           "a mistyped local path under an existing directory is called a possible hub ID"),
    Mutant("stats_p_tilde_at_the_scalar_baseline", "nemo_topr/data/stats.py",
           "        p_tilde = dataset_positive_share(rewards, objective, per_record)\n",
           "        p_tilde = dataset_positive_share(rewards, ObjectiveConfig(baseline=baseline))\n",
           ("tests/test_data_cli.py::"
            "test_p_tilde_is_the_share_the_loss_sees_for_any_rewards_and_the_records_own_baselines",),
           "data stats gives p~ at --baseline for records trained at their own baseline field"),
    Mutant("curated_through_a_closed_form_that_does_not_hold", "nemo_topr/data/curation.py",
           "            _check_closed_form_holds(kept)\n", "            pass\n",
           ("tests/test_data_curation.py::test_target_p_tilde_is_refused_where_its_closed_form_does_not_hold",),
           "curate --target-p-tilde steers non-+-1 rewards (or own baselines) to a share the loss does not see"),
    Mutant("sampled_past_the_model_context", "nemo_topr/evaluation/generate.py",
           "max_new_tokens=budgets[index], num_return_sequences", "max_new_tokens=settings.max_new_tokens, "
           "num_return_sequences", (SAMPLING_CONTEXT_TEST,),
           "generate (transformers) samples past the model's max_position_embeddings"),
    Mutant("full_prompt_refused_after_the_log", "nemo_topr/evaluation/generate.py",
           "    new_token_budgets(args.model, indexed, settings.max_new_tokens, prompt_ids)\n", "",
           (SAMPLING_CONTEXT_TEST,), "a prompt with no room in the context refused only after OUT.samples is begun"),
    Mutant("validate_blind_to_the_model_context", "nemo_topr/data/cli.py",
           "model_context=context_of(args.tokenizer))", "model_context=None)",
           ("tests/test_data_cli.py::test_validate_with_a_models_tokenizer_finds_records_beyond_its_context",),
           "data validate --tokenizer MODEL passes records that score-logprobs and train refuse"),
    Mutant("rendered_prompt_templated_again", "nemo_topr/data/tokenization.py",
           "    if prompts and isinstance(prompts[0], RenderedPrompt):\n"
           "        return _encode(tokenizer, list(prompts), add_special_tokens=False)\n", "",
           ("tests/test_data_tokenization.py::"
            "test_rendered_prompts_are_read_as_written_and_equal_the_template_of_the_plain_prompt",),
           "a rendered prompt gets the chat template and BOS a second time"),
    Mutant("train_drops_the_rendered_prompts_option", "nemo_topr/training/recipe.py",
           'strict=dataset.get("strict", True), **options)', 'strict=dataset.get("strict", True))',
           ("tests/test_config.py::test_rendered_prompts_train_and_score_as_their_plain_text",),
           "nemo-topr train reads its data without the dataset section's source options (rendered_prompts: as plain)"),
    Mutant("plain_prompts_read_as_rendered", "nemo_topr/data/tokenization.py",
           "        if pattern.search(prompt):\n            return None\n", "        return None\n",
           ("tests/test_data_tokenization.py::"
            "test_rendered_prompts_are_read_as_written_and_equal_the_template_of_the_plain_prompt",),
           "rendered_prompts set on plain prompts: trained without chat template or BOS"),
    Mutant("generate_templates_rendered_prompts_again", "nemo_topr/evaluation/generate.py",
           "        if wrong:\n", "        if False:\n",
           ("tests/test_generate_eval.py::"
            "test_rendered_prompts_are_refused_before_sampling_or_sampled_as_written_when_said",),
           "generate samples a rendered prompt file from the template applied twice"),
    Mutant("reference_answer_zero_refused", "nemo_topr/evaluation/generate.py",
           '("reference_answer", not str(answer).strip())', '("reference_answer", not answer)',
           ("tests/test_generate_eval.py::"
            "test_a_prompt_files_numeric_answers_zero_included_and_its_ids_are_read_as_given",),
           "a prompt file's reference answer 0 refused as empty"),
    Mutant("prompt_ids_shared_silently", "nemo_topr/evaluation/generate.py",
           "        if problem.prompt_id in lines_of_ids:", "        if False:",
           ("tests/test_generate_eval.py::"
            "test_a_prompt_files_numeric_answers_zero_included_and_its_ids_are_read_as_given",),
           "two prompts under one prompt_id: one prompt to records, curation and group means"),
    Mutant("records_eval_without_the_empty_samples", "nemo_topr/evaluation/evaluate.py",
           "        if empty_ids[key]:\n", "        if False:\n",
           ("tests/test_generate_eval.py::"
            "test_eval_of_the_samples_records_equals_eval_of_the_samples_empty_completions_included",),
           "eval --records of generate's records leaves empty completions out: pass@k too high"),
    Mutant("iterate_scores_rendered_records_as_plain", "nemo_topr/iterate.py",
           '*(["--rendered-prompts"] if rendered else [])), (scored,), ranks=ranks),', "), (scored,), ranks=ranks),",
           ("tests/test_iterate.py::test_rendered_prompts_reach_every_stage_that_reads_the_records",),
           "iterate's score-logprobs refuses (or templates again) the rendered records generate wrote"),
    Mutant("iterate_trains_rendered_records_as_plain", "nemo_topr/iterate.py",
           '*(["dataset.rendered_prompts=true"] if rendered else []),', "",
           ("tests/test_iterate.py::test_rendered_prompts_reach_every_stage_that_reads_the_records",),
           "iterate's train refuses the rendered records generate wrote"),
    Mutant("generate_drops_the_rendered_prompts_option", "nemo_topr/evaluation/generate.py",
           "jsonl_problems(source, task, rendered_prompts)", "jsonl_problems(source, task)",
           ("tests/test_generate_eval.py::"
            "test_rendered_prompts_are_refused_before_sampling_or_sampled_as_written_when_said",),
           "generate --rendered-prompts reads the prompts as plain text"),
    Mutant("prompt_file_messages_unchecked", "nemo_topr/evaluation/generate.py",
           "            check_messages(path, number, prompt)\n", "            pass\n",
           ("tests/test_generate_eval.py::test_a_prompt_files_bad_row_is_named_by_line_and_field",),
           "a prompt file's message without role or content reaches the chat template"),
    Mutant("iterate_summary_counts_records_not_samples", "nemo_topr/iterate.py",
           "    if log_path(graded).is_file():\n", "    if False:\n",
           ("tests/test_iterate.py::test_the_summary_counts_every_sample_drawn_empty_and_grader_failed_ones_included",
            "tests/test_iterate.py::test_a_round_that_generated_no_records_is_skipped_and_counted"),
           "iterate's summary leaves empty completions and grader errors out of the samples"),
    Mutant("verifier_judges_the_whole_rendering", "nemo_topr/evaluation/verifier.py",
           "        text = turns[-1] if turns else prompt.removeprefix(\"<|begin_of_text|>\")\n",
           "        text = prompt\n",
           ("tests/test_verifier.py::test_a_prompt_rendered_by_the_chat_template_is_judged_as_its_plain_problem",),
           "a rendered prompt's special tokens and template text land in the judge prompt"),
    Mutant("verifier_lets_special_tokens_through", "nemo_topr/evaluation/verifier.py",
           "        if match := LLAMA3_SPECIAL_TOKEN.search(text):\n", "        if match := None:\n",
           ("tests/test_verifier.py::"
            "test_build_and_score_refuse_special_tokens_the_judge_prompt_would_hold_naming_row_and_field",),
           "verifier score reads special tokens inside the judge's turn; train refuses the judge data"),
    Mutant("prompts_without_records_unsaid", "nemo_topr/evaluation/generate.py",
           "    if not missing:\n", "    if True:\n",
           ("tests/test_generate_eval.py::test_a_prompt_left_without_records_is_named_where_the_records_are_written",),
           "a prompt whose samples are all empty leaves the records, and eval --records' metrics, without a word"),
    Mutant("scoring_ends_the_callers_world", "nemo_topr/training/scoring.py",
           "    if made_the_world:\n", "    if True:\n",
           ("tests/test_distributed.py::test_score_logprobs_leaves_no_process_group_behind_and_a_callers_own_in_place",),
           "score-logprobs called in a process with a world destroys it (a pytest worker's session world)"),
    Mutant("batch_size_zero_accepted", "nemo_topr/arguments.py",
           "    if value < 1:\n", "    if value < 0:\n",
           ("tests/test_arguments.py",),
           "verifier score --batch-size 0 or score-logprobs --rows-per-batch 0 ends in a traceback"),
    Mutant("too_long_any_word_drops", "nemo_topr/training/data.py",
           "    too_long: TooLong | None = None", "    too_long: str | None = None",
           ("tests/test_config.py::test_bad_keys_are_clear_errors",),
           "dataset.too_long=foo (or Error) passes the config check and drops over-long records"),
    Mutant("tokenize_too_long_unchecked", "nemo_topr/data/tokenization.py",
           "    if too_long not in get_args(TooLong):", "    if False:",
           ("tests/test_data_tokenization.py::test_too_long_sequences_raise_or_are_counted",),
           "tokenize_records(too_long='Error') drops over-long records"),
    Mutant("batch_division_reads_unchecked_sizes", "nemo_topr/training/config.py",
           '    _check_value(f"{name}.{key}", value, int)\n', "",
           ("tests/test_config.py::test_a_batch_or_world_that_does_not_divide_stops_train_before_anything_is_written",),
           "train.global_batch_size=abc ends nemo-topr train in a TypeError traceback"),
    Mutant("export_iteration_named_twice", "nemo_topr/training/export.py",
           "    if at or source.path == source.checkpoint:", "    if at:",
           ("tests/test_export_outputs.py::test_an_iteration_named_twice_is_refused_not_one_of_the_two_dropped",),
           "export --ckpt CKPT/iter_N --all-iterations exports every iteration, not N, without a word"),
    Mutant("iterate_sampling_options_unchecked", "nemo_topr/iterate.py",
           "    problems += sampling_problems(config, eval_benchmark_known=config.eval.benchmark in EVAL_BENCHMARKS)\n",
           "",
           ("tests/test_iterate.py::test_config_mistakes_are_errors",),
           "iterate passes generate.num_samples=0 or a misspelt generate.args flag to a stage that fails rounds later"),
    Mutant("iterate_prompts_read_late", "nemo_topr/iterate.py",
           '    commands = [("generate", generate.build_parser(), prompts, read_prompts)]',
           '    commands = [("generate", generate.build_parser(), prompts, lambda args: None)]',
           ("tests/test_iterate.py::test_config_mistakes_are_errors",),
           "iterate finds a missing prompt file only at round 0's generate, after the start's eval"),
    Mutant("sbatch_values_unquoted", "nemo_topr/cluster/submit.py",
           """    return f'"{text}"' if any(c.isspace() for c in text) else text""", "    return text",
           ("tests/test_slurm_cluster.py::test_a_job_name_and_run_directory_with_spaces_reach_sbatch_whole",),
           "submit --job-name 'a b' writes an #SBATCH line sbatch refuses"),
    Mutant("submit_zero_nodes_rendered", "nemo_topr/cluster/submit.py",
           '    parser.add_argument("--nodes", type=at_least_one, default=1)',
           '    parser.add_argument("--nodes", type=int, default=1)',
           ("tests/test_slurm.py::test_submit_refuses_a_count_below_one_before_rendering",),
           "submit --nodes 0 renders #SBATCH --nodes=0 and passes the layout checks"),
    Mutant("verifier_unsigned_grades_read_correct", "nemo_topr/evaluation/verifier.py",
           "    loaded = load_records(args.graded)\n    require_signed_grades(loaded, ALL_JUDGED_CORRECT)\n",
           "    loaded = load_records(args.graded)\n",
           ("tests/test_verifier.py::test_grades_without_a_negative_are_refused_not_all_judged_correct",),
           "verifier build on 0/1 grades judges every wrong answer correct (Yes +1)"),
    Mutant("curate_anna_karenina_on_unsigned_grades", "nemo_topr/data/cli.py",
           "    if args.anna_karenina:\n", "    if False:\n",
           ("tests/test_data_cli.py::test_curate_refuses_anna_karenina_on_zero_one_grades_and_warns_of_them",),
           "data curate --anna-karenina on 0/1 grades keeps each prompt's first record, right or wrong"),
    Mutant("plot_mixes_tasks", "nemo_topr/evaluation/evaluate.py",
           '    if len({result["task"] for result in results}) > 1:', "    if False:",
           ("tests/test_generate_eval.py::test_plot_refuses_what_it_cannot_draw_naming_the_file",),
           "eval --plot draws GSM8K and MATH results as one line, titled by the first"),
    Mutant("plot_name_without_format", "nemo_topr/evaluation/evaluate.py",
           "    if args.plot and args.out.suffix[1:].lower() not in PLOT_FORMATS:", "    if False:",
           ("tests/test_generate_eval.py::test_plot_refuses_what_it_cannot_draw_naming_the_file",),
           "eval --plot --out rounds says it wrote rounds; matplotlib wrote rounds.png"),
    Mutant("doctor_timeout_unchecked", "nemo_topr/doctor.py",
           'parser.add_argument("--timeout", type=positive_seconds,', 'parser.add_argument("--timeout", type=float,',
           ("tests/test_arguments.py::test_a_doctor_time_limit_not_above_zero_is_a_usage_error_before_any_check",),
           "doctor --timeout 0 builds its model, then fails every check"),
    Mutant("grader_error_rate_unchecked", "nemo_topr/evaluation/generate.py",
           'parser.add_argument("--max-grader-error-rate", type=share,',
           'parser.add_argument("--max-grader-error-rate", type=float,',
           ("tests/test_arguments.py::test_a_grader_error_rate_outside_zero_to_one_is_a_usage_error_before_sampling",),
           "--max-grader-error-rate -1 samples everything, then fails on an IndexError"),
    Mutant("plain_process_port_chosen_ahead", "nemo_topr/distributed.py",
           '    environ.setdefault("MASTER_PORT", "0")', '    environ.setdefault("MASTER_PORT", str(free_port()))',
           ("tests/test_distributed.py::test_a_plain_process_world_of_one_needs_no_port_chosen_ahead",),
           "a plain train picks a free port that another process can take before torch's store binds it"),
    Mutant("submit_run_dir_override_apart", "nemo_topr/cluster/submit.py",
           "    if from_override and from_override != {run_dir}:", "    if False:",
           ("tests/test_slurm.py::test_submit_and_the_job_script_keep_one_run_dir",),
           "submit --run-dir A run_dir=B: the job watches A for the requeue marker, train writes B"),
    Mutant("job_script_takes_run_dir_override", "slurm/topr_job.sh",
           "    if [[ $override =~ ^\\+{0,2}run_dir= ]]; then", "    if false; then",
           ("tests/test_slurm.py::test_submit_and_the_job_script_keep_one_run_dir",),
           "sbatch slurm/llama31_8b.sbatch run_dir=B: train writes B, the job script watches runs/JOB"),
    Mutant("records_regraded_for_another_task", "nemo_topr/evaluation/evaluate.py",
           '        if task and meta.get("task") not in (None, task):', "        if False:",
           ("tests/test_generate_eval.py::test_records_eval_grades_each_record_for_its_own_task",),
           "eval --records --task math re-grades GSM8K samples with MATH's grader"),
    Mutant("empty_stop_string_sampled", "nemo_topr/evaluation/generate.py",
           '    if args.stop and "" in args.stop:', "    if False:",
           ("tests/test_generate_eval.py::test_sampling_options_are_checked_before_the_model_loads",),
           "generate --stop '' samples every completion empty"),
    Mutant("config_file_read_as_preset", "nemo_topr/training/config.py",
           '    if path.suffix == ".yaml" and not (directory / path.name).is_file():', "    if False:",
           ("tests/test_config.py::test_a_users_own_yaml_extends_a_preset_and_a_file_beside_it",),
           "train --config-name exp3.yaml (no such file here) looked up as the preset 'exp3'"),
    Mutant("submit_ignores_own_run_dir", "nemo_topr/cluster/submit.py",
           "    if run_dir is None and config_dir != CONF_DIR.resolve():", "    if False:",
           ("tests/test_slurm.py::test_submit_takes_the_run_dir_a_users_yaml_sets",),
           "submit --config my.yaml replaces the run_dir the file sets with runs/JOB_NAME"),
    Mutant("config_interpolation_unnamed", "nemo_topr/training/config.py",
           "        OmegaConf.to_container(cfg, resolve=True)  # a failing interpolation named by its key, as "
           "resolve() does not", "",
           ("tests/test_config.py::test_a_yaml_that_does_not_parse_or_a_failing_interpolation_is_one_line_naming_"
            "file_and_key",), "a failing interpolation's error names no key"),
    Mutant("benchmark_rows_unchecked", "nemo_topr/data/prompts.py",
           "        if not isinstance(row.get(column), str) or not row[column].strip():", "        if False:",
           ("tests/test_data_prompts.py::test_a_users_benchmark_file_is_read_row_by_row_naming_file_line_and_field",),
           "a user's benchmark row without a question read until a KeyError"),
    Mutant("json_key_twice_read_as_last", "nemo_topr/data/sources.py",
           ', object_pairs_hook=_object_of_distinct_keys)', ")",
           ("tests/test_data_records.py::test_a_key_given_twice_with_different_values_is_refused_not_read_as_"
            "the_last",),
           "a record giving reward twice read as the last value"),
    Mutant("hf_config_sizes_unchecked", "nemo_topr/cluster/architecture.py",
           "    if problems:\n        raise ValueError(f\"{config_json}:", "    if False:\n        raise ValueError(f\"{config_json}:",
           ("tests/test_plan.py::test_a_config_json_without_a_size_or_with_a_text_one_is_named_not_a_traceback",),
           "plan on a config.json without num_attention_heads: a KeyError traceback"),
    Mutant("submit_venv_unchecked", "nemo_topr/cluster/submit.py",
           "        venv_problems, warnings = check_venv(job.venv, cfg)", "        venv_problems = []",
           ("tests/test_slurm.py::test_submit_checks_the_venv_the_ranks_run_before_queueing",),
           "submit --venv of a vLLM venv, or FP8 without TE there, queued"),
    Mutant("stdout_noise_kept", "nemo_topr/quiet.py",
           '                if verbose or not HARMLESS_STDOUT_LINES.match(line.decode("utf-8", "replace")):',
           "                if True:",
           ("tests/test_quiet.py::test_a_verbs_stdout_holds_its_result_and_the_rest_goes_to_stderr_less_known_noise",),
           "Gloo's lines on a verb's stderr"),
    Mutant("scoring_stdout_mixed", "nemo_topr/training/scoring.py",
           "        with stdout_to_stderr():  # stdout: the JSON summary alone",
           "        with torch.no_grad():  # stdout: the JSON summary alone",
           ("tests/test_cpu_runtime.py::test_cpu_scoring_on_a_node_with_te_and_apex_installed_never_imports_them",),
           "score-logprobs' JSON summary after Gloo's lines on stdout"),
    Mutant("import_stdout_mixed", "nemo_topr/training/import_checkpoint.py",
           "        with stdout_to_stderr():  # progress and", "        if True:  # progress and",
           ("tests/test_checkpoint_route.py::"
            "test_import_writes_a_complete_checkpoint_that_exports_back_to_the_same_weights",),
           "import's result line after 24 Gloo lines and Megatron's prints on stdout"),
    Mutant("no_stop_gives_the_tasks", "nemo_topr/evaluation/generate.py",
           'stops.add_argument("--no-stop", dest="stop", action="store_const", const=[],',
           'stops.add_argument("--no-stop", dest="stop", action="store_const", const=None,',
           ("tests/test_generate_devices.py::test_stop_strings_are_the_tasks_the_given_ones_or_none",),
           "generate --no-stop still stops GSM8K samples at '\\n\\nQuestion:'"),
    Mutant("zero_advantage_trained", "nemo_topr/training/recipe.py",
           "    if p_tilde is None:  # every c", "    if False:  # every c",
           ("tests/test_config.py::test_data_whose_every_advantage_is_zero_is_refused_before_the_run_directory",),
           "records whose rewards equal their own baselines train every iteration at loss 0 and exit 0"),
    Mutant("zero_advantage_warning_missing", "nemo_topr/data/cli.py",
           "    if every_advantage_zero(rewards,", "    if False and every_advantage_zero(rewards,",
           ("tests/test_data_cli.py::test_data_validate_warns_when_every_advantage_is_zero",),
           "data validate on 0/1 grades with none correct says nothing"),
    Mutant("cpu_train_config_unread", "nemo_topr/training/scoring.py",
           '    if train_config and device != "cuda":  # read all the same', '    if False:  # read all the same',
           ("tests/test_gpu_path.py::test_scoring_flags_that_contradict_the_training_config_are_refused",),
           "score-logprobs --device cpu --train-config llama31_8b_bf61 scores; the GPU run fails on the typo"),
    Mutant("file_named_twice_read_twice", "nemo_topr/data/sources.py",
           "        if key in read_as:", "        if False:",
           ("tests/test_data_sources.py::test_a_file_named_twice_is_refused_naming_both_spellings",),
           "data validate a.jsonl d/ says 'duplicate sample_id ... first at a.jsonl:1', the same line"),
    Mutant("per_prompt_without_target_ignored", "nemo_topr/data/curation.py",
           "        if self.per_prompt and self.target_p is None", "        if False and self.target_p is None",
           ("tests/test_data_curation.py::test_per_prompt_without_a_target_is_refused_not_ignored",),
           "data curate --per-prompt without a target writes every record, as without it"),
    Mutant("version_unknown_verb", "nemo_topr/cli.py",
           '    if argv[0] == "--version":', '    if argv[0] == "--versions":',
           ("tests/test_cli.py",),
           "nemo-topr --version says unknown verb '--version'"),
    Mutant("all_zero_grades_read_correct", "nemo_topr/data/positives.py",
           "    if values == {0.0}:", "    if False:",
           ("tests/test_verifier.py::test_grades_without_a_negative_are_refused_not_all_judged_correct",),
           "verifier build on 0/1 grades with none correct writes judge data saying Yes to every wrong answer"),
    Mutant("sampling_seed_unchecked", "nemo_topr/evaluation/generate.py",
           "    if not 0 <= args.seed < 2**63:", "    if False:",
           ("tests/test_generate_eval.py::test_sampling_options_are_checked_before_the_model_loads",),
           "generate --seed -1 sampled with a fixed seed -1"),
    Mutant("unreadable_reference_read_late", "nemo_topr/grading.py",
           "        grader_of(task).reference(reference_answer)", "        grader_of(task)",
           ("tests/test_generate_eval.py::test_a_prompt_files_bad_row_is_named_by_line_and_field",
            "tests/test_generate_eval.py::test_records_eval_grades_each_record_for_its_own_task"),
           "generate samples every prompt, then fails on a GSM8K reference without a number"),
    Mutant("iterate_train_in_one_process", "nemo_topr/iterate.py",
           '(run_dir,), overwrite=False, ranks=ranks)', '(run_dir,), overwrite=False)',
           ("tests/test_iterate.py::test_overrides_may_follow_dry_run",),
           "iterate nproc_per_node=8 trains in one process: a TP=2 preset cannot start"),
    Mutant("iterate_launcher_ignores_ranks", "nemo_topr/iterate.py",
           '*(torchrun if self.per_node > 1 else [])', '*(torchrun if False else [])',
           ("tests/test_iterate.py::test_score_and_train_stages_run_in_two_ranks_under_torchrun",),
           "iterate says torchrun but runs score and train in one process"),
    Mutant("iterate_ranks_beyond_gpus", "nemo_topr/iterate.py",
           "            check_launch(self.config)\n", "            pass\n",
           ("tests/test_iterate.py::test_more_ranks_than_the_nodes_gpus_are_refused_before_any_stage",),
           "iterate nproc_per_node=8 on a 4-GPU node fails round 0's score after the start's eval and generation"),
    Mutant("iterate_verified_vote_over_fewer_problems", "nemo_topr/iterate.py",
           '    return vote["metrics"][f"weighted_maj@{k}"] * vote["num_problems"] / results["num_problems"]',
           '    return vote["metrics"][f"weighted_maj@{k}"]',
           ("tests/test_iterate.py::test_a_verifier_scores_every_evaluation_and_the_round_reports_its_weighted_vote",),
           "iterate's weighted vote leaves out the problems whose samples were all empty: a higher share than eval's"),
    Mutant("iterate_verifier_on_no_samples", "nemo_topr/iterate.py",
           "        if stage.is_done() and samples.is_file() and not read_graded(samples):", "        if False:",
           ("tests/test_iterate.py::test_a_verifier_scores_every_evaluation_and_the_round_reports_its_weighted_vote",),
           "iterate with a verifier fails at verify when every completion of an evaluation was empty"),
    Mutant("iterate_plots_verified_over_fewer_problems", "nemo_topr/iterate.py",
           "        return verified if num_problems(verified) == num_problems(results) else results",
           "        return verified",
           ("tests/test_iterate.py::test_a_verifier_scores_every_evaluation_and_the_round_reports_its_weighted_vote",),
           "iterate's plot draws pass@1 of the verified results, over fewer problems than eval's"),
    Mutant("iterate_nodes_without_allocation", "nemo_topr/iterate.py",
           "    if config.nodes == 1:\n        return\n", "    return\n",
           ("tests/test_iterate.py::test_several_nodes_need_an_allocation_of_them",),
           "iterate nodes=2 outside a Slurm allocation fails round 0's score (srun) after the start's eval"),
    Mutant("iterate_nodes_meet_without_rendezvous", "nemo_topr/iterate.py",
           "        if self.nodes == 1:\n            return {}\n", "        return {}\n",
           ("tests/test_iterate.py::test_a_stage_on_several_nodes_meets_at_the_allocations_first_node",),
           "iterate nodes=2: srun starts the ranks with no MASTER_ADDR, and score fails to meet"),
    Mutant("iterate_nodes_batch_checked_for_one", "nemo_topr/iterate.py",
           "        return cls(config.nproc_per_node, config.nodes)", "        return cls(config.nproc_per_node, 1)",
           ("tests/test_iterate.py::test_config_mistakes_are_errors",
            "tests/test_iterate.py::test_on_several_nodes_score_and_train_run_under_srun_and_the_rest_on_the_drivers_node"),
           "iterate nodes=2 runs score and train on one node, its batch checked for one node's ranks"),
    Mutant("empty_sample_log_blocks_rerun", "nemo_topr/evaluation/sample_log.py",
           "        if logged != options and len(lines) <= 1:", "        if False:",
           ("tests/test_generate_eval.py::test_a_sample_log_without_a_finished_prompt_starts_over_with_other_options",),
           "a generate that failed at start-up leaves a log that refuses the corrected rerun"),
    Mutant("sampling_tp_checked_after_log", "nemo_topr/evaluation/generate.py",
           '    if args.tensor_parallel_size != 1 and choose_backend(args.backend, args.device) == "transformers":',
           "    if False:",
           ("tests/test_generate_devices.py::test_tensor_parallel_needs_vllm",),
           "generate --tensor-parallel-size 4 on the transformers backend logs the size before refusing it"),
    Mutant("iterate_evaluates_rendered_prompts_as_plain", "nemo_topr/iterate.py",
           '                    *(["--rendered-prompts"] if self.rendered_prompts else [])]',
           "                    ]",
           ("tests/test_iterate.py::test_rendered_prompts_reach_every_stage_that_reads_the_records",),
           "iterate's eval templates an eval.prompts file of rendered prompts a second time"),
    Mutant("iterate_eval_rendered_without_prompts", "nemo_topr/iterate.py",
           "    if config.eval.rendered_prompts and not config.eval.prompts:", "    if False:",
           ("tests/test_iterate.py::test_config_mistakes_are_errors",),
           "iterate eval.rendered_prompts=true without eval.prompts: ignored without a word"),
    Mutant("eval_records_ignores_samples_out", "nemo_topr/evaluation/evaluate.py",
           '    for option, given in (("--model", args.model), ("--samples-out", args.samples_out)):',
           "    for option, given in ():",
           ("tests/test_generate_eval.py::test_eval_refuses_options_its_mode_would_ignore",),
           "eval --records r.jsonl --samples-out s.jsonl: runs, and writes no samples"),
    Mutant("iterate_eval_prompt_form_unsaid", "nemo_topr/iterate.py",
           "        if note := eval_prompt_note(self.config):", "        if note := None:",
           ("tests/test_iterate.py::test_rounds_trained_in_one_prompt_form_and_measured_in_another_are_named",),
           "iterate trains on zero-shot prompts and measures 8-shot without a word"),
    Mutant("plot_draws_every_metric", "nemo_topr/evaluation/evaluate.py",
           '        names = [name for name in ("pass@1", f"maj@{k}", f"weighted_maj@{k}", "invalid_rate") if name in common]',
           "        names = common",
           ("tests/test_generate_eval.py::test_the_plot_draws_the_headline_metrics_unless_told_otherwise",),
           "eval --plot of 16-sample rounds draws 11 lines"),
    Mutant("iterate_verifier_never_runs", "nemo_topr/iterate.py",
           "        if self.verifier_model is None:\n            return None\n",
           "        if True:\n            return None\n",
           ("tests/test_iterate.py::test_a_verifier_scores_every_evaluation_and_the_round_reports_its_weighted_vote",),
           "iterate verifier.model=DIR: no sample is scored, and no weighted vote reported, without a word"),
    Mutant("iterate_reports_the_unverified_results", "nemo_topr/iterate.py",
           "[summary_row(result, verified=self.verifier_model is not None) for",
           "[summary_row(result, verified=False) for",
           ("tests/test_iterate.py::test_a_verifier_scores_every_evaluation_and_the_round_reports_its_weighted_vote",),
           "iterate scores the samples with the verifier, but the summary leaves its vote out"),
    # the harness itself
    Mutant("workers_import_another_checkout", "tests/conftest.py",
           'env = checkout_env(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")',
           'env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}',
           ("tests/test_harness.py",), "torchrun workers import the venv's editable install, not the checkout"),
)


def copy_checkout(destination: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_file() and not source.is_symlink():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    (destination / ".venv").symlink_to((REPO / ".venv").resolve())


def run_tests(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[bool, float, str]:
    """(passed, seconds, output tail) of pytest on `tests` in `copy`; a time-out is not a pass, and its
    output says so (a mutant caught only by a hang is reported as such, not as a failed assertion)."""
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                              cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        passed, output = proc.returncode == 0, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        passed, output = False, f"timed out after {timeout} s"
    return passed, time.monotonic() - start, output[-2000:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants only")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per mutant's pytest run")
    # the unmutated run is every mutant's tests at once: 66 mutants' tests ran past 900 s on 2026-11-28
    parser.add_argument("--unmutated-timeout", type=float, default=3600, help="seconds for the unmutated run")
    args = parser.parse_args(argv)
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.only and len(mutants) != len(args.only):
        parser.error(f"unknown mutants: {sorted(set(args.only) - {m.name for m in MUTANTS})}")
    if args.list:
        for m in mutants:
            print(f"{m.name:38} {m.path:36} {m.bug}")
        return 0

    with tempfile.TemporaryDirectory(prefix="nemo_topr_mutants_") as scratch:
        copy = Path(scratch) / "repo"
        copy_checkout(copy)
        for m in MUTANTS:  # every snippet, not only those run, still matches exactly once
            count = (copy / m.path).read_text().count(m.old)
            if count != 1:
                raise SystemExit(f"mutant {m.name}: {m.path} holds its snippet {count} times (expected once)")
        tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
        passed, seconds, output = run_tests(copy, tests, args.unmutated_timeout)
        print(f"unmutated: {'pass' if passed else 'FAIL'} ({seconds:.0f} s)", flush=True)
        if not passed:
            raise SystemExit(f"the named tests fail without any mutant:\n{output}")
        results = []
        for m in mutants:
            target = copy / m.path
            original = target.read_text()
            target.write_text(original.replace(m.old, m.new))
            try:
                survived, seconds, output = run_tests(copy, m.tests, args.timeout)
            finally:
                target.write_text(original)
            timed_out = output.startswith("timed out")
            results.append({"name": m.name, "path": m.path, "bug": m.bug, "tests": list(m.tests),
                            "caught": not survived, "timed_out": timed_out, "seconds": round(seconds, 1)})
            verdict = "SURVIVED" if survived else "TIMEOUT " if timed_out else "caught  "
            print(f"{verdict} {m.name:38} {seconds:5.0f} s  {m.bug}", flush=True)
    caught = sum(r["caught"] for r in results)
    timeouts = sum(r["timed_out"] for r in results)
    print(f"score: {caught} of {len(results)} caught" + (f" ({timeouts} only by a time-out)" if timeouts else ""))
    if args.out:
        args.out.write_text(json.dumps({"caught": caught, "mutants": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
