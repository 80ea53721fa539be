"""The sampling options `generate` and `eval` share (and `iterate` checks for its stages): the
arguments, their checks before anything loads, and the `SamplingSettings` they make."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from nemo_topr.data.prompts import GSM8K_SHOTS
from nemo_topr.evaluation.sampling import (
    BACKENDS, STOP_STRINGS, TRANSFORMERS_ON_ONE_DEVICE, SamplingError, SamplingSettings, choose_backend,
)
from nemo_topr.grading import MAX_GRADER_ERROR_RATE, TASKS
from nemo_topr.model.device import add_device_argument
from nemo_topr.evaluation.problems import check_limit
from nemo_topr.utils.arguments import non_negative, share


MIN_TEMPERATURE = 1e-5  # vLLM's _SAMPLING_EPS: below it, it decodes greedily


def add_sampling_arguments(parser: argparse.ArgumentParser, *, num_samples: int) -> None:
    defaults = SamplingSettings()
    parser.add_argument("--task", choices=TASKS, help="grader for a prompt file (benchmarks set it)")
    parser.add_argument("--data-dir", type=Path, help="benchmark JSONL files or a save_to_disk dataset "
                        "(default: $NEMO_TOPR_DATA_DIR, else the repository's data/benchmarks)")
    parser.add_argument("--limit", type=int, help="only the first K problems")
    parser.add_argument("--num-shots", type=non_negative, default=GSM8K_SHOTS,
                        help="worked GSM8K train problems before each GSM8K question (default: %(default)s, the "
                             "paper's; fewer, or 0 for zero-shot, where a model's context does not hold them)")
    parser.add_argument("--num-samples", type=int, default=num_samples, help="samples per prompt (default: "
                        "%(default)s)")
    parser.add_argument("--temperature", type=float, default=defaults.temperature,
                        help="0: greedy decoding (default: %(default)s)")
    for flag, kind, value in (("--top-p", float, defaults.top_p), ("--top-k", int, defaults.top_k),
                              ("--max-new-tokens", int, defaults.max_new_tokens), ("--seed", int, defaults.seed)):
        parser.add_argument(flag, type=kind, default=value, help="(default: %(default)s)")
    stops = parser.add_mutually_exclusive_group()
    stops.add_argument("--stop", action="append",
                       help="stop string, repeatable (default: the task's, GSM8K: '\\n\\nQuestion:')")
    # `--stop ''` ended every completion at once: this is how to ask for none
    stops.add_argument("--no-stop", dest="stop", action="store_const", const=[],
                       help="no stop string: sample to EOS or --max-new-tokens (a chat model on GSM8K)")
    parser.add_argument("--sampler-logprobs", action="store_true",
                        help="record the sampler's log-prob of each completion in meta.sampler_logprob")
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="auto: vLLM when installed and the device is cuda, else transformers")
    add_device_argument(parser)
    parser.add_argument("--max-grader-error-rate", type=share, default=MAX_GRADER_ERROR_RATE,
                        help="fail when the grader itself fails (math-verify raised or timed out) on more than this "
                             "share of the samples (default: %(default)s); failed samples are dropped and counted, "
                             "never graded wrong")
    parser.add_argument("--tensor-parallel-size", type=int, default=defaults.tensor_parallel_size,
                        help="vLLM backend: GPUs to split the model over (70B in bf16 needs >= 2 x 80 GB)")


def check_sampling_args(args: argparse.Namespace) -> None:
    """The sampling options' values (SamplingError), before anything is loaded; `iterate` checks its
    generate and eval stages' options with it at its start."""
    check_limit(args.limit)
    for flag in ("num_samples", "max_new_tokens", "top_k", "tensor_parallel_size"):
        if getattr(args, flag) < 1:
            raise SamplingError(f"--{flag.replace('_', '-')} must be at least 1; got {getattr(args, flag)}",
                                key=f"--{flag.replace('_', '-')}.below_1", where=f"--{flag.replace('_', '-')}")
    # checked before the model loads (transformers refused a temperature of 0 only after loading it)
    if not 0 <= args.temperature < math.inf:  # inf: uniform over top-k, and `Infinity` in the settings' JSON
        raise SamplingError(f"--temperature must be at least 0 (0: greedy decoding) and finite; got {args.temperature}",
                            key="--temperature.negative_or_infinite", where="--temperature")
    if 0 < args.temperature < MIN_TEMPERATURE:  # 1e-300 is 0 in float32: logits / 0 ended in torch's NaN traceback
        raise SamplingError(f"--temperature {args.temperature}: below {MIN_TEMPERATURE} sampling is greedy decoding in "
                         "effect (vLLM switches to it) and overflows the logits; give 0 for greedy decoding",
                            key="--temperature.below_min", where="--temperature")
    if not 0 <= args.seed < 2**63:  # torch's generators take 64 bits; -1 would be a fixed seed, not "random"
        raise SamplingError(f"--seed must be in [0, 2^63): the same seed draws the same samples; got {args.seed}",
                            key="--seed.out_of_range", where="--seed")
    if not 0 < args.top_p <= 1:
        raise SamplingError(f"--top-p must be in (0, 1]; got {args.top_p}", key="--top-p.out_of_range", where="--top-p")
    if args.stop and "" in args.stop:  # the sampler matches it before the first token
        raise SamplingError("--stop '': an empty stop string ends every completion before its first token (all "
                         "samples empty); give non-empty stop strings, or --no-stop for none",
                            key="--stop.empty", where="--stop")
    if args.temperature == 0 and args.num_samples != 1:
        raise SamplingError(f"--temperature 0 is greedy decoding, one completion per prompt: --num-samples 1 "
                         f"(got {args.num_samples})", key="--num-samples.above_1_when_greedy", where="--num-samples")
    backend = choose_backend(args.backend, args.device)  # vLLM missing or on the CPU: refused before anything loads
    if args.tensor_parallel_size != 1 and backend == "transformers":  # before the sample log records a size no
        raise SamplingError(TRANSFORMERS_ON_ONE_DEVICE,  # sampling used
                            key="--tensor-parallel-size.transformers_backend", where="--tensor-parallel-size")
    if args.temperature == 0 and args.sampler_logprobs:
        raise SamplingError("--sampler-logprobs with --temperature 0: greedy decoding samples from no distribution "
                         "(its log-prob is 0); score the completions with `nemo-topr score-logprobs`",
                            key="--sampler-logprobs.greedy", where="--sampler-logprobs")


def settings_from_args(args: argparse.Namespace, task: str) -> SamplingSettings:
    check_sampling_args(args)
    stops = STOP_STRINGS[task] if args.stop is None else args.stop
    return SamplingSettings(num_samples=args.num_samples, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, max_new_tokens=args.max_new_tokens, seed=args.seed,
                            stop_strings=tuple(stops), sampler_logprobs=args.sampler_logprobs,
                            tensor_parallel_size=args.tensor_parallel_size)
