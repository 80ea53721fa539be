"""Bridge dataset provider for pre-scored TOPR data: validated records -> tokenized -> packed rows.

Bridge's sampler hands out *rows* (one packed row = one Bridge "sample"); ``global_batch_size``
and ``micro_batch_size`` therefore count rows. The row order is fixed before training (packing,
then a seeded shuffle per epoch), so a run resumed from a checkpoint's
``consumed_train_samples`` continues with exactly the rows it had not seen. The last global
batch is completed with empty rows (no sequences, no loss) rather than dropping real data.

Per-prompt statistics are computed here, over the whole dataset and before packing, and travel
with every sequence into the batch (`group_mean_rewards`, `baselines`; see
`nemo_topr.data.packing`): a micro-batch never holds a prompt's whole group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from megatron.bridge.data.base import DatasetBuildContext, DatasetProvider

from nemo_topr.data.packing import TokenizedSequence, collate_packed, pack_sequences, set_group_mean_rewards
from nemo_topr.data.prepared import PrepareSpec, PreparedSet, find_or_prepare
from nemo_topr.data.records import SOURCE_OPTIONS, RecordSet, load_records, require_scored
from nemo_topr.data.sequence_table import (
    RowOrder,
    SequenceTable,
    epoch_orders,
    padding_share_of,
    rows_digest,
    rows_to_arrays,
)
from nemo_topr.data.shared_prefix import collate_shared, pack_shared, shared_padding_share
from nemo_topr.data.sources import HUB_PREFIX, ExtraColumns
from nemo_topr.data.tokenization import TokenizedDataset, TooLong, load_tokenizer, pad_id_of, tokenize_records
from nemo_topr.utils.distributed import launcher_rank
from nemo_topr.training.config_error import ConfigError
from nemo_topr.training.run_state import data_fingerprint


class PackedRows(torch.utils.data.Dataset):
    """Map-style dataset of packed rows; Bridge's DataLoader batches them with `collate_fn`.

    A row is a list of sequence indices, or with `shared_prefix` a list of blocks
    (`nemo_topr.data.shared_prefix`)."""

    def __init__(self, sequences: Sequence[TokenizedSequence], rows: Sequence, seq_length: int, pad_id: int,
                 shared_prefix: bool = False):
        self.sequences, self.rows, self.seq_length, self.pad_id = sequences, rows, seq_length, pad_id
        self.collate = collate_shared if shared_prefix else collate_packed

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> list:
        return self.rows[index]

    def collate_fn(self, rows: list) -> dict[str, torch.Tensor]:
        return self.collate(self.sequences, rows, self.seq_length, self.pad_id)


@dataclass
class PreparedData:
    dataset: TokenizedDataset | PreparedSet  # the sequences (built when indexed from a prepared set), keys, report
    table: SequenceTable  # the sequences as arrays, memory-mapped from a prepared set
    rows: Sequence  # all epochs, padded to a whole number of global batches (rows of blocks when shared)
    pad_id: int
    padding_share: float
    filler_rows: int
    shared_prefix: bool = False
    written: bool | None = None  # whether this start wrote its prepared set; None: no prepared set

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def data_fingerprint(self) -> str:
        """The data part of the run fingerprint (`run_state.data_fingerprint`)."""
        digest = self.dataset.table_digest if isinstance(self.dataset, PreparedSet) else self.table.digest()
        return data_fingerprint(digest, rows_digest(self.rows))

    def summary(self) -> dict[str, Any]:
        return {
            **self.dataset.report.to_dict(),
            "sequences": len(self.table),
            "positives": int((self.table.rewards >= 0).sum()),
            "prompts": self.dataset.prompt_count,
            "record_baselines": self.dataset.record_baselines,
            "rows": self.num_rows,
            "filler_rows": self.filler_rows,
            "padding_share": round(self.padding_share, 4),
            "shared_prefix": self.shared_prefix,
            **({} if self.written is None else {"prepared_set": str(self.dataset.path),
                                                "prepared_set_written": self.written}),
        }


@dataclass(kw_only=True)
class ToprDatasetConfig(DatasetProvider):
    """``dataset:`` section of a TOPR run (Bridge's ConfigContainer.dataset)."""

    train_path: str = ""  # files, directory, glob, save_to_disk directory or hub:owner/name (nemo_topr.data.sources)
    columns: dict[str, str] = field(default_factory=dict)  # our field -> the data's column
    split: str | None = None  # of a saved DatasetDict or a hub dataset
    extra_columns: ExtraColumns = "error"  # "meta": columns that are no field are carried under meta
    rendered_prompts: bool = False  # prompts rendered already, as the sampler read them (records.RenderedPrompt)
    tokenizer_dir: str = ""
    seq_length: int = 2048
    # the base model's max_position_embeddings (build_training_run): a longer record is refused or
    # dropped as too long (positions restart per packed sequence, so only a record can exceed it)
    model_context: int | None = None
    packed: bool = True  # False: one sequence per row (padded batches)
    # True: a row holds a prompt once, then several of its completions (docs/performance.md,
    # shared-prefix packing); TE layers then run FlexCoreAttention (training/flex_attention.py)
    shared_prefix: bool = False
    strict: bool = True  # False: malformed records are dropped and counted in the report
    too_long: TooLong | None = None  # default follows `strict`
    shuffle_seed: int = 1234
    epochs: int = 1
    report_path: str | None = None  # where the data report JSON is written (training.recipe.prepare)
    # where prepared sets are kept (nemo_topr.data.prepared); `nemo-topr train` fills it in
    # (build_training_run: $NEMO_TOPR_PREPARED_DIR, else RUN_DIR/../prepared_data); None: in memory
    prepared_dir: str | None = None
    dataloader_type: str | None = "single"
    num_workers: int = 0

    def use_records(self, records: RecordSet) -> None:
        """Train on `records`, already read and validated from this config's train_path
        (`nemo-topr train` does that before importing Megatron, so a data error comes first)."""
        self._records = records  # outside the dataclass fields, as `_prepared`

    def use_prepared_set(self, prepared: PreparedSet) -> None:
        """Train on `prepared`, this config's prepared set, found already (`nemo-topr train`)."""
        self._found_set = prepared

    def prepare(self, global_batch_size: int) -> PreparedData:
        """Validate, tokenize and pack once (cached); rows padded to whole global batches."""
        # cached outside the dataclass fields: Bridge serialises the config into checkpoints
        if getattr(self, "_prepared", None) is not None:
            return self._prepared
        if not self.train_path:
            raise ConfigError("dataset.train_path is not set", key="dataset.train_path.unset",
                              where="dataset.train_path")
        if self.epochs < 1:
            raise ConfigError(f"dataset.epochs must be >= 1; got {self.epochs}", key="dataset.epochs.below_1",
                              where="dataset.epochs")
        if self.shared_prefix and not self.packed:
            raise ConfigError("dataset.shared_prefix=true packs rows; it cannot be combined with dataset.packed=false",
                              key="dataset.shared_prefix.unpacked", where="dataset.shared_prefix")
        written = None
        if self.prepared_dir and not self.train_path.startswith(HUB_PREFIX):  # a hub dataset has no local files
            dataset, written = self._prepared_set()
            table, epoch_packing, pad_id = dataset.table, (dataset.row_offsets, dataset.row_members), dataset.pad_id
        else:
            dataset, pad_id = self._tokenized()
            set_group_mean_rewards(dataset.sequences)
            table = SequenceTable.from_sequences(dataset.sequences)
            epoch_packing = None
        if self.shared_prefix:
            sequences = list(dataset.sequences)
            shared = pack_shared(sequences, self.seq_length)
            padding = shared_padding_share(sequences, shared, self.seq_length)
            rows: Sequence = [shared[i] for i in epoch_orders(len(shared), self.epochs, self.shuffle_seed)]
            filler = math.ceil(len(rows) / global_batch_size) * global_batch_size - len(rows)
            rows += [[] for _ in range(filler)]
        else:
            if not self.packed:
                epoch_packing = (np.arange(len(table) + 1, dtype=np.int64), np.arange(len(table), dtype=np.int64))
            elif epoch_packing is None:
                epoch_packing = rows_to_arrays(pack_sequences(dataset.sequences, self.seq_length, pad_id))
            order = dict(epochs=self.epochs, seed=self.shuffle_seed)
            total = (len(epoch_packing[0]) - 1) * self.epochs
            filler = math.ceil(total / global_batch_size) * global_batch_size - total
            rows = RowOrder(*epoch_packing, **order, filler=filler)
            padding = padding_share_of(int(table.offsets[-1] - table.offsets[0]), rows.epoch_rows(),
                                       self.seq_length)
        self._prepared = PreparedData(dataset, table, rows, pad_id, padding, filler, self.shared_prefix, written)
        return self._prepared

    def _tokenized(self) -> tuple[TokenizedDataset, int]:
        """(the tokenized data, the pad id), in memory."""
        records = getattr(self, "_records", None) or load_records(
            self.train_path, strict=self.strict, **{name: getattr(self, name) for name in SOURCE_OPTIONS})
        require_scored(records)
        tokenizer = load_tokenizer(self.tokenizer_dir)
        return tokenize_records(records, tokenizer, max_seq_length=self.seq_length, strict=self.strict,
                                too_long=self.too_long, model_context=self.model_context), pad_id_of(tokenizer)

    def _prepared_set(self) -> tuple[PreparedSet, bool]:
        """The prepared set of this data (`nemo_topr.data.prepared`): found, else written by
        launcher rank 0 (which `nemo-topr train` reads before Megatron) and waited for by the
        other ranks."""
        if (found := getattr(self, "_found_set", None)) is not None:
            return found, False
        spec = PrepareSpec(train_path=self.train_path, tokenizer_dir=self.tokenizer_dir, seq_length=self.seq_length,
                           strict=self.strict, too_long=self.too_long, model_context=self.model_context,
                           **{name: getattr(self, name) for name in SOURCE_OPTIONS})
        return find_or_prepare(spec, self.prepared_dir, write=launcher_rank() == 0,
                               records=getattr(self, "_records", None))

    def build_datasets(self, context: DatasetBuildContext):
        if getattr(self, "_prepared", None) is None:
            raise RuntimeError("ToprDatasetConfig.prepare(global_batch_size) must run before training")
        prepared = self._prepared
        return (PackedRows(prepared.dataset.sequences, prepared.rows, self.seq_length, prepared.pad_id,
                           self.shared_prefix), None, None)
