"""Records -> token ids with a loss mask on the completion.

The prompt and the completion are tokenized separately and their ids concatenated, so the
boundary is exact even where tokenizing `prompt + completion` would merge tokens across it
(the behaviour policy scored exactly the completion's tokens). With a chat template the prompt
is rendered as the user turn (or the given message list) followed by the assistant header; the
completion is the assistant turn. Without one, the prompt text is used as is, with the
tokenizer's own special tokens (e.g. BOS). EOS is appended to every completion.

Records hold text: the special tokens (the template's headers, BOS, EOS) come from tokenization
alone. A prompt rendered already (`<|begin_of_text|><|start_header_id|>user...`, as sampling
pipelines store it) would be wrapped a second time, and a completion ending in `<|eot_id|>` get a
second EOS: a different sequence from the one sampled, with no error. Such a record is refused
(`special_token`), naming the token.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from nemo_topr.errors import UserError
from nemo_topr.data.packing import TokenizedSequence
from nemo_topr.data.records import (DataError, Messages, Record, RecordSet, RenderedPrompt, ValidationReport,
                                    load_records)
from nemo_topr.data.schema import located

TooLong = Literal["error", "drop"]


class TokenizerError(UserError, ValueError):
    """A tokenizer that cannot tokenize these records as they are."""


@dataclass
class TokenizedDataset:
    """Tokenized sequences and what is needed to map them back to records."""

    sequences: list[TokenizedSequence]
    prompt_keys: list[str]  # dense prompt_id -> Record.prompt_key (order of first appearance)
    report: ValidationReport

    @property
    def prompt_count(self) -> int:
        return len(self.prompt_keys)

    @property
    def record_baselines(self) -> bool:
        """Whether the records carry their own baseline (all or none: it is part of the schema)."""
        return bool(self.sequences) and not math.isnan(self.sequences[0].baseline)


def load_tokenizer(path: str | Path):
    """A tokenizer from a local directory (never downloaded): a Hugging Face directory, or any
    model `base_model=` takes (a Megatron checkpoint, one of its iterations, a nemo-topr run,
    RUN@ITERATION), whose tokenizer is kept beside the checkpoints in hf_artifacts/. It must fit the
    model's embedding and have an EOS token, which ends every completion."""
    from transformers import AutoTokenizer

    from nemo_topr.model import source as model_source

    directory = Path(path)
    if not any((directory / name).is_file() for name in model_source.TOKENIZER_FILES):
        try:
            directory = model_source.resolve(path, megatron=False).hf_dir
        except model_source.ModelSourceError:
            pass  # not a model: the errors below say what the directory lacks
    if not directory.is_dir():
        raise DataError(path, 0, "tokenizer", "directory does not exist", key="tokenizer.directory_missing",
                        where=f"{path}: tokenizer")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as error:
        raise DataError(path, 0, "tokenizer", f"cannot load a tokenizer from this directory ({error})",
                        key="tokenizer.unloadable", where=f"{path}: tokenizer") from error
    _check_fits_the_model(path, directory, len(tokenizer))
    if tokenizer.eos_token_id is None:  # here, for every verb: tokenize_records' own check was a traceback
        config = directory / "tokenizer_config.json"
        raise DataError(path, 0, "tokenizer", f"no EOS token, which ends every completion trained and scored: {config} "
                        f"{'names no eos_token' if config.is_file() else 'is missing'}; copy the model's own "
                        "tokenizer_config.json there (it names eos_token)",
                        key="tokenizer.no_eos_token", where=f"{path}: tokenizer")
    return tokenizer


def _check_fits_the_model(path: str | Path, directory: Path, tokens: int) -> None:
    """A tokenizer beside a model must not give ids past the model's embedding rows: such an id
    ended `score-logprobs`, `generate` and `verifier` in torch's "index out of range in self".
    Fewer tokens than rows is common (padded vocabularies). A directory without a model's
    config.json (a bare tokenizer, for `data validate --tokenizer`) has nothing to check."""
    try:
        vocab_size = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return  # no model here, or a config that model_source names when the model is read
    if isinstance(vocab_size, int) and tokens > vocab_size:
        raise DataError(path, 0, "tokenizer", f"{tokens} tokens, but the model has {vocab_size} embedding rows "
                        f"(config.json vocab_size): ids from {vocab_size} on have no embedding; this tokenizer is not "
                        "the model's (copy the model's own tokenizer files into its directory)",
                        key="tokenizer.more_tokens_than_embedding_rows", where=f"{path}: tokenizer")


def pad_id_of(tokenizer) -> int:
    """The pad token, falling back to EOS (padding is never attended to nor trained on)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def special_token_text(tokenizer) -> re.Pattern | None:
    """A pattern matching the tokenizer's special tokens written as text (None if it has none)."""
    specials = {token.content for token in tokenizer.added_tokens_decoder.values() if token.special}
    specials = sorted((specials | set(tokenizer.all_special_tokens)) - {""}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, specials))) if specials else None


def prompt_text_problem(prompt: str | Messages, pattern: re.Pattern) -> tuple[str, str] | None:
    """(drop reason, problem) when a prompt's text disagrees with how it is read, else None: a
    plain prompt holding a special token is rendered already, and tokenization adds the chat
    template (or BOS) itself, so they would be there twice; a rendered prompt holding none is not
    rendered, and read as written it would lack the chat template and BOS."""
    if isinstance(prompt, RenderedPrompt):
        if pattern.search(prompt):
            return None
        return ("not_rendered", "holds none of the tokenizer's special tokens, so it is not rendered, but "
                "rendered_prompts is set: read as written it would get no chat template and no BOS; drop the option "
                "for prompts in plain text")
    texts = [prompt] if isinstance(prompt, str) else [message.get("content", "") for message in prompt]
    found = next((match[0] for text in texts if (match := pattern.search(text))), None)
    if found is None:
        return None
    return ("special_token", f"holds the tokenizer's special token {found!r} as text: the prompt looks rendered "
            "already, and tokenization adds the chat template (or BOS) itself, so it would be there twice; give the "
            "user's text, or the conversation as a list of messages, or, for prompts rendered as the sampler read "
            "them, set dataset.rendered_prompts=true (--rendered-prompts)")


def _special_token_problem(record, pattern: re.Pattern) -> tuple[str, str, str] | None:
    """(drop reason, field, problem) for a prompt read other than as written (`prompt_text_problem`)
    or a special token written in the completion, else None."""
    if problem := prompt_text_problem(record.prompt, pattern):
        return problem[0], "prompt", problem[1]
    if match := pattern.search(record.completion):
        return ("special_token", "completion", f"holds the tokenizer's special token {match[0]!r} as text: "
                "tokenization ends every completion with EOS itself; give the text without special tokens")
    return None


def _encode(tokenizer, texts: list[str], *, add_special_tokens: bool) -> list[list[int]]:
    if not texts:  # every record dropped before tokenization: the tokenizer raises IndexError on []
        return []
    return tokenizer(texts, add_special_tokens=add_special_tokens, return_attention_mask=False)["input_ids"]


def prompt_token_ids(tokenizer, prompts: Sequence[str | Messages]) -> list[list[int]]:
    """Ids of everything the model reads before the completion, for each prompt. Rendered prompts
    (`RenderedPrompt`, all or none) are read as written: special tokens parsed, nothing added."""
    if prompts and isinstance(prompts[0], RenderedPrompt):
        return _encode(tokenizer, list(prompts), add_special_tokens=False)
    if tokenizer.chat_template:
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt,
                tokenize=False,
                add_generation_prompt=True,
            )
            for prompt in prompts
        ]
        return _encode(tokenizer, texts, add_special_tokens=False)  # special tokens come from the template
    if not all(isinstance(prompt, str) for prompt in prompts):
        raise TokenizerError("chat-message prompts need a tokenizer with a chat template",
                             key="prompt.chat_without_template", where="prompt")
    return _encode(tokenizer, list(prompts), add_special_tokens=True)


def too_long_policy(too_long: TooLong | None, strict: bool) -> str:
    """What becomes of a record over the length limits: `too_long` as set, else "error" when
    strict and "drop" otherwise (training's rule, which `iterate`'s scoring follows)."""
    return too_long or ("error" if strict else "drop")


def tokenize_records(
    records: RecordSet,
    tokenizer,
    *,
    max_seq_length: int | None = None,
    strict: bool = True,
    too_long: TooLong | None = None,
    model_context: int | None = None,
) -> TokenizedDataset:
    """Tokenize validated records, checking what only tokens reveal.

    A record whose prompt or completion tokenizes to nothing raises when strict and is dropped
    otherwise; one over `max_seq_length` tokens (prompt + completion + EOS), or over the model's
    `model_context` (its max_position_embeddings: positions restart at each packed sequence, so
    only a longer record reaches positions the model was never trained at), is handled by
    `too_long`, which defaults to "error" when strict and "drop" otherwise. Drops are added to
    `records.report`. The dense sample_id of a sequence is its record's `index`; the dense
    prompt_id numbers `Record.prompt_key` in order of first appearance.
    """
    too_long = check_tokenizable(records, tokenizer, too_long, strict)
    prompt_keys: dict[str, int] = {}
    sequences = tokenize_chunk(records.records, tokenizer, prompt_keys, special_token_text(tokenizer), records.report,
                               strict=strict, too_long=too_long, limits=(max_seq_length, model_context))
    count_used(records.report, len(sequences))
    return TokenizedDataset(sequences, list(prompt_keys), records.report)


def tokenized_stream(
    chunks: Iterable[Sequence[Record]],
    tokenizer,
    report: ValidationReport,
    prompt_keys: dict[str, int],
    *,
    max_seq_length: int | None = None,
    strict: bool = True,
    too_long: TooLong | None = None,
    model_context: int | None = None,
) -> Iterator[tuple[Sequence[Record], list[TokenizedSequence]]]:
    """`tokenize_records` over chunks of records read one chunk at a time (`RecordReader`), drops
    counted into `report`: (each chunk, its sequences in its records' order)."""
    too_long = _checked_policy(tokenizer, too_long, strict)
    pattern = special_token_text(tokenizer)
    used = 0
    for chunk in chunks:
        _check_chat_prompts(chunk, tokenizer)
        sequences = tokenize_chunk(chunk, tokenizer, prompt_keys, pattern, report, strict=strict,
                                   too_long=too_long, limits=(max_seq_length, model_context))
        used += len(sequences)
        yield chunk, sequences
    count_used(report, used)


def check_tokenizable(records: RecordSet, tokenizer, too_long: TooLong | None, strict: bool) -> str:
    """The too-long policy in force (`too_long_policy`), after the checks that hold for the
    records as a whole: a known policy, a tokenizer with an EOS token, a chat template where a
    prompt is a message list."""
    too_long = _checked_policy(tokenizer, too_long, strict)
    _check_chat_prompts(records.records, tokenizer)
    return too_long


def _checked_policy(tokenizer, too_long: TooLong | None, strict: bool) -> str:
    """`too_long_policy`, refused when unknown, and a tokenizer that can end a completion."""
    too_long = too_long_policy(too_long, strict)
    if too_long not in get_args(TooLong):  # anything but "error" would drop
        raise TokenizerError(f"too_long must be one of {get_args(TooLong)}; got {too_long!r}",
                             key="too_long.unknown", where="too_long")
    if tokenizer.eos_token_id is None:
        raise TokenizerError("the tokenizer has no EOS token to end completions with",
                             key="tokenize.tokenizer_without_eos", where="tokenizer")
    return too_long


def _check_chat_prompts(records: Sequence[Record], tokenizer) -> None:
    if not tokenizer.chat_template:
        chat = next((r for r in records if not isinstance(r.prompt, str)), None)
        if chat is not None:
            raise DataError(chat.path, chat.line, "prompt",
                            "chat-message prompts need a tokenizer with a chat template",
                            key="record.prompt.chat_without_template", where=located(chat.path, chat.line, "prompt"))


def count_used(report: ValidationReport, used: int) -> None:
    """Set the report's records_used once every record is tokenized; none kept is refused."""
    report.records_used = used
    if not used:
        problem = f"no completion tokens: all {report.records_in} records dropped {dict(report.dropped)}"
        raise DataError(",".join(report.files), 0, "dataset", problem, key="dataset.no_completion_tokens",
                        where=f"{','.join(report.files)}: dataset")


def tokenize_chunk(records: Sequence[Record], tokenizer, dense_prompt_id: dict[str, int], pattern, report, *,
                   strict: bool, too_long: str, limits: tuple[int | None, int | None]) -> list[TokenizedSequence]:
    """The sequences of `records` (a chunk of a set, or all of it): first the special-token checks
    of every record, then one batch encoding of the distinct prompts and one of the completions,
    then the length checks; drops and refusals go to `report.reject` in that order; `dense_prompt_id`
    numbers prompt keys as they first appear among the kept sequences."""
    kept = []
    for record in records:
        if pattern and (problem := _special_token_problem(record, pattern)):
            report.reject(problem[0], _rejection(record, *problem), strict)
        else:
            kept.append(record)
    prompts: dict[str, str | Messages] = {}  # load_records ensures one prompt per prompt_id
    for record in kept:
        prompts.setdefault(record.prompt_key, record.prompt)
    prompt_ids_by_key = dict(zip(prompts, prompt_token_ids(tokenizer, list(prompts.values()))))
    completions = _encode(tokenizer, [r.completion for r in kept], add_special_tokens=False)
    eos_id = tokenizer.eos_token_id
    sequences = []
    for record, completion_ids in zip(kept, completions):
        key = record.prompt_key
        prompt_ids = prompt_ids_by_key[key]
        if not prompt_ids or not completion_ids:
            name = "prompt" if not prompt_ids else "completion"
            report.reject(f"empty_{name}", _rejection(record, f"empty_{name}", name, "tokenizes to no tokens"), strict)
            continue
        problem = _over_a_limit(len(prompt_ids), len(completion_ids), *limits)
        if problem:
            report.reject(problem[0], _rejection(record, *problem), strict=too_long == "error")
            continue
        sequences.append(
            TokenizedSequence(
                input_ids=prompt_ids + completion_ids + [eos_id],
                loss_mask=[0] * len(prompt_ids) + [1] * (len(completion_ids) + 1),
                reward=record.reward,
                behavior_logprob=math.nan if record.behavior_logprob is None else record.behavior_logprob,
                baseline=math.nan if record.baseline is None else record.baseline,
                prompt_id=dense_prompt_id.setdefault(key, len(dense_prompt_id)),
                sample_id=record.index,
            )
        )
    return sequences


def _rejection(record: Record, reason: str, field: str, problem: str) -> DataError:
    """The error of a record dropped under `reason`, raised instead when strict: key record.FIELD.REASON."""
    return DataError(record.path, record.line, field, problem, key=f"record.{field}.{reason}",
                     where=located(record.path, record.line, field))


def _over_a_limit(prompt: int, completion: int, max_seq_length: int | None,
                  model_context: int | None) -> tuple[str, str, str] | None:
    """(drop reason, field to blame, problem) of a record of these token counts over a limit, or None."""
    length = prompt + completion + 1
    limits = (("too_long", max_seq_length, f"max_seq_length {max_seq_length}"),
              ("beyond_model_context", model_context, f"the model's context {model_context} "
               "(max_position_embeddings in its config.json): positions it was never trained at"))
    for reason, limit, what in limits:
        if limit is not None and length > limit:
            # blame the prompt when it leaves no room for a completion token and EOS
            name = "prompt" if prompt + 2 > limit else "completion"
            return reason, name, f"{length} tokens ({prompt} prompt + {completion} completion + EOS) > {what}"
    return None


def load_tokenized(
    paths,
    tokenizer_dir: str | Path,
    *,
    max_seq_length: int | None = None,
    strict: bool = True,
    too_long: TooLong | None = None,
    **source: Any,
) -> TokenizedDataset:
    """Read, validate and tokenize a dataset in one call (see `tokenize_records`); `source`:
    `load_records`' columns, split and extra_columns."""
    records = load_records(paths, strict=strict, **source)
    tokenizer = load_tokenizer(tokenizer_dir)
    return tokenize_records(records, tokenizer, max_seq_length=max_seq_length, strict=strict, too_long=too_long)
