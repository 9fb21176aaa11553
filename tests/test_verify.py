"""One-forward tree verification: every node's logits and features equal an ordinary forward over its branch."""

import pytest
import torch
from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config
from transformers.cache_utils import DynamicCache, DynamicSlidingWindowLayer
from transformers.generation import LogitsProcessor, LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from eagle3_hf.generation.tree import DraftTree, ancestor_matrix, node_sequences
from eagle3_hf.generation.verify import (
    attention_layer_kinds,
    check_tree_attention,
    check_tree_cache,
    process_tree_logits,
    tree_attention_masks,
    verify_tree,
)

from .conftest import make_tiny_target


LAYER_IDS = [2, 4, 5]
ARCHITECTURES = {
    "llama": (LlamaConfig, {}),
    "qwen3": (Qwen3Config, {}),
    "qwen2-sliding": (Qwen2Config, dict(use_sliding_window=True, sliding_window=8, max_window_layers=4)),
    "mistral-sliding": (MistralConfig, dict(sliding_window=8)),
    "gemma3-sliding": (Gemma3TextConfig, dict(sliding_window=8, head_dim=8)),
}
# 0 -> {1, 2}, 1 -> {3, 4}, 3 -> {5}, 2 -> {6}
PARENTS = [-1, 0, 0, 1, 1, 3, 2]


def make_tree(tokens: list[int]) -> DraftTree:
    parents = torch.tensor(PARENTS)
    ancestors, depths = ancestor_matrix(parents)
    return DraftTree(torch.tensor(tokens), parents, depths, ancestors, torch.zeros(len(tokens)))


def reference(model, sequence: torch.LongTensor):
    """Logits and features at the last position of an uncached forward."""
    out = model(sequence[None], output_hidden_states=LAYER_IDS)
    return out.logits[0, -1], torch.cat([out.hidden_states[i][0, -1] for i in LAYER_IDS])


def assert_tree_forward_matches_each_branch(model, cache: DynamicCache, prefix_length: int, check_window: bool):
    generator = torch.Generator().manual_seed(prefix_length)
    prefix = torch.randint(0, 128, (1, prefix_length), generator=generator)
    tree = make_tree(torch.randint(0, 128, (len(PARENTS),), generator=generator).tolist())
    tree.tokens[0] = prefix[0, -1]  # the root is the last token; the cache holds everything before it
    with torch.no_grad():
        model(prefix[:, :-1], cache=cache)
        cache.activate_past_recording()
        if check_window:
            sliding = [layer for layer in cache.layers if isinstance(layer, DynamicSlidingWindowLayer)]
            assert sliding and all(layer.get_seq_length() >= layer.sliding_window for layer in sliding)
        logits, features = verify_tree(model, tree, cache, prefix_length - 1, LAYER_IDS)
        assert cache.get_seq_length() == prefix_length - 1 + len(PARENTS)
        for depth in range(4):
            nodes, sequences = node_sequences(prefix, tree, depth)
            for node, sequence in zip(nodes.tolist(), sequences):
                expected_logits, expected_features = reference(model, sequence)
                torch.testing.assert_close(logits[node], expected_logits, atol=2e-5, rtol=1e-4)
                torch.testing.assert_close(features[node], expected_features, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", list(ARCHITECTURES))
@pytest.mark.parametrize("prefix_length", [6, 20])  # 6: the tree crosses the window; 20: the prefix exceeds it
def test_tree_forward_matches_each_branch(name, attn, prefix_length):
    config_class, overrides = ARCHITECTURES[name]
    model = make_tiny_target(config_class, attn_implementation=attn, **overrides)
    check_window = "sliding" in name and prefix_length > 8
    assert_tree_forward_matches_each_branch(model, DynamicCache(config=model.config), prefix_length, check_window)


@pytest.mark.parametrize("name", ["qwen2-sliding", "mistral-sliding", "gemma3-sliding"])
def test_cache_without_config_still_gets_the_window_from_the_model(name):
    """`DynamicCache()` keeps every entry in full layers; the masks must still apply each sliding layer's window."""
    config_class, overrides = ARCHITECTURES[name]
    model = make_tiny_target(config_class, **overrides)
    assert_tree_forward_matches_each_branch(model, DynamicCache(), 20, check_window=False)


def test_masks_are_a_dict_only_for_mixed_layer_kinds():
    tree = make_tree([1] * len(PARENTS))
    for name, expect_dict in [("llama", False), ("mistral-sliding", False), ("gemma3-sliding", True)]:
        config_class, overrides = ARCHITECTURES[name]
        model = make_tiny_target(config_class, **overrides)
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(torch.ones(1, 20, dtype=torch.long), cache=cache)
        masks = tree_attention_masks(cache, tree, model.dtype, attention_layer_kinds(model))
        assert isinstance(masks, dict) == expect_dict
        if expect_dict:
            assert masks["full_attention"].shape == (1, 1, 7, 27)
            assert masks["sliding_attention"].shape == (1, 1, 7, 8 - 1 + 7)
        elif name == "mistral-sliding":
            assert masks.shape == (1, 1, 7, 8 - 1 + 7)
        else:
            assert masks.shape == (1, 1, 7, 27) and masks.dtype == model.dtype


def test_flash_attention_is_refused_with_a_clear_error():
    model = make_tiny_target()
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="flash_attention_2.*flash-attention keeps only.*attn_implementation='sdpa'"):
        check_tree_attention(model)


def test_flex_attention_is_refused_for_its_own_reason():
    model = make_tiny_target()
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="'flex_attention'.*block mask.*attn_implementation='sdpa'") as error:
        check_tree_attention(model)
    assert "flash" not in str(error.value)


def test_non_dynamic_cache_layers_are_refused():
    from transformers.cache_utils import StaticCache

    model = make_tiny_target()
    with pytest.raises(TypeError, match="StaticLayer"):
        check_tree_cache(StaticCache(config=model.config, max_cache_len=32), attention_layer_kinds(model))


def test_sliding_cache_layers_must_match_the_model_layers():
    llama, mistral = make_tiny_target(), make_tiny_target(MistralConfig, sliding_window=8)
    check_tree_cache(DynamicCache(config=mistral.config), attention_layer_kinds(mistral))
    with pytest.raises(TypeError, match="layer 0 is 'full_attention'"):
        check_tree_cache(DynamicCache(config=mistral.config), attention_layer_kinds(llama))
    other_window = make_tiny_target(MistralConfig, sliding_window=4)
    with pytest.raises(TypeError, match="window of 4 tokens.*'sliding_attention' with a window of 8"):
        check_tree_cache(DynamicCache(config=other_window.config), attention_layer_kinds(mistral))


class _LastTokenBan(LogitsProcessor):
    """Not on the row-wise list, so it is applied node by node: bans repeating the last token."""

    def __call__(self, input_ids, scores):
        return scores.scatter(1, input_ids[:, -1:], float("-inf"))


@pytest.mark.parametrize("processor", [RepetitionPenaltyLogitsProcessor(2.0), _LastTokenBan()])
def test_processors_see_each_nodes_own_sequence(processor):
    tree = make_tree([3, 10, 11, 12, 13, 14, 15])
    prefix = torch.tensor([[7, 8, 3]])
    logits = torch.randn(len(PARENTS), 20, generator=torch.Generator().manual_seed(0)).abs()
    processors = LogitsProcessorList([processor])
    scores = process_tree_logits(processors, prefix, tree, logits)
    for depth in range(4):
        nodes, sequences = node_sequences(prefix, tree, depth)
        for node, sequence in zip(nodes.tolist(), sequences):
            assert torch.equal(scores[node], processors(sequence[None], logits[node][None])[0])
    # node 5 continues 7 8 3 10 12 14: its own path tokens are penalised, a sibling branch's token (11) is not
    assert scores[5, 14] < logits[5, 14] and scores[5, 11] == logits[5, 11]
