"""Configuration of the EAGLE-3 draft head (`Eagle3Config`, `model_type = "eagle3"`).

The draft head is a Llama-style decoder layer, so the config extends `LlamaConfig` with the fields that tie the
head to its target model: which target layers feed it (`target_layer_ids`), the target's hidden size and the
draft vocabulary size. See arXiv 2503.01840 (https://huggingface.co/papers/2503.01840).
"""

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig


ATTENTION_KINDS = ("full_attention", "sliding_attention")


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
            Three in EAGLE-3; one (the top layer) for the single-feature ablation; speculators'
            `--include-last-layer` adds `L`, which here means the last layer's output *before* the final norm
            (Transformers' `hidden_states[L]` is after it).
        target_model_name_or_path (`str`, *optional*):
            Hub id or path of the target the head was trained for.
        num_hidden_layers (`int`, *optional*, defaults to 1):
            Decoder layers of the head. The first reads `concat(embedding, hidden)`; further ones are plain Llama
            decoder layers.
        norm_before_fc (`bool`, *optional*, defaults to `False`):
            EAGLE-3.1: one RMSNorm (`input_norm`, `len(target_layer_ids) * target_hidden_size` wide) over the
            concatenated target features before `fc` (speculators' `norm_before_fc`).
        fc_norm (`bool`, *optional*, defaults to `False`):
            EAGLE-3.1: one RMSNorm per tapped feature (`fc_norm.i`, `target_hidden_size` wide) before `fc`
            (speculators' and SpecForge's `fc_norm`). Exclusive with `norm_before_fc`.
        norm_before_residual (`bool`, *optional*, defaults to `False`):
            The first layer's residual stream is `hidden_norm(hidden)` instead of `hidden` (speculators).
        norm_before_lm_head (`bool`, *optional*, defaults to `True`):
            `logits = lm_head(norm(h))`; `False` gives `lm_head(h)` (SpecForge's `norm_output: false`).
        normed_feedback (`bool`, *optional*, defaults to `False`):
            The hidden state fed back to the next draft step is `norm(h)` instead of `h` (speculators'
            `norm_output: true`, EAGLE-3.1); the logits are unchanged.
        draft_layer_types (`list[str]`, *optional*):
            `"full_attention"` or `"sliding_attention"` per head layer (default: all full). Not named `layer_types`:
            under that name `DynamicCache(config=...)` would keep only a window of keys per sliding layer, which the
            tree drafter's cropping cannot undo; the head keeps every key and applies the window in its masks.
        draft_sliding_window (`int`, *optional*):
            Window of the sliding layers: a query at position `p` sees keys at positions `> p - window`.
        trained_embedding (`bool`, *optional*, defaults to `False`):
            The head has its own token embedding (`embed_tokens`, saved with it; speculators'
            `embed_requires_grad: true`). `attach_target` then keeps it instead of sharing the target's.
    """

    model_type = "eagle3"

    num_hidden_layers: int = 1
    draft_vocab_size: int | None = None
    target_hidden_size: int | None = None
    target_num_hidden_layers: int | None = 32
    target_layer_ids: list[int] | None = None
    target_model_name_or_path: str | None = None
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_before_residual: bool = False
    norm_before_lm_head: bool = True
    normed_feedback: bool = False
    draft_layer_types: list[str] | None = None
    draft_sliding_window: int | None = None
    trained_embedding: bool = False

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
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids=[]: the head needs at least one target feature.")
        if sorted(set(self.target_layer_ids)) != list(self.target_layer_ids):
            raise ValueError(f"target_layer_ids={self.target_layer_ids} must be strictly increasing.")
        if self.target_layer_ids[0] < 1:
            raise ValueError(
                f"target_layer_ids={self.target_layer_ids}: index 0 is the embedding output, not a layer feature."
            )
        if self.target_num_hidden_layers is not None and self.target_layer_ids[-1] > self.target_num_hidden_layers:
            # Id L is the last layer's output before the final norm (speculators' --include-last-layer).
            raise ValueError(
                f"target_layer_ids={self.target_layer_ids} must be <= target_num_hidden_layers="
                f"{self.target_num_hidden_layers} (id L is the last layer's pre-norm output)."
            )
        if self.normed_feedback and not self.norm_before_lm_head:
            raise ValueError("normed_feedback=True feeds norm(h) to lm_head too; it needs norm_before_lm_head=True.")
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc and fc_norm are exclusive (one norm over all features, or one each).")
        self._check_layer_types()
        if self.tie_word_embeddings:
            raise ValueError("tie_word_embeddings=True: the draft lm_head is not the target embedding.")

    def _check_layer_types(self):
        if self.draft_layer_types is None:
            if self.draft_sliding_window is not None:
                raise ValueError(
                    f"draft_sliding_window={self.draft_sliding_window} but no draft_layer_types say which layers "
                    "use it."
                )
            return
        kinds = set(self.draft_layer_types)
        if len(self.draft_layer_types) != self.num_hidden_layers or not kinds <= set(ATTENTION_KINDS):
            raise ValueError(
                f"draft_layer_types={self.draft_layer_types}: expected one of {ATTENTION_KINDS} per layer "
                f"(num_hidden_layers={self.num_hidden_layers})."
            )
        window = self.draft_sliding_window
        if "sliding_attention" in kinds and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"draft_sliding_window={window!r}: sliding layers need a positive window.")

    def layer_type(self, index: int) -> str:
        """Attention kind of head layer `index`: `"full_attention"` or `"sliding_attention"`."""
        return "full_attention" if self.draft_layer_types is None else self.draft_layer_types[index]

    @property
    def num_target_features(self) -> int:
        """Width of the concatenated target features fed to `fc`: `len(target_layer_ids) * target_hidden_size`."""
        return len(self.target_layer_ids) * self.target_hidden_size


__all__ = ["ATTENTION_KINDS", "Eagle3Config", "default_target_layer_ids"]
