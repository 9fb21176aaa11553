"""The head to train: a fresh one sized for the target, or a trained one to continue, with its draft vocabulary.

`eagle3-hf train` and notebook 02 both build their head here, so a head trained from Python starts exactly like one
trained from the command line.

A head may have several decoder layers (`num_hidden_layers`). Layer 0 is the EAGLE-3 layer that reads
`concat(embedding, hidden)`; layers 1.. are plain Llama decoder layers on the `hidden_size` residual stream, which
`init_draft_layers` can start as the identity (`"identity"`) or as copies of the target's top layers (`"top"`).
`grow_draft_head` adds such layers to a trained head and `widen_draft_mlp` widens its MLPs, both without changing
what it computes.
"""

import logging

import torch
from transformers import PreTrainedModel

from ..configuration_eagle3 import Eagle3Config
from ..modeling_eagle3 import Eagle3DraftModel
from .vocab import DraftVocab, check_draft_vocab


logger = logging.getLogger(__name__)

LAYER_INITS = ("none", "identity", "top")


def build_draft_head(
    target: PreTrainedModel,
    draft_vocab: DraftVocab | None = None,
    *,
    draft_vocab_size: int = 32000,
    pretrained: str | None = None,
    target_layer_ids: list[int] | None = None,
    num_hidden_layers: int | None = None,
    intermediate_size: int | None = None,
    init_layers_from_target: str = "none",
    init_from_target: bool = True,
    init_fc_from_top_feature: bool = False,
    freeze_lm_head: bool = False,
    fc_norm: bool = False,
) -> Eagle3DraftModel:
    """A head ready for `Eagle3Trainer`, in float32 (master weights; mixed precision comes from the trainer).

    Args:
        target ([`PreTrainedModel`]): the frozen target; its embedding is attached to the head.
        draft_vocab ([`DraftVocab`], *optional*): the draft vocabulary (`build_draft_vocab`,
            `load_or_build_draft_vocab` or `load_draft_vocab`). A fresh head takes its size and maps; a `pretrained`
            head is switched to it (`Eagle3DraftModel.replace_draft_vocab`: kept tokens keep their trained rows,
            new ones start from the target's). Without it a fresh head maps draft id `i` to target id `i`.
        draft_vocab_size (`int`, *optional*, defaults to 32000): size of a fresh head's vocabulary without
            `draft_vocab`; capped at the target's vocabulary.
        pretrained (`str`, *optional*): a trained head to continue (folder or Hub id, any dialect).
        target_layer_ids (`list[int]`, *optional*): a fresh head's layer taps (default `[2, L // 2, L - 3]`).
        num_hidden_layers (`int`, *optional*): decoder layers of the head. A fresh head defaults to 1; a
            `pretrained` head keeps its own count, or grows to this many (`grow_draft_head`; never shrinks).
        intermediate_size (`int`, *optional*): MLP width of a fresh head's layers (default: the target's). A
            `pretrained` head keeps its own, or widens to this (`widen_draft_mlp`; never narrows).
        init_layers_from_target (`str`, *optional*, defaults to `"none"`): how the layers after the first start
            (a fresh head's layers 1.., a grown head's new layers): `"none"` (random), `"identity"` or `"top"`
            (see `init_draft_layers`).
        init_from_target (`bool`, *optional*, defaults to `True`): start a fresh head's `lm_head` (its vocabulary's
            rows) and `norm` from the target's (`Eagle3DraftModel.init_output_from_target`).
        init_fc_from_top_feature (`bool`, *optional*, defaults to `False`): with `init_from_target`, also start
            `fc` as the projection onto the highest tapped layer.
        freeze_lm_head (`bool`, *optional*, defaults to `False`): do not train `lm_head`.
        fc_norm (`bool`, *optional*, defaults to `False`): a fresh head gets EAGLE-3.1's input norms, one RMSNorm
            per tapped layer before `fc` (`Eagle3Config.fc_norm`). A `pretrained` head keeps its own inputs: asking
            a head without them for them is an error (they would change what its `fc` was trained on).
    """
    if init_layers_from_target not in LAYER_INITS:
        raise ValueError(f"init_layers_from_target={init_layers_from_target!r}; expected one of {LAYER_INITS}.")
    text_config = target.config.get_text_config()
    if draft_vocab is not None:
        check_draft_vocab(draft_vocab, text_config.vocab_size)
    if pretrained is not None:
        draft = _continued_head(
            target, draft_vocab, pretrained, num_hidden_layers, intermediate_size, fc_norm, init_layers_from_target
        )
    else:
        size = draft_vocab.d2t.shape[0] if draft_vocab is not None else min(draft_vocab_size, text_config.vocab_size)
        overrides = {"target_layer_ids": list(target_layer_ids)} if target_layer_ids is not None else {}
        if num_hidden_layers is not None:
            overrides["num_hidden_layers"] = num_hidden_layers
        if intermediate_size is not None:
            overrides["intermediate_size"] = intermediate_size
        if fc_norm:
            overrides["fc_norm"] = True
        draft = Eagle3DraftModel.from_target(target, draft_vocab_size=size, **overrides)
        if draft_vocab is not None:
            draft.set_vocab_maps(draft_vocab.d2t, draft_vocab.t2d)
        if init_from_target:
            done = draft.init_output_from_target(target, fc_from_top_feature=init_fc_from_top_feature)
            logger.info(f"Initialized {', '.join(done)} from the target.")
        extra = range(1, draft.config.num_hidden_layers)
        copied = init_draft_layers(draft, extra, init_layers_from_target, target)
        if extra and init_layers_from_target != "none":
            source = f" (target layers {copied})" if copied else ""
            logger.info(f"Layers {list(extra)} start as {init_layers_from_target!r}{source}.")
    if freeze_lm_head:
        draft.lm_head.requires_grad_(False)
    return draft.float()


def _continued_head(
    target, draft_vocab, pretrained, num_hidden_layers, intermediate_size, fc_norm, init
) -> Eagle3DraftModel:
    """The trained head `pretrained`, switched to `draft_vocab`, widened to `intermediate_size` and grown to
    `num_hidden_layers` where given.

    Options a continued head cannot take are refused as soon as its config is known, before any vocabulary switch
    or growth.
    """
    draft = Eagle3DraftModel.from_pretrained(pretrained, target=target)
    if fc_norm and not draft.config.fc_norm:
        raise ValueError(
            f"fc_norm=True but the head to continue ({pretrained}) has no fc_norm; input norms are chosen when a "
            "head is created (its fc was trained on the unnormalised features). Leave the option unset."
        )
    width = draft.config.intermediate_size
    if intermediate_size is not None and intermediate_size < width:
        raise ValueError(
            f"intermediate_size={intermediate_size} but the head to continue ({pretrained}) has intermediate_size="
            f"{width}; a continued head keeps its MLP width or widens it, never narrows it."
        )
    if draft_vocab is not None:
        added = draft.replace_draft_vocab(draft_vocab.token_ids, target)
        logger.info(
            f"Draft vocabulary switched to {draft.config.draft_vocab_size} tokens ({added} new, rows from the target)."
        )
    if intermediate_size is not None and intermediate_size != width:  # before growing: new layers get the width
        draft = widen_draft_mlp(draft, intermediate_size)
        logger.info(f"Widened the head's MLPs from {width} to {intermediate_size} (new channels add 0 at first).")
    layers = draft.config.num_hidden_layers
    if num_hidden_layers is not None and num_hidden_layers != layers:
        draft = grow_draft_head(draft, num_hidden_layers, init, target)
        logger.info(f"Grew the head from {layers} to {num_hidden_layers} layers (new layers: {init!r}).")
    elif init != "none":
        logger.warning(
            f"init_layers_from_target={init!r} does nothing here: the head to continue keeps its {layers} layers "
            "(pass num_hidden_layers to add some)."
        )
    return draft


@torch.no_grad()
def grow_draft_head(
    draft: Eagle3DraftModel, num_hidden_layers: int, init: str = "identity", target: PreTrainedModel | None = None
) -> Eagle3DraftModel:
    """A copy of `draft` with more decoder layers: every tensor it had is kept (`fc`, its layers, `norm`,
    `lm_head`, `d2t`/`t2d`, input norms, an own embedding), and the new layers are appended after its last one.

    With `init="identity"` the grown head computes exactly what `draft` computes, so training continues from
    where `draft` stood. New layers are full-attention layers.

    Args:
        draft ([`Eagle3DraftModel`]): the head to grow (left unchanged); its attached embedding is shared.
        num_hidden_layers (`int`): the grown head's layer count, at least `draft`'s.
        init (`str`, *optional*, defaults to `"identity"`): how the new layers start (`init_draft_layers`).
        target ([`PreTrainedModel`], *optional*): needed for `init="top"`.

    Returns:
        The grown head, on `draft`'s device and dtype (`draft` itself when it has `num_hidden_layers` already).
    """
    old = draft.config.num_hidden_layers
    if num_hidden_layers < old:
        raise ValueError(
            f"num_hidden_layers={num_hidden_layers}: the head has {old} layers and a head is never shrunk (its "
            "later layers' output is what its norm and lm_head were trained on)."
        )
    if num_hidden_layers == old:
        return draft
    fields = {"num_hidden_layers": num_hidden_layers}
    if draft.config.draft_layer_types is not None:
        added = ["full_attention"] * (num_hidden_layers - old)
        fields["draft_layer_types"] = [*draft.config.draft_layer_types, *added]
    new_prefixes = tuple(f"layers.{i}." for i in range(old, num_hidden_layers))
    grown = _rebuilt(draft, fields, draft.state_dict(), lambda key: key.startswith(new_prefixes), "grow_draft_head")
    init_draft_layers(grown, range(old, num_hidden_layers), init, target)
    return grown


@torch.no_grad()
def widen_draft_mlp(draft: Eagle3DraftModel, intermediate_size: int) -> Eagle3DraftModel:
    """A copy of `draft` whose layers' MLPs are `intermediate_size` wide, computing exactly what `draft` computes.

    Every layer's `gate_proj` and `up_proj` keep their rows and gain `intermediate_size - old` random ones; its
    `down_proj` keeps its columns and gains zero ones, so the new MLP channels add 0 to the residual stream (the
    MLP analogue of `init_draft_layers`' `"identity"`). Their gate and up rows are not zero, so the new
    `down_proj` columns get gradients from the first step. Everything else is kept as in `grow_draft_head`.

    Args:
        draft ([`Eagle3DraftModel`]): the head to widen (left unchanged); its attached embedding is shared.
        intermediate_size (`int`): the new MLP width, at least `draft.config.intermediate_size`.

    Returns:
        The widened head, on `draft`'s device and dtype (`draft` itself when it is that wide already).
    """
    old = draft.config.intermediate_size
    if intermediate_size < old:
        raise ValueError(
            f"intermediate_size={intermediate_size}: the head's MLPs are {old} wide and a head is never narrowed "
            "(dropping trained channels would change what it computes)."
        )
    if intermediate_size == old:
        return draft

    def is_mlp(key: str) -> bool:
        return any(f".mlp.{name}." in key for name in ("gate_proj", "up_proj", "down_proj"))

    kept = {key: tensor for key, tensor in draft.state_dict().items() if not is_mlp(key)}
    widened = _rebuilt(draft, {"intermediate_size": intermediate_size}, kept, is_mlp, "widen_draft_mlp")
    for narrow, wide in zip(draft.layers, widened.layers, strict=True):
        for name in ("gate_proj", "up_proj"):  # output channels: the first `old` rows are the trained ones
            source, projection = getattr(narrow.mlp, name), getattr(wide.mlp, name)
            projection.weight[:old].copy_(source.weight)
            if projection.bias is not None:
                projection.bias[:old].copy_(source.bias)
        wide.mlp.down_proj.weight.zero_()
        wide.mlp.down_proj.weight[:, :old].copy_(narrow.mlp.down_proj.weight)
        if wide.mlp.down_proj.bias is not None:
            wide.mlp.down_proj.bias.copy_(narrow.mlp.down_proj.bias)
    return widened


def _rebuilt(draft: Eagle3DraftModel, changes: dict, state_dict: dict, is_new, caller: str) -> Eagle3DraftModel:
    """A new head with `draft`'s config plus `changes`, loaded with `state_dict`; the keys it lacks must all be new
    (`is_new(key)`). Requires-grad flags (a frozen `lm_head`) and the attached embedding are carried over."""
    config = Eagle3Config.from_dict(
        {**draft.config.to_dict(), **changes}, attn_implementation=draft.config._attn_implementation
    )
    weight = draft.fc.weight
    rebuilt = Eagle3DraftModel(config).to(device=weight.device, dtype=weight.dtype)
    loaded = rebuilt.load_state_dict(state_dict, strict=False)
    if loaded.unexpected_keys or not all(is_new(key) for key in loaded.missing_keys):
        raise RuntimeError(f"{caller}: the state dicts do not line up ({loaded}).")
    kept = dict(draft.named_parameters())
    for name, parameter in rebuilt.named_parameters():
        if name in kept:  # a frozen lm_head stays frozen
            parameter.requires_grad_(kept[name].requires_grad)
    if draft.has_embedding and not config.trained_embedding:
        rebuilt.set_input_embeddings(draft.get_input_embeddings())
    return rebuilt


@torch.no_grad()
def init_draft_layers(
    draft: Eagle3DraftModel, layers: range, init: str, target: PreTrainedModel | None = None
) -> list[int]:
    """Start the plain decoder layers `layers` (indices >= 1) of `draft`.

    - `"none"`: leave them as they are (a fresh head's random init).
    - `"identity"`: zero each layer's output projections (`self_attn.o_proj`, `mlp.down_proj`, biases included),
      so both residual branches add 0: the layers start as the identity on the residual stream and an n-layer head
      computes exactly what its first layer alone does. Their other weights keep their random init, so the
      gradients of the zeroed projections are not zero and the layers start learning at once.
    - `"top"`: copy the target's top decoder layers (attention, MLP, norms): draft layer `i` of an `n`-layer head
      gets target layer `L - n + i`, so the head's last layer is the target's last and the order is kept.
      Every layer is checked first (same tensor names and shapes, else `ValueError` naming the mismatch) and
      nothing is copied on a refusal. The target's RoPE base is not copied (the head keeps its own, 10000).

    Returns:
        The target layer indices copied (`"top"`), else `[]`.
    """
    if init not in LAYER_INITS:
        raise ValueError(f"init={init!r}; expected one of {LAYER_INITS}.")
    if layers and min(layers) < 1:
        raise ValueError(f"layers={list(layers)}: layer 0 reads concat(embedding, hidden) and has no such init.")
    if init == "identity":
        for index in layers:
            layer = draft.layers[index]
            for projection in (layer.self_attn.o_proj, layer.mlp.down_proj):
                projection.weight.zero_()
                if projection.bias is not None:
                    projection.bias.zero_()
    if init != "top" or not layers:
        return []
    pairs = _top_layer_pairs(draft, layers, target)
    for index, (_, source) in pairs.items():
        draft.layers[index].load_state_dict(source.state_dict())
    return [source_index for source_index, _ in pairs.values()]


def _top_layer_pairs(draft: Eagle3DraftModel, layers: range, target: PreTrainedModel | None) -> dict:
    """`{draft index: (target index, target layer)}` for `"top"`, after checking that every pair matches."""
    decoder = None if target is None else target.get_decoder()
    source_layers = getattr(decoder, "layers", None)
    if source_layers is None:
        where = "no target was given" if target is None else f"{type(decoder).__name__} has no `layers`"
        raise ValueError(f"init_layers_from_target='top' copies the target's top decoder layers, but {where}.")
    num_layers, num_source = draft.config.num_hidden_layers, len(source_layers)
    if num_source < num_layers - 1:
        raise ValueError(
            f"init_layers_from_target='top': a {num_layers}-layer head copies {num_layers - 1} target layers, but "
            f"the target has {num_source}."
        )
    pairs = {
        index: (num_source - num_layers + index, source_layers[num_source - num_layers + index]) for index in layers
    }
    for index, (source_index, source) in pairs.items():
        ours, theirs = draft.layers[index].state_dict(), source.state_dict()
        where = f"draft layer {index} and target layer {source_index} ({type(source).__name__})"
        if ours.keys() != theirs.keys():
            raise ValueError(
                f"init_layers_from_target='top': {where} hold different tensors: only the target's has "
                f"{sorted(theirs.keys() - ours.keys())}, only the draft's has {sorted(ours.keys() - theirs.keys())}. "
                "Its layers are not Llama decoder layers; use 'identity' or 'none'."
            )
        wrong = [
            f"{k} {tuple(ours[k].shape)} vs {tuple(theirs[k].shape)}" for k in ours if ours[k].shape != theirs[k].shape
        ]
        if wrong:
            raise ValueError(
                f"init_layers_from_target='top': {where} differ in shape (draft vs target): {'; '.join(wrong)}. "
                "The head's sizes (e.g. --draft_intermediate_size) must be the target's."
            )
    return pairs


__all__ = ["LAYER_INITS", "build_draft_head", "grow_draft_head", "init_draft_layers", "widen_draft_mlp"]
