"""`eagle3-hf train`: train an EAGLE-3 draft head for a target with `Eagle3Trainer`.

Steps: load the target and its tokenizer -> tokenize the chat data (`eagle3_hf.data`) -> choose the draft vocabulary
(`eagle3_hf.vocab`, cached next to the output) -> build the head (`Eagle3DraftModel.from_target`) -> optionally
build the offline feature cache -> train -> save the head (loadable with `Eagle3DraftModel.from_pretrained`).
Every `Eagle3TrainingArguments` / `TrainingArguments` option is a flag; multi-GPU runs go through `accelerate launch`.
"""

import logging
import os
import shlex
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from eagle3_hf.training_args import Eagle3TrainingArguments


logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    draft_vocab_size: int = field(default=32000, metadata={"help": "Draft vocabulary size (capped at the target's)."})
    draft_model_name_or_path: str | None = field(
        default=None, metadata={"help": "Start from this head (any dialect) instead of a fresh one."}
    )
    init_from_target: bool = field(
        default=True,
        metadata={"help": "Start a fresh head's lm_head (draft-vocabulary rows) and norm from the target's."},
    )
    init_fc_from_top_feature: bool = field(
        default=False,
        metadata={"help": "With --init_from_target, also start fc as the projection onto the highest tapped layer."},
    )
    freeze_lm_head: bool = field(
        default=False, metadata={"help": "Do not train the head's lm_head (sensible with --init_from_target)."}
    )
    target_dtype: str = field(
        default="auto",
        metadata={"help": "dtype of the frozen target.", "choices": ["auto", "float32", "bfloat16", "float16"]},
    )


@dataclass
class DataArguments:
    dataset: str = field(
        default="sharegpt", metadata={"help": "ShareGPT/chat JSON or JSONL file, or 'sharegpt' (the shipped file)."}
    )
    dataset_offset: int = field(default=0, metadata={"help": "First record of the data file to use."})
    dataset_limit: int | None = field(default=None, metadata={"help": "Number of records to use (default: all)."})
    eval_samples: int = field(
        default=0, metadata={"help": "Hold out N tokenized samples, chosen at random with --seed, for evaluation."}
    )
    overflow: str = field(
        default="drop",
        metadata={
            "help": "Samples longer than max_length: dropped (reference) or truncated.",
            "choices": ["drop", "truncate"],
        },
    )
    system_prompt: str | None = field(default=None, metadata={"help": "System message for conversations without one."})
    num_proc: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    draft_vocab_file: str | None = field(
        default=None,
        metadata={
            "help": "Draft vocabulary of a fresh head: built there if missing, reused if it was built from this "
            "data (`eagle3-hf vocab` with the same data options), an error otherwise; it is never overwritten "
            "(default: <output_dir>/draft_vocab.safetensors, a cache rebuilt when stale). With "
            "--draft_model_name_or_path, an existing file (from `eagle3-hf vocab`) that replaces the head's "
            "vocabulary: kept tokens keep their lm_head rows, new ones start from the target's."
        },
    )


def make_parser() -> HfArgumentParser:
    return HfArgumentParser((ModelArguments, DataArguments, Eagle3TrainingArguments), prog="eagle3-hf train")


def _datasets(data_args: DataArguments, args: Eagle3TrainingArguments, tokenizer):
    from eagle3_hf.data import DataStats, build_training_dataset

    with args.main_process_first(desc="tokenizing the training data"):
        dataset = build_training_dataset(
            data_args.dataset,
            tokenizer,
            max_length=args.max_length,
            overflow=data_args.overflow,
            num_proc=data_args.num_proc,
            offset=data_args.dataset_offset,
            limit=data_args.dataset_limit,
            system_prompt=data_args.system_prompt,
        )
    logger.info(f"Training data: {DataStats.from_dataset(dataset)}")
    if not data_args.eval_samples:
        return dataset, None
    if data_args.eval_samples >= len(dataset):
        raise ValueError(f"eval_samples={data_args.eval_samples} leaves no training sample out of {len(dataset)}.")
    # A seeded random subset: the last rows are no held-out slice (regenerated files run shortest prompt first).
    split = dataset.train_test_split(test_size=data_args.eval_samples, shuffle=True, seed=args.seed)
    return split["train"], split["test"]


def _check_draft_vocab_file(
    path: str, train, vocab_size: int, draft_vocab_size: int, data_args: DataArguments, args: Eagle3TrainingArguments
) -> None:
    """Refuse an existing user `--draft_vocab_file` built for other data or sizes instead of overwriting it."""
    from eagle3_hf.vocab import load_draft_vocab, vocab_cache_key

    if not os.path.isfile(path):
        return  # built there
    stored = load_draft_vocab(path).metadata
    key = vocab_cache_key(train, vocab_size, draft_vocab_size, args.target_model_name_or_path)
    differences = [
        f"{name} {stored.get(name)!r} in the file, {value!r} here"
        for name, value in key.items()
        if stored.get(name) != value
    ]
    if not differences:
        return
    if data_args.eval_samples:
        fix = "With --eval_samples the vocabulary is counted on the training split, which `eagle3-hf vocab` "
        fix += "cannot reproduce: delete the file to have train build it there, or pass a path that does not exist."
    else:
        command = ["eagle3-hf", "vocab", "--output", path, "--tokenizer", args.target_model_name_or_path]
        command += ["--data", data_args.dataset, "--vocab-size", str(vocab_size)]
        command += ["--draft-vocab-size", str(draft_vocab_size), "--max-length", str(args.max_length)]
        command += ["--overflow", data_args.overflow, "--offset", str(data_args.dataset_offset)]
        command += ["--limit", str(data_args.dataset_limit)] if data_args.dataset_limit is not None else []
        command += ["--system-prompt", data_args.system_prompt] if data_args.system_prompt is not None else []
        fix = f"Rebuild it for this run with `{shlex.join(command)}`, delete it, or pass another path."
    raise ValueError(
        f"--draft_vocab_file {path} was built for other data or sizes ({'; '.join(differences)}); train does not "
        f"overwrite it. {fix}"
    )


def _draft_head(model_args: ModelArguments, data_args: DataArguments, args: Eagle3TrainingArguments, target, train):
    from eagle3_hf import Eagle3DraftModel
    from eagle3_hf.vocab import load_draft_vocab, load_or_build_draft_vocab

    text_config = target.config.get_text_config()
    if model_args.draft_model_name_or_path:
        draft = Eagle3DraftModel.from_pretrained(model_args.draft_model_name_or_path, target=target)
        if data_args.draft_vocab_file:
            if not os.path.isfile(data_args.draft_vocab_file):
                raise FileNotFoundError(
                    f"--draft_vocab_file {data_args.draft_vocab_file} does not exist; with --draft_model_name_or_path "
                    "it must be a vocabulary file to switch the head to (build one with `eagle3-hf vocab`)."
                )
            vocab = load_draft_vocab(data_args.draft_vocab_file)
            added = draft.replace_draft_vocab(vocab.token_ids, target)
            logger.info(
                f"Draft vocabulary switched to {data_args.draft_vocab_file} ({draft.config.draft_vocab_size} tokens, "
                f"{added} new, rows from the target)."
            )
    else:
        layers = text_config.num_hidden_layers
        overrides = {"target_layer_ids": [layers - 3]} if args.single_feature else {}
        draft_vocab_size = min(model_args.draft_vocab_size, text_config.vocab_size)
        draft = Eagle3DraftModel.from_target(target, draft_vocab_size=draft_vocab_size, **overrides)
        if draft_vocab_size < text_config.vocab_size:
            path = data_args.draft_vocab_file or os.path.join(args.output_dir, "draft_vocab.safetensors")
            if data_args.draft_vocab_file:
                _check_draft_vocab_file(path, train, text_config.vocab_size, draft_vocab_size, data_args, args)
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with args.main_process_first(desc="choosing the draft vocabulary"):
                vocab = load_or_build_draft_vocab(
                    train, text_config.vocab_size, draft_vocab_size, path, args.target_model_name_or_path
                )
            draft.set_vocab_maps(vocab.d2t, vocab.t2d)
            logger.info(f"Draft vocabulary {path}: coverage {vocab.coverage:.2%} of the loss tokens.")
        if model_args.init_from_target:
            done = draft.init_output_from_target(target, fc_from_top_feature=model_args.init_fc_from_top_feature)
            logger.info(f"Initialized {', '.join(done)} from the target.")
    if model_args.freeze_lm_head:
        draft.lm_head.requires_grad_(False)
    # fp32 master weights; use --bf16/--fp16 for mixed precision.
    return draft.float()


def _offline_datasets(args: Eagle3TrainingArguments, target, layer_ids: list[int], train, evaluation):
    from accelerate import PartialState

    from eagle3_hf.features import CachedFeatureDataset, FeatureCache, build_feature_cache

    state = PartialState()
    wrapped = []
    for name, dataset in (("train", train), ("eval", evaluation)):
        if dataset is None:
            wrapped.append(None)
            continue
        cache_dir = os.path.join(args.feature_cache_dir, name)
        build_feature_cache(
            target,
            dataset,
            cache_dir,
            layer_ids,
            dtype=args.feature_cache_dtype,
            process_index=state.process_index,
            num_processes=state.num_processes,
            verbose=state.is_main_process,
        )
        state.wait_for_everyone()
        wrapped.append(CachedFeatureDataset(dataset, FeatureCache(cache_dir)))
    return wrapped


def check_distributed_launch(args: Eagle3TrainingArguments) -> None:
    """Refuse a multi-process launch that Transformers would not run as DDP.

    Without an accelerator, `Trainer` joins the process group but trains each process on its own unless
    `use_cpu=True`: N independent copies of one run, each saving over the others. Fail before that starts.
    """
    from transformers.training_args import ParallelMode

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and args.parallel_mode != ParallelMode.DISTRIBUTED:
        raise ValueError(
            f"Launched as {world_size} processes, but Transformers would train each one separately (parallel_mode="
            f"{args.parallel_mode.value!r}). On a machine without GPUs pass --use_cpu true to train with DDP over "
            "gloo."
        )


def main(argv: list[str] | None = None) -> int:
    model_args, data_args, args = make_parser().parse_args_into_dataclasses(args=argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    check_distributed_launch(args)
    from eagle3_hf.regenerate import load_target
    from eagle3_hf.trainer import Eagle3Trainer

    args.target_model_name_or_path = args.target_model_name_or_path or "smollm2"
    target, tokenizer = load_target(
        args.target_model_name_or_path, dtype=model_args.target_dtype, device=str(args.device)
    )
    train, evaluation = _datasets(data_args, args, tokenizer)
    draft = _draft_head(model_args, data_args, args, target, train)
    if args.feature_mode == "offline":
        train, evaluation = _offline_datasets(args, target, draft.config.target_layer_ids, train, evaluation)
    trainer = Eagle3Trainer(
        draft, args, target_model=target, train_dataset=train, eval_dataset=evaluation, processing_class=tokenizer
    )
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.save_model(args.output_dir)
    if evaluation is not None:
        trainer.log_metrics("eval", trainer.evaluate())
    if trainer.is_world_process_zero():
        print(f"Saved the EAGLE-3 head to {args.output_dir} (load it with Eagle3DraftModel.from_pretrained).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
