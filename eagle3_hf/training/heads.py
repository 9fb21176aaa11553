"""The head to train: a fresh one sized for the target, or a trained one to continue, with its draft vocabulary.

`eagle3-hf train` and notebook 02 both build their head here, so a head trained from Python starts exactly like one
trained from the command line.
"""

import logging

from transformers import PreTrainedModel

from ..modeling_eagle3 import Eagle3DraftModel
from .vocab import DraftVocab, check_draft_vocab


logger = logging.getLogger(__name__)


def build_draft_head(
    target: PreTrainedModel,
    draft_vocab: DraftVocab | None = None,
    *,
    draft_vocab_size: int = 32000,
    pretrained: str | None = None,
    target_layer_ids: list[int] | None = None,
    init_from_target: bool = True,
    init_fc_from_top_feature: bool = False,
    freeze_lm_head: bool = False,
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
        init_from_target (`bool`, *optional*, defaults to `True`): start a fresh head's `lm_head` (its vocabulary's
            rows) and `norm` from the target's (`Eagle3DraftModel.init_output_from_target`).
        init_fc_from_top_feature (`bool`, *optional*, defaults to `False`): with `init_from_target`, also start
            `fc` as the projection onto the highest tapped layer.
        freeze_lm_head (`bool`, *optional*, defaults to `False`): do not train `lm_head`.
    """
    text_config = target.config.get_text_config()
    if draft_vocab is not None:
        check_draft_vocab(draft_vocab, text_config.vocab_size)
    if pretrained is not None:
        draft = Eagle3DraftModel.from_pretrained(pretrained, target=target)
        if draft_vocab is not None:
            added = draft.replace_draft_vocab(draft_vocab.token_ids, target)
            logger.info(
                f"Draft vocabulary switched to {draft.config.draft_vocab_size} tokens ({added} new, rows from the "
                "target)."
            )
    else:
        size = draft_vocab.d2t.shape[0] if draft_vocab is not None else min(draft_vocab_size, text_config.vocab_size)
        overrides = {"target_layer_ids": list(target_layer_ids)} if target_layer_ids is not None else {}
        draft = Eagle3DraftModel.from_target(target, draft_vocab_size=size, **overrides)
        if draft_vocab is not None:
            draft.set_vocab_maps(draft_vocab.d2t, draft_vocab.t2d)
        if init_from_target:
            done = draft.init_output_from_target(target, fc_from_top_feature=init_fc_from_top_feature)
            logger.info(f"Initialized {', '.join(done)} from the target.")
    if freeze_lm_head:
        draft.lm_head.requires_grad_(False)
    return draft.float()


__all__ = ["build_draft_head"]
