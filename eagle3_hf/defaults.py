"""The embedded defaults of the demo and the benchmark: SmolLM2-135M-Instruct and the head we trained for it."""

from pathlib import Path


# The head ships in the repository, Hub-ready, under model_cards/ (see its README.md for the recipe).
DEFAULT_HEAD_DIR = Path(__file__).resolve().parent.parent / "model_cards" / "eagle3-SmolLM2-135M-Instruct"


def load_default_pair(head: str | Path | None = None, dtype=None, attn_implementation: str = "sdpa"):
    """`(target, tokenizer, draft)`: offline SmolLM2 and an EAGLE-3 head (default: the shipped one).

    `head` may be a local folder in any dialect or a Hub id.
    """
    from .assets import load_smollm2
    from .modeling_eagle3 import Eagle3DraftModel

    head = head or DEFAULT_HEAD_DIR
    if Path(head) == DEFAULT_HEAD_DIR and not DEFAULT_HEAD_DIR.is_dir():
        raise FileNotFoundError(
            f"The default head folder {DEFAULT_HEAD_DIR} is missing; it ships with the eagle3_hf repository. "
            "Pass --head PATH_OR_HUB_ID."
        )
    target, tokenizer = load_smollm2(dtype=dtype, attn_implementation=attn_implementation)
    draft = Eagle3DraftModel.from_pretrained(str(head))
    draft = draft.to(device=target.device, dtype=target.dtype).eval()
    draft.attach_target(target)
    return target, tokenizer, draft
