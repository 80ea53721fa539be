"""A tiny byte-level BPE tokenizer, built offline, for tests and demos.

Trained with the `tokenizers` library on GSM8K train text, so its merges (and therefore token
lengths and merges across a prompt/completion boundary) look like a real tokenizer's. Special
tokens and the chat template follow Llama 3, the paper's model family.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
CHAT_TOKENS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")

LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def gsm8k_corpus(data_dir: str | Path | None = None) -> list[str]:
    """Questions and answers of the GSM8K train split, the default training text."""
    from nemo_topr.data.prompts import load_gsm8k

    rows = load_gsm8k("train", data_dir)
    return [row["question"] for row in rows] + [row["answer"] for row in rows]


def build_tiny_tokenizer(
    out_dir: str | Path | None = None,
    *,
    vocab_size: int = 512,
    chat_template: bool = True,
    corpus: Iterable[str] | None = None,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer (deterministic, about a second on GSM8K train).

    `vocab_size` counts the 256 byte tokens and the special tokens; `corpus` defaults to
    GSM8K train (`gsm8k_corpus`). With `out_dir`, the tokenizer is saved there so that
    `AutoTokenizer.from_pretrained(out_dir, local_files_only=True)` reloads it.
    """
    special_tokens = [BOS, EOS, PAD, *(CHAT_TOKENS if chat_template else ())]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(gsm8k_corpus() if corpus is None else corpus, trainer)
    # Like Llama 3: encoding with add_special_tokens=True prepends BOS.
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bpe.token_to_id(BOS))]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        extra_special_tokens=list(CHAT_TOKENS) if chat_template else [],
        chat_template=LLAMA3_CHAT_TEMPLATE if chat_template else None,
    )
    if out_dir is not None:
        tokenizer.save_pretrained(str(out_dir))
    return tokenizer

