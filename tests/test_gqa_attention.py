"""The grouped SDPA backend: same outputs as `sdpa` under causal, padding and tree masks; lossless tree decoding."""

import torch
from transformers.cache_utils import DynamicCache

from eagle3_hf import Eagle3DraftModel
from eagle3_hf.generation.gqa_attention import GROUPED_SDPA, use_grouped_sdpa
from eagle3_hf.generation.tree import additive_mask

from .conftest import make_tiny_target


def _tree_forward_logits(target, prefix, nodes, visible):
    """Logits of a forward over `nodes` after `prefix`, each node seeing the prefix and the nodes `visible` marks."""
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        target(input_ids=prefix, cache=cache, use_cache=True)
        past = torch.ones(nodes.shape[1], prefix.shape[1], dtype=torch.bool)
        mask = additive_mask(torch.cat([past, visible], dim=1), target.dtype)
        positions = prefix.shape[1] + visible.sum(-1)[None] - 1
        return target(input_ids=nodes, attention_mask=mask, position_ids=positions, cache=cache).logits


def test_outputs_equal_sdpa_under_causal_padding_and_tree_masks():
    target = make_tiny_target()  # 4 query heads, 2 key-value heads
    prefix = torch.randint(0, 128, (2, 7))
    padding = torch.ones(2, 7, dtype=torch.long)
    padding[1, :3] = 0
    nodes = torch.randint(0, 128, (1, 5))
    visible = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]])
    with torch.no_grad():
        stock = [target(prefix).logits, target(prefix, attention_mask=padding).logits]
    stock_tree = _tree_forward_logits(target, prefix[:1], nodes, visible.bool())
    assert use_grouped_sdpa(target) and target.config._attn_implementation == GROUPED_SDPA
    assert not use_grouped_sdpa(target)  # already switched
    with torch.no_grad():
        grouped = [target(prefix).logits, target(prefix, attention_mask=padding).logits]
    torch.testing.assert_close(grouped[0], stock[0])
    torch.testing.assert_close(grouped[1][1, 3:], stock[1][1, 3:])  # padded rows' outputs are meaningless
    torch.testing.assert_close(_tree_forward_logits(target, prefix[:1], nodes, visible.bool()), stock_tree)
    assert use_grouped_sdpa(target, enable=False) and target.config._attn_implementation == "sdpa"


def test_other_backends_are_left_alone():
    eager = make_tiny_target(attn_implementation="eager")
    assert not use_grouped_sdpa(eager) and eager.config._attn_implementation == "eager"


def test_tree_decoding_with_grouped_sdpa_equals_plain_generate():
    target = make_tiny_target()
    torch.manual_seed(1)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64)
    prompt = torch.randint(0, 128, (1, 9))
    plain = target.generate(prompt, do_sample=False, max_new_tokens=24)
    assert use_grouped_sdpa(target) and use_grouped_sdpa(draft)
    tree_kwargs = dict(tree_total_tokens=8, tree_depth=3, tree_top_k=3)
    tree = target.generate(prompt, assistant_model=draft, do_sample=False, max_new_tokens=24, **tree_kwargs)
    assert torch.equal(target.generate(prompt, do_sample=False, max_new_tokens=24), plain)
    assert torch.equal(tree, plain)
