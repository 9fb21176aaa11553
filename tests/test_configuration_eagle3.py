import pytest
from transformers import AutoConfig

from eagle3_hf import Eagle3Config
from eagle3_hf.configuration_eagle3 import default_target_layer_ids


SMALL = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)


def test_defaults_follow_the_reference():
    config = Eagle3Config(**SMALL, target_num_hidden_layers=30)
    assert config.target_layer_ids == [2, 15, 27]
    assert config.draft_vocab_size == 100
    assert config.target_hidden_size == 32
    assert config.num_hidden_layers == 1
    assert config.rope_parameters["rope_theta"] == 10000.0
    assert config.num_target_features == 96
    assert default_target_layer_ids(32) == [2, 16, 29]


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(draft_vocab_size=200), "draft_vocab_size=200"),
        (dict(target_layer_ids=[2, 2, 5]), "target_layer_ids"),
        (dict(target_layer_ids=[]), "target_layer_ids"),
        (dict(target_layer_ids=[0, 3, 5]), "target_layer_ids"),
        (dict(target_layer_ids=[2, 4, 9], target_num_hidden_layers=8), "target_num_hidden_layers=8"),
        (dict(norm_before_fc=True, fc_norm=True), "norm_before_fc and fc_norm are exclusive"),
        (dict(normed_feedback=True, norm_before_lm_head=False), "normed_feedback=True"),
        (dict(draft_layer_types=["sliding_attention"] * 2), "draft_layer_types"),
        (dict(draft_layer_types=["chunked_attention"]), "draft_layer_types"),
        (dict(draft_layer_types=["sliding_attention"]), "draft_sliding_window=None"),
        (dict(draft_sliding_window=8), "no draft_layer_types"),
        (dict(num_attention_heads=5), "num_attention_heads=5"),
        (dict(num_key_value_heads=3), "num_key_value_heads=3"),
        (dict(tie_word_embeddings=True), "tie_word_embeddings"),
        (dict(target_num_hidden_layers=3), "target_num_hidden_layers=3"),
    ],
)
def test_inconsistent_values_raise_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[")):
        Eagle3Config(**{**SMALL, **overrides})


def test_last_layer_tap_and_four_features_are_allowed():
    # speculators' --include-last-layer: id L is the last layer's output before the final norm
    config = Eagle3Config(**SMALL, target_layer_ids=[2, 4, 5, 8], target_num_hidden_layers=8)
    assert config.num_target_features == 128


def test_single_feature_ablation_is_allowed():
    config = Eagle3Config(**SMALL, target_layer_ids=[5], target_num_hidden_layers=8)
    assert config.num_target_features == 32


def test_save_load_and_auto_config(tmp_path):
    config = Eagle3Config(**SMALL, target_num_hidden_layers=8, draft_vocab_size=50, target_model_name_or_path="x/y")
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, Eagle3Config)
    assert loaded.to_diff_dict() == config.to_diff_dict()
