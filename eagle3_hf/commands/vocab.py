"""`eagle3-hf vocab`: choose the draft vocabulary (most frequent target ids in the training answers).

It reads the training data with `train`'s own data options (`DataArguments`: `--data`, `--data_offset`,
`--eval_samples`, ...), so `eagle3-hf vocab` and `eagle3-hf train` given the same options count the same rows and
`train --draft_vocab_file` reuses the file.
"""

import logging
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from eagle3_hf.commands.arguments import TARGET_HELP, DataArguments, training_splits
from eagle3_hf.loading import DEFAULT_TARGET
from eagle3_hf.training.training_args import Eagle3TrainingArguments


_TRAIN_FIELDS = Eagle3TrainingArguments.__dataclass_fields__


@dataclass
class VocabArguments:
    draft_vocab_file: str = field(metadata={"help": "Draft vocabulary file to write (.safetensors)."})
    target: str = field(default=DEFAULT_TARGET, metadata={"help": TARGET_HELP})
    draft_vocab_size: int = field(default=32000, metadata={"help": "Draft vocabulary size V_d (train's default)."})
    vocab_size: int | None = field(
        default=None,
        metadata={"help": "Target vocabulary size V (default: from the model config, else the tokenizer length)."},
    )
    max_length: int = field(
        default=_TRAIN_FIELDS["max_length"].default, metadata={"help": "Longest training sample in tokens (train's)."}
    )
    seed: int = field(
        default=_TRAIN_FIELDS["seed"].default, metadata={"help": "Seed of the --eval_samples split (train's)."}
    )


def make_parser() -> HfArgumentParser:
    parser = HfArgumentParser((VocabArguments, DataArguments), prog="eagle3-hf vocab")
    parser.description = (
        "Count target token ids over the assistant tokens of the training data, keep the most frequent ones as the "
        "draft vocabulary, and save d2t/t2d (safetensors). An existing --draft_vocab_file built from the same data, "
        "tokenizer and sizes is reused; otherwise it is rebuilt."
    )
    return parser


def _target_vocab_size(name: str, tokenizer) -> int:
    """The target's text vocab_size (its embedding may be larger than the tokenizer; composite configs such as
    multimodal ones keep it in their text config), else len(tokenizer)."""
    from eagle3_hf.loading import load_target_config

    try:
        return load_target_config(name).get_text_config().vocab_size
    except (OSError, ValueError, AttributeError) as error:
        logging.getLogger(__name__).warning(f"No model config for {name} ({error}); using len(tokenizer).")
    return len(tokenizer)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args, data_args = parser.parse_args_into_dataclasses(args=argv)
    if data_args.problem():  # before the data is tokenized
        parser.error(data_args.problem())
    if args.draft_vocab_size < 1:
        parser.error(f"--draft_vocab_size {args.draft_vocab_size}: expected >= 1.")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from eagle3_hf.loading import load_tokenizer
    from eagle3_hf.training.data import DataStats, tokenizer_fingerprint
    from eagle3_hf.training.vocab import load_or_build_draft_vocab

    tokenizer = load_tokenizer(args.target)
    vocab_size = args.vocab_size or _target_vocab_size(args.target, tokenizer)
    dataset, _ = training_splits(data_args, tokenizer, args.max_length, args.seed)
    vocab = load_or_build_draft_vocab(
        dataset,
        vocab_size,
        args.draft_vocab_size,
        args.draft_vocab_file,
        args.target,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
    )
    print(f"data: {DataStats.from_dataset(dataset)}")
    print(
        f"draft vocabulary: {args.draft_vocab_size} of {vocab_size} target ids, coverage {vocab.coverage:.4f} of "
        f"{int(vocab.counts.sum())} loss-masked tokens ({vocab.metadata['filled']} filled in) -> "
        f"{args.draft_vocab_file}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
