"""`eagle3-hf vocab`: choose the draft vocabulary (most frequent target ids in the training answers)."""

import argparse
import logging


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagle3-hf vocab",
        description="Count target token ids over the assistant tokens of the training data, keep the most frequent "
        "ones as the draft vocabulary, and save d2t/t2d (safetensors). An existing --output built from the same "
        "data, tokenizer and sizes is reused; otherwise it is rebuilt.",
    )
    parser.add_argument("--output", required=True, help="Draft vocabulary file (.safetensors).")
    parser.add_argument("--tokenizer", default="smollm2", help="Tokenizer path or Hub id; 'smollm2' is offline.")
    parser.add_argument("--data", default="sharegpt", help="JSON/JSONL file, or 'sharegpt' (the shipped file).")
    parser.add_argument("--draft-vocab-size", type=int, default=32000, help="Draft vocabulary size V_d.")
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="Target vocabulary size V (default: from the model config, else the tokenizer length).",
    )
    parser.add_argument("--max-length", type=int, default=2048, help="Longest training sample in tokens.")
    parser.add_argument(
        "--overflow",
        default="drop",
        choices=["drop", "truncate"],
        help="Longer samples: dropped or truncated. The default is train's, so train reuses the file.",
    )
    parser.add_argument("--offset", type=int, default=0, help="First source record to use.")
    parser.add_argument("--limit", type=int, default=None, help="Number of source records to use (default: all).")
    parser.add_argument("--system-prompt", default=None, help="System message for conversations without one.")
    parser.add_argument("--num-proc", type=int, default=None, help="Processes for tokenisation.")
    return parser


def _target_vocab_size(name: str, tokenizer) -> int:
    """The target's text vocab_size (its embedding may be larger than the tokenizer; composite configs such as
    multimodal ones keep it in their text config), else len(tokenizer)."""
    from transformers import AutoConfig

    if name != "smollm2":  # the offline SmolLM2 config sits in a 100 MB GGUF file; its vocab is the tokenizer's
        try:
            return AutoConfig.from_pretrained(name).get_text_config().vocab_size
        except (OSError, ValueError, AttributeError) as error:
            logging.getLogger(__name__).warning(f"No model config for {name} ({error}); using len(tokenizer).")
    return len(tokenizer)


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from eagle3_hf.data import DataStats, build_training_dataset, load_tokenizer
    from eagle3_hf.vocab import load_or_build_draft_vocab

    tokenizer = load_tokenizer(args.tokenizer)
    vocab_size = args.vocab_size or _target_vocab_size(args.tokenizer, tokenizer)
    dataset = build_training_dataset(
        args.data,
        tokenizer,
        max_length=args.max_length,
        overflow=args.overflow,
        num_proc=args.num_proc,
        offset=args.offset,
        limit=args.limit,
        system_prompt=args.system_prompt,
    )
    vocab = load_or_build_draft_vocab(dataset, vocab_size, args.draft_vocab_size, args.output, args.tokenizer)
    print(f"data: {DataStats.from_dataset(dataset)}")
    print(
        f"draft vocabulary: {args.draft_vocab_size} of {vocab_size} target ids, coverage {vocab.coverage:.4f} of "
        f"{int(vocab.counts.sum())} loss-masked tokens ({vocab.metadata['filled']} filled in) -> {args.output}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
