"""Data: find it, load it with `datasets`, check it, tokenize it, batch it.

Classification keeps examples whole and pads each batch to its longest member, with
batches drawn from length-sorted pools so little padding is left. Language modelling packs
the token stream into fixed blocks, so there is no padding at all.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .args import TrainArgs, exists_here
from .contract import Contract
from .offline import hub_load

ASSETS = Path(__file__).parent / "assets"
BUILTIN = {"sentiment": ASSETS / "sentiment.jsonl", "corpus": ASSETS / "corpus.txt"}
BUILDERS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text"}


class DataError(ValueError):
    """Bad data input; the message is one line that names the flag or file."""


@dataclass
class PreparedData:
    train: Any  # datasets.Dataset, tokenized
    validation: Any
    label_names: list[str] | None
    lengths: list[int] | None  # train example lengths, for length-grouped batches
    padded: bool  # True when batches need dynamic padding


# ---------------------------------------------------------------- finding and loading


def resolve_sources(args: TrainArgs, contract: Contract) -> tuple[str, dict]:
    """Where the data comes from, as (description, load_dataset kwargs)."""
    if args.dataset and args.dataset.startswith("builtin:"):
        name = args.dataset.split(":", 1)[1]
        if name not in BUILTIN:
            raise DataError(f"--dataset {args.dataset}: no such builtin; choose builtin:sentiment or builtin:corpus")
        return args.dataset, _files_kwargs({"train": [BUILTIN[name]]}, "--dataset")
    if args.dataset and exists_here(Path(args.dataset)):
        return args.dataset, _folder_or_file(Path(args.dataset), "--dataset")
    if args.dataset:
        return args.dataset, {"path": args.dataset, "name": args.dataset_config}
    if args.train_file:
        files = {"train": [Path(args.train_file)]}
        if args.validation_file:
            files["validation"] = [Path(args.validation_file)]
        return args.train_file, _files_kwargs(files, "--train-file")
    if "train" in contract.channels:
        files = {"train": _channel_files(contract.channels["train"])}
        for name in ("validation", "valid", "test"):
            if name in contract.channels:
                files["validation"] = _channel_files(contract.channels[name])
                break
        return f"channel {contract.channels['train']}", _files_kwargs(files, "the train channel")
    default = "builtin:sentiment" if args.task == "classification" else "builtin:corpus"
    return default, _files_kwargs({"train": [BUILTIN[default.split(":")[1]]]}, "--dataset")


def _channel_files(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in BUILDERS)
    if not files:
        raise DataError(f"channel folder {folder} holds no csv, json, jsonl, parquet or txt files")
    return files


def _folder_or_file(path: Path, flag: str) -> dict:
    if path.is_file():
        return _files_kwargs({"train": [path]}, flag)
    by_split: dict[str, list[Path]] = {}
    for p in sorted(path.rglob("*")):
        if p.is_file() and p.suffix in BUILDERS:
            split = "validation" if any(k in p.stem for k in ("valid", "test", "eval")) else "train"
            by_split.setdefault(split, []).append(p)
    if "train" not in by_split:
        raise DataError(f"{flag} {path}: found no training files (csv, json, jsonl, parquet, txt)")
    return _files_kwargs(by_split, flag)


def _files_kwargs(files: dict[str, list[Path]], flag: str) -> dict:
    suffixes = {p.suffix for paths in files.values() for p in paths}
    for paths in files.values():
        for p in paths:
            if exists_here(p, Path.is_dir):
                raise DataError(
                    f"{flag}: {p} is a directory: give one data file in it (csv, json, jsonl, parquet or txt), "
                    f"or pass the folder as --dataset {p}"
                )
            if not exists_here(p, Path.is_file):
                raise DataError(f"{flag}: cannot read {p}: no such file")
            if p.suffix not in BUILDERS:
                raise DataError(
                    f"{flag}: cannot read {p}: unsupported format {p.suffix!r} (use csv, json, jsonl, parquet or txt)"
                )
            if _is_empty(p):
                raise DataError(f"{flag}: data file {p} is empty; add rows to it or remove it")
    builders = {BUILDERS[s] for s in suffixes}
    if len(builders) > 1:
        raise DataError(f"{flag}: mixed file formats {sorted(suffixes)}; use one format for all splits")
    kwargs = {"path": builders.pop(), "data_files": {k: [str(p) for p in v] for k, v in files.items()}}
    if ".tsv" in suffixes:
        kwargs["delimiter"] = "\t"
    return kwargs


def _is_empty(path: Path) -> bool:
    """True for a file of 0 bytes, a parquet file of no rows, or a text file of only blank lines.

    `datasets` answers such files with a StopIteration, a schema error or an Arrow error,
    sometimes only when a second file follows.
    """
    if path.stat().st_size == 0:
        return True
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:  # the footer alone says; a file that is not parquet is the loader's to report
            return pq.read_metadata(path).num_rows == 0
        except (OSError, ValueError):  # pyarrow's ArrowInvalid is a ValueError
            return False
    with path.open("rb") as f:  # a real file ends this loop at its first byte
        while chunk := f.read(1 << 16):
            if chunk.strip():
                return False
    return True


def load_raw(args: TrainArgs, contract: Contract):
    """A DatasetDict with 'train' and 'validation' splits, checked against the arguments."""
    import datasets

    source, kwargs = resolve_sources(args, contract)
    datasets.disable_progress_bars()
    # Our one-line error says it: no Arrow stack, nor the "Failed to read" line logged before a raise.
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    hub_id = args.dataset if args.dataset and kwargs.get("path") == args.dataset else None
    try:
        with hub_load("--dataset", hub_id, DataError, dataset=True):
            raw = datasets.load_dataset(**kwargs)
    except DataError:  # already one line that names the fix
        raise
    except (FileNotFoundError, ValueError, OSError, datasets.exceptions.DatasetGenerationError) as e:
        # A csv of only a header, or a split whose files hold no rows between them.
        no_rows = re.match(r'Instruction "(\w+)" corresponds to no data', str(e))
        if no_rows:
            raise DataError(f"{_where(source, kwargs, no_rows[1])} holds no rows; add rows to it") from e
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        cause = e.__cause__ or e.__context__
        if cause is not None and str(cause).strip():
            reason = str(cause).strip().splitlines()[-1]
        raise DataError(f"cannot read data {source}: {reason[:300]}") from e
    if "train" not in raw:
        raise DataError(f"data {source} has no 'train' split (splits: {', '.join(raw)})")
    validation = next((s for s in ("validation", "valid", "test", "eval") if s in raw), None)
    # Checked before any split or selection, so a row number is the row's place in its file.
    _check_columns(args, raw, source)
    for split in ["train"] + ([validation] if validation else []):
        _check_rows(args, raw[split], _where(source, kwargs, split))
    if validation is None:
        parts = raw["train"].train_test_split(test_size=args.validation_fraction, seed=args.seed)
        raw["train"], raw["validation"] = parts["train"], parts["test"]
    elif validation != "validation":
        raw["validation"] = raw.pop(validation)
    if args.max_train_samples:
        raw["train"] = raw["train"].select(range(min(args.max_train_samples, len(raw["train"]))))
    if args.max_eval_samples:
        raw["validation"] = raw["validation"].select(range(min(args.max_eval_samples, len(raw["validation"]))))
    return raw


def _where(source: str, kwargs: dict, split: str) -> str:
    """How an error names a split's data: its file, or the source and split, whose rows are counted
    through its files in the order they are read (by name)."""
    files = kwargs.get("data_files", {}).get(split, [])
    if len(files) == 1:
        return f"data file {files[0]}"
    read = f", {len(files)} files read in name order" if files else ""
    return f"data {source} ({split} split{read})"


def _check_columns(args: TrainArgs, raw, source: str) -> None:
    columns = raw["train"].column_names
    if args.text_column not in columns:
        raise DataError(
            f"--text-column {args.text_column!r} is not in data {source}; its columns are: {', '.join(columns)}"
        )
    if args.task == "classification" and args.label_column not in columns:
        raise DataError(
            f"--label-column {args.label_column!r} is not in data {source}; its columns are: {', '.join(columns)}"
        )


def _check_rows(args: TrainArgs, split, where: str) -> None:
    """Refuse a split with no rows, text that is not a string, or a missing label.

    Tokenizers raise a TypeError on null or non-string text (or, for a list, silently read
    it as words); a null label has no class. Each check is one vectorized pass over a column.
    """
    if len(split) == 0:
        raise DataError(f"{where} holds no rows; add rows to it")
    columns = [("--text-column", args.text_column)]
    if args.task == "classification":
        columns.append(("--label-column", args.label_column))
    for flag, column in columns:
        if column not in split.column_names:  # a validation file without the column
            raise DataError(f"{flag} {column!r} is not in {where}; its columns are: {', '.join(split.column_names)}")
        values = split.with_format("arrow")[column]
        if flag == "--text-column":
            count, row, what = _non_text(values)
            if count:
                raise DataError(
                    f"{where}: {flag} {column!r} must hold text, but row {row + 1} is {what} "
                    f"({count} of {len(split)} rows are not text); fix or remove those rows"
                )
        else:
            count, row = _missing_labels(values, is_class_label=hasattr(split.features[column], "names"))
            if count:
                raise DataError(
                    f"{where}: {flag} {column!r} has no label in row {row + 1} "
                    f"({count} of {len(split)} rows have none); fill in or remove those rows"
                )


def _non_text(values) -> tuple[int, int, str]:
    """How many values are not strings, the index of the first, and what it is."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = values.type.value_type if pa.types.is_dictionary(values.type) else values.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or str(kind) == "string_view":
        return (values.null_count, _first(values.is_null()), "null") if values.null_count else (0, -1, "")
    # Arrow's JSON extension type, which datasets (>= 5) gives a json column that mixes strings
    # with other values.
    if getattr(kind, "extension_name", None) == "arrow.json":
        storage = pa.chunked_array([c.storage for c in values.chunks], kind.storage_type)
        # Each value is stored as its JSON text, so a string is one that starts with a quote.
        bad = pc.invert(pc.fill_null(pc.starts_with(storage, '"'), False))
        count = pc.sum(bad).as_py() or 0
        if not count:
            return 0, -1, ""
        i = _first(bad)
        value = storage[i].as_py()
        return count, i, _describe(None if value is None else json.loads(value))
    # numbers, booleans, lists, objects or only nulls: no row holds a string
    return len(values), 0, _describe(values[0].as_py())


def _missing_labels(values, is_class_label: bool) -> tuple[int, int]:
    """How many labels are null (or -1, datasets' missing ClassLabel), and the index of the first."""
    import pyarrow.compute as pc

    missing = values.is_null()
    if is_class_label:
        missing = pc.or_(missing, pc.fill_null(pc.less(values, 0), False))
    count = pc.sum(missing).as_py() or 0
    return count, _first(missing) if count else -1


def _first(mask) -> int:
    import pyarrow.compute as pc

    return pc.index(mask, True).as_py()


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, (int, float)):
        return f"a number ({json.dumps(value)})"
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


def label_names(args: TrainArgs, raw) -> list[str]:
    """The label set, from the training split; other splits may not add labels."""
    feature = raw["train"].features[args.label_column]
    if hasattr(feature, "names"):  # a ClassLabel already knows its names
        return list(feature.names)
    seen = sorted({str(v) for v in raw["train"][args.label_column] if v is not None})
    if len(seen) < 2:
        raise DataError(
            f"--label-column {args.label_column!r} has {len(seen)} distinct value(s) in the "
            "training data; classification needs at least 2"
        )
    unseen = sorted({str(v) for v in raw["validation"][args.label_column]} - set(seen))
    if unseen:
        shown = ", ".join(repr(u) for u in unseen[:5])
        raise DataError(
            f"--label-column {args.label_column!r}: validation data has label(s) {shown} "
            "that never occur in the training data"
        )
    return seen


# ---------------------------------------------------------------- tokenizing


def load_checked(args: TrainArgs, contract: Contract) -> tuple[Any, list[str]]:
    """The raw splits and the classification labels (none for language modelling), every check of
    the data done: what the entry point loads before it imports torch, so that bad data is one
    line in about a second, not after torch's, transformers' and Accelerate's imports. Every
    process loads it, none waiting for the others: bad data stops them all at once."""
    raw = load_raw(args, contract)
    return raw, label_names(args, raw) if args.task == "classification" else []


def prepare(args: TrainArgs, loaded: tuple[Any, list[str]], tokenizer, main_process_first) -> PreparedData:
    """The tokenized splits of `loaded` (load_checked's), the main process first: it fills the caches."""
    raw, names = loaded
    with main_process_first():
        if args.task == "classification":
            train, val = (_tokenize_classification(args, raw[s], tokenizer, names) for s in ("train", "validation"))
            return PreparedData(train, val, names, list(train["length"]), padded=True)
        train, val = (_pack(args, raw[s], tokenizer) for s in ("train", "validation"))
        if len(train) == 0 or len(val) == 0:
            raise DataError(
                f"--block-size {args.block_size} is larger than the data: no full block to train "
                "or evaluate on; lower --block-size or add data"
            )
        return PreparedData(train, val, None, None, padded=False)


def _tokenize_classification(args: TrainArgs, split, tokenizer, names: list[str]):
    label_of = {n: i for i, n in enumerate(names)}
    is_class_label = hasattr(split.features[args.label_column], "names")

    def encode(batch):
        out = tokenizer(batch[args.text_column], truncation=True, max_length=args.max_length)
        out["labels"] = [v if is_class_label else label_of[str(v)] for v in batch[args.label_column]]
        out["length"] = [len(ids) for ids in out["input_ids"]]
        return out

    return split.map(encode, batched=True, remove_columns=split.column_names)


def _pack(args: TrainArgs, split, tokenizer):
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    block = args.block_size

    def encode_and_pack(batch):
        ids = tokenizer(batch[args.text_column], add_special_tokens=False)["input_ids"]
        stream = [t for doc in ids for t in (doc + [eos] if eos is not None else doc)]
        usable = len(stream) // block * block
        return {"input_ids": [stream[i : i + block] for i in range(0, usable, block)]}

    # Large map batches keep the tail dropped per batch small (< block / 1000 docs).
    packed = split.map(encode_and_pack, batched=True, batch_size=2000, remove_columns=split.column_names)
    return packed.with_format("torch")


# ---------------------------------------------------------------- batching


class EpochBatchSampler:
    """Global batches (micro batch x processes) in an order fixed by (seed, epoch).

    Owning the order, rather than drawing it from the global RNG, is what makes resume
    exact and keeps the data order the same whatever the number of processes.
    With `lengths`, batches come from length-sorted pools of `pool_batches` batches, so
    examples of similar length share a batch (less padding), and batch order is shuffled.
    """

    def __init__(
        self,
        num_examples: int,
        batch_size: int,
        seed: int,
        *,
        shuffle: bool = True,
        drop_last: bool = True,
        lengths: Sequence[int] | None = None,
        pool_batches: int = 128,
    ):
        self.n, self.batch_size, self.seed = num_examples, batch_size, seed
        self.shuffle, self.drop_last, self.lengths, self.pool_batches = shuffle, drop_last, lengths, pool_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else math.ceil(self.n / self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        import torch

        if not self.shuffle:
            order = list(range(self.n))
        else:
            g = torch.Generator().manual_seed(self.seed * 1000003 + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        lengths = self.lengths
        if lengths is not None:
            pool = self.batch_size * self.pool_batches
            order = [i for s in range(0, self.n, pool) for i in sorted(order[s : s + pool], key=lambda j: -lengths[j])]
        batches = [order[i : i + self.batch_size] for i in range(0, self.n, self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        if self.shuffle and self.lengths is not None:
            perm = torch.randperm(len(batches), generator=g).tolist()
            batches = [batches[i] for i in perm]
        yield from batches


def collator(tokenizer, padded: bool, pad_to_multiple_of: int | None):
    if not padded:
        return None  # fixed-size blocks: torch's default collation stacks them
    from transformers import DataCollatorWithPadding

    pad = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)

    def collate(features):
        return pad([{k: v for k, v in f.items() if k != "length"} for f in features])

    return collate


def make_loaders(args: TrainArgs, data: PreparedData, tokenizer, world_size: int, use_cuda: bool):
    import torch
    from torch.utils.data import DataLoader

    # On GPUs, round padded lengths to a multiple of 8 by default for the tensor cores.
    multiple = args.pad_to_multiple_of if args.pad_to_multiple_of is not None else (8 if use_cuda else None)
    collate = collator(tokenizer, data.padded, multiple if multiple and multiple > 1 else None)
    train_sampler = EpochBatchSampler(len(data.train), args.batch_size * world_size, args.seed, lengths=data.lengths)
    if len(train_sampler) == 0:
        raise DataError(
            f"--batch-size {args.batch_size} x {world_size} process(es) is larger than the "
            f"{len(data.train)} training examples; lower --batch-size"
        )
    eval_bs = (args.eval_batch_size or args.batch_size) * world_size
    eval_sampler = EpochBatchSampler(len(data.validation), eval_bs, args.seed, shuffle=False, drop_last=False)
    # Their own generator: starting an iterator (e.g. on resume) must not draw from the
    # global RNG that dropout uses, or resume is not exact.
    workers = args.num_workers if args.num_workers is not None else (2 if use_cuda else 0)
    common: dict[str, Any] = dict(
        num_workers=workers,
        pin_memory=use_cuda,
        collate_fn=collate,
        persistent_workers=workers > 0,
        generator=torch.Generator(),
        worker_init_fn=leave_process_group if workers > 0 else None,
    )
    train = DataLoader(data.train, batch_sampler=train_sampler, **common)
    val = DataLoader(data.validation, batch_sampler=eval_sampler, **common)
    return train, val, train_sampler


def leave_process_group(worker_id: int) -> None:
    """A data loader worker moves to a process group of its own. torchrun's agent stops the training
    processes with a SIGTERM to each one's group (and a terminal's Ctrl-C reaches the foreground
    group): in a worker, torch's handler dies of any SIGTERM but its parent's, and the trainer's
    step then fails on the dead worker instead of ending in the checkpointed stop the signal asked
    for. Out of that group only the trainer hears the stop; the worker still ends with it (torch's
    workers exit once their parent is gone) or when the trainer shuts the loader down."""
    if hasattr(os, "setpgid"):  # POSIX; elsewhere there are no process groups to leave
        os.setpgid(0, 0)
