"""The mutants of `scripts/mutation_check.py`: plausible bugs in what a TOPR run's meaning rests on.

Each is keyed to a definition and an AST pattern inside it (`scripts/mutation_locator.py`), never
to a file or a line, and names the pytest marker of the tests that must catch it: `guards_<concern>`,
registered in pyproject.toml and put on those tests as one-line decorators. The concerns:

    guards_objective      the TOPR loss: reward sign, truncation min(rho, 1), ratio level, normalisation
    guards_baselines      which baseline c each sequence gets in the training step
    guards_packing        the packed layout: labels, loss mask, positions, THD cu_seqlens, the mask
    guards_sample_ledger  the ledger of trained samples, cut back to the checkpoint a resume loads
    guards_data_order     the seeded row order that a resume continues with exactly the unseen rows
    guards_resume         the resume fingerprint and the choice of the checkpoint to resume from
    guards_job_script     slurm/topr_job.sh after srun: requeue a stop or the warning, fail a failed rank;
                          a rank holding the warning dies of it, so that srun's status says warning
    guards_preemption     the warning (SIGUSR1) held through start-up, then a checkpoint and STOPPED
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    scope: str | None  # Python: qualified name; shell: function name, None for the whole script
    pattern: str  # Python: an expression or statement (wildcards _1.._9); shell: words
    replacement: str
    marker: str  # the pytest marker of the tests that must catch it
    bug: str  # the real bug it stands for
    shell: bool = False


def py(name: str, scope: str, pattern: str, replacement: str, marker: str, bug: str) -> Mutant:
    return Mutant(name, scope, pattern, replacement, marker, bug)


def sh(name: str, scope: str | None, pattern: str, replacement: str, marker: str, bug: str) -> Mutant:
    return Mutant(name, scope, pattern, replacement, marker, bug, shell=True)


OBJECTIVE, BASELINES, PACKING = "guards_objective", "guards_baselines", "guards_packing"
LEDGER, ORDER, RESUME = "guards_sample_ledger", "guards_data_order", "guards_resume"
JOB, PREEMPTION = "guards_job_script", "guards_preemption"

MUTANTS = (
    # the objective
    py("zero_reward_is_negative", "_advantages", "_1 < 0", "_1 <= 0", OBJECTIVE,
       "R = 0 treated as a negative (tapered) sample"),
    py("negative_rule_ignored", "_advantages", 'advantages if config.negative_rule == "advantage" else rewards',
       "rewards", OBJECTIVE, "negative_rule=advantage still splits the sides on the reward's sign"),
    py("topr_negatives_untruncated", "_VARIANT_BOUNDS", "(1.0, 1.0, 0.0, 1.0)", "(1.0, 1.0, 0.0, math.inf)",
       OBJECTIVE, "TOPR's negative weight min(rho, 1) without its upper bound"),
    py("negatives_clamped_with_the_positive_bounds", "_tapered_weights",
       "log_ratio.clamp(_log(neg_lower), _log(neg_upper))", "log_ratio.clamp(_log(pos_lower), _log(pos_upper))",
       OBJECTIVE, "negatives weighted by the positives' bounds (TOPR: every negative at weight 1)"),
    py("weights_carry_gradient", "policy_loss", "_tapered_weights(log_ratio.detach(), negative, config)",
       "_tapered_weights(log_ratio, negative, config)", OBJECTIVE,
       "the importance weight not detached: gradient flows through rho"),
    py("sequence_ratio_as_geometric_mean", "_log_ratio", '_1 / lengths if ratio_level == "geometric_mean" else _1',
       "_1 / lengths", OBJECTIVE, "the sequence-level ratio divided by the length (the geometric mean)"),
    py("token_ratio_weights_averaged", "policy_loss", "advantages * (weights * logprobs).sum(-1)",
       "advantages * weights.mean(-1) * logprobs.sum(-1)", OBJECTIVE,
       "token-level ratios averaged over the sequence instead of weighting each token"),
    py("per_token_mu_summed_over_padding", "_log_ratio", "torch.where(mask, behavior_logprobs, 0.0).sum(-1)",
       "behavior_logprobs.sum(-1)", OBJECTIVE, "per-token log mu summed over padding positions too"),
    py("sequence_mean_by_mean_length", "policy_loss", "-(objective / lengths).mean()",
       "-objective.mean() / lengths.mean()", OBJECTIVE, "sequence_mean normalised by the batch's mean length"),
    py("token_sum_normalised_by_length", "policy_loss", "-objective.mean()", "-(objective / lengths).mean()",
       OBJECTIVE, "token_sum (the paper's log pi(tau)) divided by each completion's length"),
    py("batch_token_mean_by_sequences", "policy_loss", "-objective.sum() / lengths.sum()",
       "-objective.sum() / len(lengths)", OBJECTIVE, "batch_token_mean divided by the sequences, not the tokens"),
    py("baseline_ignored", "_advantages", "advantages = rewards - c", "advantages = rewards", OBJECTIVE,
       "the advantage taken as R, whatever the baseline c"),
    py("asymre_delta_v_dropped", "_advantages", '_1 + config.asymre_delta_v if config.variant == "asymre" else _1',
       "_1", OBJECTIVE, "AsymRE's deltaV left out of its baseline"),
    # the training step's baselines
    py("record_baselines_ignored", "baseline_source", "record_baselines", "False", BASELINES,
       "the records' own baselines replaced by the group mean or the scalar"),
    py("group_mean_leaves_one_out", "group_mean_rewards", "math.fsum(values) / len(values)",
       "math.fsum(values[1:]) / max(len(values) - 1, 1)", BASELINES,
       "AsymRE's whole-group mean computed without one sample"),
    py("rewards_paired_with_other_sequences", "topr_loss", 'batch["rewards"]', 'batch["rewards"].flip(0)', BASELINES,
       "rewards paired with the wrong sequences in the loss"),
    # packing and cu_seqlens
    py("labels_not_shifted", "collate_packed", "ids[1:]", "ids[:-1]", PACKING,
       "each position trained to predict itself"),
    py("loss_mask_not_shifted", "collate_packed", "seq.loss_mask[1:]", "seq.loss_mask[:-1]", PACKING,
       "the loss mask on the input token, not on the label it predicts"),
    py("positions_run_on_across_sequences", "collate_packed", "torch.arange(n)", "torch.arange(start, end)",
       PACKING, "position ids of a packed sequence continue from the previous one"),
    py("best_fit_overfills_a_row", "best_fit_rows", "bisect.bisect_left(room_and_row, (lengths[i], -1))",
       "bisect.bisect_left(room_and_row, (lengths[i] - 1, -1))", PACKING,
       "a sequence packed into a row one token short of room"),
    py("cu_seqlens_without_the_end", "thd_cu_seqlens", "sorted(starts | {rows * length})", "sorted(starts)",
       PACKING, "cu_seqlens without the stream's end: the last segment is dropped from THD attention"),
    py("cu_seqlens_without_padding_tails", "thd_cu_seqlens", "starts |= {e for e in ends if e % length}", "pass",
       PACKING, "a row's padding tail joins its last sequence's THD segment"),
    py("packed_mask_not_causal", "packed_attention_mask", "same_block & own_or_shared & causal",
       "same_block & own_or_shared", PACKING, "the local path's packed mask lets a token see later tokens"),
    # the sample ledger and the data order
    py("ledger_keeps_the_resumed_iteration", "truncate_ledgers", 'json.loads(line)["iteration"] < resume_iteration',
       'json.loads(line)["iteration"] <= resume_iteration', LEDGER,
       "a resume keeps the ledger lines of the iteration it trains again (samples logged twice)"),
    py("ledger_numbers_the_next_iteration", "ToprForwardStep._log_samples", "int(state.train_state.step)",
       "int(state.train_state.step) + 1", LEDGER,
       "ledger lines numbered one iteration late: a resume cuts back the wrong lines"),
    py("every_chunk_logs_the_samples", "is_first_model_chunk", "get_model_chunk_vp_stage(model) in (None, 0)",
       "True", LEDGER, "with virtual pipelining every micro-batch is logged once per model chunk"),
    py("unseeded_shuffle", "epoch_orders", "random.Random(seed + epoch).shuffle(order)",
       "random.shuffle(order)", ORDER, "a row order that differs per process: a resume trains other rows"),
    # the resume fingerprint and the checkpoint resumed from
    py("fingerprint_blind_to_rewards", "SequenceTable.digest", "fields(self)",
       "[f for f in fields(self) if f.name != 'rewards']", RESUME,
       "a resume onto data with other rewards is accepted"),
    py("fingerprint_blind_to_the_order", "rows_digest", "members.astype('<i8').tobytes()",
       "np.sort(members).astype('<i8').tobytes()", RESUME,
       "a resume onto another row order is accepted"),
    py("resume_compared_on_a_fresh_start", "check_resume", "not resuming or not path.is_file()",
       "not path.is_file()", RESUME, "a fresh start of a run directory is refused over the previous run's record"),
    py("changed_settings_accepted", "_setting_changes", "meant(key, before[key]) != meant(key, value)", "False",
       RESUME, "a resume with another learning rate or schedule is accepted"),
    py("repair_to_the_oldest_checkpoint", "ensure_latest_complete", "complete[-1]", "complete[0]", RESUME,
       "a repair resumes from the oldest complete checkpoint"),
    py("train_state_not_required", "is_complete", '(iteration_dir / "train_state.pt").is_file()', "True", RESUME,
       "an iteration without train_state.pt counted complete"),
    # the job script after srun
    sh("failures_requeued", None, "if [[ -f $run_dir/STOPPED ]]; then", "if true; then", JOB,
       "every unfinished run requeued, failures included"),
    sh("signal_deaths_requeued", None, "if ((status == 128 + $(kill -l USR1))); then", "if ((status > 128)); then",
       JOB, "a rank killed by any signal requeued, not only by the warning"),
    sh("warning_deaths_fail", None, "if ((status == 128 + $(kill -l USR1))); then", "if false; then", JOB,
       "ranks killed by the warning before they could hold it fail the job"),
    sh("failed_job_exits_zero", None, 'exit "$status"', "exit 0", JOB,
       "a failed training ends the job as a success"),
    sh("completed_run_not_seen", None, "if [[ -f $run_dir/COMPLETED ]]; then", "if false; then", JOB,
       "a finished run read as a failure"),
    sh("exit_signal_mismatch", None, "train.exit_signal=SIGUSR1 train.exit_signal_handler_for_dataloader=true",
       "train.exit_signal=SIGTERM train.exit_signal_handler_for_dataloader=true", JOB,
       "the ranks checkpoint on another signal than the one Slurm sends"),
    # the pre-emption path: signal -> checkpoint -> requeue
    py("held_warning_dies_of_sigterm", "_die_of_the_held_warning",
       "signal.SIGUSR1 if signal.SIGUSR1 in signal.sigpending() else signal.SIGTERM", "signal.SIGTERM", JOB,
       "a rank holding the warning dies of --kill-on-bad-exit's SIGTERM: srun 143, the job fails"),
    py("warning_never_released", "ReleaseExitSignal.on_train_start", "release_the_warning()", "None", PREEMPTION,
       "the warning stays held once training runs: no checkpoint before the time limit kills the job"),
    py("stopped_marker_not_left", "recipe._train_in", "(run.run_dir / STOPPED_MARKER).write_text(message + '\\n')",
       "None", PREEMPTION, "a stopped run leaves no STOPPED marker: the job script does not requeue it"),
)
