"""Cache compaction along the sequence axis, for full and sliding-window layers, contiguous or not."""

import pytest
import torch
from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig
from transformers.cache_utils import DynamicCache, QuantizedLayer

from eagle3_hf.generation.kv_cache import keep_tree_entries
from eagle3_hf.generation.tree import DraftTree, ancestor_matrix, path_to
from eagle3_hf.generation.verify import verify_tree

from .conftest import make_tiny_target


# 0 -> {1, 2, 3}, 1 -> {4}, 2 -> {5}, 5 -> {6}
PARENTS = [-1, 0, 0, 0, 1, 2, 5]


def test_keeps_selected_rows_after_the_prefix():
    cache = DynamicCache()
    keys = torch.arange(8.0).view(1, 1, 8, 1)
    cache.update(keys, -keys, 0)
    keep_tree_entries(cache, num_new=5, keep=torch.tensor([0, 2, 4]))  # prefix 0..2, tree 3..7
    assert cache.layers[0].keys.flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 5.0, 7.0]
    assert cache.layers[0].values.flatten().tolist() == [-0.0, -1.0, -2.0, -3.0, -5.0, -7.0]
    assert cache.get_seq_length() == 6


@pytest.mark.parametrize(
    "config_class,overrides",
    [
        (LlamaConfig, {}),
        (MistralConfig, dict(sliding_window=8)),
        (Gemma3TextConfig, dict(sliding_window=8, head_dim=8)),
    ],
)
@pytest.mark.parametrize("accepted_node", [6, 4, 3, 0])  # paths [0,2,5,6], [0,1,4], [0,3], [0]
def test_compacted_cache_equals_a_fresh_forward(config_class, overrides, accepted_node):
    """Verify a tree, keep one path, then decode two tokens: logits equal an uncached forward on the same text."""
    model = make_tiny_target(config_class, **overrides)
    generator = torch.Generator().manual_seed(accepted_node)
    prefix = torch.randint(0, 128, (1, 20), generator=generator)  # longer than the window
    parents = torch.tensor(PARENTS)
    ancestors, depths = ancestor_matrix(parents)
    tokens = torch.randint(0, 128, (len(PARENTS),), generator=generator)
    tokens[0] = prefix[0, -1]
    tree = DraftTree(tokens, parents, depths, ancestors, torch.zeros(len(PARENTS)))
    path = path_to(tree, accepted_node)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(prefix[:, :-1], cache=cache)
        cache.activate_past_recording()
        verify_tree(model, tree, cache, position_start=19, layer_ids=[2, 4, 5])
        keep_tree_entries(cache, tree.num_nodes, path)
        assert cache.get_seq_length() == 19 + len(path)
        text = torch.cat([prefix[0, :-1], tokens[path], torch.tensor([5, 9])])
        next_logits = model(text[None, -2:], cache=cache).logits[0]
        expected = model(text[None]).logits[0, -2:]
    torch.testing.assert_close(next_logits, expected, atol=2e-5, rtol=1e-4)


def test_sliding_layer_without_past_recording_is_refused():
    model = make_tiny_target(MistralConfig, sliding_window=8)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.ones(1, 20, dtype=torch.long), cache=cache)
        model(torch.ones(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(RuntimeError, match="activate_past_recording"):
        keep_tree_entries(cache, 3, torch.tensor([0]))


def test_unknown_layer_types_are_refused():
    cache = DynamicCache()
    cache.update(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2), 0)
    cache.layers[0].__class__ = type("CustomLayer", (QuantizedLayer,), {})
    with pytest.raises(TypeError, match="CustomLayer"):
        keep_tree_entries(cache, 2, torch.tensor([0]))
