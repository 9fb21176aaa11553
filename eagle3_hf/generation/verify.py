"""Verify a whole draft tree with one forward of any decoder-only Transformers causal LM.

The tree goes in as `N` new tokens at positions `prefix + depth`, with a float additive 4-D mask that lets each
node see the cached prefix, its ancestors and itself. Models whose layers all share one attention kind (Llama:
full; Mistral with `sliding_window`: sliding) get one mask sized for that kind. Models that mix full and sliding
layers (Gemma3, Qwen2/3 with `use_sliding_window`) take a dict `{"full_attention": ..., "sliding_attention": ...}`,
which their forward uses as is.

Each layer's attention kind and window come from the model config, as Transformers' own mask creation takes them;
the mask's size comes from the cache layer. A `DynamicCache(config=model.config)` keeps only `sliding_window - 1`
past entries in sliding layers, so their mask has `sliding_window - 1 + N` columns once the prefix has filled the
window; a `DynamicCache()` built without a config keeps every entry, and the window is then applied by the mask alone,
as plain `generate` does with such a cache.

The logits processors are then applied to every node with that node's own sequence (`process_tree_logits`).
"""

from contextlib import nullcontext

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer, get_layer_types_and_kwargs
from transformers.generation import LogitsProcessorList, logits_process

from ..target import capture_last_layer_output, gather_target_features
from .cuda_attention import speculative_attention_kernels
from .tree import DraftTree, additive_mask, node_sequences, tree_position_ids, tree_visibility


TREE_MASK_BACKENDS = ("sdpa", "eager", "eagle3_grouped_sdpa")  # the last: `eagle3_hf.generation.gqa_attention`
# Attention kinds a tree mask can express. Chunked attention (Llama 4) sees only the keys of the query's own chunk:
# not a window behind each query, so the sliding mask would be wrong for it.
TREE_LAYER_KINDS = ("full_attention", "sliding_attention")


def attention_layer_kinds(model: PreTrainedModel) -> list[tuple[str, int | None]]:
    """`(attention kind, sliding window or None)` of every decoder layer, read from the config as
    `DynamicCache(config=...)` reads it (`config.layer_types`, else each layer's `sliding_window`)."""
    layer_types, per_layer_kwargs = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))
    return [(kind, kwargs.get("sliding_window")) for kind, kwargs in zip(layer_types, per_layer_kwargs)]


def check_tree_attention(model: PreTrainedModel) -> None:
    """Raise `ValueError` unless `model` uses an attention backend that accepts an arbitrary 4-D float mask and only
    attention kinds a tree mask can express (`TREE_LAYER_KINDS`)."""
    implementation = model.config._attn_implementation
    if implementation not in TREE_MASK_BACKENDS:
        if "flash" in str(implementation):
            why = "flash-attention keeps only a 2-D padding mask"
        elif "flex" in str(implementation):
            why = "flex_attention takes a block mask built from a mask function, not a 4-D tensor"
        else:
            why = f"only {', '.join(TREE_MASK_BACKENDS)} take one"
        raise ValueError(
            f"EAGLE-3 tree decoding verifies the draft tree with a 4-D attention mask, which the "
            f"{implementation!r} attention backend of {type(model).__name__} cannot take ({why}). Load the target "
            f"with attn_implementation='sdpa' or 'eager', or call model.set_attn_implementation('sdpa')."
        )
    unsupported = sorted({kind for kind, _ in attention_layer_kinds(model)} - set(TREE_LAYER_KINDS))
    if unsupported:
        raise ValueError(
            f"EAGLE-3 tree decoding supports full and sliding-window attention layers only; {type(model).__name__} "
            f"has {', '.join(map(repr, unsupported))} layers, which a tree mask cannot express. Use plain generate "
            "or eagle3_mode='chain'."
        )


def check_tree_cache(cache: Cache, layer_kinds: list[tuple[str, int | None]]) -> None:
    """Raise `TypeError` unless every layer of `cache` is a plain dynamic (full or sliding-window) layer that keeps
    what its attention kind in `layer_kinds` (from `attention_layer_kinds`) needs.

    A full `DynamicLayer` may serve a sliding layer (a `DynamicCache()` built without a config): it keeps more than
    the window, and the mask hides the rest. A `DynamicSlidingWindowLayer` must have the layer's own window.
    """
    for index, (layer, (kind, window)) in enumerate(zip(cache.layers, layer_kinds)):
        if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
            raise TypeError(
                f"EAGLE-3 tree decoding needs a DynamicCache of full or sliding-window layers; layer {index} is a "
                f"{type(layer).__name__}. Do not pass cache_implementation= or a static/quantized/offloaded cache."
            )
        if type(layer) is DynamicSlidingWindowLayer and (
            kind != "sliding_attention" or layer.sliding_window != window
        ):
            raise TypeError(
                f"Cache layer {index} keeps a sliding window of {layer.sliding_window} tokens, but the model's layer "
                f"{index} is {kind!r}" + (f" with a window of {window}" if window is not None else "") + ". Pass "
                "DynamicCache(config=model.config), or no cache."
            )


def _layer_mask(
    layer: DynamicLayer,
    tree: DraftTree,
    dtype: torch.dtype,
    padding: torch.BoolTensor | None,
    sliding_window: int | None,
) -> torch.Tensor:
    """The `(1, 1, N, kv)` float mask for one cache layer, sized as the layer's `get_mask_sizes` says, hiding keys
    `sliding_window` or more positions behind a node (`None`: full attention)."""
    num_nodes = tree.num_nodes
    kv_length, kv_offset = layer.get_mask_sizes(num_nodes)
    num_past = kv_length - num_nodes
    past_keep = None if padding is None else padding[kv_offset : kv_offset + num_past]
    visible = tree_visibility(
        tree.ancestors,
        tree.depths,
        num_past=num_past,
        past_offset=kv_offset,
        tree_offset=layer.get_seq_length(),
        sliding_window=sliding_window,
        past_keep=past_keep,
    )
    return additive_mask(visible, dtype)


def tree_attention_masks(
    cache: Cache,
    tree: DraftTree,
    dtype: torch.dtype,
    layer_kinds: list[tuple[str, int | None]],
    padding: torch.BoolTensor | None = None,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Tree masks for the next forward on `cache`: one tensor, or a dict by layer type for mixed models.

    Args:
        cache (`Cache`): the target's cache *before* the tree forward (its layers must exist).
        tree ([`DraftTree`]): the tree (on the model's device).
        dtype (`torch.dtype`): the model's dtype.
        layer_kinds (`list[tuple[str, int | None]]`): each layer's attention kind and window
            (`attention_layer_kinds(model)`); the first cache layer of each kind sizes that kind's mask.
        padding (`torch.BoolTensor` of shape `(cached_length,)`, *optional*): False at padding positions.
    """
    masks = {}
    for layer, (kind, window) in zip(cache.layers, layer_kinds):
        if kind not in masks:
            masks[kind] = _layer_mask(layer, tree, dtype, padding, window)
    return next(iter(masks.values())) if len(masks) == 1 else masks


@torch.no_grad()
def verify_tree(
    model: PreTrainedModel,
    tree: DraftTree,
    cache: Cache,
    position_start: int,
    layer_ids: list[int],
    padding: torch.BoolTensor | None = None,
    layer_kinds: list[tuple[str, int | None]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One target forward over all tree nodes; appends their `N` KV entries to `cache`.

    Args:
        model (`PreTrainedModel`): the target causal LM (sdpa or eager attention).
        tree ([`DraftTree`]): the tree, root first, on the model's device.
        cache (`Cache`): the target's cache holding every token before the root.
        position_start (`int`): RoPE position of the root.
        layer_ids (`list[int]`): EAGLE layer ids (= `hidden_states` indices) of the features to capture.
        padding (`torch.BoolTensor` of shape `(cache length,)`, *optional*): False at padding positions.
        layer_kinds (`list[tuple[str, int | None]]`, *optional*): `attention_layer_kinds(model)`, read from the
            config when not given.

    Returns:
        `(logits, features)`: float32 logits `(N, vocab_size)` at every node, and target features
        `(N, len(layer_ids) * hidden_size)`.
    """
    layer_kinds = attention_layer_kinds(model) if layer_kinds is None else layer_kinds
    mask = tree_attention_masks(cache, tree, model.dtype, layer_kinds, padding)
    with capturing_taps(model, layer_ids) as captured, speculative_attention_kernels(tree.tokens.device):
        outputs = model(
            input_ids=tree.tokens[None],
            attention_mask=mask,
            position_ids=tree_position_ids(tree, position_start),
            cache=cache,
            use_cache=True,
            output_hidden_states=list(layer_ids),
            logits_to_keep=0,  # the input is only the tree: every row is needed
        )
    features = gather_target_features(outputs.hidden_states, layer_ids, captured.get("hidden"))[0]
    return outputs.logits[0].float(), features


def capturing_taps(model: PreTrainedModel, layer_ids: list[int]):
    """A context whose dict holds the last layer's pre-norm output when `layer_ids` tap it (id `L`, which
    `hidden_states` does not hold: its last entry is after the final norm); an empty dict otherwise (no hook)."""
    if model.config.get_text_config().num_hidden_layers in layer_ids:
        return capture_last_layer_output(model)
    return nullcontext({})


# Processors that treat every row independently, so one call can score all nodes of a tree level at once. Any
# other processor is called node by node (correct as long as it is stateless, as assisted decoding assumes; the
# stateful ones Transformers ships are refused by `check_stateless_processors`).
_ROW_WISE_PROCESSORS = frozenset(
    {
        logits_process.MinLengthLogitsProcessor,
        logits_process.MinNewTokensLengthLogitsProcessor,
        logits_process.TemperatureLogitsWarper,
        logits_process.RepetitionPenaltyLogitsProcessor,
        logits_process.TopPLogitsWarper,
        logits_process.TopKLogitsWarper,
        logits_process.MinPLogitsWarper,
        logits_process.TypicalLogitsWarper,
        logits_process.EpsilonLogitsWarper,
        logits_process.EtaLogitsWarper,
        logits_process.NoRepeatNGramLogitsProcessor,
        logits_process.SequenceBiasLogitsProcessor,
        logits_process.NoBadWordsLogitsProcessor,
        logits_process.ForcedBOSTokenLogitsProcessor,
        logits_process.ForcedEOSTokenLogitsProcessor,
        logits_process.InfNanRemoveLogitsProcessor,
        logits_process.ExponentialDecayLengthPenalty,
        logits_process.LogitNormalization,
        logits_process.SuppressTokensAtBeginLogitsProcessor,
        logits_process.SuppressTokensLogitsProcessor,
    }
)


# Processors that keep state from call to call, with the `generate()` argument that creates each. Speculative
# decoding also scores draft tokens that are then rejected (a tree: every node, sibling branches included), so such a
# processor would see other calls than under plain `generate` and change the output even under greedy decoding.
_STATEFUL_PROCESSORS = {
    logits_process.UnbatchedClassifierFreeGuidanceLogitsProcessor: "guidance_scale",  # the unconditional KV cache
    logits_process.SynthIDTextWatermarkLogitsProcessor: "watermarking_config",  # the last n-gram context
}


def check_stateless_processors(processors: LogitsProcessorList, mode: str = "tree") -> None:
    """Raise `ValueError` if `processors` holds a processor known to keep state between calls.

    Args:
        processors (`LogitsProcessorList`): as prepared by `generate()`.
        mode (`str`): `"tree"` or `"chain"`, for the message.
    """
    for processor in processors:
        for processor_class, argument in _STATEFUL_PROCESSORS.items():
            if isinstance(processor, processor_class):
                raise ValueError(
                    f"EAGLE-3 {mode} decoding cannot apply {type(processor).__name__} (generate's `{argument}=`): it "
                    "keeps state between calls, while speculative decoding also scores draft tokens that are then "
                    "rejected, so the output would differ from plain generate. Call generate without assistant_model."
                )


def _is_row_wise(processor) -> bool:
    if type(processor) not in _ROW_WISE_PROCESSORS:
        return False
    # a per-batch-row tensor of prompt lengths ties the processor to the original batch size
    return not isinstance(getattr(processor, "prompt_ignore_length", None), torch.Tensor)


def process_tree_logits(
    processors: LogitsProcessorList, prefix: torch.LongTensor, tree: DraftTree, logits: torch.Tensor
) -> torch.Tensor:
    """Apply the logits processors to every node, each with its own sequence (prefix + path to the node).

    Processors that read the sequence (repetition penalty, n-gram blocking, min length, ...) thus see exactly what
    plain `generate` would show them at that point. Nodes of one depth share a length and are processed in one
    call when every processor is row-wise; otherwise node by node.

    Args:
        processors (`LogitsProcessorList`): as prepared by `generate()`.
        prefix (`torch.LongTensor` of shape `(1, L)`): the sequence so far, ending with the root.
        tree ([`DraftTree`]): the verified tree.
        logits (`torch.FloatTensor` of shape `(N, V)`): the target's raw logits per node.

    Returns:
        `torch.FloatTensor` of shape `(N, V)`: processed scores.
    """
    if len(processors) == 0:
        return logits
    row_wise = all(_is_row_wise(p) for p in processors)
    scores = torch.empty_like(logits)
    for depth in range(int(tree.depths.max()) + 1):
        nodes, sequences = node_sequences(prefix, tree, depth)
        if row_wise:
            scores[nodes] = processors(sequences, logits[nodes])
            continue
        for row, node in enumerate(nodes.tolist()):
            scores[node] = processors(sequences[row : row + 1], logits[node : node + 1])[0]
    return scores
