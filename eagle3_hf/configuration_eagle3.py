"""Configuration of the EAGLE-3 draft head (`Eagle3Config`, `model_type = "eagle3"`).

The draft head is a Llama-style decoder layer, so the config extends `LlamaConfig` with the fields that tie the
head to its target model: which target layers feed it (`target_layer_ids`), the target's hidden size and the
draft vocabulary size. See arXiv 2503.01840 (https://huggingface.co/papers/2503.01840).
"""

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig


def default_target_layer_ids(num_target_layers: int) -> list[int]:
    """EAGLE-3's default feature taps `[2, L // 2, L - 3]` in the Transformers `hidden_states` index convention.

    Index `i` of `output_hidden_states` is the hidden state *entering* decoder layer `i` (index 0 is the
    embeddings), which is exactly the layer id the reference implementation uses.
    """
    if num_target_layers < 4:
        raise ValueError(
            f"target_num_hidden_layers={num_target_layers}: EAGLE-3's default taps [2, L//2, L-3] need a target "
            "with at least 4 layers; pass `target_layer_ids` explicitly."
        )
    return [2, num_target_layers // 2, num_target_layers - 3]


@strict
class Eagle3Config(LlamaConfig):
    r"""
    Configuration of an [`Eagle3DraftModel`]. Inherits every Llama field (sizes, heads, `rope_parameters`, ...).

    Args:
        vocab_size (`int`):
            Vocabulary size of the **target** model. Token ids fed to the draft are target ids.
        draft_vocab_size (`int`, *optional*, defaults to `vocab_size`):
            Number of rows of the draft `lm_head`. Draft id `i` maps to target id `i + d2t[i]`.
        target_hidden_size (`int`, *optional*, defaults to `hidden_size`):
            Hidden size of the target; `fc` maps `len(target_layer_ids) * target_hidden_size` to `hidden_size`.
        target_num_hidden_layers (`int`, *optional*, defaults to 32):
            Number of decoder layers of the target, used for the default `target_layer_ids`.
        target_layer_ids (`list[int]`, *optional*, defaults to `[2, L // 2, L - 3]`):
            Target `hidden_states` indices (index `i` = input of decoder layer `i`) fused by `fc`, low to high.
            Three in EAGLE-3; one (the top layer) for the single-feature ablation.
        target_model_name_or_path (`str`, *optional*):
            Hub id or path of the target the head was trained for.
        num_hidden_layers (`int`, *optional*, defaults to 1):
            Decoder layers of the head. The first reads `concat(embedding, hidden)`; further ones are plain Llama
            decoder layers.
    """

    model_type = "eagle3"

    num_hidden_layers: int = 1
    draft_vocab_size: int | None = None
    target_hidden_size: int | None = None
    target_num_hidden_layers: int | None = 32
    target_layer_ids: list[int] | None = None
    target_model_name_or_path: str | None = None

    def __post_init__(self, **kwargs):
        if self.draft_vocab_size is None:
            self.draft_vocab_size = self.vocab_size
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        if self.target_layer_ids is None:
            self.target_layer_ids = default_target_layer_ids(self.target_num_hidden_layers)
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        # Checked here rather than in `validate_architecture`, whose errors `@strict` wraps in a non-ValueError.
        self._check_consistency()
        super().__post_init__(**kwargs)

    def _check_consistency(self):
        """Cross-field checks; each error names the fields and values involved."""
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not a multiple of num_attention_heads={self.num_attention_heads}."
            )
        kv_heads = self.num_key_value_heads or self.num_attention_heads
        if self.num_attention_heads % kv_heads != 0:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of num_key_value_heads={kv_heads}."
            )
        if self.num_hidden_layers < 1:
            raise ValueError(f"num_hidden_layers={self.num_hidden_layers}: the draft head needs at least 1 layer.")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size={self.draft_vocab_size} must be in [1, vocab_size={self.vocab_size}].")
        if len(self.target_layer_ids) not in (1, 3):
            raise ValueError(
                f"target_layer_ids={self.target_layer_ids}: expected 3 ids (low, mid, high) or 1 (ablation)."
            )
        if sorted(set(self.target_layer_ids)) != list(self.target_layer_ids):
            raise ValueError(f"target_layer_ids={self.target_layer_ids} must be strictly increasing.")
        if self.target_layer_ids[0] < 1:
            raise ValueError(
                f"target_layer_ids={self.target_layer_ids}: index 0 is the embedding output, not a layer feature."
            )
        if self.target_num_hidden_layers is not None and self.target_layer_ids[-1] >= self.target_num_hidden_layers:
            # hidden_states[L] is the *post-norm* output in Transformers; EAGLE features are pre-norm.
            raise ValueError(
                f"target_layer_ids={self.target_layer_ids} must be < target_num_hidden_layers="
                f"{self.target_num_hidden_layers} (hidden_states[L] is post-norm)."
            )
        if self.tie_word_embeddings:
            raise ValueError("tie_word_embeddings=True: the draft lm_head is not the target embedding.")

    @property
    def num_target_features(self) -> int:
        """Width of the concatenated target features fed to `fc`: `len(target_layer_ids) * target_hidden_size`."""
        return len(self.target_layer_ids) * self.target_hidden_size


__all__ = ["Eagle3Config", "default_target_layer_ids"]
