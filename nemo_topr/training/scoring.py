"""`nemo-topr score-logprobs`: behaviour log-probs log mu(y|x) for a pre-scored dataset.

    nemo-topr score-logprobs --model MODEL --data graded.jsonl --out scored.jsonl [--tp 2 --pp 1] [--device cpu]
                             [--shared-prefix] [--train-config llama31_8b_fp8]

MODEL is any starting model `base_model=` accepts: a Hugging Face directory, a Megatron
checkpoint (e.g. from `nemo-topr import`, loaded at --tp/--pp whatever layout it was saved at)
or a nemo-topr run directory (RUN or RUN@ITERATION). A forward-only pass of that model (the
data's generator, or the starting checkpoint of training when the data carries no mu) through
the same tokenization, packing and Megatron forward as training, with the same TP/PP machinery.
Writes the input records with ``behavior_logprob`` set (summed over completion tokens incl. EOS).
Scoring with the starting checkpoint makes rho = 1 at step 0 by construction: TOPR then begins
as SFT on positives plus a full-weight push-down on negatives, and tapers as pi moves away.

`--train-config` scores with a training config's model section (FP8 recipe, TP/PP/SP), so that
mu has the numerics training will use (docs/training.md, "mu and rho").

`--device` (default cuda) chooses where the model runs: on cuda the weights are built on the
GPU and each batch is moved to the model's device; cpu runs the CPU runtime. The cuda path ran
on one H200 (bench/results/gpu_verbs_h200_2026-11-26_*.json): plain, within 1.41e-4 per token
of the CPU's scores; `--shared-prefix` with local layers; from an import, a run and an export.
With TP or PP > 1 on GPUs it has never run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from itertools import batched
from pathlib import Path

import torch

from nemo_topr.errors import Problems, UserError, refuse
from nemo_topr.model import source as model_source
from nemo_topr.utils.arguments import Parser, at_least_one
from nemo_topr.data.cli import add_source_arguments, source_options
from nemo_topr.data.packing import TokenizedSequence, collate_packed, pack_sequences
from nemo_topr.data.records import Record, RecordReader, jsonl_line
from nemo_topr.data.report import ValidationReport
from nemo_topr.data.shared_prefix import collate_shared, pack_shared
from nemo_topr.data.tokenization import load_tokenizer, pad_id_of, tokenized_stream
from nemo_topr.model.device import add_device_argument, select_device, use_device
from nemo_topr.model.settings import device_model_settings
from nemo_topr.utils.outputs import (add_overwrite_argument, writable_output_file, writable_records_file,
                               write_whole, written_whole)
from nemo_topr.utils.progress import Progress
from nemo_topr.model.quiet import stdout_to_stderr
from nemo_topr.training.config import apply_section, check_values, compose, shape_changes
from nemo_topr.training.config_error import ConfigError
from nemo_topr.training.validation import check_fp8
from nemo_topr.training.host_memory import available_bytes, check_cpu_attention


def scoring_forward_step(scores: dict[int, float], config):
    """Forward-only step for Megatron's pipeline schedule: adds {sample_id: log pi(completion)}
    to `scores` (on the last pipeline stage), through the training step's own forward and sums."""
    from nemo_topr.training.step import completion_logprob_table, forward_packed, with_thd_boundaries

    def forward_step(data_iterator, chunk):
        batch = next(data_iterator)
        max_length = int(batch["seq_len"].max())  # read on the host, before the move
        batch = to_model_device(with_thd_boundaries(batch, config), chunk)
        output = forward_packed(chunk, batch, config)

        def collect(per_token_ce: torch.Tensor):
            logprobs, _ = completion_logprob_table(per_token_ce, batch, max_length)
            scores.update(zip(batch["sample_ids"].tolist(), logprobs.sum(-1).tolist()))
            return per_token_ce.sum() * 0.0, {}

        return output, collect

    return forward_step


def scoring_rows_per_batch(provider, requested: int) -> int:
    """Rows per scoring micro-batch: the training step's rule (one row per micro-batch for packed
    THD streams under pipeline parallelism, `single_row_micro_batches`); the scores do not depend
    on it, so scoring follows it with a note instead of an error."""
    from nemo_topr.training.step import single_row_micro_batches

    if requested > 1 and single_row_micro_batches(provider):
        print(f"[nemo-topr] --rows-per-batch {requested} -> 1: with --pp {provider.pipeline_model_parallel_size} "
              "Transformer Engine takes one packed row per micro-batch", flush=True)
        return 1
    return requested


def training_model_section(train_config: str, provider) -> dict:
    """A training config's ``model`` section, checked as `train` checks it, less the sizes that
    describe the data rather than the model (seq_length stays the scoring command's).
    `train_config` is a config name in conf/ or a YAML path; `provider` is the scored model's."""
    raw = compose(train_config, whole_run=False)  # a YAML path or a preset's name, as train's --config-name
    section = {k: v for k, v in dict(raw.get("model") or {}).items() if k != "seq_length"}
    check_values({"model": section})
    # a key that sets the weights' shapes (a user's YAML with model.num_layers) would score
    # another model than the one on disk, or end its load in a shape-mismatch traceback
    if changed := shape_changes(section, provider, "the scored model"):
        raise ConfigError(f"--train-config {train_config}: {changed}: scoring reads --model's weights, whose "
                          "shapes these keys set; drop them from the config's model section (the architecture "
                          "comes from --model)", key="train_config.model.shape_keys", where="--train-config")
    return section


def apply_training_model_section(provider, train_config: str) -> dict:
    """Put a training config's ``model`` section (precision incl. the FP8 recipe, TP/PP/SP, ...)
    on the scoring provider, so that log mu is scored with the numerics training will use; returns
    the section."""
    section = training_model_section(train_config, provider)
    apply_section(provider, section)
    # Virtual pipeline stages (the 70B preset's VP=5) only assign layers to chunks: scoring's world
    # has none (`initialize_model_parallel`), so their chunks would meet the non-interleaved
    # schedule, which takes one model per rank (tried on CPU: 2 chunks built, 1F1B chosen).
    provider.virtual_pipeline_model_parallel_size = None
    return section


def apply_scoring_layout(provider, device: str, *, train_config: str | None, precision: str | None,
                         tensor_parallel: int | None, pipeline_parallel: int | None) -> str | None:
    """The scoring model's precision and TP/PP: on cuda with `train_config`, that config's model
    section (`apply_training_model_section`), and a flag that would contradict it is refused
    rather than silently overridden; otherwise the flags (precision: bf16 on cuda, fp32 on cpu).
    Returns the training config applied, or None."""
    if train_config and device != "cuda":  # read all the same: a typo there is named on a CPU dry run too
        training_model_section(train_config, provider)
    if train_config and device == "cuda":
        check_layout_flags(device, train_config, precision=precision, tensor_parallel=tensor_parallel,
                           pipeline_parallel=pipeline_parallel)
        apply_training_model_section(provider, train_config)
        return train_config
    if train_config:  # the CPU runtime computes in fp32 with local layers whatever the preset says
        print(f"[nemo-topr] --device cpu: --train-config {train_config} is not applied (CPU scoring is fp32)",
              flush=True)
    provider.tensor_model_parallel_size = 1 if tensor_parallel is None else tensor_parallel
    provider.pipeline_model_parallel_size = 1 if pipeline_parallel is None else pipeline_parallel
    if (precision or ("bf16" if device == "cuda" else "fp32")) == "bf16":
        provider.bf16, provider.params_dtype = True, torch.bfloat16
    provider.pipeline_dtype = provider.params_dtype
    return None


def check_layout_flags(device: str, train_config: str | None, *, precision: str | None,
                       tensor_parallel: int | None, pipeline_parallel: int | None) -> None:
    """On cuda, `train_config` sets the precision and TP/PP: a flag given beside it would contradict it,
    and is refused rather than silently overridden."""
    if not (train_config and device == "cuda"):
        return
    given = [flag for flag, value in (("--precision", precision), ("--tp", tensor_parallel),
                                      ("--pp", pipeline_parallel)) if value is not None]
    if given:
        raise ConfigError(f"--train-config {train_config} takes the precision and TP/PP from its model section; "
                          f"drop {', '.join(given)}, or drop --train-config to score with the flags",
                          key="train_config.with_layout_flags", where="--train-config")


def check_scoring_world(provider, world_size: int, train_config: str | None) -> None:
    """The launched processes (WORLD_SIZE) must divide into TP x PP groups: Megatron's
    initialize_model_parallel raises otherwise, as a traceback on every rank."""
    tp, pp = provider.tensor_model_parallel_size, provider.pipeline_model_parallel_size
    named = f"--train-config {train_config}'s TP x PP" if train_config else "--tp x --pp"
    if tp < 1 or pp < 1:
        raise ConfigError(f"{named} must be at least 1 each; got {tp} x {pp}",
                          key="tp_pp.below_1", where="--train-config" if train_config else "--tp, --pp")
    if world_size % (tp * pp):
        raise ConfigError(f"{named} = {tp} x {pp} = {tp * pp} ranks per model, but WORLD_SIZE is {world_size}: "
                          f"launch a multiple of {tp * pp} processes (torchrun --nproc_per_node {tp * pp} -m "
                          "nemo_topr.cli score-logprobs ...)",
                          key="world_size.not_multiple_of_tp_pp", where="WORLD_SIZE")


def scoring_model_settings(provider, train_config: str | None) -> None:
    """`device_model_settings` for a forward-only build, then refuse a training config's FP8 that
    this machine would not run: without Transformer Engine the layers are local and compute in
    BF16, so mu would not have the numerics `--train-config` asked for."""
    device_model_settings(provider, wrapped_in_ddp=False)
    if train_config:
        try:
            check_fp8(provider, "cuda", without_fp8="score in BF16 on purpose: --precision bf16 without --train-config")
        except ConfigError as error:
            raise ConfigError(f"--train-config {train_config}: {error}",
                              key=f"train_config.{error.key}", where="--train-config") from None


def to_model_device(batch: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The batch's tensors on the device of the model's parameters (a no-op on CPU)."""
    device = next(model.parameters()).device
    return {key: value.to(device, non_blocking=True) for key, value in batch.items()}


# Records read, tokenized, scored and written at a time: memory follows this, not the data set's
# size. Each chunk is packed on its own and padded to whole micro-batches: at most one part-filled
# row and rows_per_batch - 1 empty ones per data-parallel rank, against ~300 rows of 2048 tokens
# for 2048 records of ~300 tokens.
CHUNK_RECORDS = 2048


def scoring_chunks(records: Iterator[Record], tokenizer, report: ValidationReport, chunk_records: int,
                   **tokenizing) -> Iterator[tuple[Sequence[Record], list[TokenizedSequence]]]:
    """(records, their sequences) `chunk_records` of `records` (a `RecordReader`'s read) at a time,
    tokenization's drops counted into `report`. Every rank reads the same chunks in the same order. Dense
    prompt ids start again in each chunk: they only group a chunk's sequences for packing, and a table
    over the whole set grows with its prompts."""
    prompt_keys: dict[str, int] = {}
    for chunk, sequences in tokenized_stream(batched(records, chunk_records), tokenizer, report, prompt_keys,
                                             **tokenizing):
        yield chunk, sequences
        prompt_keys.clear()


@dataclass(frozen=True)
class ScoreLogprobsSpec:
    """What `nemo-topr score-logprobs` will do: `model`'s log-probs of the records of `data` (read by
    `source`'s columns, strict or not) written to `out`, with the layout and precision of the flags or
    of `train_config` (`apply_scoring_layout`); see `score_logprobs` for each field."""

    model: str | Path
    data: str | Path
    out: str | Path
    seq_length: int = 2048
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    rows_per_batch: int = 4
    strict: bool = True
    precision: str | None = None
    device: str = "cuda"
    source: dict | None = None
    shared_prefix: bool = False
    train_config: str | None = None
    overwrite: bool = False
    chunk_records: int = CHUNK_RECORDS

    def reader(self) -> RecordReader:
        return RecordReader(self.data, strict=self.strict, **(self.source or {}))

    def model_source(self) -> model_source.ModelSource:
        return model_source.resolve(self.model, named="--model ")  # file checks only


def validate(spec: ScoreLogprobsSpec) -> list[UserError]:
    """Every problem of `spec` before Megatron's import, nothing written: the model source whole,
    --train-config beside the flags it replaces and the device; where these are fine, the data's files,
    `out` and its report (writable, none of them an input) and every record (read once, none kept).
    The data is read only on a device and for a model it can be scored with: a pass over millions of
    records is not made to tell what the device or the model's files told in a second."""
    problems, device_problems = Problems(), Problems()
    device = spec.device  # as asked, where it cannot be had: a flag that contradicts --train-config is named too
    with device_problems.check():
        device = select_device(spec.device, where="--device")
    with problems.check():
        model_source.check_intact(spec.model_source())
    with problems.check():
        check_layout_flags(device, spec.train_config, precision=spec.precision,
                           tensor_parallel=spec.tensor_parallel, pipeline_parallel=spec.pipeline_parallel)
    if problems or device_problems:
        return [*problems, *device_problems]  # the device's last: its remedy (--device cpu) ends the refusal
    reader, inputs = None, []
    with problems.check():
        reader = spec.reader()
        inputs = reader.new_report().files
    with problems.check():
        writable_records_file(spec.out, inputs=inputs, overwrite=spec.overwrite)
        writable_output_file(str(spec.out) + ".report.json", "--out's report", inputs=inputs, overwrite=spec.overwrite)
    with problems.check():
        if reader is not None:
            deque(reader.read(reader.new_report()), maxlen=0)  # every record validated, none kept
    return problems


def score_logprobs(model_dir: str | Path, data: str | Path, out: str | Path, *, seq_length: int = 2048,
                   tensor_parallel: int | None = None, pipeline_parallel: int | None = None, rows_per_batch: int = 4,
                   strict: bool = True, precision: str | None = None, device: str = "cuda",
                   source: dict | None = None, shared_prefix: bool = False,
                   train_config: str | None = None, overwrite: bool = False,
                   chunk_records: int = CHUNK_RECORDS) -> dict:
    """Score every record; rank 0 writes `out` and returns a summary (other ranks return {}): `run` of
    a `ScoreLogprobsSpec` that `validate` finds nothing wrong with.

    `device` is cuda, cpu or auto (`nemo_topr.model.device`); cuda without CUDA raises DeviceError.
    `precision` ("fp32" or "bf16"; default bf16 on cuda, fp32 on cpu) should match training's, so
    that rho = 1 at step 0 when the starting checkpoint scores its own data (bf16 rounding summed
    over hundreds of tokens otherwise shows up as |log rho| > 0 before the first update).
    `source`: `load_records`' columns, split and extra_columns, for data in another shape; `out`
    is in our schema. `shared_prefix`: rows hold each prompt once for several of its completions
    (`nemo_topr.data.shared_prefix`; the same scores, fewer tokens), with either layer spec.
    `train_config`: score with that training config's model section (`apply_scoring_layout`), in place
    of `precision`, `tensor_parallel` and `pipeline_parallel` (default 1 each). `out` and its report
    (`OUT.report.json`) are replaced only with `overwrite`."""
    spec = ScoreLogprobsSpec(model_dir, data, out, seq_length, tensor_parallel, pipeline_parallel, rows_per_batch,
                             strict, precision, device, source, shared_prefix, train_config, overwrite, chunk_records)
    refuse(validate(spec), key="score-logprobs.several_problems")
    return run(spec)


def run(spec: ScoreLogprobsSpec) -> dict:
    """Score `spec`'s records (`validate`d); rank 0 writes `out` and returns the summary.

    The data is read three times, `chunk_records` records at a time, never whole: validated (by
    `validate`, before Megatron's imports), tokenized and packed (a record's tokens refused before the
    model is built, the micro-batches counted, the report's drops counted), then tokenized again, scored
    and written in input order, to OUT.partial renamed to `out` after the last chunk. The records written
    and the report do not depend on `chunk_records`; the scores only at float rounding, since a
    sequence's place in its packed row orders the attention's sums (`CHUNK_RECORDS`)."""
    seq_length, shared_prefix, chunk_records, out = spec.seq_length, spec.shared_prefix, spec.chunk_records, spec.out
    source_model = spec.model_source()
    reader = spec.reader()
    report = reader.new_report()
    report_path = Path(str(out) + ".report.json")
    # imports Megatron: on CPU it hides CUDA-only packages from it first
    device = use_device(spec.device, where="--device")
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from nemo_topr.utils.distributed import initialize_model_parallel, launcher_world_size
    from nemo_topr.model.providers import load_model, source_provider

    tokenizer = load_tokenizer(source_model.hf_dir)
    pad_id = pad_id_of(tokenizer)
    tokenizing = {"max_seq_length": seq_length, "strict": spec.strict,
                  "model_context": model_source.context_length(source_model.hf_dir)}

    def rows_of(sequences: list[TokenizedSequence]) -> list:
        return pack_shared(sequences, seq_length) if shared_prefix else pack_sequences(sequences, seq_length, pad_id)

    # the validation's drops counted here, with tokenization's, so that the data is read three times in all
    chunks = scoring_chunks(reader.read(report), tokenizer, report, chunk_records, **tokenizing)
    rows_per_chunk = [len(rows_of(sequences)) for _, sequences in chunks]
    _, provider = source_provider(source_model, seq_length=seq_length)
    applied = apply_scoring_layout(provider, device, train_config=spec.train_config, precision=spec.precision,
                                   tensor_parallel=spec.tensor_parallel, pipeline_parallel=spec.pipeline_parallel)
    check_scoring_world(provider, launcher_world_size(), applied)
    initialize_model_parallel(provider.tensor_model_parallel_size, provider.pipeline_model_parallel_size)
    if torch.distributed.get_rank() == 0:
        print(f"[nemo-topr] model: {source_model.describe()}", flush=True)
    scoring_model_settings(provider, applied)
    if shared_prefix:  # after the layer spec is settled: the local attention, or FlexCoreAttention in TE's spec
        from nemo_topr.training.flex_attention import prepare_shared_prefix_attention

        prepare_shared_prefix_attention(provider)
    rows_per_batch = scoring_rows_per_batch(provider, spec.rows_per_batch)
    if device == "cpu":
        check_cpu_attention(provider, rows_per_batch, available_bytes(), names=("--seq-length", "--rows-per-batch"))
    provider.finalize()
    # without CPU initialisation Bridge builds the weights on torch.cuda.current_device()
    # (bridge/models/model_provider.py:689)
    model = load_model(source_model, provider, cpu_init=device == "cpu")
    for chunk in model:
        chunk.eval()

    collate = collate_shared if shared_prefix else collate_packed
    dp_rank, dp_size = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
    rank0 = torch.distributed.get_rank() == 0
    # micro-batches/s and ETA on global rank 0's stderr
    progress = Progress("nemo-topr score-logprobs", sum(-(-len(range(dp_rank, rows, dp_size)) // rows_per_batch)
                                                         for rows in rows_per_chunk), "micro-batches")
    last_stage_leader = (parallel_state.is_pipeline_last_stage()
                         and parallel_state.get_tensor_model_parallel_rank() == 0)
    totals = ScoreTotals()
    with written_whole(out) if rank0 else nullcontext() as written, torch.no_grad():
        chunks = scoring_chunks(reader.read(reader.new_report()), tokenizer, reader.new_report(), chunk_records,
                                **tokenizing)
        for records, sequences in chunks:
            my_rows = rows_of(sequences)[dp_rank::dp_size]
            my_rows += [[] for _ in range(-len(my_rows) % rows_per_batch)]  # equal micro-batch shapes for PP
            batches = (collate(sequences, my_rows[i:i + rows_per_batch], seq_length, pad_id)
                       for i in range(0, len(my_rows), rows_per_batch))
            scores: dict[int, float] = {}
            done = progress.done
            if my_rows:
                get_forward_backward_func()(
                    forward_step_func=scoring_forward_step(scores, provider), model=model,
                    data_iterator=progress.wrap(batches) if rank0 else batches,
                    num_microbatches=len(my_rows) // rows_per_batch, seq_length=seq_length,
                    micro_batch_size=rows_per_batch, forward_only=True)
                # wrap counts a micro-batch when the next is asked for: not the chunk's last
                if rank0 and (uncounted := done + len(my_rows) // rows_per_batch - progress.done):
                    progress.advance(uncounted)
            gathered = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, scores if last_stage_leader else {})
            if rank0:
                totals.write(records, {k: v for part in gathered for k, v in part.items()}, written)
    if not rank0:
        return {}
    progress.finish()
    summary = {**report.to_dict(), "records_scored": totals.records, "out": str(out), **totals.means()}
    write_whole(report_path, json.dumps(summary, indent=2) + "\n")
    return summary


class ScoreTotals:
    """What `score_logprobs` reports of the scores, summed chunk by chunk in input order (so that
    the sums do not depend on the chunk size)."""

    def __init__(self) -> None:
        self.records, self.logprob_sum = 0, 0.0
        self.replaced, self.change_sum, self.change_max = 0, 0.0, 0.0

    def write(self, records: Sequence[Record], scores: dict[int, float], out) -> None:
        """Write `records` that have a score, in their order, with it as behavior_logprob."""
        for record in records:
            if (score := scores.get(record.index)) is None:
                continue  # dropped in tokenization (counted in the report)
            out.write(jsonl_line(replace(record, behavior_logprob=score)))
            self.records += 1
            self.logprob_sum += score
            # values the input already had (a sampler's own, an earlier scoring): how far the new ones moved
            if record.behavior_logprob is not None:
                change = abs(score - record.behavior_logprob)
                self.replaced += 1
                self.change_sum += change
                self.change_max = max(self.change_max, change)

    def means(self) -> dict:
        summary = {"mean_behavior_logprob": self.logprob_sum / self.records}
        if self.replaced:
            summary["replaced_behavior_logprobs"] = {"records": self.replaced, "mean_abs_change":
                                                     self.change_sum / self.replaced, "max_abs_change": self.change_max}
        return summary


def main(argv: list[str]) -> int:
    parser = Parser(prog="nemo-topr score-logprobs", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True,
                        help="HF directory, Megatron checkpoint, or run directory (RUN[@ITER])")
    parser.add_argument("--data", required=True, help="records: JSONL/Parquet/Arrow files, directory, glob, "
                        "save_to_disk directory or hub:OWNER/NAME (see --columns)")
    parser.add_argument("--out", required=True, help="output JSONL with behavior_logprob set (its report: "
                        "OUT.report.json)")
    add_overwrite_argument(parser)
    parser.add_argument("--seq-length", type=at_least_one, default=2048,
                        help="tokens per packed row, so the longest record it scores (prompt + completion + EOS) "
                             "(default: %(default)s)")
    parser.add_argument("--tp", type=int, help="tensor parallel size (default 1)")
    parser.add_argument("--pp", type=int, help="pipeline parallel size (default 1)")
    parser.add_argument("--rows-per-batch", type=at_least_one, default=4)
    parser.add_argument("--precision", choices=("bf16", "fp32"),
                        help="model precision; match training's (default: bf16 on cuda, fp32 on cpu)")
    parser.add_argument("--train-config", help="score with this training config's model section (a conf/ name such "
                        "as llama31_8b_fp8, or a YAML path): its precision incl. FP8, TP/PP/SP, instead of --precision, "
                        "--tp and --pp (cuda only; see docs/training.md, 'mu and rho')")
    parser.add_argument("--shared-prefix", action="store_true",
                        help="pack each prompt once for several of its completions (fewer tokens, the same "
                             "scores; local attention only, e.g. --device cpu; see docs/performance.md)")
    add_device_argument(parser)
    parser.add_argument("--no-strict", dest="strict", action="store_false",
                        help="drop malformed or over-long records (counted in OUT.report.json)")
    add_source_arguments(parser)
    args = parser.parse_args(argv)
    spec = ScoreLogprobsSpec(args.model, args.data, args.out, args.seq_length, args.tp, args.pp, args.rows_per_batch,
                             args.strict, args.precision, args.device, source_options(args), args.shared_prefix,
                             args.train_config, args.overwrite)
    refuse(validate(spec), key="score-logprobs.several_problems")
    made_the_world = not torch.distributed.is_initialized()  # a caller's own world is the caller's to end
    with stdout_to_stderr():  # stdout: the JSON summary alone
        summary = run(spec)
    if summary:
        print(json.dumps(summary, indent=2))
        print(f"wrote {summary['records_scored']} records with behavior_logprob to {summary['out']} (report: "
              f"{summary['out']}.report.json)", file=sys.stderr)  # stdout stays the JSON alone, for `| jq`
    from nemo_topr.utils.distributed import destroy_model_parallel, launcher_world_size

    if launcher_world_size() > 1:
        torch.distributed.barrier()
    # NCCL warns at exit about a process group left alive (on every GPU scoring of the H200 run)
    if made_the_world:
        destroy_model_parallel()
    return 0
