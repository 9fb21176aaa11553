"""How much of held-out text a draft vocabulary can predict at all: the share of held-out answer tokens inside the
head's draft vocabulary (its `t2d`), and inside the `N`-token vocabularies `train` would choose from the training
answers for larger `N` (`select_draft_token_ids`: the most frequent; issue 17's "draft vocabulary 8k vs 16k/32k"). A token outside the draft vocabulary is never drafted, so this share
caps every position's top-1 accuracy.

    .venv/bin/python scripts/measure_vocab_coverage.py --head model_cards/eagle3-SmolLM2-135M-Instruct \
        --train data/regenerated/*.jsonl.gz --heldout runs/diagnose/answers/heldout-11045b04447b.jsonl

Files are JSONL records (`.gz` or not) with `messages` (what `eagle3-hf regenerate` and `diagnose --regenerated_dir`
write); the assistant turns are tokenized with the target's tokenizer, without special tokens.
"""

import argparse
from pathlib import Path

import torch
from safetensors.torch import load_file

from eagle3_hf.loading import DEFAULT_TARGET, load_tokenizer
from eagle3_hf.training.records import iter_json_records
from eagle3_hf.training.vocab import select_draft_token_ids


def assistant_texts(path: Path) -> list[str]:
    return [m["content"] for record in iter_json_records(path) for m in record["messages"] if m["role"] == "assistant"]


def token_counts(tokenizer, texts: list[str], vocab_size: int, batch: int = 512) -> torch.Tensor:
    """`(vocab_size,)` int64 counts of the tokens of `texts`."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for start in range(0, len(texts), batch):
        for ids in tokenizer(texts[start : start + batch], add_special_tokens=False).input_ids:
            counts += torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=vocab_size)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", type=Path, required=True, help="head folder with model.safetensors (its t2d)")
    parser.add_argument("--train", type=Path, nargs="+", required=True, help="training answers (JSONL, .gz or not)")
    parser.add_argument("--heldout", type=Path, required=True, help="held-out answers (JSONL)")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="target whose tokenizer to use")
    parser.add_argument("--sizes", type=int, nargs="+", default=[8192, 16384, 32768])
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.target)
    t2d = load_file(args.head / "model.safetensors")["t2d"]
    vocab_size = t2d.numel()
    train = token_counts(tokenizer, [text for path in args.train for text in assistant_texts(path)], vocab_size)
    heldout = token_counts(tokenizer, assistant_texts(args.heldout), vocab_size)
    print(f"training answers: {int(train.sum())} tokens, {int((train > 0).sum())} distinct")
    print(f"held-out answers: {int(heldout.sum())} tokens")
    print(f"the head's draft vocabulary ({int(t2d.sum())} tokens) covers {heldout[t2d].sum() / heldout.sum():.4f}")
    for size in args.sizes:
        chosen = select_draft_token_ids(train, size)[0]
        print(
            f"the {size}-token vocabulary of the training answers covers {heldout[chosen].sum() / heldout.sum():.4f} "
            f"of the held-out tokens ({train[chosen].sum() / train.sum():.4f} of the training tokens)"
        )


if __name__ == "__main__":
    main()
