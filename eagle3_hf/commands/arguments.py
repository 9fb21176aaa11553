"""Options that several commands share, so that one concept has one flag everywhere.

`DataArguments` is read by `eagle3-hf train` and `eagle3-hf vocab` (through `HfArgumentParser`, which accepts
`--data_offset` and `--data-offset` alike); `regenerate` names its data with the same `--data`, `--data-offset` and
`--data-limit`. Every command names its target `--target` (a folder, a Hub id, a `.gguf` file or `smollm2`, see
`eagle3_hf.loading`). The commands that run the target's own batched `generate` (`regenerate`, `magpie`) share
its device, dtype, cache and packing options (`add_batched_generation_arguments`, `load_target_for_batches`).
"""

from dataclasses import dataclass, field, fields

from ..loading import DEFAULT_TARGET
from ..training.exclusion import OVERLAP_POLICIES
from . import add_pack_weights_argument, below_minimum, is_data_source


# what `--target-dtype` accepts: "auto" keeps the checkpoint's dtype (`load_target_model`)
TARGET_DTYPES = ("auto", "float32", "bfloat16", "float16")
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
    evaluation_overlap: str = field(
        default="drop",
        metadata={
            "help": "Records whose user turns overlap the benchmark's evaluation prompts (MT-bench, HumanEval, the "
            "held-out ShareGPT slice; the rule of `eagle3-hf check-data`) are left out ('drop', with a warning), "
            "only reported ('warn'), refused ('error') or not checked ('off').",
            "choices": list(OVERLAP_POLICIES),
        },
    )

    def problem(self) -> str | None:
        """What is wrong with these options, checked before anything loads (None when nothing is)."""
        if not is_data_source(self.data):
            return f"--data {self.data}: not a file (a ShareGPT/chat JSON or JSONL file, or 'sharegpt')."
        counts = {"--data_offset": (self.data_offset, 0), "--data_limit": (self.data_limit, 1)}
        return below_minimum({**counts, "--eval_samples": (self.eval_samples, 0), "--num_proc": (self.num_proc, 1)})

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
    from ..training.exclusion import screen_training_records

    exclude = screen_training_records(
        data_args.data, data_args.evaluation_overlap, data_args.data_offset, data_args.data_limit
    )
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
        exclude=exclude,
    )
    stats = DataStats.from_dataset(dataset)
    if not data_args.eval_samples:
        return dataset, None
    if data_args.eval_samples >= len(dataset):
        raise ValueError(f"--eval_samples={data_args.eval_samples} leaves no training sample out of {stats.kept}.")
    # A seeded random subset: the last rows are no held-out slice (regenerated files run shortest prompt first).
    split = dataset.train_test_split(test_size=data_args.eval_samples, shuffle=True, seed=seed)
    return split["train"], split["test"]


__all__ = ["TARGET_DTYPES", "TARGET_HELP", "DataArguments", "training_splits"]


def add_batched_generation_arguments(parser) -> None:
    """`--seed`, `--target-dtype`, `--device`, `--cache-implementation`, `--pack-weights` and `--no-progress`, for
    a command that runs the target's batched `generate` with `--batch-size` rows."""
    parser.add_argument("--seed", type=int, default=0, help="Random seed.")
    parser.add_argument(
        "--target-dtype",
        default="auto",
        choices=TARGET_DTYPES,
        help="dtype of the target.",
    )
    parser.add_argument("--device", default=None, help="Device (default: cuda if available, else cpu).")
    parser.add_argument(
        "--cache-implementation",
        default="auto",
        help="KV cache for generate: 'auto' uses 'static' on CPU (no per-step concatenation; measured 1.3x faster "
        "here at batch 32) and the model's default elsewhere; 'dynamic', 'static' or any cache name generate takes.",
    )
    add_pack_weights_argument(parser, "--batch-size rows, the row count of every decoding step")
    parser.add_argument("--no-progress", action="store_true", help="Hide the progress bar.")


def load_target_for_batches(args, logger) -> tuple:
    """The target and tokenizer of `args.target`, packed for `args.batch_size` rows as `--pack-weights` says, and the
    `cache_implementation` to give `GenerationConfig` (`None`: the dynamic cache); logs what was chosen."""
    from ..generation.cpu_packing import pack_for_decoding
    from ..loading import load_target

    model, tokenizer = load_target(args.target, dtype=args.target_dtype, device=args.device)
    cache_implementation = args.cache_implementation
    if cache_implementation == "auto":
        cache_implementation = "static" if model.device.type == "cpu" else None
    elif cache_implementation == "dynamic":
        cache_implementation = None
    packing = pack_for_decoding(model, None, [args.batch_size], [], args.pack_weights)
    logger.info(f"{packing}; KV cache: {cache_implementation or 'dynamic'}")
    return model, tokenizer, cache_implementation
