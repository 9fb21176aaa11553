"""The peers' own code as oracle: heads created with vLLM speculators' and SpecForge's classes are read by us, ours
are read by theirs, and both compute the same draft logits over two training-time-test steps.

Two steps, because the second one reads the hidden state fed back by the first (where speculators' `norm_output`
acts) and the keys the first one cached. The peers are installed by scripts/setup.sh (`--no-deps`, CPU only); the
versions checked are `PEER_VERSIONS`. The official SafeAILab code is not installable: test_checkpoints.py pins the
rules it applies on load against the files we write.
"""

import importlib.metadata
import json

import pytest
import torch
from safetensors.torch import load_file
from specforge.export.checkpoint_io import apply_legacy_rope_scaling
from specforge.export.to_sglang import _serving_state
from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig
from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.models.eagle3 import Eagle3SpeculatorConfig
from speculators.models.eagle3.core import Eagle3DraftModel as SpeculatorsEagle3
from speculators.proposals.greedy import GreedyTokenProposalConfig
from transformers import LlamaConfig

from eagle3_hf import Eagle3DraftModel
from eagle3_hf.checkpoints.writing import save_in_dialect
from eagle3_hf.training.losses import shift_left
from eagle3_hf.training.trainer import unroll_training_time_test

from .conftest import TINY_TARGET_KWARGS, make_tiny_target


PEER_VERSIONS = {"speculators": "0.9.0", "specforge": "0.2.0"}
H, VOCAB, DRAFT_VOCAB, SEQ = 32, 128, 64, 12
TOLERANCE = 2e-5  # float32 on CPU; the measured differences are in docs/checkpoint-dialects.md
LLAMA = dict(TINY_TARGET_KWARGS, num_hidden_layers=1, rms_norm_eps=1e-5, tie_word_embeddings=False)

# name -> (speculators config fields, transformer_layer_config fields); every case runs in both directions
SPECULATORS_CASES = {
    "plain": ({}, {}),
    "eagle-3.1 (0.9 defaults)": ({"norm_before_fc": True, "norm_output": True}, {}),
    "fc_norm, norm_before_residual": ({"fc_norm": True, "norm_before_residual": True}, {}),
    "sliding window": (
        {},
        {"num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4},
    ),
    "rope llama3 scaling": (
        {},
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8,
            }
        },
    ),  # fmt: skip
    "3 layers": ({}, {"num_hidden_layers": 3}),
    "trained embedding": ({"embed_requires_grad": True}, {}),
    "last-layer tap": ({"eagle_aux_hidden_state_layer_ids": [2, 4, 5, 8]}, {}),
}
SPECFORGE_CASES = {
    "plain": {},
    "fc_norm": {"fc_norm": True},
    "norm_output false": {"norm_output": False},
    "rope_theta": {"rope_theta": 500000.0},
    "rope linear scaling": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "rope llama3 scaling": {
        "rope_scaling": {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        }
    },
    "rope yarn scaling": {  # SpecForge's own YaRN needs every field
        "rope_scaling": {
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0,
        }
    },
}  # fmt: skip


def test_the_peer_versions_checked_are_installed():
    for name, version in PEER_VERSIONS.items():
        assert importlib.metadata.version(name) == version


@pytest.fixture(scope="module")
def target():
    return make_tiny_target()


@pytest.fixture(scope="module")
def verifier_dir(tmp_path_factory, target):
    """The tiny target saved as the verifier speculators resolves layer ids and embeddings from."""
    folder = tmp_path_factory.mktemp("verifier")
    target.save_pretrained(folder)
    return str(folder)


@pytest.fixture(autouse=True, scope="module")
def no_torch_compile():
    """SpecForge decorates its norm and RoPE with torch.compile; run them eagerly (no C compiler, no minutes)."""
    import torch._dynamo

    previous, torch._dynamo.config.disable = torch._dynamo.config.disable, True
    yield
    torch._dynamo.config.disable = previous


def randomize(module, seed: int) -> None:
    """Every floating parameter random (norm weights around 1), so that a skipped norm changes the logits."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(1 + 0.3 * noise if "norm" in name else 0.2 * noise)


def draft_maps(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`(d2t, t2d)` of a random sorted draft vocabulary of `DRAFT_VOCAB` ids."""
    ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))[:DRAFT_VOCAB].sort().values
    return ids - torch.arange(DRAFT_VOCAB), torch.zeros(VOCAB, dtype=torch.bool).index_fill_(0, ids, True)


def inputs(num_features: int, seed: int = 3) -> tuple[torch.LongTensor, torch.Tensor]:
    """Token ids `(1, SEQ)` and target features `(1, SEQ, num_features * H)`, paired position by position."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (1, SEQ), generator=generator)
    return ids, torch.randn(1, SEQ, num_features * H, generator=generator)


def our_two_steps(head: Eagle3DraftModel, ids, features) -> list[torch.Tensor]:
    """Our logits of TTT steps 0 and 1 `(1, SEQ - 2, draft_vocab)`: `ids[t]` pairs with `features[t]`.

    `unroll_training_time_test` feeds `x[t + 1 + k]` with `features[t]`, so it gets the ids shifted right by one;
    the last two positions lack their later tokens there and are left out.
    """
    shifted = torch.cat([ids[:, :1], ids[:, :-1]], dim=1)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        steps = unroll_training_time_test(head, head.config, shifted, mask, features, steps=2)
        return [out.logits[:, : SEQ - 2] for out in steps]


def speculators_two_steps(model, ids, features) -> list[torch.Tensor]:
    """speculators' own `forward` (2 TTT steps; positions start at 1 as in its data); logits read at `lm_head`."""
    logits = []
    handle = model.lm_head.register_forward_hook(lambda module, args, output: logits.append(output))
    try:
        with torch.no_grad():
            model(hidden_states=features, input_ids=ids, document_ids=torch.zeros_like(ids), ttt_steps=2)
    finally:
        handle.remove()
    return [step[:, : SEQ - 2] for step in logits]


def specforge_two_steps(model, ids, features) -> list[torch.Tensor]:
    """SpecForge's TTT step by step with its own pieces, as its Eagle3 trainer chains them (sdpa backend):
    `project_hidden_states`, then per step `embed_input_ids`, `backbone` over the shared `cache_hidden` and
    `compute_logits`; the backbone's output is the next step's hidden state."""
    mask = model.prepare_decoder_attention_mask(torch.ones_like(ids), features, 1, SEQ, 0)
    positions, cache_hidden, logits = torch.arange(SEQ)[None], [[], []], []
    with torch.no_grad():
        hidden = model.project_hidden_states(features)
        for step in range(2):
            embeds = model.embed_input_ids(shift_left(ids, step))
            hidden = model.backbone(embeds, hidden, cache_hidden, mask, positions, use_cache=True)
            logits.append(model.compute_logits(hidden)[:, : SEQ - 2])
    return logits


def max_difference(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> float:
    assert [t.shape for t in ours] == [t.shape for t in theirs]
    return max(float((a - b).abs().max()) for a, b in zip(ours, theirs))


# ------------------------------------------------------------------------------------------------- speculators
def speculators_model(verifier_dir, fields: dict, layer_fields: dict, seed: int = 0) -> SpeculatorsEagle3:
    """A head built with speculators' own classes, random weights, the draft vocabulary and the verifier's
    embedding (or a random trained one)."""
    layer = LlamaConfig(**{**LLAMA, **layer_fields})
    layer._attn_implementation = "sdpa"  # its default, flex attention, needs a compiler on CPU
    verifier = VerifierConfig.from_pretrained(verifier_dir)
    fields = {"eagle_aux_hidden_state_layer_ids": [2, 4, 5], **fields}
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=DRAFT_VOCAB,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=verifier,
        ),
        **fields,
    )
    model = SpeculatorsEagle3(config)
    randomize(model, seed)
    d2t, t2d = draft_maps(seed)
    model.load_vocab_mappings(t2d, d2t)
    if not fields.get("embed_requires_grad"):
        torch.nn.init.constant_(model.embed_tokens.weight, torch.nan)  # "not loaded": take the verifier's
    model.load_verifier_weights()
    return model.eval()


def load_speculators(folder) -> SpeculatorsEagle3:
    config = Eagle3SpeculatorConfig.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "sdpa"
    return SpeculatorsEagle3.from_pretrained(folder, config=config).eval()


@pytest.mark.parametrize("case", SPECULATORS_CASES)
def test_speculators_heads_read_by_us_compute_speculators_logits(case, tmp_path, target, verifier_dir):
    fields, layer_fields = SPECULATORS_CASES[case]
    theirs = speculators_model(verifier_dir, fields, layer_fields)
    theirs.save_pretrained(tmp_path / "head")

    ours = Eagle3DraftModel.from_pretrained(tmp_path / "head", target=target).eval()

    ids, features = inputs(len(theirs.config.eagle_aux_hidden_state_layer_ids))
    difference = max_difference(our_two_steps(ours, ids, features), speculators_two_steps(theirs, ids, features))
    assert difference < TOLERANCE, f"{case}: max logit difference {difference}"
    if fields.get("embed_requires_grad"):  # the head's own embedding survives target=
        assert torch.equal(ours.get_input_embeddings().weight, theirs.embed_tokens.weight)
        assert not torch.equal(ours.get_input_embeddings().weight, target.get_input_embeddings().weight)


@pytest.mark.parametrize("case", SPECULATORS_CASES)
def test_our_heads_written_as_speculators_compute_the_same_logits_in_speculators(case, tmp_path, verifier_dir):
    fields, layer_fields = SPECULATORS_CASES[case]
    source = speculators_model(verifier_dir, fields, layer_fields, seed=7)  # only to get a random head of ours
    source.save_pretrained(tmp_path / "source")
    target = make_tiny_target()
    ours = Eagle3DraftModel.from_pretrained(tmp_path / "source", target=target).eval()
    ours.config.target_model_name_or_path = verifier_dir
    randomize(ours, seed=11)  # weights of our own, not theirs round-tripped

    save_in_dialect(ours, tmp_path / "ours", "speculators")
    theirs = load_speculators(tmp_path / "ours")

    ids, features = inputs(len(ours.config.target_layer_ids), seed=5)
    difference = max_difference(our_two_steps(ours, ids, features), speculators_two_steps(theirs, ids, features))
    assert difference < TOLERANCE, f"{case}: max logit difference {difference}"
    assert torch.equal(theirs.d2t, ours.d2t) and torch.equal(theirs.t2d, ours.t2d)


# --------------------------------------------------------------------------------------------------- SpecForge
def specforge_model(target, fields: dict, seed: int = 0) -> LlamaForCausalLMEagle3:
    """A head built with SpecForge's own class (sdpa backend) and random weights; its frozen embedding is the
    target's, as `load_embedding` would copy it."""
    config = LlamaConfig(**LLAMA, draft_vocab_size=DRAFT_VOCAB, **fields)
    model = LlamaForCausalLMEagle3(config, attention_backend="sdpa")
    randomize(model, seed)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        model.d2t.copy_(draft_maps(seed)[0])
        model.t2d.copy_(draft_maps(seed)[1])
    return model.eval()


def export_specforge(model, folder) -> None:
    """What `specforge export --to sglang` writes for a draft: the serving state (embeddings dropped, required
    keys checked by its own `_serving_state`) through `save_pretrained`, then its RoPE key mirroring."""
    state = {key: value for key, value in model.state_dict().items() if "embed" not in key.lower()}
    model.save_pretrained(folder, state_dict=_serving_state(state, {}))
    apply_legacy_rope_scaling(str(folder))


def load_specforge(folder, target) -> LlamaForCausalLMEagle3:
    """A draft directory as SpecForge reads it when it starts from one: its config reader and model registry, then
    the weights loaded the way its `materialize_draft` checks them (nothing unexpected, only the embedding missing,
    which it takes from the target). Not `from_pretrained`: under transformers 5.24 that leaves its precomputed
    RoPE tables as uninitialised memory."""
    config = AutoDraftModelConfig.from_file(str(folder / "config.json"))
    model = AutoDraftModel.from_config(config, attention_backend="sdpa")
    missing, unexpected = model.load_state_dict(load_file(folder / "model.safetensors"), strict=False)
    assert not unexpected and missing == ["embed_tokens.weight"]
    with torch.no_grad():
        model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
    return model.eval()


@pytest.mark.parametrize("case", SPECFORGE_CASES)
def test_specforge_exports_read_by_us_compute_specforge_logits(case, tmp_path, target):
    theirs = specforge_model(target, SPECFORGE_CASES[case])
    export_specforge(theirs, tmp_path / "head")

    ours = Eagle3DraftModel.from_pretrained(tmp_path / "head", target=target, target_layer_ids=[2, 4, 5]).eval()

    ids, features = inputs(3)
    difference = max_difference(our_two_steps(ours, ids, features), specforge_two_steps(theirs, ids, features))
    assert difference < TOLERANCE, f"{case}: max logit difference {difference}"


@pytest.mark.parametrize("case", SPECFORGE_CASES)
def test_our_sglang_exports_compute_the_same_logits_in_specforge(case, tmp_path, target):
    source = specforge_model(target, SPECFORGE_CASES[case], seed=7)
    export_specforge(source, tmp_path / "source")
    ours = Eagle3DraftModel.from_pretrained(tmp_path / "source", target=target, target_layer_ids=[2, 4, 5]).eval()
    randomize(ours, seed=11)

    save_in_dialect(ours, tmp_path / "ours", "sglang")
    theirs = load_specforge(tmp_path / "ours", target)

    ids, features = inputs(3, seed=5)
    difference = max_difference(our_two_steps(ours, ids, features), specforge_two_steps(theirs, ids, features))
    assert difference < TOLERANCE, f"{case}: max logit difference {difference}"
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["norm_output"] is SPECFORGE_CASES[case].get("norm_output", True)
