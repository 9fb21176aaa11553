"""`eagle3-hf train`: train an EAGLE-3 draft head for a target with `Eagle3Trainer`.

Steps: load the target and its tokenizer (`eagle3_hf.loading`) -> tokenize the chat data (`eagle3_hf.training.data`)
-> choose the draft vocabulary (`eagle3_hf.training.vocab`, cached next to the output) -> build the head
(`eagle3_hf.training.heads.build_draft_head`) -> optionally build the offline feature cache -> train -> save the head
(loadable with `Eagle3DraftModel.from_pretrained`). Every `Eagle3TrainingArguments` / `TrainingArguments` option is a
flag (`--max_length` and `--max-length` alike); multi-GPU runs go through `accelerate launch`.
"""

import logging
import os
import shlex
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from eagle3_hf.commands.arguments import TARGET_DTYPES, DataArguments, training_splits
from eagle3_hf.training.training_args import Eagle3TrainingArguments


logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    draft_vocab_size: int = field(default=32000, metadata={"help": "Draft vocabulary size (capped at the target's)."})
    draft_model_name_or_path: str | None = field(
        default=None, metadata={"help": "Start from this head (any dialect) instead of a fresh one."}
    )
    draft_num_hidden_layers: int | None = field(
        default=None,
        metadata={
            "help": "Decoder layers of the head (default: 1 for a fresh head). With --draft_model_name_or_path the "
            "head keeps its own layers and grows to this many (its tensors kept, new layers appended; never shrunk)."
        },
    )
    draft_intermediate_size: int | None = field(
        default=None,
        metadata={
            "help": "MLP width of a fresh head's layers (default: the target's). With --draft_model_name_or_path the "
            "head widens to this (new channels add 0 at first, so it starts computing what it did; never narrowed)."
        },
    )
    init_layers_from_target: str = field(
        default="none",
        metadata={
            "help": "How the layers after the first start (a fresh head's layers 1.., a grown head's new layers): "
            "'none' (random), 'identity' (o_proj and down_proj zeroed: the head starts computing what its first "
            "layers do) or 'top' (copies of the target's top decoder layers; sizes must match).",
            "choices": ["none", "identity", "top"],
        },
    )
    init_from_target: bool = field(
        default=True,
        metadata={"help": "Start a fresh head's lm_head (draft-vocabulary rows) and norm from the target's."},
    )
    init_fc_from_top_feature: bool = field(
        default=False,
        metadata={"help": "With --init_from_target, also start fc as the projection onto the highest tapped layer."},
    )
    fc_norm: bool = field(
        default=False,
        metadata={
            "help": "A fresh head normalises each tapped target layer on its own (one RMSNorm each) before fc "
            "(EAGLE-3.1's `fc_norm`; the taps' scales differ several-fold). A continued head keeps its own inputs."
        },
    )
    freeze_lm_head: bool = field(
        default=False, metadata={"help": "Do not train the head's lm_head (sensible with --init_from_target)."}
    )
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
    target_dtype: str = field(
        default="auto",
        metadata={"help": "dtype of the frozen target.", "choices": list(TARGET_DTYPES)},
    )


def make_parser() -> HfArgumentParser:
    return HfArgumentParser((ModelArguments, DataArguments, Eagle3TrainingArguments), prog="eagle3-hf train")


def _datasets(data_args: DataArguments, args: Eagle3TrainingArguments, tokenizer):
    from eagle3_hf.training.data import DataStats

    with args.main_process_first(desc="tokenizing the training data"):
        train, evaluation = training_splits(data_args, tokenizer, args.max_length, args.seed)
    logger.info(f"Training data: {DataStats.from_dataset(train)}")
    return train, evaluation


def _vocab_rebuild_hint(path: str, model_args: "ModelArguments", data_args: DataArguments, args) -> str:
    """The `eagle3-hf vocab` command that builds, next to `path`, the vocabulary this run counts."""
    root, extension = os.path.splitext(path)
    fresh = f"{root}-rebuilt{extension or '.safetensors'}"
    command = ["eagle3-hf", "vocab", "--draft_vocab_file", fresh, "--target", args.target_model_name_or_path]
    command += ["--draft_vocab_size", str(model_args.draft_vocab_size), "--max_length", str(args.max_length)]
    command += ["--seed", str(args.seed)] if data_args.eval_samples else []
    command += data_args.command_line()
    return f"`{shlex.join(command)}`, then pass --draft_vocab_file {fresh}"


def _check_draft_vocab_file(path: str, train, vocab_size: int, draft_vocab_size: int, model_args, data_args, args):
    """Refuse an existing user `--draft_vocab_file` built for other data or sizes instead of overwriting it."""
    from eagle3_hf.training.vocab import load_draft_vocab, vocab_cache_key

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
    split = " (with --eval_samples it is counted on the training split: the hint repeats --seed)"
    raise ValueError(
        f"--draft_vocab_file {path} was built for other data or sizes ({'; '.join(differences)}); train does not "
        f"overwrite it. Build this run's vocabulary{split if data_args.eval_samples else ''} with "
        f"{_vocab_rebuild_hint(path, model_args, data_args, args)}; or delete the file to have train build it there."
    )


def _draft_vocab(
    model_args: ModelArguments, data_args: DataArguments, args: Eagle3TrainingArguments, target, tokenizer, train
):
    """The draft vocabulary of the head to train, or `None` for a head that keeps its own (or the identity)."""
    from eagle3_hf.training.data import tokenizer_fingerprint
    from eagle3_hf.training.vocab import check_draft_vocab, load_draft_vocab, load_or_build_draft_vocab

    vocab_size = target.config.get_text_config().vocab_size
    if model_args.draft_model_name_or_path:
        if not model_args.draft_vocab_file:
            return None
        if not os.path.isfile(model_args.draft_vocab_file):
            raise FileNotFoundError(
                f"--draft_vocab_file {model_args.draft_vocab_file} does not exist; with --draft_model_name_or_path "
                "it must be a vocabulary file to switch the head to (build one with `eagle3-hf vocab`)."
            )
        vocab = load_draft_vocab(model_args.draft_vocab_file)
        check_draft_vocab(vocab, vocab_size, tokenizer)  # built by another tokenizer: refused before training
        return vocab
    draft_vocab_size = min(model_args.draft_vocab_size, vocab_size)
    if draft_vocab_size == vocab_size:
        return None
    path = model_args.draft_vocab_file or os.path.join(args.output_dir, "draft_vocab.safetensors")
    if model_args.draft_vocab_file:
        _check_draft_vocab_file(path, train, vocab_size, draft_vocab_size, model_args, data_args, args)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with args.main_process_first(desc="choosing the draft vocabulary"):
        vocab = load_or_build_draft_vocab(
            train,
            vocab_size,
            draft_vocab_size,
            path,
            args.target_model_name_or_path,
            tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        )
    logger.info(f"Draft vocabulary {path}: coverage {vocab.coverage:.2%} of the loss tokens.")
    return vocab


def _offline_datasets(args: Eagle3TrainingArguments, target, layer_ids: list[int], train, evaluation):
    from accelerate import PartialState

    from eagle3_hf.training.features import CachedFeatureDataset, FeatureCache, build_feature_cache

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


def warn_about_emulated_precision(args: Eagle3TrainingArguments) -> list[str]:
    """Warn when `--bf16` or `--fp16` asks the head to compute in a half precision this CPU has no instructions
    for (`eagle3_hf.cpu_features`): such a run is many times slower than in float32. Returns the flags warned about
    (the target's `--target_dtype` is checked where it is loaded)."""
    from eagle3_hf.cpu_features import warn_if_emulated

    warned = []
    for flag, dtype in (("bf16", "bfloat16"), ("fp16", "float16")):
        what = f"--{flag} true (the head computes in {dtype})"
        if getattr(args, flag) and warn_if_emulated(dtype, what, args.device):
            warned.append(f"--{flag}")
    return warned


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    model_args, data_args, args = parser.parse_args_into_dataclasses(args=argv)
    if data_args.problem():  # before the target loads
        parser.error(data_args.problem())
    if model_args.draft_vocab_size < 1:
        parser.error(f"--draft_vocab_size {model_args.draft_vocab_size}: expected >= 1.")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    check_distributed_launch(args)
    warn_about_emulated_precision(args)
    from eagle3_hf.loading import DEFAULT_TARGET, load_target
    from eagle3_hf.training.heads import build_draft_head
    from eagle3_hf.training.trainer import Eagle3Trainer

    args.target_model_name_or_path = args.target_model_name_or_path or DEFAULT_TARGET
    target, tokenizer = load_target(
        args.target_model_name_or_path, dtype=model_args.target_dtype, device=str(args.device)
    )
    train, evaluation = _datasets(data_args, args, tokenizer)
    layers = target.config.get_text_config().num_hidden_layers
    draft = build_draft_head(
        target,
        _draft_vocab(model_args, data_args, args, target, tokenizer, train),
        draft_vocab_size=model_args.draft_vocab_size,
        pretrained=model_args.draft_model_name_or_path,
        target_layer_ids=[layers - 3] if args.single_feature else None,
        num_hidden_layers=model_args.draft_num_hidden_layers,
        intermediate_size=model_args.draft_intermediate_size,
        init_layers_from_target=model_args.init_layers_from_target,
        init_from_target=model_args.init_from_target,
        init_fc_from_top_feature=model_args.init_fc_from_top_feature,
        freeze_lm_head=model_args.freeze_lm_head,
        fc_norm=model_args.fc_norm,
    )
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
    # Under `accelerate launch`, tear the process group down while the interpreter is whole: one left to interpreter
    # exit can abort a rank ("terminate called without an active exception") after everything was saved.
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
