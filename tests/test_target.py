import pytest
import torch

from eagle3_hf.target import gather_target_features, target_forward_with_features


def test_only_requested_layers_are_captured_and_match_full_output(tiny_target):
    ids = torch.tensor([[1, 2, 3, 4]])
    outputs, features = target_forward_with_features(tiny_target, [2, 4, 5], input_ids=ids)
    full = tiny_target(ids, output_hidden_states=True).hidden_states
    assert features.shape == (1, 4, 96)
    torch.testing.assert_close(features, torch.cat([full[2], full[4], full[5]], -1))
    assert outputs.hidden_states[3] is None


def test_missing_or_out_of_range_layers_raise():
    states = (torch.zeros(1, 1, 2), None, torch.zeros(1, 1, 2))
    with pytest.raises(ValueError, match="not captured"):
        gather_target_features(states, [1])
    with pytest.raises(ValueError, match="out of range"):
        gather_target_features(states, [2])
