"""Build the heads and the large-vocabulary target that the cost model's benchmarks run on, into a folder.

- `untrained-smollm2/`: `Eagle3DraftModel.from_target(SmolLM2, draft_vocab_size=8192)`, never trained (it drafts
  almost nothing right: the case where speculation must notice it does not pay);
- `large-vocab-target/`: a Llama-shaped target with a 262,144-token vocabulary (Gemma 3's size) and random weights,
  SmolLM2's tokenizer (its ids are a subset), built in code; every verified node pays a 262k-row `lm_head` product;
- `untrained-large-vocab/`: an untrained head for it (8,192-token draft vocabulary).

Then, for example (interleaved in one process, through generate's default path):

    .venv/bin/python scripts/make_bench_heads.py runs/bench-heads
    .venv/bin/eagle3-hf bench --head runs/bench-heads/untrained-smollm2 --methods plain adaptive ...
    .venv/bin/eagle3-hf bench --target runs/bench-heads/large-vocab-target --head runs/bench-heads/untrained-large-vocab \\
        --methods plain adaptive ...
"""

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from eagle3_hf import Eagle3DraftModel
from eagle3_hf.loading import load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="folder to write the three checkpoints into")
    parser.add_argument("--large-vocab-size", type=int, default=262_144)
    parser.add_argument("--draft-vocab-size", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    smollm2, tokenizer = load_target(device="cpu")
    Eagle3DraftModel.from_target(smollm2, draft_vocab_size=args.draft_vocab_size).save_pretrained(
        args.output / "untrained-smollm2"
    )
    text = smollm2.config
    config = LlamaConfig(  # SmolLM2-135M's body (hidden 576, 30 layers, GQA 9/3) with a Gemma-3-sized vocabulary
        vocab_size=args.large_vocab_size,
        hidden_size=text.hidden_size,
        intermediate_size=text.intermediate_size,
        num_hidden_layers=text.num_hidden_layers,
        num_attention_heads=text.num_attention_heads,
        num_key_value_heads=text.num_key_value_heads,
        max_position_embeddings=text.max_position_embeddings,
        rope_parameters=text.rope_parameters,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    large = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    large.save_pretrained(args.output / "large-vocab-target")
    tokenizer.save_pretrained(args.output / "large-vocab-target")
    Eagle3DraftModel.from_target(large, draft_vocab_size=args.draft_vocab_size).save_pretrained(
        args.output / "untrained-large-vocab"
    )
    print(f"wrote {', '.join(sorted(p.name for p in args.output.iterdir()))} to {args.output}")


if __name__ == "__main__":
    main()
