"""Heads of several decoder layers (`eagle3_hf.training.heads`): size options, how the layers after the first start
(`identity`, `top`), growing and widening a trained head, and that such heads save, load, decode and train like one-layer heads.

Layer 0 reads `concat(embedding, hidden)`; layers 1.. are plain Llama decoder layers, each with its own KV cache
layer, which the drafter crops and the training-time test accumulates like layer 0's.
"""

import copy

import pytest
import torch
from transformers import Qwen3Config
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from eagle3_hf import Eagle3DraftModel
from eagle3_hf.checkpoints.writing import save_in_dialect
from eagle3_hf.generation import original_generate
from eagle3_hf.generation.drafter import TreeDrafter
from eagle3_hf.modeling_eagle3 import Eagle3DecoderLayer
from eagle3_hf.target import gather_target_features
from eagle3_hf.training.heads import build_draft_head, grow_draft_head, init_draft_layers, widen_draft_mlp
from eagle3_hf.training.trainer import Eagle3Trainer, unroll_training_time_test
from eagle3_hf.vocab_maps import maps_from_token_ids

from .conftest import make_tiny_target
from .oracle_draft import OracleDraft
from .test_decoding import peaked_target, random_prompt, tree_generate
from .test_trainer import make_args, make_dataset, make_sharp_target, make_word_tokenizer, write_word_chats


IDS = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
FEATURES = torch.randn(2, 9, 96, generator=torch.Generator().manual_seed(1))


def step_logits(draft, steps: int = 3) -> list[torch.Tensor]:
    """The logits of `steps` training-time-test steps: step 0 reads target features, later steps the fed-back
    hidden states and every layer's cached keys of the earlier steps."""
    with torch.no_grad():
        outputs = unroll_training_time_test(draft, draft.config, IDS, torch.ones(2, 9), FEATURES, steps)
        return [out.logits for out in outputs]


def first_layer_only(draft: Eagle3DraftModel, target) -> Eagle3DraftModel:
    """The one-layer head made of `draft`'s `fc`, layer 0, `norm`, `lm_head` and vocabulary maps."""
    config = copy.deepcopy(draft.config)
    config.num_hidden_layers = 1
    single = Eagle3DraftModel(config)
    state = {k: v for k, v in draft.state_dict().items() if not k.startswith("layers.") or k.startswith("layers.0.")}
    single.load_state_dict(state)
    return single.attach_target(target)


def scrambled_vocab(size: int = 64) -> torch.Tensor:
    ids = torch.randperm(128, generator=torch.Generator().manual_seed(3))[:size]
    return maps_from_token_ids(ids, 128)[0]


@pytest.fixture
def target():
    return make_tiny_target()


# ------------------------------------------------------------------------------------------------------ sizes
def test_a_fresh_head_starts_its_output_from_the_target_unless_told_not_to(target):
    started = build_draft_head(target, draft_vocab_size=64, init_fc_from_top_feature=True)
    rows = target.get_output_embeddings().weight[started.draft_to_target_ids(torch.arange(64))]
    assert torch.equal(started.lm_head.weight, rows)
    hidden = target.config.hidden_size
    assert torch.equal(started.fc.weight[:, -hidden:], torch.eye(hidden)) and not started.fc.weight[:, :-hidden].any()
    random = build_draft_head(target, draft_vocab_size=64, init_from_target=False, init_fc_from_top_feature=True)
    assert not torch.allclose(random.lm_head.weight, rows, atol=1e-3)  # the random init, not the target's rows
    assert not torch.allclose(random.fc.weight[:, -hidden:], torch.eye(hidden), atol=0.5)  # fc follows lm_head


def test_size_options_shape_a_fresh_head(target):
    draft = build_draft_head(target, draft_vocab_size=64, num_hidden_layers=3, intermediate_size=48)
    assert draft.config.num_hidden_layers == 3 and draft.config.intermediate_size == 48
    assert type(draft.layers[0]) is Eagle3DecoderLayer
    assert [type(layer) for layer in draft.layers[1:]] == [LlamaDecoderLayer, LlamaDecoderLayer]
    assert all(layer.mlp.down_proj.in_features == 48 for layer in draft.layers)
    assert draft.layers[2].self_attn.q_proj.in_features == 32  # plain layers read the H-wide residual stream
    default = build_draft_head(target, draft_vocab_size=64)
    assert default.config.num_hidden_layers == 1 and default.config.intermediate_size == 64  # the target's
    with pytest.raises(ValueError, match="init_layers_from_target='random'"):
        build_draft_head(target, num_hidden_layers=2, init_layers_from_target="random")


def test_train_command_declares_the_size_and_layer_options():
    from eagle3_hf.commands.train import make_parser

    model_args = make_parser().parse_args_into_dataclasses(
        args=["--output_dir=x", "--draft_num_hidden_layers=3", "--draft-intermediate-size=48"]
        + ["--init_layers_from_target=top"]
    )[0]
    assert (model_args.draft_num_hidden_layers, model_args.draft_intermediate_size) == (3, 48)
    assert model_args.init_layers_from_target == "top"
    defaults = make_parser().parse_args_into_dataclasses(args=["--output_dir=x"])[0]
    assert (defaults.draft_num_hidden_layers, defaults.draft_intermediate_size) == (None, None)
    assert defaults.init_layers_from_target == "none"
    with pytest.raises(SystemExit):
        make_parser().parse_args_into_dataclasses(args=["--output_dir=x", "--init_layers_from_target=random"])


def test_fc_norm_gives_a_fresh_head_one_input_norm_per_tap_and_a_continued_head_keeps_its_inputs(
    target, tmp_path, monkeypatch
):
    draft = build_draft_head(target, draft_vocab_size=64, fc_norm=True)
    assert draft.config.fc_norm and len(draft.fc_norm) == len(draft.config.target_layer_ids)
    scaled = FEATURES.clone()
    scaled[..., :32] *= 50.0  # one tap far larger than the others: its norm takes the scale out
    with torch.no_grad():
        same = next(unroll_training_time_test(draft, draft.config, IDS, torch.ones(2, 9), FEATURES, 1)).logits
        large = next(unroll_training_time_test(draft, draft.config, IDS, torch.ones(2, 9), scaled, 1)).logits
    torch.testing.assert_close(large, same, atol=1e-4, rtol=1e-4)
    assert not build_draft_head(target, draft_vocab_size=64).config.fc_norm
    Eagle3DraftModel.from_target(target, draft_vocab_size=64).save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match="fc_norm=True but the head to continue .* has no fc_norm"):
        build_draft_head(target, pretrained=str(tmp_path / "plain"), fc_norm=True)
    with monkeypatch.context() as patched:  # refused before the head is grown, not after
        patched.setattr("eagle3_hf.training.heads.grow_draft_head", lambda *args: pytest.fail("grown first"))
        with pytest.raises(ValueError, match="has no fc_norm"):
            build_draft_head(target, pretrained=str(tmp_path / "plain"), fc_norm=True, num_hidden_layers=2)
    draft.save_pretrained(tmp_path / "normed")
    assert build_draft_head(target, pretrained=str(tmp_path / "normed"), fc_norm=True).config.fc_norm
    from eagle3_hf.commands.train import make_parser

    assert make_parser().parse_args_into_dataclasses(args=["--output_dir=x", "--fc_norm=true"])[0].fc_norm


# ----------------------------------------------------------------------------------------------- identity
def test_identity_layers_compute_exactly_what_the_first_layer_alone_computes(target):
    draft = build_draft_head(target, num_hidden_layers=3, init_layers_from_target="identity", draft_vocab_size=64)
    for layer in draft.layers[1:]:
        assert not layer.self_attn.o_proj.weight.any() and not layer.mlp.down_proj.weight.any()
        assert layer.self_attn.q_proj.weight.any() and layer.mlp.up_proj.weight.any()  # still learn from step 1
    ours, single = step_logits(draft), step_logits(first_layer_only(draft, target))
    assert len(ours) == len(single) > 1
    for mine, theirs in zip(ours, single, strict=True):
        assert torch.equal(mine, theirs)


def test_grown_head_keeps_every_tensor_and_its_logits(target, tmp_path):
    torch.manual_seed(2)
    trained = Eagle3DraftModel.from_target(target, draft_vocab_size=64, fc_norm=True)
    trained.set_vocab_maps(scrambled_vocab())
    trained.save_pretrained(tmp_path / "one")
    grown = build_draft_head(
        target, pretrained=str(tmp_path / "one"), num_hidden_layers=2, init_layers_from_target="identity"
    )
    assert grown.config.num_hidden_layers == 2 and grown.config.fc_norm
    for name, tensor in trained.state_dict().items():  # fc, fc_norm, layer 0, norm, lm_head, d2t, t2d
        assert torch.equal(grown.state_dict()[name], tensor), name
    assert grown.get_input_embeddings() is target.get_input_embeddings()
    for ours, single in zip(step_logits(grown), step_logits(trained.attach_target(target))):
        assert torch.equal(ours, single)

    grown.save_pretrained(tmp_path / "two")  # grown again from 2 to 3: the second layer is kept too
    three = grow_draft_head(Eagle3DraftModel.from_pretrained(tmp_path / "two", target=target), 3, "identity")
    assert torch.equal(three.layers[1].mlp.up_proj.weight, grown.layers[1].mlp.up_proj.weight)
    assert torch.equal(step_logits(three)[2], step_logits(grown)[2])


def test_a_head_is_never_shrunk_or_narrowed_and_keeps_its_size_by_default(target, tmp_path):
    Eagle3DraftModel.from_target(target, draft_vocab_size=64, num_hidden_layers=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="the head has 2 layers and a head is never shrunk"):
        build_draft_head(target, pretrained=str(tmp_path), num_hidden_layers=1)
    with pytest.raises(ValueError, match="intermediate_size=48 but the head to continue .* intermediate_size=64"):
        build_draft_head(target, pretrained=str(tmp_path), intermediate_size=48)
    with pytest.raises(ValueError, match="intermediate_size=48: the head's MLPs are 64 wide .* never narrowed"):
        widen_draft_mlp(Eagle3DraftModel.from_pretrained(tmp_path, target=target), 48)
    kept = build_draft_head(target, pretrained=str(tmp_path))
    assert (kept.config.num_hidden_layers, kept.config.intermediate_size) == (2, 64)  # kept by default


# -------------------------------------------------------------------------------------------------- widen
def test_widened_head_keeps_its_trained_channels_and_its_logits(target, tmp_path):
    torch.manual_seed(4)
    trained = Eagle3DraftModel.from_target(target, draft_vocab_size=64, num_hidden_layers=2)
    trained.set_vocab_maps(scrambled_vocab())
    trained.lm_head.requires_grad_(False)
    trained.attach_target(target).save_pretrained(tmp_path / "narrow")
    wide = widen_draft_mlp(trained, 96)
    assert wide.config.intermediate_size == 96 and trained.config.intermediate_size == 64  # a copy
    for narrow_layer, wide_layer in zip(trained.layers, wide.layers, strict=True):
        narrow_mlp, wide_mlp = narrow_layer.mlp, wide_layer.mlp
        assert torch.equal(wide_mlp.gate_proj.weight[:64], narrow_mlp.gate_proj.weight)
        assert torch.equal(wide_mlp.up_proj.weight[:64], narrow_mlp.up_proj.weight)
        assert torch.equal(wide_mlp.down_proj.weight[:, :64], narrow_mlp.down_proj.weight)
        assert not wide_mlp.down_proj.weight[:, 64:].any()  # the new channels add 0 ...
        assert wide_mlp.up_proj.weight[64:].any() and wide_mlp.gate_proj.weight[64:].any()  # ... and still learn
    kept = {k: v for k, v in trained.state_dict().items() if ".mlp." not in k}
    for name, tensor in kept.items():  # fc, attention, norms, lm_head, d2t, t2d
        assert torch.equal(wide.state_dict()[name], tensor), name
    assert not wide.lm_head.weight.requires_grad and wide.get_input_embeddings() is target.get_input_embeddings()
    for ours, narrow in zip(step_logits(wide), step_logits(trained), strict=True):
        torch.testing.assert_close(ours, narrow, rtol=1e-5, atol=1e-5)  # zero columns: only summation order differs
    assert widen_draft_mlp(wide, 96) is wide

    # The command-line path: widened first, then grown, so the new layer has the new width too.
    both = build_draft_head(
        target,
        pretrained=str(tmp_path / "narrow"),
        intermediate_size=96,
        num_hidden_layers=3,
        init_layers_from_target="identity",
    )
    assert both.config.intermediate_size == 96 and both.layers[2].mlp.down_proj.weight.shape == (32, 96)
    torch.testing.assert_close(step_logits(both)[2], step_logits(trained)[2], rtol=1e-5, atol=1e-5)
    both.save_pretrained(tmp_path / "wide")
    reloaded = Eagle3DraftModel.from_pretrained(tmp_path / "wide", target=target)
    assert reloaded.config.intermediate_size == 96
    assert torch.equal(step_logits(reloaded)[1], step_logits(both)[1])


# ---------------------------------------------------------------------------------------------------- top
def test_top_copies_the_targets_top_layers_in_order(target, tmp_path):
    fresh = build_draft_head(target, draft_vocab_size=64, num_hidden_layers=3, init_layers_from_target="top")
    layers = target.model.layers  # 8 layers: a 3-layer head copies layers 6 and 7 into its layers 1 and 2
    for index, source in ((1, 6), (2, 7)):
        for name, tensor in layers[source].state_dict().items():
            assert torch.equal(fresh.layers[index].state_dict()[name], tensor), (index, name)
    assert fresh.layers[1].self_attn.q_proj.weight.data_ptr() != layers[6].self_attn.q_proj.weight.data_ptr()

    two = Eagle3DraftModel.from_target(target, draft_vocab_size=64, num_hidden_layers=2)
    two.save_pretrained(tmp_path)
    grown = build_draft_head(target, pretrained=str(tmp_path), num_hidden_layers=3, init_layers_from_target="top")
    assert torch.equal(grown.layers[1].mlp.gate_proj.weight, two.layers[1].mlp.gate_proj.weight)  # kept
    assert torch.equal(grown.layers[2].mlp.gate_proj.weight, layers[7].mlp.gate_proj.weight)  # L - n + i = 7


def test_top_refuses_layers_that_do_not_match(target):
    with pytest.raises(ValueError, match=r"differ in shape .* mlp.gate_proj.weight \(48, 32\) vs \(64, 32\)"):
        build_draft_head(target, num_hidden_layers=2, intermediate_size=48, init_layers_from_target="top")
    qwen3 = make_tiny_target(Qwen3Config, head_dim=8)
    with pytest.raises(ValueError, match=r"only the target's has \['self_attn.k_norm.weight', 'self_attn.q_norm"):
        build_draft_head(qwen3, num_hidden_layers=2, init_layers_from_target="top")
    shallow = make_tiny_target(num_hidden_layers=4)
    draft = Eagle3DraftModel.from_target(shallow, num_hidden_layers=6, target_layer_ids=[1, 2, 3])
    with pytest.raises(ValueError, match="a 6-layer head copies 5 target layers, but the target has 4"):
        init_draft_layers(draft, range(1, 6), "top", shallow)
    with pytest.raises(ValueError, match="layer 0 reads concat"):
        init_draft_layers(draft, range(0, 2), "identity")


# -------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("num_layers", [2, 3])
def test_multi_layer_heads_round_trip_in_the_dialects_that_hold_them(target, tmp_path, num_layers):
    torch.manual_seed(num_layers)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64, num_hidden_layers=num_layers)
    draft.set_vocab_maps(scrambled_vocab())
    draft.config.target_model_name_or_path = "tiny/target"  # the speculators dialect records its verifier
    expected = step_logits(draft, 2)
    draft.save_pretrained(tmp_path / "native")
    folders = [tmp_path / "native", save_in_dialect(draft, tmp_path / "speculators", "speculators")]
    for folder in folders:
        loaded = Eagle3DraftModel.from_pretrained(folder, target=target)
        assert loaded.config.num_hidden_layers == num_layers, folder.name
        for name, tensor in draft.state_dict().items():
            assert torch.equal(loaded.state_dict()[name], tensor), (folder.name, name)
        for ours, theirs in zip(step_logits(loaded, 2), expected):
            assert torch.equal(ours, theirs), folder.name
    loaded.save_pretrained(tmp_path / "again")  # speculators -> native keeps every layer
    assert Eagle3DraftModel.from_pretrained(tmp_path / "again").config.num_hidden_layers == num_layers
    for dialect in ("eagle", "sglang"):  # one `midlayer` each: refused before anything is written
        with pytest.raises(ValueError, match=f"num_hidden_layers={num_layers}: the {dialect} dialect stores exactly"):
            save_in_dialect(draft, tmp_path / dialect, dialect)
        assert not (tmp_path / dialect).exists()


# ------------------------------------------------------------------------------------------------ decoding
def test_the_unroll_of_a_multi_layer_head_is_what_drafting_computes(target):
    """TTT step k at index t == k drafted tokens after the prefix 0..t, with every layer's cache in play."""
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64, num_hidden_layers=3)
    ids, features = IDS[:1], FEATURES[:1]
    with torch.no_grad():
        steps = list(unroll_training_time_test(draft, draft.config, ids, torch.ones(1, 9), features, 3))
        for t in (0, 3, 5):
            prefix = draft(ids[:, 1 : t + 2], target_hidden_states=features[:, : t + 1])
            assert len(prefix.cache.layers) == 3
            hidden, cache = prefix.hidden_states[:, -1:], prefix.cache
            for k in (1, 2):
                node = draft(ids[:, t + 1 + k : t + 2 + k], hidden_states=hidden, cache=cache)
                torch.testing.assert_close(steps[k].logits[:, t], node.logits[:, 0], rtol=1e-4, atol=1e-5)
                hidden = node.hidden_states


def test_tree_drafting_keeps_every_layers_cache_right(target):
    """The tree's scores equal drafting each path alone, and after the tree every layer holds the stable entries
    only: the next round's pairs see exactly what a from-scratch encoding of all pairs sees."""
    draft = Eagle3DraftModel.from_target(target, num_hidden_layers=3).attach_target(target)
    with torch.no_grad():
        for layer in draft.layers[1:]:  # large residual branches: a wrong key in layers 1, 2 shows in the logits
            layer.self_attn.o_proj.weight.mul_(20.0)
            layer.mlp.down_proj.weight.mul_(20.0)
        draft.lm_head.weight.mul_(20.0)
    prompt = random_prompt(14, seed=0)
    layer_ids = list(draft.config.target_layer_ids)
    with torch.no_grad():
        features = gather_target_features(target(prompt, output_hidden_states=layer_ids).hidden_states, layer_ids)
        drafter = TreeDrafter(draft, top_k=3)
        drafter.extend(prompt[:, 1:10], features[:, :9])  # pairs (x[j + 1], F[j]) at draft positions 0..8
        tree = drafter.grow(prompt[0, 9], depth=3, num_nodes=14)
        assert [layer.keys.shape[-2] for layer in drafter.cache.layers] == [9, 9, 9]
        prefix = draft(prompt[:, 1:10], target_hidden_states=features[:, :9])
        for node in range(1, tree.num_nodes):
            path = [node]
            while tree.parents[path[0]] > 0:
                path.insert(0, int(tree.parents[path[0]]))
            cache, hidden, logits = copy.deepcopy(prefix.cache), prefix.hidden_states[:, -1:], prefix.logits
            score = 0.0
            for depth, member in enumerate(path):
                score += torch.log_softmax(logits[0, -1].float(), -1)[tree.tokens[member]]
                if depth < len(path) - 1:
                    out = draft(tree.tokens[member].view(1, 1), hidden_states=hidden, cache=cache)
                    hidden, logits = out.hidden_states, out.logits
            torch.testing.assert_close(tree.scores[node], score, rtol=1e-4, atol=1e-4)
        drafter.extend(prompt[:, 10:14], features[:, 9:13])  # the next round's accepted pairs
        full = draft(prompt[:, 1:14], target_hidden_states=features[:, :13])
    torch.testing.assert_close(drafter._last_logits, full.logits[0, -1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("num_layers", [2, 3])
def test_multi_layer_heads_decode_greedily_as_the_target_does(num_layers):
    target = peaked_target()
    torch.manual_seed(num_layers)
    head = Eagle3DraftModel.from_target(target, draft_vocab_size=64, num_hidden_layers=num_layers)
    oracle = OracleDraft.from_target(target, num_hidden_layers=num_layers)  # real layers, the target's proposals
    accepted = []
    for seed, length in enumerate((5, 11)):
        ids = random_prompt(length, seed)
        expected = original_generate(target, ids, do_sample=False, max_new_tokens=16)
        assert torch.equal(target.generate(ids, assistant_model=head, do_sample=False, max_new_tokens=16), expected)
        chain = target.generate(ids, assistant_model=head, eagle3_mode="chain", do_sample=False, max_new_tokens=16)
        assert torch.equal(chain, expected)
        out = tree_generate(target, oracle, ids, noise=0.5, do_sample=False, max_new_tokens=16)
        assert torch.equal(out.sequences, expected)
        accepted += [len(path) - 1 for path in out.accepted_paths]
    assert max(accepted) >= 3  # rounds accepted several tokens: the n-layer cache was compacted and re-extended


# ------------------------------------------------------------------------------------------------ training
def test_a_two_layer_head_trains(tmp_path):
    target = make_sharp_target()
    torch.manual_seed(1)
    draft = build_draft_head(target, draft_vocab_size=64, num_hidden_layers=2, init_layers_from_target="identity")
    before = {name: p.detach().clone() for name, p in draft.named_parameters()}
    args = make_args(tmp_path, max_steps=12, logging_steps=4, per_device_train_batch_size=4)
    trainer = Eagle3Trainer(draft, args, target_model=target, train_dataset=make_dataset())
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss_step_0" in entry]
    assert losses[-1] < 0.5 * losses[0]
    for name, parameter in draft.named_parameters():  # the identity layer's q/k/v/gate/up learn from step 2 on
        assert not torch.equal(parameter, before[name]), f"{name} did not change"


def test_train_command_trains_a_multi_layer_head_and_grows_a_trained_one(tmp_path):
    from eagle3_hf.commands.train import main

    target = make_sharp_target()
    target.save_pretrained(tmp_path / "target")
    make_word_tokenizer().save_pretrained(tmp_path / "target")
    write_word_chats(tmp_path / "chats.jsonl", 6)
    argv = [f"--target_model_name_or_path={tmp_path / 'target'}", f"--data={tmp_path / 'chats.jsonl'}"]
    argv += ["--draft_vocab_size=64", "--max_steps=1", "--ttt_steps=2", "--per_device_train_batch_size=2"]
    argv += ["--use_cpu", "--report_to=none", "--disable_tqdm=true", "--save_strategy=no"]
    fresh = ["--draft_num_hidden_layers=2", "--init_layers_from_target=top", "--learning_rate=0"]
    assert main([*argv, f"--output_dir={tmp_path / 'two'}", *fresh]) == 0
    two = Eagle3DraftModel.from_pretrained(tmp_path / "two")
    assert two.config.num_hidden_layers == 2
    assert torch.equal(two.layers[1].mlp.up_proj.weight, target.model.layers[7].mlp.up_proj.weight)

    grow = [f"--draft_model_name_or_path={tmp_path / 'two'}", "--draft_num_hidden_layers=3", "--learning_rate=0"]
    assert main([*argv, f"--output_dir={tmp_path / 'three'}", *grow, "--init_layers_from_target=identity"]) == 0
    three = Eagle3DraftModel.from_pretrained(tmp_path / "three")
    assert three.config.num_hidden_layers == 3 and not three.layers[2].mlp.down_proj.weight.any()
    for name, tensor in two.state_dict().items():
        assert torch.equal(three.state_dict()[name], tensor), name
