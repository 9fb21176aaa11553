import pytest
import torch
from transformers import AutoModel, Gemma3TextConfig, LlamaConfig, Qwen3Config

from eagle3_hf import Eagle3DraftModel
from eagle3_hf.vocab_maps import maps_from_token_ids

from .conftest import make_tiny_target


def test_forward_shapes_sequence_then_own_hidden(tiny_draft):
    ids = torch.randint(0, 128, (2, 5))
    features = torch.randn(2, 5, 96)
    out = tiny_draft(ids, target_hidden_states=features)
    assert out.logits.shape == (2, 5, 64)
    assert out.hidden_states.shape == (2, 5, 32)
    assert out.cache.get_seq_length() == 5
    step = tiny_draft(ids[:, :1], hidden_states=out.hidden_states[:, -1:], cache=out.cache)
    assert step.logits.shape == (2, 1, 64)
    assert out.cache.get_seq_length() == 6


def test_cached_steps_equal_one_full_pass(tiny_draft):
    ids = torch.randint(0, 128, (1, 7))
    features = torch.randn(1, 7, 96)
    full = tiny_draft(ids, target_hidden_states=features, use_cache=False)
    first = tiny_draft(ids[:, :4], target_hidden_states=features[:, :4])
    rest = tiny_draft(ids[:, 4:], target_hidden_states=features[:, 4:], cache=first.cache)
    torch.testing.assert_close(torch.cat([first.logits, rest.logits], 1), full.logits, rtol=1e-5, atol=1e-5)


def test_tree_mask_equals_separate_branches(tiny_draft):
    """Two sibling nodes at the same position under a 4-D mask == each run alone on the prefix."""
    ids = torch.randint(0, 128, (1, 4))
    prefix = tiny_draft(ids, target_hidden_states=torch.randn(1, 4, 96))
    hidden = prefix.hidden_states[:, -1:].expand(1, 2, 32)
    nodes = torch.tensor([[5, 9]])
    mask = torch.zeros(1, 1, 2, 6)
    mask[0, 0, 0, 5] = torch.finfo(torch.float32).min  # node 0 must not see node 1 and vice versa
    mask[0, 0, 1, 4] = torch.finfo(torch.float32).min
    cache = prefix.cache
    tree = tiny_draft(
        nodes, hidden_states=hidden, attention_mask=mask, position_ids=torch.tensor([[4, 4]]), cache=cache
    )
    cache.crop(-2)
    for i in range(2):
        alone = tiny_draft(nodes[:, i : i + 1], hidden_states=hidden[:, :1], cache=cache)
        cache.crop(-1)
        torch.testing.assert_close(tree.logits[:, i], alone.logits[:, 0], rtol=1e-5, atol=1e-5)


def test_positions_beyond_max_position_embeddings(tiny_draft):
    ids = torch.randint(0, 128, (1, 3))
    out = tiny_draft(ids, target_hidden_states=torch.randn(1, 3, 96), position_ids=torch.tensor([[5000, 5001, 5002]]))
    assert torch.isfinite(out.logits).all()


def test_exactly_one_hidden_input_and_widths_checked(tiny_draft):
    ids = torch.randint(0, 128, (1, 3))
    with pytest.raises(ValueError, match="exactly one"):
        tiny_draft(ids)
    with pytest.raises(ValueError, match="96"):
        tiny_draft(ids, target_hidden_states=torch.randn(1, 3, 32))


def test_head_without_embedding_refuses_to_run(tiny_draft, tmp_path):
    tiny_draft.save_pretrained(tmp_path)
    loaded = Eagle3DraftModel.from_pretrained(tmp_path)
    assert not loaded.has_embedding
    with pytest.raises(RuntimeError, match="attach_target"):
        loaded(torch.tensor([[1]]), target_hidden_states=torch.randn(1, 1, 96))


def test_attach_checks_the_target(tiny_draft):
    other = make_tiny_target(vocab_size=96)
    with pytest.raises(ValueError, match="vocab_size mismatch"):
        tiny_draft.attach_target(other)
    shallow = make_tiny_target(num_hidden_layers=4)
    with pytest.raises(ValueError, match="target_layer_ids"):
        tiny_draft.attach_target(shallow)


def test_embedding_is_shared_frozen_and_never_saved(tiny_target, tiny_draft, tmp_path):
    assert tiny_draft.get_input_embeddings() is tiny_target.get_input_embeddings()
    assert all(not name.startswith("_embedding") for name, _ in tiny_draft.named_parameters())
    tiny_draft.save_pretrained(tmp_path)
    from safetensors import safe_open

    keys = set(safe_open(tmp_path / "model.safetensors", "pt").keys())
    assert not any("embed" in key for key in keys)
    assert {"fc.weight", "lm_head.weight", "d2t", "t2d", "layers.0.hidden_norm.weight"} <= keys


@pytest.mark.parametrize("config_class", [LlamaConfig, Qwen3Config, Gemma3TextConfig])
def test_from_target_sizes_the_head(config_class):
    extra = {"head_dim": 8} if config_class is not LlamaConfig else {}
    target = make_tiny_target(config_class, **extra)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=32)
    config = draft.config
    assert config.vocab_size == 128 and config.draft_vocab_size == 32
    assert config.target_layer_ids == [2, 4, 5]
    assert config.target_hidden_size == 32 and config.hidden_size == 32
    assert draft.fc.in_features == 96 and draft.layers[0].self_attn.q_proj.in_features == 64
    hidden = target(torch.tensor([[1, 2, 3]]), output_hidden_states=True).hidden_states
    features = torch.cat([hidden[i] for i in config.target_layer_ids], -1)
    out = draft(torch.tensor([[2, 3, 4]]), target_hidden_states=features)
    assert out.logits.shape == (1, 3, 32)


def test_from_target_follows_target_dtype():
    target = make_tiny_target().to(torch.bfloat16)
    draft = Eagle3DraftModel.from_target(target)
    assert draft.fc.weight.dtype == torch.bfloat16


def test_vocab_maps_and_id_mapping(tiny_draft):
    ids = torch.tensor(sorted(torch.randperm(128)[:64].tolist()))
    d2t, t2d = maps_from_token_ids(ids, 128)
    tiny_draft.set_vocab_maps(d2t)
    assert torch.equal(tiny_draft.t2d, t2d)
    assert torch.equal(tiny_draft.draft_to_target_ids(torch.arange(64)), ids)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        tiny_draft.set_vocab_maps(d2t[:10])


def test_replace_draft_vocab_keeps_trained_rows_and_takes_new_ones_from_the_target(tiny_target, tiny_draft, tmp_path):
    old_ids = torch.arange(0, 128, 2)  # 64 even ids
    tiny_draft.set_vocab_maps(maps_from_token_ids(old_ids, 128)[0])
    tiny_draft.lm_head.weight.requires_grad_(False)
    features = torch.randn(1, 3, 96)
    before = tiny_draft(torch.tensor([[1, 2, 3]]), target_hidden_states=features).logits
    new_ids = torch.cat([torch.arange(0, 64, 2), torch.tensor([1, 3, 5])])  # 32 kept, 3 new, 32 dropped
    with pytest.raises(ValueError, match="pass `target=`"):
        tiny_draft.replace_draft_vocab(new_ids)
    assert tiny_draft.config.draft_vocab_size == 64  # untouched by the refusal
    assert tiny_draft.replace_draft_vocab(new_ids, tiny_target) == 3
    assert tiny_draft.config.draft_vocab_size == 35 and tiny_draft.lm_head.weight.shape == (35, 32)
    assert not tiny_draft.lm_head.weight.requires_grad
    sorted_ids = torch.sort(new_ids).values
    assert torch.equal(tiny_draft.draft_to_target_ids(torch.arange(35)), sorted_ids)
    after = tiny_draft(torch.tensor([[1, 2, 3]]), target_hidden_states=features).logits
    kept = sorted_ids % 2 == 0
    # Kept tokens score exactly as before (their rows moved); new rows are the target's output embedding.
    torch.testing.assert_close(after[..., kept], before[..., sorted_ids[kept] // 2])
    torch.testing.assert_close(tiny_draft.lm_head.weight[~kept], tiny_target.lm_head.weight[sorted_ids[~kept]])
    tiny_draft.save_pretrained(tmp_path)
    loaded = Eagle3DraftModel.from_pretrained(tmp_path)
    assert loaded.config.draft_vocab_size == 35 and torch.equal(loaded.d2t, tiny_draft.d2t)


def test_more_than_one_layer(tiny_target):
    draft = Eagle3DraftModel.from_target(tiny_target, num_hidden_layers=2)
    out = draft(torch.tensor([[1, 2]]), target_hidden_states=torch.randn(1, 2, 96))
    assert out.hidden_states.shape == (1, 2, 32) and out.cache.get_seq_length() == 2


def test_auto_model_resolves_saved_folder(tiny_draft, tmp_path):
    tiny_draft.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path)
    assert type(loaded) is Eagle3DraftModel
    for name, tensor in tiny_draft.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name


def test_public_api_exposes_training_and_chain_classes_lazily():
    import eagle3_hf

    for name in ("Eagle3Trainer", "Eagle3TrainingArguments", "DataCollatorForEagle3", "Eagle3CandidateGenerator"):
        assert getattr(eagle3_hf, name).__name__ == name
    with pytest.raises(AttributeError, match="no_such_name"):
        eagle3_hf.no_such_name  # noqa: B018


def test_init_output_from_target_reproduces_the_targets_head(tiny_target):
    """With fc onto the top tap and the layer's residual branches silenced, the head's logits are the target's
    own logits at that layer, restricted to the draft vocabulary: lm_head rows and norm really are the target's."""
    ids = torch.tensor(sorted(torch.randperm(128, generator=torch.Generator().manual_seed(0))[:64].tolist()))
    draft = Eagle3DraftModel.from_target(tiny_target, draft_vocab_size=64)
    draft.set_vocab_maps(maps_from_token_ids(ids, 128)[0])
    with torch.no_grad():
        tiny_target.model.norm.weight.uniform_(0.5, 1.5)  # a norm weight that is not the default ones
    assert draft.init_output_from_target(tiny_target, fc_from_top_feature=True) == ["lm_head", "norm", "fc"]
    with torch.no_grad():
        draft.layers[0].self_attn.o_proj.weight.zero_()
        draft.layers[0].mlp.down_proj.weight.zero_()
    hidden = tiny_target(torch.tensor([[1, 2, 3, 4]]), output_hidden_states=True).hidden_states
    features = torch.cat([hidden[i] for i in draft.config.target_layer_ids], -1)
    logits = draft(torch.tensor([[2, 3, 4, 5]]), target_hidden_states=features).logits
    top = hidden[draft.config.target_layer_ids[-1]]
    expected = tiny_target.lm_head(tiny_target.model.norm(top))[..., ids]
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def test_init_output_from_target_leaves_a_different_norm_alone():
    target = make_tiny_target(Gemma3TextConfig, head_dim=8)  # Gemma's norm scales by (1 + weight)
    with torch.no_grad():
        target.model.norm.weight.fill_(0.3)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=32)
    assert draft.init_output_from_target(target) == ["lm_head"]
    assert torch.equal(draft.norm.weight, torch.ones(32))
    torch.testing.assert_close(draft.lm_head.weight, target.get_output_embeddings().weight[:32])


@pytest.mark.parametrize(
    "config_class, width_field, expected",
    [("GPT2Config", "n_inner", 4 * 32), ("OPTConfig", "ffn_dim", 48), ("FalconConfig", "ffn_hidden_size", 48)],
)
def test_from_target_reads_the_mlp_width_of_targets_without_intermediate_size(config_class, width_field, expected):
    import transformers

    sizes = dict(vocab_size=128, hidden_size=32, num_attention_heads=4, num_hidden_layers=8)
    config = getattr(transformers, config_class)(**sizes, **({} if width_field == "n_inner" else {width_field: 48}))
    target = transformers.AutoModelForCausalLM.from_config(config)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=32)
    assert draft.config.intermediate_size == expected
    assert draft.config.target_layer_ids == [2, 4, 5]


# EAGLE-3.1 switches, sliding-window layers and an own embedding in one head (their logits are checked against
# speculators' and SpecForge's code in test_peers.py; here: the head's own invariants and lossless decoding).
VARIANT = dict(
    draft_vocab_size=64, num_hidden_layers=2, draft_layer_types=["sliding_attention", "full_attention"],
    draft_sliding_window=3, fc_norm=True, norm_before_residual=True, normed_feedback=True, trained_embedding=True,
)  # fmt: skip


def test_sliding_layers_window_a_4d_mask_as_they_window_the_causal_one(tiny_target):
    torch.manual_seed(0)
    draft = Eagle3DraftModel.from_target(tiny_target, **VARIANT).eval()
    ids, features = torch.randint(0, 128, (1, 9)), torch.randn(1, 9, 96)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        implicit = draft(ids, target_hidden_states=features).logits
        explicit = draft(ids, target_hidden_states=features, attention_mask=causal).logits
        draft.config.draft_layer_types = None  # the window matters: 9 tokens > 3
        unwindowed = draft(ids, target_hidden_states=features).logits
    torch.testing.assert_close(explicit, implicit)
    assert (unwindowed - implicit).abs().max() > 1e-3


def test_a_head_with_every_variant_decodes_losslessly_and_saves_its_embedding(tiny_target, tmp_path):
    torch.manual_seed(0)
    draft = Eagle3DraftModel.from_target(tiny_target, **VARIANT).eval()
    assert torch.equal(draft.get_input_embeddings().weight, tiny_target.get_input_embeddings().weight)
    with torch.no_grad():
        draft.embed_tokens.weight.mul_(1.5)  # trained away from the target's
    prompt = torch.tensor([[5, 17, 42, 9, 100, 3]])
    greedy = tiny_target.generate(prompt, max_new_tokens=24, do_sample=False)
    assert torch.equal(tiny_target.generate(prompt, assistant_model=draft, max_new_tokens=24, do_sample=False), greedy)
    draft.save_pretrained(tmp_path / "head")
    loaded = Eagle3DraftModel.from_pretrained(tmp_path / "head", target=tiny_target)
    torch.testing.assert_close(loaded.get_input_embeddings().weight, draft.embed_tokens.weight)
    assert loaded.config.draft_layer_types == VARIANT["draft_layer_types"] and loaded.config.normed_feedback
