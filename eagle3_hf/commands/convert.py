"""`eagle3-hf convert SRC DST --to DIALECT`: rewrite an EAGLE-3 head in another checkpoint dialect.

SRC is a folder or Hub id in any dialect `Eagle3DraftModel.from_pretrained` reads (eagle3_hf, official EAGLE,
SGLang/SpecForge, NVIDIA ModelOpt, vLLM speculators); DST is written atomically. See docs/checkpoint-dialects.md.
"""

import argparse
import sys

from . import check_at_least


# Kept in sync with eagle3_hf.checkpoints.writing.WRITABLE_DIALECTS (a test checks it); not imported so that
# `--help` is fast.
DIALECTS = ("eagle3_hf", "eagle", "sglang", "speculators")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagle3-hf convert",
        description="Convert an EAGLE-3 draft head between checkpoint dialects (read: any; write: --to).",
    )
    parser.add_argument("source", help="folder or Hub id of the head, in any dialect")
    parser.add_argument("destination", help="output folder (staged next to it and renamed into place)")
    parser.add_argument("--to", dest="dialect", required=True, choices=DIALECTS, help="dialect to write")
    parser.add_argument(
        "--target",
        help="the target model (folder, Hub id or .gguf file), loaded on CPU: gives the layer count, verifier id, "
        "context length and token embedding (the speculators dialect ships it) and checks the head fits it",
    )
    parser.add_argument("--target-num-hidden-layers", type=int, help="target layer count L (default taps)")
    parser.add_argument("--target-layer-ids", type=int, nargs="+", help="target hidden_states indices fused by fc")
    parser.add_argument("--target-name", help="verifier id to record (speculators verifier.name_or_path)")
    parser.add_argument(
        "--max-position-embeddings",
        type=int,
        help="value written for the engines (default: the target's with --target, unless the head's RoPE reads it, "
        "as dynamic NTK does)",
    )
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"))
    parser.add_argument("--speculative-tokens", type=int, default=3, help="speculators proposal length")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty destination")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    check_at_least(
        parser,
        {
            "--max-position-embeddings": (args.max_position_embeddings, 1),
            "--speculative-tokens": (args.speculative_tokens, 1),
            "--target-num-hidden-layers": (args.target_num_hidden_layers, 1),
        },
    )
    from huggingface_hub.errors import StrictDataclassError

    from eagle3_hf import Eagle3DraftModel
    from eagle3_hf.checkpoints.reading import detect_checkpoint_dialect, rope_reads_max_position_embeddings
    from eagle3_hf.checkpoints.writing import save_in_dialect
    from eagle3_hf.loading import load_target_model

    try:
        source_dialect = detect_checkpoint_dialect(args.source)
        target = load_target_model(args.target, device="cpu", attn_implementation=None) if args.target else None
        overrides = {
            "target_num_hidden_layers": args.target_num_hidden_layers,
            "target_layer_ids": args.target_layer_ids,
        }
        overrides = {key: value for key, value in overrides.items() if value is not None}
        if overrides and source_dialect == "eagle3_hf":
            raise ValueError("--target-num-hidden-layers/--target-layer-ids: a native head records its layer ids.")
        draft = Eagle3DraftModel.from_pretrained(args.source, dtype=args.dtype, target=target, **overrides)
        if args.target_name:
            draft.config.target_model_name_or_path = args.target_name
        max_positions = args.max_position_embeddings
        if max_positions is None and target is not None:  # a RoPE that reads the value keeps the head's own
            if not rope_reads_max_position_embeddings(draft.config.rope_parameters):
                max_positions = target.config.get_text_config().max_position_embeddings
        save_in_dialect(
            draft,
            args.destination,
            args.dialect,
            overwrite=args.overwrite,
            max_position_embeddings=max_positions,
            speculative_tokens=args.speculative_tokens,
            verifier_architectures=target.config.architectures if target is not None else None,
        )
    except (OSError, ValueError, TypeError, StrictDataclassError) as error:
        message = " ".join(str(error).split())  # one line, whatever the library wrote
        print(f"eagle3-hf convert: error: {message}", file=sys.stderr)
        return 1
    config = draft.config
    print(
        f"{args.source} ({source_dialect}) -> {args.destination} ({args.dialect}): target_layer_ids="
        f"{config.target_layer_ids}, rope_theta={config.rope_parameters['rope_theta']}, draft_vocab_size="
        f"{config.draft_vocab_size}/{config.vocab_size}, verifier={config.target_model_name_or_path}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
