"""`eagle3-hf push FOLDER REPO_ID`: upload a draft head to the Hub in a serving format, with its model card."""

import argparse
import json
import tempfile
from pathlib import Path


def make_parser() -> argparse.ArgumentParser:
    from ..checkpoints.hub import DEFAULT_FORMAT, FORMATS

    parser = argparse.ArgumentParser(
        prog="eagle3-hf push",
        description="Convert a draft-head checkpoint to a serving format, update its model card and upload both.",
    )
    parser.add_argument("folder", help="checkpoint folder of the head (any EAGLE-3 dialect)")
    parser.add_argument("repo_id", help="Hub repository, e.g. `my-org/SmolLM2-135M-Instruct-eagle3`")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=DEFAULT_FORMAT,
        help=f"checkpoint dialect to upload (default: {DEFAULT_FORMAT}, read by SGLang and vLLM)",
    )
    parser.add_argument(
        "--target",
        help="target model (folder, Hub id or .gguf file) whose embedding the speculators format ships; loaded "
        "only if given",
    )
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--token", help="Hub token (default: the one saved by `hf auth login`)")
    parser.add_argument("--commit-message", help="commit message")
    parser.add_argument("--revision", help="branch to push to (created if missing)")
    parser.add_argument("--create-pr", action="store_true", help="open a pull request instead of committing")
    parser.add_argument("--training", type=Path, help="JSON file with the training recipe for the card")
    parser.add_argument("--results", type=Path, help="`results.json` written by `eagle3-hf bench`, for the card")
    parser.add_argument("--dataset", action="append", dest="dataset_names", help="training dataset (repeatable)")
    parser.add_argument("--license", help="license metadata (default: the card's own, else apache-2.0)")
    parser.add_argument("--dry-run", action="store_true", help="print the files and the card; upload nothing")
    return parser


def _read_json(path: Path | None, option: str):
    if path is None:
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise SystemExit(f"eagle3-hf push: cannot read {option} {path}: {error}") from error
    if not isinstance(value, dict):
        raise SystemExit(f"eagle3-hf push: {option} {path}: expected a JSON object, found a {type(value).__name__}.")
    return value


def _size(num_bytes: int) -> str:
    """`1234567` -> `1.2 MB`."""
    value, unit = float(num_bytes), "B"
    for next_unit in ("KB", "MB", "GB"):
        if value < 1000:
            break
        value, unit = value / 1000, next_unit
    return f"{num_bytes} B" if unit == "B" else f"{value:.1f} {unit}"


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:  # the Hub's own rule, so that a dry run does not approve an id the upload would refuse
        validate_repo_id(args.repo_id)
    except HFValidationError as error:
        parser.error(f"repo_id {args.repo_id!r}: {error}")
    try:
        return _push(args)
    except (OSError, ValueError) as error:  # CheckpointFormatError is a ValueError: the message names the file
        raise SystemExit(f"eagle3-hf push: {error}") from error


def _push(args: argparse.Namespace) -> int:
    from ..checkpoints.hub import prepare_upload_folder, push_to_hub
    from ..loading import load_target_model

    card_kwargs = dict(
        target=load_target_model(args.target, device="cpu", attn_implementation=None) if args.target else None,
        training=_read_json(args.training, "--training"),
        results=_read_json(args.results, "--results"),
        dataset_names=args.dataset_names,
        license=args.license,
    )
    if not args.dry_run:
        commit = push_to_hub(
            args.folder,
            args.repo_id,
            format=args.format,
            private=args.private or None,
            token=args.token,
            commit_message=args.commit_message,
            revision=args.revision,
            create_pr=args.create_pr,
            **card_kwargs,
        )
        print(f"Uploaded to {commit.commit_url}")
        return 0
    with tempfile.TemporaryDirectory(prefix="eagle3_hf-dry-run-") as tmp:
        upload = Path(tmp) / "upload"
        files = prepare_upload_folder(args.folder, upload, args.format, repo_id=args.repo_id, **card_kwargs)
        print(f"Dry run: would upload {len(files)} files to https://huggingface.co/{args.repo_id} ({args.format}):")
        for name in files:
            print(f"  {name}  ({_size((upload / name).stat().st_size)})")
        print("\nA README.md already on the Hub would be merged: its text outside the generated sections is kept.")
        print("\n--- README.md ---")
        print((upload / "README.md").read_text(encoding="utf-8"), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
