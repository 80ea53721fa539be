"""Pre-scored records: schema, validation and the drop report.

A record is one sampled completion with its reward (see docs/data.md):

    prompt            str, or a list of chat messages {"role": str, "content": str}
    completion        str, non-empty (or TRL's conversational form: [one assistant message])
    reward            finite number, |reward| <= MAX_ABS_REWARD (1e6)
    behavior_logprob  optional finite number <= 0: log mu(completion | prompt), summed over tokens
    prompt_id         optional str or int
    sample_id         optional str or int; unique per prompt (prompt_id, else the prompt text)
    baseline          optional finite number (|baseline| <= 1e6): this record's own baseline b in the advantage
                      R - b (e.g. leave-one-out); all records or none (docs/objective.md)
    meta              optional JSON object, carried along untouched

Rows come from `nemo_topr.data.sources` (JSONL, Parquet, Arrow, save_to_disk directories, hub
datasets named hub:owner/name), renamed by an optional column mapping, each with its location, so
that every error names `source:row: field: problem` (line 0: the file or dataset as a whole).
Record-level problems raise in strict mode and are counted as drops otherwise; problems with a
whole file, with the schema or with the column mapping always raise.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from nemo_topr.errors import did_you_mean
from nemo_topr.data.schema import FIELDS, REQUIRED_FIELDS, DataError, RejectedRow
from nemo_topr.data.report import ValidationReport
from nemo_topr.data.sources import ColumnMapping, open_sources, refusal, spec_name
from nemo_topr.utils.outputs import written_whole

Messages = list[dict[str, str]]

# load_records' options that say how to read a source, under the same names in a config's
# `dataset:` section, ToprDatasetConfig's fields and the verbs' flags (data/cli.add_source_arguments)
SOURCE_OPTIONS = ("columns", "split", "extra_columns", "rendered_prompts")


class RenderedPrompt(str):
    """A prompt rendered already, as the sampler read it (chat template, BOS and other special
    tokens written out): `load_records(rendered_prompts=True)`. Tokenization reads it as written,
    its special tokens as tokens, and adds nothing (`nemo_topr.data.tokenization`)."""


@dataclass(frozen=True)
class Record:
    """One validated record; `index` is its position among all records read (dropped included)."""

    prompt: str | Messages
    completion: str
    reward: float
    behavior_logprob: float | None = None
    prompt_id: str | int | None = None
    sample_id: str | int | None = None
    baseline: float | None = None
    meta: dict[str, Any] | None = None
    path: str = ""
    line: int = 0
    index: int = 0

    @property
    def prompt_key(self) -> str:
        """Groups the samples of one prompt: the prompt_id if given, else the prompt itself."""
        if self.prompt_id is not None:
            return str(self.prompt_id)
        return self.prompt if isinstance(self.prompt, str) else json.dumps(self.prompt, sort_keys=True)

    @property
    def prompt_name(self) -> str | int:
        """The prompt as an error names it: its prompt_id, else "(prompt text)"."""
        return self.prompt_id if self.prompt_id is not None else "(prompt text)"

    def error(self, field: str, problem: str, *, key: str | None = None, where: str | None = None) -> DataError:
        return DataError(self.path, self.line, field, problem, key=key, where=where)

    def rejected(self, reason: str, problem: str, *, key: str, where: str) -> RejectedRow:
        """Problem `key` of this record's field `where`: raised when strict, else dropped under `reason`."""
        return RejectedRow(reason, DataError(self.path, self.line, where, problem, key=key))

    def to_json(self) -> dict[str, Any]:
        """The record as written to JSONL: schema fields only, absent optionals left out."""
        values = {name: getattr(self, name) for name in FIELDS}
        return {name: value for name, value in values.items() if value is not None}


# The largest |reward| (and |baseline|) accepted. Training computes the loss from float32
# cross-entropies and the gradient norm as the root of a float32 sum of squares (largest finite
# value 3.4e38): a gradient entry scales with the advantage R - b times activations summed over a
# batch's tokens, so with |R - b| <= 2e6 the squared norm over 1e12 parameters stays finite while
# that product stays below ~1e7. Larger rewards made a run train on NaN (issue 29); rewards of
# realistic scale (0/1, +-1, rubric scores) are far below this.
MAX_ABS_REWARD = 1e6


def is_positive(reward: float) -> bool:
    """The paper's T+ (R >= 0), the rule `nemo_topr.objective` applies by default."""
    return reward >= 0


@dataclass
class RecordSet:
    """Validated records plus the report of how they were obtained."""

    records: list[Record]
    report: ValidationReport

    def to_hf_dataset(self):
        """The records as a `datasets.Dataset`; `meta` becomes a JSON string (its keys vary)."""
        import datasets

        rows = [record.to_json() for record in self.records]
        for row in rows:
            if "meta" in row:
                row["meta"] = json.dumps(row["meta"])
        return datasets.Dataset.from_list(rows)


# ---------------------------------------------------------------------------------------------
# Validating one row


def is_number(value: Any) -> bool:
    """A JSON number: an int or a float, never a boolean."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_id(value: Any) -> bool:
    """A `prompt_id` or `sample_id`: a string or an integer, never a boolean."""
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def _is_finite(value: int | float) -> bool:
    """math.isfinite, which raises OverflowError on an int beyond float range (JSON allows 10**400):
    an int is finite, and the range checks after this one refuse it as out of range."""
    return isinstance(value, int) or math.isfinite(value)


def _shown(value: int | float) -> str:
    """A number as an error names it: an int beyond float range in scientific notation, not its 400 digits."""
    return f"{Decimal(value):.3e}" if isinstance(value, int) and abs(value) > sys.float_info.max else str(value)


def _type_name(value: Any) -> str:
    names = {type(None): "null", str: "string", bool: "boolean", dict: "object", list: "array"}
    return names.get(type(value), "number")


# A code point a JSON escape can name but UTF-8 cannot encode: half of a pair (`"\ud83d"`, an emoji
# cut in two) that json.loads keeps as is, where a whole pair becomes one character. The tokenizer
# refused it in a TypeError traceback, and writing the record (data curate) in a bare UnicodeEncodeError.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate_problem(text: str) -> str | None:
    """The problem of a text holding a lone UTF-16 surrogate, else None."""
    if match := _LONE_SURROGATE.search(text):
        return (f"holds a lone UTF-16 surrogate \\u{ord(match[0]):04x} (e.g. a truncated emoji), which cannot be "
                "encoded as UTF-8; fix the text or drop the record")
    return None


def _strings_of(value: Any, name: str):
    """(dotted name, string) for every string in a JSON value; an object's keys are named as the object."""
    if isinstance(value, str):
        yield name, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield name, key
            yield from _strings_of(item, f"{name}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings_of(item, f"{name}[{i}]")


# The roles Llama 3.1's chat template renders (it writes tool as ipython); any other role was
# rendered as its own header (`<|start_header_id|>usr<|end_header_id|>`), which the model never saw.
CHAT_ROLES = ("system", "user", "assistant", "ipython", "tool")


def check_messages(path: str | Path, line: int, messages: list) -> None:
    """Each message is an object with a known string `role` and string `content` without a lone
    surrogate; the last user message asks something, and the last message is not the assistant's.
    RejectedRow names the first problem."""

    def rejected(reason: str, problem: str, *, key: str, where: str) -> RejectedRow:
        return RejectedRow(reason, DataError(path, line, where, problem, key=key))

    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise rejected("wrong_type", f"expected a message object, got {_type_name(message)}",
                           key="record.prompt.message.not_an_object", where=f"prompt[{i}]")
        for name in ("role", "content"):
            if not isinstance(message.get(name), str):
                problem = f"expected a string, got {_type_name(message.get(name))}"
                raise rejected("wrong_type", problem, key=f"record.prompt.message.{name}.not_a_string",
                               where=f"prompt[{i}].{name}")
        role = message["role"]
        if role not in CHAT_ROLES:
            raise rejected("invalid_message", f"unknown role {role!r}; the chat template knows "
                           f"{', '.join(CHAT_ROLES)}" + did_you_mean(role, CHAT_ROLES, quote=True),
                           key="record.prompt.message.role.unknown", where=f"prompt[{i}].role")
        if problem := lone_surrogate_problem(message["content"]):
            raise rejected("invalid_utf8", problem, key="record.prompt.message.content.lone_surrogate",
                           where=f"prompt[{i}].content")
    if not messages:
        return
    # the completion follows the prompt rendered with a new assistant header, so a last assistant
    # message would be a finished turn the completion does not continue
    if messages[-1]["role"] == "assistant":
        raise rejected("invalid_message", "the last message is the assistant's: the completion is a new assistant "
                       "turn after it, not its continuation; end the prompt with the message the completion answers, "
                       "and put text the assistant began into the completion",
                       key="record.prompt.ends_with_assistant", where=f"prompt[{len(messages) - 1}].role")
    last_user = next((i for i in reversed(range(len(messages))) if messages[i]["role"] == "user"), None)
    if last_user is not None and not messages[last_user]["content"]:
        raise rejected("empty_prompt", "is empty (the last user message)", key="record.prompt.last_user_message.empty",
                       where=f"prompt[{last_user}].content")
    if not any(message["content"] for message in messages):
        raise rejected("empty_prompt", "every message's content is empty", key="record.prompt.messages.empty",
                       where="prompt")


def _assistant_content(completion: list, rejected) -> str:
    """The text of TRL's conversational completion, a list of one assistant message."""
    message = completion[0] if len(completion) == 1 else None
    if not (isinstance(message, dict) and message.get("role") == "assistant"
            and isinstance(message.get("content"), str)):
        raise rejected("wrong_type", "expected a string or one assistant message {role: assistant, content: string}",
                       key="record.completion.not_one_assistant_message", where="completion")
    return message["content"]


def _record_from_row(path: str, line: int, row: Any, index: int, mapping: ColumnMapping) -> Record:
    """The Record a parsed row describes, or RejectedRow naming the first problem found; a
    field renamed by `mapping` is named with its column."""

    def rejected(reason: str, problem: str, *, key: str, where: str) -> RejectedRow:
        return RejectedRow(reason, DataError(path, line, mapping.label(where), problem, key=key))

    if not isinstance(row, dict):
        raise rejected("wrong_type", f"expected a JSON object, got {_type_name(row)}", key="record.not_an_object",
                       where="record")
    unknown = sorted(set(row) - set(FIELDS))
    if unknown:  # a schema problem (often a misspelt field), never a per-record drop
        known = ", ".join(FIELDS)
        raise refusal(path, line, f"unknown field; known fields: {known} (put extra data under 'meta', map columns "
                      "to fields with a column mapping, or set extra_columns=meta)", key="record.unknown_field",
                      where=unknown[0])
    for name in REQUIRED_FIELDS:
        if row.get(name) is None:
            raise rejected("missing_field", "missing" if name not in row else "is null", key=f"record.{name}.missing",
                           where=name)
    values = {name: row.get(name) for name in FIELDS}

    prompt, completion = values["prompt"], values["completion"]
    if isinstance(completion, list):
        completion = _assistant_content(completion, rejected)
    if isinstance(prompt, list):
        check_messages(path, line, prompt)
    elif not isinstance(prompt, str):
        raise rejected("wrong_type", f"expected a string or a list of messages, got {_type_name(prompt)}",
                       key="record.prompt.wrong_type", where="prompt")
    if not isinstance(completion, str):
        raise rejected("wrong_type", f"expected a string, got {_type_name(completion)}",
                       key="record.completion.wrong_type", where="completion")
    for name in ("reward", "behavior_logprob", "baseline"):
        if values[name] is not None and not is_number(values[name]):
            # a sampler's per-token log-probs (vLLM's `logprobs`): TOPR's ratio is over the whole sequence
            per_token = (": the completion's log mu(y|x) is one number, the sum over its tokens; score it with "
                         "`nemo-topr score-logprobs` (the trainer's own numerics, so rho = 1 at step 0)"
                         if name == "behavior_logprob" and isinstance(values[name], list) else "")
            raise rejected("wrong_type", f"expected a number, got {_type_name(values[name])} {values[name]!r}"
                           f"{per_token}", key=f"record.{name}.not_a_number", where=name)
    for name in ("prompt_id", "sample_id"):
        if values[name] is not None and not is_id(values[name]):
            raise rejected("wrong_type", f"expected a string or an integer, got {_type_name(values[name])}",
                           key=f"record.{name}.not_an_id", where=name)
    if values["meta"] is not None and not isinstance(values["meta"], dict):
        raise rejected("wrong_type", f"expected an object, got {_type_name(values['meta'])}",
                       key="record.meta.not_an_object", where="meta")
    # messages' content is check_messages'; meta too, as data curate writes it
    texts = {**values, "prompt": prompt if isinstance(prompt, str) else None, "completion": completion}
    for name in ("prompt", "completion", "prompt_id", "sample_id", "meta"):
        for where, text in _strings_of(texts[name], name):
            if problem := lone_surrogate_problem(text):
                raise rejected("invalid_utf8", problem, key=f"record.{name}.lone_surrogate", where=where)

    reward, logprob, baseline = values["reward"], values["behavior_logprob"], values["baseline"]
    if not _is_finite(reward):
        raise rejected("nonfinite_reward", f"must be finite, got {reward}", key="record.reward.not_finite",
                       where="reward")
    if abs(reward) > MAX_ABS_REWARD:
        raise rejected("reward_out_of_range", f"|{_shown(reward)}| > {MAX_ABS_REWARD:g} overflows the training loss "
                       "or its gradient norm in float32; rescale the rewards", key="record.reward.out_of_range",
                       where="reward")
    # the lower bound refuses an int below float range (-10**400), which float() below could not convert
    if logprob is not None and not (_is_finite(logprob) and -sys.float_info.max <= logprob <= 0):
        problem = f"must be a finite log-probability <= 0, got {_shown(logprob)}"
        raise rejected("invalid_behavior_logprob", problem, key="record.behavior_logprob.not_a_logprob",
                       where="behavior_logprob")
    if baseline is not None and not _is_finite(baseline):
        raise rejected("nonfinite_baseline", f"must be finite, got {baseline}", key="record.baseline.not_finite",
                       where="baseline")
    if baseline is not None and abs(baseline) > MAX_ABS_REWARD:
        raise rejected("baseline_out_of_range", f"|{_shown(baseline)}| > {MAX_ABS_REWARD:g} overflows the training "
                       "loss or its gradient norm in float32", key="record.baseline.out_of_range", where="baseline")
    if not prompt:
        raise rejected("empty_prompt", "is empty", key="record.prompt.empty", where="prompt")
    if not completion:
        raise rejected("empty_completion", "is empty", key="record.completion.empty", where="completion")

    return Record(
        prompt=prompt,
        completion=completion,
        reward=float(reward),
        behavior_logprob=None if logprob is None else float(logprob),
        prompt_id=values["prompt_id"],
        sample_id=values["sample_id"],
        baseline=None if baseline is None else float(baseline),
        meta=values["meta"],
        path=str(path),
        line=line,
        index=index,
    )


def _rendered(record: Record) -> Record:
    if not isinstance(record.prompt, str):
        raise record.rejected("wrong_type", "a list of messages, but rendered_prompts is set: a rendered prompt is "
                              "one string, as the sampler read it", key="record.prompt.not_rendered", where="prompt")
    return replace(record, prompt=RenderedPrompt(record.prompt))


# ---------------------------------------------------------------------------------------------
# Checks across records


def require_scored(records: RecordSet) -> None:
    """Training needs log mu of every record: data without `behavior_logprob` (one schema per
    dataset: all records have it or none) is refused, naming the command that adds it."""
    if records.records and records.records[0].behavior_logprob is None:
        raise refusal(",".join(records.report.files), 0, "absent: score the data first (`nemo-topr score-logprobs`)",
                      key="dataset.behavior_logprob.absent", where="behavior_logprob")


def schema_of(record: Record) -> dict[str, str]:
    """Field -> kind; all records of a dataset share it (meta is free-form and left out)."""
    schema = {"prompt": "string" if isinstance(record.prompt, str) else "messages"}
    for name in ("behavior_logprob", "baseline"):
        if getattr(record, name) is not None:
            schema[name] = "number"
    for name in ("prompt_id", "sample_id"):
        value = getattr(record, name)
        if value is not None:
            schema[name] = "string" if isinstance(value, str) else "integer"
    return schema


def _schema_difference(schema: dict[str, str], expected: dict[str, str]) -> tuple[str, str, str]:
    """(field, its kind here, its kind in `expected`) for the first field that differs."""
    name = next(name for name in FIELDS if schema.get(name) != expected.get(name))
    return name, schema.get(name, "absent or null"), expected.get(name, "absent or null")


def _digest(value: Any) -> bytes:  # what the checks keep of a prompt or an id: 16 bytes, not its text
    return hashlib.blake2b(json.dumps(value, sort_keys=True).encode(), digest_size=16).digest()


class _ConsistencyCheck:
    """One schema, one prompt per prompt_id, unique (prompt, sample_id): kept as digests and places, not records."""

    def __init__(self) -> None:
        self.schema, self.schema_path = None, ""
        self.file_schema: dict[str, str] | None = None
        self.first_of_prompt_id: dict[str | int, tuple[bytes, str, int]] = {}  # the prompt's digest, path, line
        self.first_of_id: dict[bytes, tuple[str, int]] = {}  # (prompt key, sample_id)'s digest -> path, line

    def start_file(self) -> None:
        self.file_schema = None

    def check(self, record: Record) -> None:
        schema = schema_of(record)
        if self.schema is None:
            self.schema, self.schema_path = schema, record.path
        if self.file_schema is None:  # a file's first record fixes its schema
            self.file_schema = schema
            if schema != self.schema:
                name, here, there = _schema_difference(schema, self.schema)
                raise refusal(record.path, record.line, f"schema differs between files: {here} here, {there} in "
                              f"{self.schema_path}", key="dataset.schema.differs_between_files", where=name)
        if schema != self.file_schema:
            name, here, there = _schema_difference(schema, self.file_schema)
            problem = f"schema differs within the file: {here} here, {there} in earlier records"
            raise record.rejected("schema_mismatch", problem, key="record.schema.differs_within_file", where=name)
        if record.prompt_id is not None:
            prompt = _digest(record.prompt)
            first, path, line = self.first_of_prompt_id.setdefault(record.prompt_id, (prompt, record.path, record.line))
            if first != prompt:
                problem = f"differs from the prompt of prompt_id {record.prompt_id!r} at {path}:{line}"
                raise record.rejected("conflicting_prompt", problem, key="record.prompt.conflicts", where="prompt")
        if record.sample_id is not None:  # the prompt stands in for a missing prompt_id
            place, key = (record.path, record.line), _digest([record.prompt_key, record.sample_id])
            if (first := self.first_of_id.setdefault(key, place)) is not place:
                problem = f"duplicate sample_id {record.sample_id!r} of prompt {record.prompt_name!r}"
                problem += f"; first at {first[0]}:{first[1]}"
                raise record.rejected("duplicate_id", problem, key="record.sample_id.duplicate", where="sample_id")


# ---------------------------------------------------------------------------------------------
# Loading a dataset


class RecordReader:
    """`load_records`' records one at a time, none held (`score-logprobs` streams): each `read` opens
    the sources again and yields the same records in the same order."""

    def __init__(self, paths: str | Path | Sequence[str | Path], *, strict: bool = True,
                 columns: Mapping[str, str] | str | Sequence[str] | None = None, split: str | None = None,
                 extra_columns: str = "error", rendered_prompts: bool = False):
        self.spec = spec_name(paths)
        self.mapping = ColumnMapping.parse(columns, extra_columns=extra_columns, source=self.spec)
        self.sources, self.notes = open_sources(paths, split=split)
        self.strict, self.rendered_prompts = strict, rendered_prompts

    def new_report(self) -> ValidationReport:
        return ValidationReport(files=[source.name for source in self.sources], notes=list(self.notes))

    def read(self, report: ValidationReport) -> Iterator[Record]:
        """The records, counting every row read and dropped into `report` (its records_used once the
        last is read); raises as `load_records` does."""
        consistency, used = _ConsistencyCheck(), 0
        for source in self.sources:
            consistency.start_file()
            records_before = report.records_in
            for line, row in self.mapping.rows(source):
                report.records_in += 1
                try:
                    if isinstance(row, RejectedRow):
                        raise row
                    record = _record_from_row(source.name, line, row, report.records_in - 1, self.mapping)
                    record = _rendered(record) if self.rendered_prompts else record
                    consistency.check(record)
                except RejectedRow as rejected:
                    report.reject(rejected.reason, rejected.error, self.strict)
                    continue
                used += 1
                yield record
            if report.records_in == records_before:
                raise refusal(source.name, 0, "empty (no records)", key="file.empty", where="file")
        report.records_used = used
        if not used:
            problem = f"no usable records ({report.records_in} read, all dropped: {dict(report.dropped)})"
            raise refusal(self.spec, 0, problem, key="dataset.no_usable_records", where="dataset")


def load_records(paths: str | Path | Sequence[str | Path], *, strict: bool = True,
                 columns: Mapping[str, str] | str | Sequence[str] | None = None, split: str | None = None,
                 extra_columns: str = "error", rendered_prompts: bool = False) -> RecordSet:
    """Read and validate every record under `paths` (see `nemo_topr.data.sources`: files,
    directories, globs, save_to_disk directories, hub:owner/name).

    `columns` maps our fields to the source's columns (`{"prompt": "question"}`, or
    "prompt=question,reward=score"); `split` picks a DatasetDict's or hub dataset's split;
    `extra_columns="meta"` carries columns that are no field under `meta`; `rendered_prompts`:
    every prompt is one string rendered already (`RenderedPrompt`; a message list is refused).

    Strict: the first problem raises DataError. Non-strict: records with a problem are
    dropped and counted by reason in the report. Missing, empty or unreadable files, mixed
    formats, a bad column mapping, unknown fields, a schema that differs between files and a
    dataset left with no records raise in both modes.
    """
    reader = RecordReader(paths, strict=strict, columns=columns, split=split, extra_columns=extra_columns,
                          rendered_prompts=rendered_prompts)
    report = reader.new_report()
    return RecordSet(list(reader.read(report)), report)


def write_jsonl(records: Sequence[Record], path: str | Path) -> None:
    """Write records in the input schema (readable again by `load_records`), whole or not at all
    (`written_whole`): a kill or an error half-way leaves neither half a dataset under that name
    nor the file it was to replace (`--overwrite`) lost."""
    with written_whole(path) as out:
        out.writelines(map(jsonl_line, records))


def jsonl_line(record: Record) -> str:
    return json.dumps(record.to_json(), ensure_ascii=False) + "\n"
