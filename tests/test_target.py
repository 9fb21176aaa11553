import pytest
import torch

from eagle3_hf.target import capture_last_layer_output, gather_target_features, target_forward_with_features


def test_only_requested_layers_are_captured_and_match_full_output(tiny_target):
    ids = torch.tensor([[1, 2, 3, 4]])
    outputs, features = target_forward_with_features(tiny_target, [2, 4, 5], input_ids=ids)
    full = tiny_target(ids, output_hidden_states=True).hidden_states
    assert features.shape == (1, 4, 96)
    torch.testing.assert_close(features, torch.cat([full[2], full[4], full[5]], -1))
    assert outputs.hidden_states[3] is None


def test_layer_id_L_is_the_last_layers_output_before_the_final_norm(tiny_target):
    # speculators' --include-last-layer taps id L; Transformers' hidden_states[L] is the post-norm state instead.
    ids = torch.tensor([[1, 2, 3, 4]])
    _, features = target_forward_with_features(tiny_target, [2, 8], input_ids=ids)
    decoder = tiny_target.model
    full = tiny_target(ids, output_hidden_states=True).hidden_states
    expected = full[7]
    positions = torch.arange(4)[None]
    expected = decoder.layers[7](expected, position_embeddings=decoder.rotary_emb(expected, positions))
    torch.testing.assert_close(features[..., 32:], expected)
    torch.testing.assert_close(decoder.norm(features[..., 32:]), full[8])
    assert not torch.allclose(features[..., 32:], full[8])


def test_missing_or_out_of_range_layers_raise(tiny_target):
    states = (torch.zeros(1, 1, 2), None, torch.zeros(1, 1, 2))
    with pytest.raises(ValueError, match="not captured"):
        gather_target_features(states, [1])
    with pytest.raises(ValueError, match="out of range"):
        gather_target_features(states, [3])
    with pytest.raises(ValueError, match="capture_last_layer_output"):
        gather_target_features(states, [2])
    with capture_last_layer_output(tiny_target) as captured:
        tiny_target(torch.tensor([[1, 2]]))
    assert captured["hidden"].shape == (1, 2, 32)
    assert not tiny_target.model.norm._forward_pre_hooks  # the hook is removed on exit
