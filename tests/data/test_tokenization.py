"""Tokenization: exact prompt/completion boundary, loss masks, chat templates, length limits."""

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from nemo_topr.data.records import DataError, Record, RecordSet, ValidationReport, load_records
from nemo_topr.data.tokenization import (TokenizerError, load_tokenized, load_tokenizer, prompt_token_ids,
                                         tokenize_records)
from nemo_topr.data.tiny_tokenizer import BOS, CHAT_TOKENS, EOS, PAD, build_tiny_tokenizer

FIXTURES = Path(__file__).parents[1] / "fixtures" / "data"


@pytest.fixture(scope="module")
def chat_tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_chat_tokenizer")
    build_tiny_tokenizer(out)
    return out


@pytest.fixture(scope="module")
def plain_tokenizer():
    return build_tiny_tokenizer(chat_template=False)


def _refusal(call: Callable[[], object]) -> tuple[str, str]:
    """(key, where) of the DataError `call()` raises."""
    with pytest.raises(DataError) as refused:
        call()
    return refused.value.key, refused.value.where


def _record_set(*pairs: tuple[str, str]) -> RecordSet:
    records = [Record(prompt=p, completion=c, reward=1.0, index=i) for i, (p, c) in enumerate(pairs)]
    return RecordSet(records, ValidationReport(records_in=len(records), records_used=len(records)))


def test_tiny_tokenizer_is_deterministic_and_reloads(chat_tokenizer_dir):
    built = build_tiny_tokenizer()
    reloaded = AutoTokenizer.from_pretrained(chat_tokenizer_dir, local_files_only=True)
    assert len(built) == len(reloaded) == 512
    assert built.get_vocab() == reloaded.get_vocab()
    assert (reloaded.bos_token, reloaded.eos_token, reloaded.pad_token) == (BOS, EOS, PAD)
    assert all(token in reloaded.all_special_tokens for token in CHAT_TOKENS)
    text = "Natalia sold 48/2 = 24 clips in May."
    assert reloaded(text)["input_ids"] == built(text)["input_ids"]
    assert reloaded(text)["input_ids"][0] == reloaded.bos_token_id  # Llama-style BOS
    assert reloaded.decode(reloaded(text, add_special_tokens=False)["input_ids"]) == text


def test_tiny_tokenizer_without_chat_template(plain_tokenizer):
    assert not plain_tokenizer.chat_template
    assert not any(token in plain_tokenizer.get_vocab() for token in CHAT_TOKENS)


@pytest.mark.parametrize(
    "prompt, completion",
    [("She sold th", "e rest of the apples."), ("So 10 - 4 = ", "6 apples remain.")],
)
def test_boundary_is_exact_where_joint_tokenization_merges(plain_tokenizer, prompt, completion):
    tok = plain_tokenizer
    prompt_ids = tok(prompt)["input_ids"]
    completion_ids = tok(completion, add_special_tokens=False)["input_ids"]
    joint = tok(prompt + completion)["input_ids"]
    assert joint != prompt_ids + completion_ids  # the case this test exists for

    (seq,) = tokenize_records(_record_set((prompt, completion)), tok).sequences
    assert seq.input_ids == prompt_ids + completion_ids + [tok.eos_token_id]
    assert seq.loss_mask == [0] * len(prompt_ids) + [1] * (len(completion_ids) + 1)


def test_chat_template_renders_messages_and_string_prompts(chat_tokenizer_dir):
    tok = load_tokenizer(chat_tokenizer_dir)
    records = load_records(FIXTURES / "math500_chat.jsonl")
    tokenized = tokenize_records(records, tok)
    seq, record = tokenized.sequences[0], records.records[0]
    n_prompt = seq.loss_mask.count(0)
    prompt_text = tok.decode(seq.input_ids[:n_prompt])
    assert prompt_text.startswith(f"{BOS}<|start_header_id|>system<|end_header_id|>\n\nYou are a careful mathematician.<|eot_id|>")
    assert prompt_text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert tok.decode(seq.input_ids[n_prompt:]) == record.completion + EOS
    assert math.isnan(seq.behavior_logprob)  # the fixture has no behavior_logprob

    (user_turn,) = map(tok.decode, prompt_token_ids(tok, ["What is 2 + 2?"]))
    assert user_turn == f"{BOS}<|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"


def test_chat_prompts_need_a_chat_template(plain_tokenizer):
    records = load_records(FIXTURES / "math500_chat.jsonl")
    with pytest.raises(DataError) as refused:
        tokenize_records(records, plain_tokenizer)
    assert (refused.value.key, refused.value.where) == ("record.prompt.chat_without_template",
                                                        f"{FIXTURES / 'math500_chat.jsonl'}:1: prompt")


def test_dense_ids_and_their_mapping(plain_tokenizer):
    records = load_records(FIXTURES / "gsm8k_scored.jsonl")
    tokenized = tokenize_records(records, plain_tokenizer)
    assert [s.sample_id for s in tokenized.sequences] == list(range(24))
    assert [s.prompt_id for s in tokenized.sequences] == [i // 4 for i in range(24)]
    assert tokenized.prompt_keys == [f"gsm8k-train-{i}" for i in range(6)]
    assert tokenized.sequences[0].behavior_logprob == records.records[0].behavior_logprob


def test_too_long_sequences_raise_or_are_counted(chat_tokenizer_dir):
    malformed = FIXTURES / "malformed.jsonl"
    assert _refusal(lambda: load_tokenized(malformed, chat_tokenizer_dir, max_seq_length=256, strict=False,
                                           too_long="error")) == ("record.completion.too_long",
                                                                  f"{malformed}:14: completion")
    tokenized = load_tokenized(malformed, chat_tokenizer_dir, max_seq_length=256, strict=False)
    report = tokenized.report
    assert report.dropped["too_long"] == 1 and sum(report.dropped.values()) == 13
    assert report.records_in == 16 == len(tokenized.sequences) + sum(report.dropped.values())
    assert report.records_used == len(tokenized.sequences) == 3
    assert max(len(s.input_ids) for s in tokenized.sequences) <= 256
    # any other word (`dataset.too_long=Error`) is refused, not read as drop
    with pytest.raises(TokenizerError) as refused:
        load_tokenized(malformed, chat_tokenizer_dir, max_seq_length=256, strict=False, too_long="Error")
    assert refused.value.key == "too_long.unknown"


def test_a_too_long_prompt_is_blamed_on_the_prompt(plain_tokenizer):
    long_prompt = "Question: " + "one two three " * 40 + "?\nAnswer:"
    prompt_tokens = len(prompt_token_ids(plain_tokenizer, [long_prompt])[0])
    limit = prompt_tokens  # no room for even one completion token and EOS
    assert _refusal(lambda: tokenize_records(_record_set((long_prompt, " 2"), ("Q: 1?\nA:", " 1")), plain_tokenizer,
                                             max_seq_length=limit)) == ("record.prompt.too_long", "prompt")
    assert _refusal(lambda: tokenize_records(
        _record_set(("Q: 1?\nA:", " one two three four five six seven eight nine ten eleven")), plain_tokenizer,
        max_seq_length=12)) == ("record.completion.too_long", "completion")


def test_a_record_longer_than_the_models_context_is_refused_or_dropped_though_it_fits_a_row(plain_tokenizer, tmp_path):
    """Packed rows restart positions at each sequence, so model.seq_length may exceed the model's
    max_position_embeddings; a single record longer than it may not."""
    pairs = [("Q: 1?\nA:", " 1"), ("Q: 2?\nA:", " one two three four five six seven eight nine ten eleven")]
    data = tmp_path / "graded.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "completion": c, "reward": 1.0}) + "\n" for p, c in pairs))
    lengths = [len(plain_tokenizer(p).input_ids) + len(plain_tokenizer(c, add_special_tokens=False).input_ids) + 1
               for p, c in pairs]
    context = lengths[1] - 1  # only the second record is over it
    assert lengths[0] < context

    def tokenized(**options):
        return tokenize_records(load_records(data), plain_tokenizer, max_seq_length=4 * context, **options)

    assert _refusal(lambda: tokenized(model_context=context)) == ("record.completion.beyond_model_context",
                                                                   f"{data}:2: completion")
    dropped = tokenized(model_context=context, too_long="drop")
    assert [s.sample_id for s in dropped.sequences] == [0]
    assert dict(dropped.report.dropped) == {"beyond_model_context": 1} and dropped.report.records_used == 1
    assert len(tokenized(model_context=lengths[1]).sequences) == 2  # a record of exactly the context fits
    assert len(tokenized().sequences) == 2


def test_all_records_too_long_means_no_completion_tokens(plain_tokenizer):
    records = _record_set(("Question: 1 + 1?\nAnswer:", " 2"))
    with pytest.raises(DataError) as refused:
        tokenize_records(records, plain_tokenizer, max_seq_length=3, strict=False)
    assert refused.value.key == "dataset.no_completion_tokens"


def test_missing_or_empty_tokenizer_directory(tmp_path):
    for directory, key in ((tmp_path / "nope", "tokenizer.directory_missing"), (tmp_path, "tokenizer.unloadable")):
        with pytest.raises(DataError) as refused:
            load_tokenizer(directory)
        assert (refused.value.key, refused.value.where) == (key, f"{directory}: tokenizer")


@pytest.mark.slow
def test_a_tokenizer_with_more_tokens_than_the_models_embedding_rows_is_refused(tmp_path):
    """A tokenizer of 2,048 tokens copied into a model of 512 rows ended score-logprobs, generate
    and verifier in torch's "index out of range in self"; fewer tokens than rows is a padded vocabulary."""
    build_tiny_tokenizer(tmp_path, vocab_size=2048)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 512}))
    with pytest.raises(DataError) as refused:
        load_tokenizer(tmp_path)
    assert (refused.value.key, refused.value.where) == ("tokenizer.more_tokens_than_embedding_rows",
                                                        f"{tmp_path}: tokenizer")
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 2048}))
    assert len(load_tokenizer(tmp_path)) == 2048
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 4096}))  # padded rows: fine
    assert len(load_tokenizer(tmp_path)) == 2048


def test_a_tokenizer_without_eos_is_refused_naming_its_directory(tmp_path):
    """A model directory without tokenizer_config.json (or one naming no eos_token) loads a tokenizer
    with no EOS: score-logprobs and train ended in a traceback from tokenize_records (ValueError: the
    tokenizer has no EOS token to end completions with), data validate in that line, naming no directory."""
    build_tiny_tokenizer(tmp_path)
    config = tmp_path / "tokenizer_config.json"
    without_eos = {key: value for key, value in json.loads(config.read_text()).items() if key != "eos_token"}
    config.write_text(json.dumps(without_eos))
    with pytest.raises(DataError) as names_none:
        load_tokenizer(tmp_path)
    config.unlink()
    with pytest.raises(DataError) as missing:
        load_tokenizer(tmp_path)
    for refused in (names_none, missing):
        assert (refused.value.key, refused.value.where) == ("tokenizer.no_eos_token", f"{tmp_path}: tokenizer")


RENDERED = ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_special_tokens_written_in_a_records_text_are_refused_naming_line_field_and_token(chat_tokenizer_dir, tmp_path):
    """A prompt rendered already, as sampling pipelines store it, would get the template (and BOS)
    a second time, and a completion ending in <|eot_id|> a second EOS: a sequence other than the
    one sampled, trained without a word."""
    tokenizer = load_tokenizer(chat_tokenizer_dir)
    twice = prompt_token_ids(tokenizer, [RENDERED])[0]
    assert twice.count(tokenizer.bos_token_id) == 2  # what the check prevents
    data = tmp_path / "rendered.jsonl"
    rows = [{"prompt": "What is 1 + 1?", "completion": " 2", "reward": 1.0},
            {"prompt": RENDERED, "completion": " 4", "reward": 1.0},
            {"prompt": "What is 3 + 3?", "completion": " 6<|eot_id|>", "reward": 1.0}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DataError) as refused:
        load_tokenized(data, chat_tokenizer_dir)
    assert (refused.value.key, refused.value.where) == ("record.prompt.special_token", f"{data}:2: prompt")
    assert "'<|begin_of_text|>'" in str(refused.value)  # the token it holds
    tokenized = load_tokenized(data, chat_tokenizer_dir, strict=False)
    report = tokenized.report
    assert (report.records_in, report.records_used, dict(report.dropped)) == (3, 1, {"special_token": 2})
    assert [s.sample_id for s in tokenized.sequences] == [0]
    assert report.first_error["special_token"].startswith(f"{data}:2: prompt: ")
    # every record dropped here: the DataError of an empty dataset (was an IndexError from the tokenizer)
    data.write_text("".join(json.dumps(row) + "\n" for row in rows[1:]))
    with pytest.raises(DataError) as refused:
        load_tokenized(data, chat_tokenizer_dir, strict=False)
    assert (refused.value.key, refused.value.where) == ("dataset.no_completion_tokens", f"{data}: dataset")
    assert "{'special_token': 2}" in str(refused.value)  # the drops, counted
    messages = tmp_path / "messages.jsonl"
    messages.write_text(json.dumps({"prompt": [{"role": "user", "content": "What is 4 + 4?<|eot_id|>"}],
                                    "completion": " 8", "reward": -1.0}) + "\n")
    with pytest.raises(DataError) as refused:
        load_tokenized(messages, chat_tokenizer_dir)
    assert (refused.value.key, refused.value.where) == ("record.prompt.special_token", f"{messages}:1: prompt")
    assert "'<|eot_id|>'" in str(refused.value)  # the token it holds


def test_rendered_prompts_are_read_as_written_and_equal_the_template_of_the_plain_prompt(chat_tokenizer_dir,
                                                                                          plain_tokenizer, tmp_path):
    """`rendered_prompts`: a prompt stored as the sampler read it gives the very ids the chat
    template gives its user text (BOS once); a completion's special token is still refused, and
    a message list is no rendered prompt."""
    tokenizer = load_tokenizer(chat_tokenizer_dir)
    data = tmp_path / "rendered.jsonl"
    rows = [{"prompt": RENDERED, "completion": " 4", "reward": 1.0},
            {"prompt": RENDERED, "completion": " 5<|eot_id|>", "reward": -1.0},
            {"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "completion": " 4", "reward": 1.0}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    kept = tokenize_records(load_records(data, strict=False, rendered_prompts=True), tokenizer, strict=False)
    assert dict(kept.report.dropped) == {"wrong_type": 1, "special_token": 1}
    assert kept.report.first_error["wrong_type"].startswith(f"{data}:3: prompt: a list of messages, but "
                                                            "rendered_prompts is set")
    assert kept.report.first_error["special_token"].startswith(f"{data}:2: completion: ")
    (sequence,) = kept.sequences
    from_template = prompt_token_ids(tokenizer, ["What is 2 + 2?"])[0]
    assert sequence.input_ids[:len(from_template)] == from_template and sum(sequence.loss_mask) == 2  # " 4", EOS
    assert from_template.count(tokenizer.bos_token_id) == 1 and sequence.input_ids[len(from_template)] != \
        tokenizer.bos_token_id

    not_rendered = tmp_path / "not_rendered.jsonl"  # the option set on plain prompts: no template, no BOS
    not_rendered.write_text(json.dumps({"prompt": "What is 2 + 2?", "completion": " 4", "reward": 1.0}) + "\n")
    assert _refusal(lambda: tokenize_records(load_records(not_rendered, rendered_prompts=True), tokenizer)) == (
        "record.prompt.not_rendered", f"{not_rendered}:1: prompt")

    plain = tmp_path / "plain.jsonl"  # no chat template: BOS written out, where the plain path adds it
    plain.write_text(json.dumps({"prompt": "<|begin_of_text|>Q: 1 + 1?\nA:", "completion": " 2", "reward": 1.0}))
    (rendered,) = tokenize_records(load_records(plain, rendered_prompts=True), plain_tokenizer).sequences
    assert rendered.input_ids[:-2] == prompt_token_ids(plain_tokenizer, ["Q: 1 + 1?\nA:"])[0]


def test_a_completion_with_eos_written_out_is_refused_without_a_chat_template(plain_tokenizer):
    with pytest.raises(DataError) as refused:
        tokenize_records(_record_set(("Q: 1 + 1?\nA:", " 2<|end_of_text|>")), plain_tokenizer)
    assert (refused.value.key, refused.value.where) == ("record.completion.special_token", "completion")
    assert "'<|end_of_text|>'" in str(refused.value)  # the token it holds
