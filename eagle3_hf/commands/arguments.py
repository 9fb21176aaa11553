"""Options that several commands share, so that one concept has one flag everywhere.

`DataArguments` is read by `eagle3-hf train` and `eagle3-hf vocab` (through `HfArgumentParser`, which accepts
`--data_offset` and `--data-offset` alike); `regenerate` names its data with the same `--data`, `--data-offset` and
`--data-limit`. Every command names its target `--target` (a folder, a Hub id, a `.gguf` file or `smollm2`, see
`eagle3_hf.loading`).
"""

from dataclasses import dataclass, field, fields

from ..loading import DEFAULT_TARGET


TARGET_HELP = f"Target model: a folder, a Hub id, a .gguf file, or '{DEFAULT_TARGET}' (the offline SmolLM2 GGUF)."


@dataclass
class DataArguments:
    """Which training conversations to read and how to turn them into samples (`build_training_dataset`)."""

    data: str = field(
        default="sharegpt", metadata={"help": "ShareGPT/chat JSON or JSONL file, or 'sharegpt' (the shipped file)."}
    )
    data_offset: int = field(default=0, metadata={"help": "First record of the data to use."})
    data_limit: int | None = field(default=None, metadata={"help": "Number of records to use (default: all)."})
    eval_samples: int = field(
        default=0,
        metadata={"help": "Hold out N tokenized samples, chosen at random with --seed, for evaluation."},
    )
    overflow: str = field(
        default="drop",
        metadata={
            "help": "Samples longer than max_length: dropped (reference) or truncated.",
            "choices": ["drop", "truncate"],
        },
    )
    system_prompt: str | None = field(default=None, metadata={"help": "System message for conversations without one."})
    plain_text_loss: str = field(
        default="all",
        metadata={
            "help": "Targets without a chat template train on plain text: the loss covers every token ('all') or "
            "only the assistant turns' text ('assistant').",
            "choices": ["all", "assistant"],
        },
    )
    num_proc: int | None = field(default=None, metadata={"help": "Processes for tokenization."})

    def command_line(self) -> list[str]:
        """These options as flags, the ones left at their defaults omitted (to print a command that repeats them)."""
        flags = []
        for option in fields(self):
            value = getattr(self, option.name)
            if value != option.default:
                flags += [f"--{option.name}", str(value)]
        return flags


def training_splits(data_args: DataArguments, tokenizer, max_length: int, seed: int):
    """`(train, evaluation)`: the tokenized data, with `eval_samples` rows held out at random with `seed`
    (`evaluation` is `None` without them). `train` and `vocab` call this, so both count the same rows."""
    from ..training.data import DataStats, build_training_dataset

    dataset = build_training_dataset(
        data_args.data,
        tokenizer,
        max_length=max_length,
        overflow=data_args.overflow,
        num_proc=data_args.num_proc,
        offset=data_args.data_offset,
        limit=data_args.data_limit,
        system_prompt=data_args.system_prompt,
        plain_text_loss=data_args.plain_text_loss,
    )
    stats = DataStats.from_dataset(dataset)
    if not data_args.eval_samples:
        return dataset, None
    if data_args.eval_samples >= len(dataset):
        raise ValueError(f"--eval_samples={data_args.eval_samples} leaves no training sample out of {stats.kept}.")
    # A seeded random subset: the last rows are no held-out slice (regenerated files run shortest prompt first).
    split = dataset.train_test_split(test_size=data_args.eval_samples, shuffle=True, seed=seed)
    return split["train"], split["test"]


__all__ = ["TARGET_HELP", "DataArguments", "training_splits"]
