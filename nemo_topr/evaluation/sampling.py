"""Sampling completions from a local Hugging Face model: vLLM when installed and the device is cuda,
`transformers` otherwise, with the paper's settings (`SamplingSettings`).

Prompts are tokenized as training tokenizes them (`prompt_ids_checked`); each prompt's new tokens
stop short of the model's context (`new_token_budgets`); sample j of prompt i is drawn with seed
`prompt_seed(seed, i)`, so a run is deterministic and a resumed or shortened run draws the same samples.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from nemo_topr.errors import UserError
from nemo_topr.evaluation.samples import Completion, GradedCompletion, Problem, grade_completions
from nemo_topr.model.device import out_of_memory
from nemo_topr.utils.progress import Progress

STOP_STRINGS = {"gsm8k": ("\n\nQuestion:",), "math": ()}
BACKENDS = ("auto", "vllm", "transformers")
VLLM_CHUNK = 256  # prompts per vLLM call (see _sample_with_vllm)
TRANSFORMERS_ON_ONE_DEVICE = ("the transformers backend runs on one device; --tensor-parallel-size needs --backend "
                              "vllm (--backend auto chooses it on cuda when vLLM is installed)")


class SamplingError(UserError, ValueError):
    """Sampling that cannot run as asked: its options, its backend, a prompt the model cannot take, memory."""


@dataclass(frozen=True)
class SamplingSettings:
    """The paper's defaults: temperature 1, top-p 1, top-k 500, at most 512 new tokens."""

    num_samples: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 500
    max_new_tokens: int = 512
    seed: int = 0
    stop_strings: tuple[str, ...] = ()
    sampler_logprobs: bool = False
    tensor_parallel_size: int = 1  # vLLM: GPUs one model is split over (Llama 3.1 70B: 4 or 8)


def prompt_seed(seed: int, prompt_index: int) -> int:
    """The seed of one prompt's samples: 32 random bits drawn from (seed, prompt_index).

    32 bits because torch's CPU generator (mt19937) keeps only the low 32 bits of a seed.
    """
    return random.Random(f"{seed}:{prompt_index}").getrandbits(32)


def trim_at_stop(text: str, stop_strings: Sequence[str]) -> str:
    """`text` up to the first occurrence of any stop string."""
    cuts = [text.find(stop) for stop in stop_strings if stop in text]
    return text[: min(cuts)] if cuts else text


def choose_backend(backend: str, device: str) -> str:
    """`auto`: vLLM when it is importable and the device is cuda, else `transformers`. `vllm`
    where vLLM is not installed, or with --device cpu, is refused (SamplingError)."""
    if backend == "vllm" and not importlib.util.find_spec("vllm"):
        raise SamplingError("--backend vllm: vLLM is not installed in this environment (pip install -r "
                         "requirements-vllm.txt); --backend transformers, or auto, samples without it",
                            key="--backend.vllm_not_installed", where="--backend")
    if backend == "vllm" and device == "cpu":
        raise SamplingError("--backend vllm samples on GPUs: it needs --device cuda (or auto on a machine with one)",
                            key="--backend.vllm_on_cpu", where="--backend")
    if backend != "auto":
        return backend
    return "vllm" if importlib.util.find_spec("vllm") and device == "cuda" else "transformers"


def _generated_lengths(new_tokens, eos_ids: set[int], pad_id: int) -> list[int]:
    """Tokens each sequence sampled: through its first EOS, or up to the padding that follows
    a stop string (or all of them at the token limit)."""
    lengths = []
    for row in new_tokens.tolist():
        length = len(row)
        for i, token in enumerate(row):
            if token in eos_ids:
                length = i + 1
                break
            if token == pad_id:
                length = i
                break
        lengths.append(length)
    return lengths


def _decoding(settings: SamplingSettings) -> dict:
    """transformers' options for `settings`: temperature 0 is greedy (as in vLLM), whatever the
    model's generation_config samples with (Llama 3 Instruct's: temperature 0.6, top-p 0.9)."""
    if settings.temperature == 0:
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {"do_sample": True, "temperature": settings.temperature, "top_p": settings.top_p, "top_k": settings.top_k}


def _sample_with_transformers(model_dir: Path, prompt_ids: dict[int, list[int]], budgets: dict[int, int],
                              settings: SamplingSettings, tokenizer, device: str
                              ) -> Iterator[tuple[int, list[Completion]]]:
    """One `generate` call per prompt (its N samples batched), on CPU or one GPU, yielded as it
    finishes. The sampler log-prob comes from the processed scores (after temperature and top-k/top-p)."""
    import torch
    from transformers import AutoModelForCausalLM

    from nemo_topr.data.tokenization import pad_id_of

    if settings.tensor_parallel_size != 1:
        raise SamplingError(TRANSFORMERS_ON_ONE_DEVICE,
                            key="--tensor-parallel-size.transformers_backend", where="--tensor-parallel-size")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype="auto").eval().to(device)
    eos = model.generation_config.eos_token_id
    eos_ids, pad_id = set(eos if isinstance(eos, list) else [eos]), pad_id_of(tokenizer)
    for index, ids in prompt_ids.items():
        torch.manual_seed(prompt_seed(settings.seed, index))
        input_ids = torch.tensor([ids], device=device)
        try:
            with torch.no_grad():
                output = model.generate(
                    input_ids, attention_mask=torch.ones_like(input_ids), **_decoding(settings),
                    max_new_tokens=budgets[index], num_return_sequences=settings.num_samples,
                    stop_strings=list(settings.stop_strings) or None, tokenizer=tokenizer,
                    pad_token_id=pad_id, return_dict_in_generate=True,
                    output_scores=settings.sampler_logprobs,
                )
        except (RuntimeError, MemoryError) as error:
            if not out_of_memory(error):
                raise
            raise SamplingError(sampling_out_of_memory(settings, device, len(ids) + budgets[index], error),
                                key="sampling.out_of_memory", where="--device") from None
        new_tokens = output.sequences[:, input_ids.shape[1]:]
        texts = tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        logprobs = [None] * len(texts)
        if settings.sampler_logprobs:
            token_logprobs = model.compute_transition_scores(output.sequences, output.scores, normalize_logits=True)
            lengths = _generated_lengths(new_tokens, eos_ids, pad_id)
            logprobs = [float(row[:n].sum()) for row, n in zip(token_logprobs, lengths)]
        yield index, [Completion(trim_at_stop(t, settings.stop_strings), lp) for t, lp in zip(texts, logprobs)]


def sampling_out_of_memory(settings: SamplingSettings, device: str, tokens: int, error: BaseException) -> str:
    """What to do where transformers could not hold one prompt's samples, sampled as one batch."""
    kept = ("; the scores of every step are kept for --sampler-logprobs, vocabulary-wide: leave it out"
            if settings.sampler_logprobs else "")
    other = "" if device == "cpu" else ", or sample with --backend vllm"
    said = (str(error).splitlines() or [type(error).__name__])[0][:200]  # Python's MemoryError says nothing
    return (f"{device} ran out of memory sampling one prompt's {settings.num_samples} samples (up to {tokens} tokens "
            f"each): the transformers backend samples a prompt's samples as one batch{kept}. Give a lower "
            f"--num-samples or --max-new-tokens{other} ({said})")


def _sample_with_vllm(model_dir: Path, prompt_ids: dict[int, list[int]], budgets: dict[int, int],
                      settings: SamplingSettings) -> Iterator[tuple[int, list[Completion]]]:
    """VLLM_CHUNK prompts per vLLM call (large batches keep the GPU busy; a chunk at a time is
    what a crash can lose); vLLM cuts the stop strings itself. Never run on GPU in CI.

    vLLM V1 returns raw log-probs (the model's, before temperature and top-k/top-p) unless
    `logprobs_mode` says otherwise; "processed_logprobs" makes it record what the transformers
    backend records: the log-prob under the distribution actually sampled from."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(model_dir), seed=settings.seed, tensor_parallel_size=settings.tensor_parallel_size,
              logprobs_mode="processed_logprobs")
    indices = list(prompt_ids)
    for start in range(0, len(indices), VLLM_CHUNK):
        chunk = indices[start:start + VLLM_CHUNK]
        params = [
            SamplingParams(n=settings.num_samples, temperature=settings.temperature, top_p=settings.top_p,
                           top_k=settings.top_k, max_tokens=budgets[index], stop=list(settings.stop_strings),
                           seed=prompt_seed(settings.seed, index), logprobs=0 if settings.sampler_logprobs else None)
            for index in chunk
        ]
        outputs = llm.generate([TokensPrompt(prompt_token_ids=prompt_ids[index]) for index in chunk], params,
                               use_tqdm=False)
        for index, output in zip(chunk, outputs):
            yield index, [Completion(trim_at_stop(sample.text, settings.stop_strings),
                                     sample.cumulative_logprob if settings.sampler_logprobs else None)
                          for sample in output.outputs]


def iter_completions(model_dir: str | Path, problems: dict[int, Problem], settings: SamplingSettings,
                     backend: str = "auto", device: str = "cpu") -> Iterator[tuple[int, list[Completion]]]:
    """(index, its `settings.num_samples` completions) for each of {index: problem} as each
    finishes, on `device` ("cpu" or "cuda", resolved by the caller:
    `nemo_topr.model.device.select_device`). The index seeds the prompt's samples (`prompt_seed`)."""
    from nemo_topr.data.tokenization import load_tokenizer

    if not problems:
        return
    tokenizer = load_tokenizer(model_dir)
    prompt_ids = prompt_ids_checked(tokenizer, problems)
    budgets = new_token_budgets(model_dir, problems, settings.max_new_tokens, prompt_ids)
    if choose_backend(backend, device) == "vllm":
        yield from _sample_with_vllm(Path(model_dir), prompt_ids, budgets, settings)
    else:
        yield from _sample_with_transformers(Path(model_dir), prompt_ids, budgets, settings, tokenizer, device)


def prompt_ids_checked(tokenizer, problems: dict[int, Problem], source: str = "prompts") -> dict[int, list[int]]:
    """{index: the prompt's tokens}, as training tokenizes it (`prompt_token_ids`), once the prompts'
    text passed training's check (`prompt_text_problem`): a prompt rendered already, templated
    again, would be sampled from a context the records' scoring and training never see."""
    from nemo_topr.data.tokenization import prompt_text_problem, prompt_token_ids, special_token_text

    if pattern := special_token_text(tokenizer):
        wrong = [(problem, found) for problem in problems.values()
                 if (found := prompt_text_problem(problem.prompt, pattern))]
        if wrong:
            (first, (reason, why)), count = wrong[0], len(wrong)
            raise SamplingError(f"{source}: prompt {first.prompt_id}: {why} ({count} of {len(problems)} prompts)",
                                key=f"prompts.prompt.{reason}", where=f"{source}: prompt {first.prompt_id}")
    return dict(zip(problems, prompt_token_ids(tokenizer, [problem.prompt for problem in problems.values()])))


def new_token_budgets(model_dir: str | Path, problems: dict[int, Problem], max_new_tokens: int,
                      prompt_ids: dict[int, list[int]] | None = None) -> dict[int, int]:
    """{index: new tokens to sample at most}: `max_new_tokens`, less where prompt + completion + the
    EOS training appends would pass the model's context (max_position_embeddings), which
    `score-logprobs` and `train` refuse (`beyond_model_context`); transformers would sample on past
    it. A prompt that leaves no room at all is refused. `prompt_ids`: the prompts' tokens, when
    the caller has them (else they are tokenized here)."""
    from nemo_topr.data.tokenization import load_tokenizer
    from nemo_topr.model.source import context_length

    context = context_length(model_dir)
    if context is None:
        return {index: max_new_tokens for index in problems}
    if prompt_ids is None:
        prompt_ids = prompt_ids_checked(load_tokenizer(model_dir), problems)
    full = [index for index, ids in prompt_ids.items() if len(ids) + 2 > context]
    if full:
        first = full[0]
        raise SamplingError(f"prompt {problems[first].prompt_id}: {len(prompt_ids[first])} tokens leave no room for a "
                         f"completion token and EOS in the model's context of {context} (max_position_embeddings in "
                         f"{Path(model_dir) / 'config.json'}); {len(full)} of {len(prompt_ids)} prompts are that long",
                            key="prompts.prompt.beyond_model_context", where=f"prompt {problems[first].prompt_id}")
    return {index: min(max_new_tokens, context - len(ids) - 1) for index, ids in prompt_ids.items()}


def sample_and_grade(model_dir: str | Path, problems: Sequence[Problem], settings: SamplingSettings,
                     backend: str = "auto", device: str = "cpu", log=None, what: str = "nemo-topr generate"
                     ) -> list[list[GradedCompletion]]:
    """Each problem's graded samples, in problem order. With `log` (a `sample_log.SampleLog`) the
    problems it holds are taken from it and each new one is appended as it finishes. Progress
    (samples/s, ETA) goes to stderr."""
    from nemo_topr.model.source import require_hugging_face

    graded = dict(log.done) if log is not None else {}
    todo = {index: problem for index, problem in enumerate(problems) if index not in graded}
    progress = Progress(what, len(problems) * settings.num_samples, "samples",
                        done=(len(problems) - len(todo)) * settings.num_samples)
    for index, completions in iter_completions(require_hugging_face(model_dir), todo, settings, backend, device):
        graded[index] = grade_completions(problems[index], completions)
        if log is not None:
            log.append(index, problems[index], graded[index])
        progress.advance(len(completions))
    return [graded[index] for index in range(len(problems))]
