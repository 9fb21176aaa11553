"""The EAGLE-3 draft head as a Transformers model.

Reads top to bottom: attention with a 2H-wide input -> the fused decoder layer -> `Eagle3PreTrainedModel` ->
`Eagle3DraftModel`. The Llama building blocks (RMSNorm, RoPE, MLP, attention backends) are reused by subclassing;
only what differs from Llama is written here.

The token embedding is the **target's** (frozen) and is not part of the head's weights: it is attached with
`Eagle3DraftModel.attach_target(target)` (done for you by `from_target`, by the decoding loop and by the trainer),
or comes from a checkpoint that ships it (the vLLM speculators dialect). A head with no embedding refuses to run.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import ModelOutput
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

from .configuration_eagle3 import Eagle3Config, default_target_layer_ids
from .vocab_maps import check_vocab_maps, maps_from_token_ids, t2d_from_d2t


@dataclass
class Eagle3DraftOutput(ModelOutput):
    """Output of one or several draft steps.

    Args:
        logits (`torch.FloatTensor` of shape `(batch_size, seq_len, draft_vocab_size)`):
            Scores over the **draft** vocabulary; map ids with `Eagle3DraftModel.draft_to_target_ids`.
        hidden_states (`torch.FloatTensor` of shape `(batch_size, seq_len, hidden_size)`):
            Output of the last layer, fed back as `hidden_states` of the next draft step: pre-norm, or after `norm`
            for `config.normed_feedback` heads (EAGLE-3.1).
        cache (`Cache`, *optional*):
            The draft's KV cache, updated with this call's keys and values.
    """

    logits: torch.FloatTensor | None = None
    hidden_states: torch.FloatTensor | None = None
    cache: Cache | None = None


class Eagle3Attention(LlamaAttention):
    """Llama attention whose q/k/v projections read `concat(embedding, hidden)`, i.e. `2 * hidden_size` wide."""

    def __init__(self, config: Eagle3Config, layer_idx: int):
        super().__init__(config, layer_idx)
        # main diff with Llama: the attention input is 2H wide, the output stays H wide
        in_features = 2 * config.hidden_size
        self.q_proj = nn.Linear(in_features, config.num_attention_heads * self.head_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(in_features, config.num_key_value_heads * self.head_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(in_features, config.num_key_value_heads * self.head_dim, bias=config.attention_bias)


class Eagle3DecoderLayer(LlamaDecoderLayer):
    """The EAGLE-3 layer: attention over `concat(input_layernorm(embedding), hidden_norm(hidden))`.

    The residual stream is the un-normed `hidden` (`hidden_norm(hidden)` with `config.norm_before_residual`), not
    the concatenation.
    """

    def __init__(self, config: Eagle3Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = Eagle3Attention(config, layer_idx)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm_before_residual = config.norm_before_residual

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """`inputs_embeds` and `hidden_states`: `(batch, seq, hidden_size)`; returns the pre-norm `(batch, seq, H)`."""
        normed = self.hidden_norm(hidden_states)
        residual = normed if self.norm_before_residual else hidden_states
        attn_input = torch.cat([self.input_layernorm(inputs_embeds), normed], dim=-1)
        attn_output, _ = self.self_attn(
            hidden_states=attn_input,
            attention_mask=attention_mask,
            position_embeddings=position_embeddings,
            cache=cache,
            **kwargs,
        )
        hidden_states = residual + attn_output
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        return residual + hidden_states


class Eagle3PreTrainedModel(PreTrainedModel):
    config_class = Eagle3Config
    config: Eagle3Config
    base_model_prefix = ""
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False
    _no_split_modules = ["Eagle3DecoderLayer", "LlamaDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = False  # a draft tree needs an arbitrary 4-D mask
    _supports_flex_attn = False
    _supports_attention_backend = True

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, Eagle3DraftModel):
            module.reset_vocab_maps()


def sliding_window_mask(
    mask: torch.Tensor | None, position_ids: torch.LongTensor, kv_length: int, window: int
) -> torch.Tensor:
    """`mask` restricted to keys at index `j > position - window` (Transformers' sliding-window rule).

    Args:
        mask (`torch.Tensor` of shape `(batch, 1, query, kv_length)`, *optional*): bool (True = visible) or additive
            float; `None` means causal over `kv_length` keys (key index `j <= position`).
        position_ids (`torch.LongTensor` of shape `(batch, query)`): the queries' positions.

    Returns:
        A mask of `mask`'s kind (bool when `mask` is `None`) of shape `(batch, 1, query, kv_length)`.
    """
    keys = torch.arange(kv_length, device=position_ids.device)
    positions = position_ids[:, None, :, None]
    inside = keys > positions - window  # shape: [B, 1, Q, K]
    if mask is None:
        return inside & (keys <= positions)
    inside = inside.to(mask.device)
    if mask.dtype == torch.bool:
        return mask & inside
    return mask.masked_fill(~inside, torch.finfo(mask.dtype).min)


def _intermediate_size(text_config) -> int:
    """The target's MLP width, under the names different architectures give it (GPT-2: `n_inner`, `None` meaning
    `4 * hidden_size`; OPT: `ffn_dim`; Falcon: `ffn_hidden_size`)."""
    for name in ("intermediate_size", "ffn_dim", "ffn_hidden_size", "n_inner"):
        value = getattr(text_config, name, None)
        if value:
            return int(value)
    return 4 * text_config.hidden_size


class Eagle3DraftModel(Eagle3PreTrainedModel):
    """EAGLE-3 draft head (arXiv 2503.01840): `fc` fuses target features, one or more decoder layers, `norm`,
    and an `lm_head` over the draft vocabulary.

    Buffers:
        d2t (`torch.LongTensor` of shape `(draft_vocab_size,)`): offsets; draft id `i` is target id `i + d2t[i]`.
        t2d (`torch.BoolTensor` of shape `(vocab_size,)`): `t2d[v]` is true iff target id `v` is in the draft vocab.
    """

    def __init__(self, config: Eagle3Config):
        super().__init__(config)
        eps = config.rms_norm_eps
        # EAGLE-3.1 input norms (absent from plain EAGLE-3 heads, so their checkpoints keep the same tensors)
        if config.norm_before_fc:
            self.input_norm = LlamaRMSNorm(config.num_target_features, eps=eps)
        if config.fc_norm:
            features = len(config.target_layer_ids)
            self.fc_norm = nn.ModuleList([LlamaRMSNorm(config.target_hidden_size, eps=eps) for _ in range(features)])
        self.fc = nn.Linear(config.num_target_features, config.hidden_size, bias=False)
        self.layers = nn.ModuleList(
            [Eagle3DecoderLayer(config, 0)]
            + [LlamaDecoderLayer(config, i) for i in range(1, config.num_hidden_layers)]
        )
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        # Deliberately not a registered submodule: the embedding belongs to the target (frozen, not saved, not
        # moved or cast with the head, not seen by the optimizer). See `attach_target`. A head with a trained
        # embedding of its own registers it as `embed_tokens` instead: saved, moved and trained with the head.
        object.__setattr__(self, "_embedding", None)
        if config.trained_embedding:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
            object.__setattr__(self, "_embedding", self.embed_tokens)
        self.post_init()

    # ----------------------------------------------------------------------------------------------- vocabulary
    @torch.no_grad()
    def reset_vocab_maps(self) -> None:
        """Identity maps: draft id `i` is target id `i` (the first `draft_vocab_size` target ids)."""
        self.d2t.zero_()
        self.t2d.zero_()
        self.t2d[: self.config.draft_vocab_size] = True

    @torch.no_grad()
    def set_vocab_maps(self, d2t: torch.Tensor, t2d: torch.Tensor | None = None) -> None:
        """Install draft->target maps after checking them (`t2d` is rebuilt from `d2t` when not given)."""
        d2t = d2t.to(torch.long)
        if t2d is None:
            t2d = t2d_from_d2t(d2t, self.config.vocab_size)
        check_vocab_maps(d2t, t2d, self.config.draft_vocab_size, self.config.vocab_size)
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def draft_to_target_ids(self, draft_ids: torch.LongTensor) -> torch.LongTensor:
        """Map draft-vocabulary ids (any shape) to target-vocabulary ids: `target = draft + d2t[draft]`."""
        return draft_ids + self.d2t[draft_ids]

    @torch.no_grad()
    def replace_draft_vocab(self, token_ids: torch.Tensor, target: PreTrainedModel | None = None) -> int:
        """Switch a head to another draft vocabulary (of any size), keeping what it learned.

        A token in both vocabularies keeps its trained `lm_head` row. A new token's row is the target's
        output-embedding row, which is exactly what the head has when it was trained with `--init_from_target`
        and a frozen `lm_head`; so such a head reads the new tokens as well as the old ones without retraining.
        `config.draft_vocab_size`, `d2t` and `t2d` follow.

        Args:
            token_ids (`torch.LongTensor` of shape `(new_draft_vocab_size,)`, or a `DraftVocab`): target ids of the
                new vocabulary (any order, no duplicates), or a vocabulary file's `DraftVocab` (`eagle3-hf vocab`),
                whose recorded target vocabulary must be this head's (`ValueError` naming the file otherwise).
            target ([`PreTrainedModel`], *optional*): needed when `token_ids` holds ids outside the current
                vocabulary, for their rows.

        Returns:
            The number of tokens that were not in the old vocabulary.
        """
        metadata = getattr(token_ids, "metadata", None)
        if metadata is not None:  # a DraftVocab (not imported: the head does not depend on the training package)
            where, recorded = getattr(token_ids, "path", None) or "the draft vocabulary", token_ids.t2d.shape[0]
            if metadata.get("vocab_size", recorded) != self.config.vocab_size or recorded != self.config.vocab_size:
                raise ValueError(
                    f"{where}: vocab_size={metadata.get('vocab_size', recorded)} (tokenizer "
                    f"{metadata.get('tokenizer')!r}) but the head's target vocabulary has vocab_size="
                    f"{self.config.vocab_size}: it was built for another tokenizer."
                )
            token_ids = token_ids.token_ids
        d2t, t2d = maps_from_token_ids(token_ids.cpu(), self.config.vocab_size)
        new_ids = torch.arange(d2t.shape[0]) + d2t
        old_ids = self.draft_to_target_ids(torch.arange(self.config.draft_vocab_size, device=self.d2t.device)).cpu()
        old_row = torch.full((self.config.vocab_size,), -1, dtype=torch.long)
        old_row[old_ids] = torch.arange(old_ids.shape[0])
        rows = old_row[new_ids]
        added = rows < 0
        num_added = int(added.sum())
        weight = self.lm_head.weight
        lm_head = nn.Linear(weight.shape[1], new_ids.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
        lm_head.weight[~added] = weight[rows[~added].to(weight.device)]
        if num_added:
            output = None if target is None else target.get_output_embeddings()
            if output is None:
                raise ValueError(
                    f"replace_draft_vocab: {num_added} of the new token_ids are not in the current draft "
                    "vocabulary; pass `target=` (a model with an output embedding) for their lm_head rows."
                )
            self.check_target(target)
            lm_head.weight[added] = output.weight[new_ids[added].to(output.weight.device)].to(weight)
        lm_head.weight.requires_grad_(weight.requires_grad)
        # Nothing of the head changes before this point, so a refusal above leaves it as it was.
        self.lm_head = lm_head
        self.config.draft_vocab_size = new_ids.shape[0]
        self.d2t = torch.zeros_like(d2t, device=self.d2t.device)
        self.set_vocab_maps(d2t, t2d)
        return num_added

    # ------------------------------------------------------------------------------------------------ embedding
    def get_input_embeddings(self) -> nn.Module | None:
        return self._embedding

    def set_input_embeddings(self, value: nn.Module | None) -> None:
        if value is not None and value.weight.shape[0] != self.config.vocab_size:
            raise ValueError(
                f"The embedding has {value.weight.shape[0]} rows but the head's config says "
                f"vocab_size={self.config.vocab_size}."
            )
        if self.config.trained_embedding:
            if value is None or value.weight.shape != self.embed_tokens.weight.shape:
                raise ValueError(
                    f"This head's own trained embedding is {tuple(self.embed_tokens.weight.shape)}; got "
                    f"{None if value is None else tuple(value.weight.shape)}."
                )
            with torch.no_grad():
                self.embed_tokens.weight.copy_(value.weight)
            return
        object.__setattr__(self, "_embedding", value)

    @property
    def has_embedding(self) -> bool:
        return self._embedding is not None

    def check_target(self, target: PreTrainedModel) -> None:
        """Raise `ValueError` when the vocabulary, the hidden size or the layer taps do not match `target`."""
        text_config = target.config.get_text_config()
        if text_config.vocab_size != self.config.vocab_size:
            raise ValueError(
                f"vocab_size mismatch: the draft head has vocab_size={self.config.vocab_size} but the target "
                f"{target.name_or_path or type(target).__name__!r} has vocab_size={text_config.vocab_size}."
            )
        if text_config.hidden_size != self.config.target_hidden_size:
            raise ValueError(
                f"target_hidden_size={self.config.target_hidden_size} but the target's hidden_size is "
                f"{text_config.hidden_size}."
            )
        layers, recorded = text_config.num_hidden_layers, self.config.target_num_hidden_layers
        if (
            recorded is not None
            and recorded >= 4
            and recorded != layers
            and self.config.target_layer_ids == default_target_layer_ids(recorded)
        ):
            # The taps were derived from a different depth: they would silently read the wrong layers.
            raise ValueError(
                f"The head's target_layer_ids={self.config.target_layer_ids} are the defaults for a "
                f"{recorded}-layer target, but the target has {layers} layers."
            )
        if self.config.target_layer_ids[-1] > layers:
            raise ValueError(
                f"target_layer_ids={self.config.target_layer_ids} but the target has only {layers} layers."
            )

    def attach_target(self, target: PreTrainedModel) -> "Eagle3DraftModel":
        """Use `target`'s input embedding (shared, frozen, never saved) after `check_target(target)`.

        A head with a trained embedding of its own (`config.trained_embedding`) is only checked: it keeps its own.
        """
        self.check_target(target)
        if self.config.trained_embedding:
            return self
        embedding = target.get_input_embeddings()
        if embedding.weight.shape[1] != self.config.hidden_size:
            raise ValueError(
                f"The target embedding is {embedding.weight.shape[1]} wide but the head's hidden_size is "
                f"{self.config.hidden_size}; such a head must ship its own embedding."
            )
        self.set_input_embeddings(embedding)
        return self

    def embed(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """Embed target-vocabulary ids `(batch, seq)` -> `(batch, seq, hidden_size)` with the attached embedding."""
        if self._embedding is None:
            raise RuntimeError(
                "The draft head has no token embedding: EAGLE-3 checkpoints do not store it. Call "
                "`draft.attach_target(target)` (generate() and Eagle3Trainer do this for you)."
            )
        weight = self._embedding.weight
        if self.config.trained_embedding:  # the head's own: trainable like the rest of it
            return self._embedding(input_ids.to(weight.device))
        with torch.no_grad():
            embeds = self._embedding(input_ids.to(weight.device))
        return embeds.to(device=self.fc.weight.device, dtype=self.fc.weight.dtype)

    # -------------------------------------------------------------------------------------------------- forward
    def forward(
        self,
        input_ids: torch.LongTensor,
        target_hidden_states: torch.Tensor | None = None,
        hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> Eagle3DraftOutput:
        r"""One draft step over a sequence, or over the nodes of a tree with a 4-D mask.

        Args:
            input_ids (`torch.LongTensor` of shape `(batch, seq)`): token ids in the **target** vocabulary.
            target_hidden_states (`torch.Tensor` of shape `(batch, seq, len(target_layer_ids) * target_hidden_size)`):
                Concatenated target features (low -> high), fused by `fc`. Exclusive with `hidden_states`.
            hidden_states (`torch.Tensor` of shape `(batch, seq, hidden_size)`):
                The head's own pre-norm output from the previous step, fed back without `fc`.
            attention_mask (`torch.Tensor` or `dict`, *optional*): 2-D padding mask `(batch, past + seq)`, or a 4-D
                mask `(batch, 1, seq, past + seq)` (float additive or bool) used as is by full-attention layers, e.g.
                a tree mask (sliding layers restrict it to their window), or a dict of 4-D masks per attention kind
                (`"full_attention"`, `"sliding_attention"`) used as is.
            position_ids (`torch.LongTensor` of shape `(batch, seq)`, *optional*): RoPE positions; default
                `past + arange(seq)`. No cap: RoPE is computed for any position.
            cache (`Cache`, *optional*): the draft's KV cache; created when `use_cache` and none is given.
            logits_to_keep (`int`, defaults to 0): compute logits for the last `logits_to_keep` positions only
                (0 = all).
        """
        if (target_hidden_states is None) == (hidden_states is None):
            raise ValueError("Pass exactly one of `target_hidden_states` (target features) or `hidden_states`.")
        if target_hidden_states is not None:
            if target_hidden_states.shape[-1] != self.config.num_target_features:
                raise ValueError(
                    f"target_hidden_states is {target_hidden_states.shape[-1]} wide; expected "
                    f"len(target_layer_ids) * target_hidden_size = {self.config.num_target_features}."
                )
            hidden_states = self.fc(self._normed_features(target_hidden_states.to(self.fc.weight.dtype)))
        elif hidden_states.shape[-1] != self.config.hidden_size:
            raise ValueError(f"hidden_states is {hidden_states.shape[-1]} wide; expected {self.config.hidden_size}.")

        inputs_embeds = self.embed(input_ids)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(past, past + input_ids.shape[1], device=inputs_embeds.device).unsqueeze(0)

        masks = self._attention_masks(attention_mask, inputs_embeds, cache, position_ids)
        position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)

        first_mask = masks[self.config.layer_type(0)]
        hidden_states = self.layers[0](
            inputs_embeds, hidden_states, first_mask, position_embeddings, cache if use_cache else None, **kwargs
        )
        for index, layer in enumerate(self.layers[1:], start=1):
            hidden_states = layer(
                hidden_states,
                attention_mask=masks[self.config.layer_type(index)],
                position_embeddings=position_embeddings,
                position_ids=position_ids,
                cache=cache if use_cache else None,
                **kwargs,
            )
        if self.config.normed_feedback:  # EAGLE-3.1: the next step reads the normed state; logits are the same
            hidden_states = self.norm(hidden_states)
        kept = hidden_states[:, -logits_to_keep:] if logits_to_keep else hidden_states
        if self.config.norm_before_lm_head and not self.config.normed_feedback:
            kept = self.norm(kept)
        logits = self.lm_head(kept)
        return Eagle3DraftOutput(logits=logits, hidden_states=hidden_states, cache=cache if use_cache else None)

    def _normed_features(self, features: torch.Tensor) -> torch.Tensor:
        """The EAGLE-3.1 input norms (`norm_before_fc` or `fc_norm`) on `(batch, seq, num_target_features)`."""
        if self.config.norm_before_fc:
            return self.input_norm(features)
        if self.config.fc_norm:
            chunks = features.split(self.config.target_hidden_size, dim=-1)
            return torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, chunks)], dim=-1)
        return features

    def _attention_masks(self, attention_mask, inputs_embeds, cache, position_ids) -> dict:
        """The mask of each attention kind the head's layers use: `{"full_attention": ..., "sliding_attention": ...}`.

        A dict `attention_mask` is taken as is (the training-time test builds its windows on its own key layout).
        Otherwise the full mask is Transformers' causal mask (a 4-D tensor used as is), and the sliding one is that
        mask restricted to keys at index `> position - window`: the key index is the position in every cache the
        head fills (the drafter's stable entries; tree entries are the newest, always inside the window).
        """
        if isinstance(attention_mask, dict):
            needed = {self.config.layer_type(i) for i in range(self.config.num_hidden_layers)}
            if missing := sorted(needed - attention_mask.keys()):
                raise ValueError(f"attention_mask has no entry for the head's {missing} layers.")
            return attention_mask
        full = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            cache=cache,
            position_ids=position_ids,
        )
        masks = {"full_attention": full}
        if self.config.draft_layer_types is not None and "sliding_attention" in self.config.draft_layer_types:
            past = cache.get_seq_length() if cache is not None else 0
            kv_length = full.shape[-1] if full is not None else past + inputs_embeds.shape[1]
            masks["sliding_attention"] = sliding_window_mask(
                full, position_ids, kv_length, self.config.draft_sliding_window
            )
        return masks

    # -------------------------------------------------------------------------------------------- construction
    @classmethod
    def from_target(cls, target: PreTrainedModel, **overrides) -> "Eagle3DraftModel":
        """An untrained head sized for `target`, with the target's embedding attached.

        Hidden size, heads, intermediate size, norm eps, activation, vocabulary and `max_position_embeddings`
        come from the target; RoPE uses base 10000 as the reference training does; the layer taps default to
        `[2, L // 2, L - 3]`. Any `Eagle3Config` field can be overridden, e.g. `draft_vocab_size=8192`.
        The head is placed on the target's device and dtype.
        """
        config = cls.config_from_target(target, **overrides)
        embedding = target.get_input_embeddings().weight
        draft = cls(config).to(device=embedding.device, dtype=embedding.dtype)
        if config.trained_embedding:  # an embedding of its own starts as a copy of the target's
            draft.set_input_embeddings(target.get_input_embeddings())
        return draft.attach_target(target)

    @torch.no_grad()
    def init_output_from_target(self, target: PreTrainedModel, fc_from_top_feature: bool = False) -> list[str]:
        """Start the head's output side from the target's instead of from random weights.

        - `lm_head` gets the target's output-embedding rows of the draft vocabulary (`draft_to_target_ids`), so
          the head starts with the target's own token directions; call it *after* `set_vocab_maps`.
        - `norm` gets the target's final norm weight, when that norm computes the same function as an RMSNorm
          with that weight (checked on random inputs; Gemma's `1 + weight` norm, say, is left alone).
        - with `fc_from_top_feature=True`, `fc` starts as the projection onto the highest tapped layer, so the
          residual stream starts in the target's last-layer space that `norm` and `lm_head` read.

        EAGLE-1/2 reused the target's frozen `lm_head`; EAGLE-3 trains its own over a smaller vocabulary. Starting
        that one from the target's rows saves most of what a short training run would spend learning it.

        Returns:
            The names of the parameters that were initialized (`["lm_head", "norm", ...]`).
        """
        self.check_target(target)
        output = target.get_output_embeddings()
        if output is None or output.weight.shape != (self.config.vocab_size, self.config.hidden_size):
            raise ValueError(
                f"init_output_from_target needs a target output embedding of shape "
                f"({self.config.vocab_size}, {self.config.hidden_size}); {type(target).__name__} has "
                f"{None if output is None else tuple(output.weight.shape)}."
            )
        rows = self.draft_to_target_ids(torch.arange(self.config.draft_vocab_size, device=self.d2t.device))
        weight = output.weight[rows.to(output.weight.device)]
        self.lm_head.weight.copy_(weight.to(self.lm_head.weight))
        done = ["lm_head"]
        target_norm = getattr(target.get_decoder(), "norm", None)
        if self._norm_matches(target_norm):
            done.append("norm")
        if fc_from_top_feature:
            hidden = self.config.target_hidden_size
            self.fc.weight.zero_()
            self.fc.weight[:, -hidden:].copy_(torch.eye(hidden, self.config.hidden_size).T)
            done.append("fc")
        return done

    @torch.no_grad()
    def _norm_matches(self, target_norm: nn.Module | None) -> bool:
        """Copy `target_norm.weight` into `self.norm` if both then compute the same function; restore otherwise."""
        weight = getattr(target_norm, "weight", None)
        if weight is None or weight.shape != self.norm.weight.shape:
            return False
        saved = self.norm.weight.detach().clone()
        self.norm.weight.copy_(weight.to(self.norm.weight))
        probe = torch.randn(4, self.config.hidden_size, generator=torch.Generator().manual_seed(0))
        probe = probe.to(device=self.norm.weight.device, dtype=torch.float32)
        expected = target_norm(probe.to(device=weight.device, dtype=weight.dtype)).float().to(probe.device)
        if torch.allclose(self.norm(probe.to(self.norm.weight.dtype)).float(), expected, rtol=1e-2, atol=1e-3):
            return True
        self.norm.weight.copy_(saved)
        return False

    @staticmethod
    def config_from_target(target: PreTrainedModel, **overrides) -> Eagle3Config:
        """The `Eagle3Config` that `from_target` builds (see there)."""
        text = target.config.get_text_config()
        fields = dict(
            vocab_size=text.vocab_size,
            hidden_size=text.hidden_size,
            intermediate_size=_intermediate_size(text),
            num_attention_heads=text.num_attention_heads,
            num_key_value_heads=getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
            hidden_act=getattr(text, "hidden_act", None) or getattr(text, "hidden_activation", None) or "silu",
            rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6),
            max_position_embeddings=text.max_position_embeddings,
            target_hidden_size=text.hidden_size,
            target_num_hidden_layers=text.num_hidden_layers,
            target_model_name_or_path=target.name_or_path or None,
            pad_token_id=text.pad_token_id,
            bos_token_id=text.bos_token_id,
            eos_token_id=text.eos_token_id,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
        fields.update(overrides)
        return Eagle3Config(**fields)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs) -> "Eagle3DraftModel":
        r"""Load a head from a folder or Hub id in **any** EAGLE-3 checkpoint dialect.

        `model_type: "eagle3"` folders take the stock Transformers path; official SafeAILab, SGLang/SpecForge,
        NVIDIA ModelOpt and vLLM speculators checkpoints are detected and converted (see
        `eagle3_hf.checkpoints.reading` and docs/checkpoint-dialects.md). Every tensor is checked before anything is
        loaded; problems raise `eagle3_hf.checkpoints.files.CheckpointFormatError` naming the file and field.

        Besides the stock arguments (`dtype`, `device_map`, `attn_implementation`, `revision`, `cache_dir`,
        `token`, `local_files_only`, `subfolder`, ...) it accepts:
            target (`PreTrainedModel`, *optional*): the target; attached after loading, and it supplies the layer
                count for the default taps, the verifier id and `max_position_embeddings` of converted heads.
            target_num_hidden_layers (`int`, *optional*), target_layer_ids (`list[int]`, *optional*),
            target_model_name_or_path (`str`, *optional*): for checkpoints (official ones) that do not record them.
        """
        from .checkpoints.reading import from_pretrained_any_dialect

        stock = super().from_pretrained
        return from_pretrained_any_dialect(cls, stock, pretrained_model_name_or_path, *model_args, **kwargs)

    def save_pretrained(
        self,
        save_directory,
        is_main_process: bool = True,
        push_to_hub: bool = False,
        model_card_kwargs: dict | None = None,
        **kwargs,
    ):
        """Save in the native format (safetensors + config) and write/update the model card `README.md`.

        `model_card_kwargs` go to `eagle3_hf.checkpoints.model_card.create_or_update_model_card` (e.g. `repo_id`, the
        id or path the card's snippets load the head from; default: `save_directory`). Use
        `draft.push_to_hub(repo_id)` to upload (it writes our card and can export a serving dialect); `push_to_hub=True`
        here would upload before the card is written, so it is refused.
        """
        if push_to_hub:
            raise ValueError("save_pretrained(push_to_hub=True) is not supported: use draft.push_to_hub(repo_id).")
        super().save_pretrained(save_directory, is_main_process=is_main_process, **kwargs)
        from .checkpoints.model_card import write_model_card

        write_model_card(save_directory, self, is_main_process=is_main_process, **(model_card_kwargs or {}))

    def push_to_hub(self, repo_id: str, **kwargs):
        """Upload the head with its model card (`eagle3_hf.checkpoints.hub.push_to_hub`; `format="sglang"` by
        default)."""
        from .checkpoints.hub import push_to_hub

        return push_to_hub(self, repo_id, **kwargs)


__all__ = ["Eagle3DraftModel", "Eagle3DraftOutput", "Eagle3PreTrainedModel", "Eagle3DecoderLayer"]
