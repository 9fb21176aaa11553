"""Every EAGLE-3 checkpoint dialect: detection, conversion, round trips, bad input, atomic writes, the CLI.

Fixture checkpoints are written by hand in each dialect's exact layout (field and tensor names from
checkpoint-formats.md), never with the writer under test.
"""

import json
import logging
import re
import runpy
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModel

from eagle3_hf import Eagle3Config, Eagle3DraftModel
from eagle3_hf.checkpoints import writing
from eagle3_hf.checkpoints.files import CheckpointFormatError, load_checkpoint_tensors, weight_files
from eagle3_hf.checkpoints.reading import detect_checkpoint_dialect
from eagle3_hf.checkpoints.writing import ARCHITECTURES, WRITABLE_DIALECTS, save_in_dialect
from eagle3_hf.cli import main as cli_main
from eagle3_hf.commands import convert as convert_command
from eagle3_hf.vocab_maps import t2d_from_d2t

from .conftest import make_tiny_target


# The tiny head matches conftest's target: hidden 32, 4 heads / 2 KV heads, vocab 128, 8 target layers.
H, HEADS, KV_HEADS, INTER, VOCAB, DRAFT_VOCAB, LAYERS = 32, 4, 2, 64, 128, 64, 8
DEFAULT_IDS = [2, 4, 5]  # [2, L//2, L-3] for L = 8
LAYER_PARTS = {
    "self_attn.q_proj.weight": (HEADS * 8, 2 * H),
    "self_attn.k_proj.weight": (KV_HEADS * 8, 2 * H),
    "self_attn.v_proj.weight": (KV_HEADS * 8, 2 * H),
    "self_attn.o_proj.weight": (H, HEADS * 8),
    "mlp.gate_proj.weight": (INTER, H),
    "mlp.up_proj.weight": (INTER, H),
    "mlp.down_proj.weight": (H, INTER),
    "hidden_norm.weight": (H,),
    "input_layernorm.weight": (H,),
    "post_attention_layernorm.weight": (H,),
}
EQUIVALENT_FIELDS = (
    "vocab_size", "draft_vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
    "max_position_embeddings", "rope_parameters", "target_hidden_size", "target_layer_ids",
    "target_num_hidden_layers", "target_model_name_or_path", "tie_word_embeddings", "bos_token_id", "eos_token_id",
    "pad_token_id",
)  # fmt: skip


def head_tensors(prefix: str, dtype=torch.float16, draft_vocab=DRAFT_VOCAB, maps=True, seed=0) -> dict:
    """The 15 tensors of an official EAGLE-3 head (13 without the vocab maps), layer keys under `prefix`."""
    generator = torch.Generator().manual_seed(seed)
    shapes = {"fc.weight": (H, 3 * H), **{prefix + k: v for k, v in LAYER_PARTS.items()}, "norm.weight": (H,)}
    shapes["lm_head.weight"] = (draft_vocab, H)
    tensors = {name: torch.randn(shape, generator=generator).to(dtype) for name, shape in shapes.items()}
    if maps:
        ids = torch.randperm(VOCAB, generator=generator)[:draft_vocab].sort().values
        tensors["d2t"] = ids - torch.arange(draft_vocab)
        tensors["t2d"] = torch.zeros(VOCAB, dtype=torch.bool).index_fill_(0, ids, True)
    return tensors


def llama_fields(**extra) -> dict:
    fields = dict(
        hidden_size=H, intermediate_size=INTER, num_hidden_layers=1, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, hidden_act="silu", max_position_embeddings=2048, rms_norm_eps=1e-5,
        vocab_size=VOCAB, initializer_range=0.02, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, use_cache=True,
    )  # fmt: skip
    return {**fields, **extra}


def write_checkpoint(folder, config: dict, tensors: dict, pickled: bool = False):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    if pickled:
        torch.save(tensors, folder / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "model.safetensors")
    return folder


def write_official(folder, pickled=True, maps=True, **config_extra):
    """yuhuili/EAGLE3-* layout: LlamaForCausalLM, no rope_theta, max_position_embeddings 2048, no embed_tokens."""
    draft_vocab = DRAFT_VOCAB if maps else VOCAB
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "transformers_version": "4.28.1",
        "torch_dtype": "float16", "draft_vocab_size": draft_vocab, **llama_fields(), **config_extra,
    }  # fmt: skip
    return write_checkpoint(folder, config, head_tensors("midlayer.", draft_vocab=draft_vocab, maps=maps), pickled)


def write_sglang(folder, **config_extra):
    """SpecForge export: LlamaForCausalLMEagle3, midlayer.*, eagle_config ids as 0-based layer outputs, bf16."""
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "draft_vocab_size": DRAFT_VOCAB,
        "rope_theta": 1000000.0, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]},
        **llama_fields(max_position_embeddings=256), **config_extra,
    }  # fmt: skip
    return write_checkpoint(folder, config, head_tensors("midlayer.", dtype=torch.bfloat16, seed=1))


def write_modelopt(folder, lm_head=True, **config_extra):
    """ModelOpt export: layers.0.*, ModelOpt eagle_config, YaRN rope_scaling, d2t only (no t2d)."""
    draft_vocab = DRAFT_VOCAB if lm_head else VOCAB
    eagle_config = {
        "eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True,
        "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True, "use_mtp_layernorm": False,
        "next_layer_regular": True, "parallel_draft_step": 1, "parallel_draft_heads_num_layers": 1,
    }  # fmt: skip
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "draft_vocab_size": draft_vocab,
        "head_dim": 8, "rope_theta": 10000.0, "eagle_config": eagle_config,
        "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 256},
        **llama_fields(max_position_embeddings=512), **config_extra,
    }  # fmt: skip
    tensors = head_tensors("layers.0.", dtype=torch.float32, draft_vocab=draft_vocab, maps=lm_head, seed=2)
    tensors.pop("t2d", None)
    if not lm_head:
        tensors.pop("lm_head.weight")
    return write_checkpoint(folder, config, tensors)


def write_speculators(folder, **config_extra):
    """vLLM speculators: Eagle3Speculator, transformer_layer_config, layers.0.*, embed_tokens.weight, bf16."""
    config = {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.3.0",
        "transformer_layer_config": {"model_type": "llama", "rope_theta": 250000.0, "head_dim": 8,
                                     **llama_fields(max_position_embeddings=512)},
        "draft_vocab_size": DRAFT_VOCAB, "target_hidden_size": H, "eagle_aux_hidden_state_layer_ids": DEFAULT_IDS,
        "norm_before_residual": False, "norm_before_fc": False, "fc_norm": False, "norm_output": False,
        "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": "tiny/target", "architectures": ["LlamaForCausalLM"]},
        },
        **config_extra,
    }  # fmt: skip
    tensors = head_tensors("layers.0.", dtype=torch.bfloat16, seed=3)
    tensors["embed_tokens.weight"] = torch.randn(VOCAB, H).to(torch.bfloat16)
    return write_checkpoint(folder, config, tensors)


SOURCES = {  # name -> (writer, extra from_pretrained kwargs, detected dialect)
    "official-bin": (lambda f: write_official(f), {"target_num_hidden_layers": LAYERS}, "eagle"),
    "official-safetensors": (lambda f: write_official(f, pickled=False), {"target_layer_ids": [2, 4, 5]}, "eagle"),
    "official-full-vocab": (lambda f: write_official(f, maps=False), {"target_num_hidden_layers": LAYERS}, "eagle"),
    "sglang": (write_sglang, {}, "sglang"),
    "modelopt": (write_modelopt, {}, "modelopt"),
    "speculators": (write_speculators, {}, "speculators"),
}


def load_source(name, tmp_path):
    writer, kwargs, _ = SOURCES[name]
    return Eagle3DraftModel.from_pretrained(writer(tmp_path / name), **kwargs)


def assert_same_head(a: Eagle3DraftModel, b: Eagle3DraftModel):
    sd_a, sd_b = a.state_dict(), b.state_dict()
    assert sd_a.keys() == sd_b.keys()
    for key in sd_a:
        assert sd_a[key].dtype == sd_b[key].dtype and torch.equal(sd_a[key], sd_b[key]), key
    for field in EQUIVALENT_FIELDS:
        assert getattr(a.config, field) == getattr(b.config, field), field


@pytest.mark.parametrize("name", SOURCES)
def test_detects_and_loads_every_dialect(name, tmp_path):
    writer, kwargs, dialect = SOURCES[name]
    folder = writer(tmp_path / name)
    assert detect_checkpoint_dialect(folder) == dialect
    draft = Eagle3DraftModel.from_pretrained(folder, **kwargs)
    assert draft.config.target_layer_ids == DEFAULT_IDS  # ModelOpt/SGLang [1, 3, 4] are layer outputs
    assert draft.config.head_dim == 8 and not draft.training
    assert draft.t2d.sum() == draft.config.draft_vocab_size
    expected_theta = {"sglang": 1e6, "speculators": 2.5e5}.get(name, 10000.0)  # official: none given -> 10000
    assert draft.config.rope_parameters["rope_theta"] == expected_theta
    assert draft.has_embedding == (name == "speculators")
    draft.attach_target(make_tiny_target())
    out = draft(torch.tensor([[1, 2, 3]]), target_hidden_states=torch.randn(1, 3, 3 * H))
    assert out.logits.shape == (1, 3, draft.config.draft_vocab_size)


def test_conversion_keeps_tensors_and_converts_fields(tmp_path):
    official = load_source("official-bin", tmp_path)
    raw = head_tensors("midlayer.")
    assert torch.equal(official.layers[0].self_attn.q_proj.weight, raw["midlayer.self_attn.q_proj.weight"])
    assert official.fc.weight.dtype == torch.float16 and official.d2t.dtype == torch.long
    assert official.config.max_position_embeddings == 2048 and official.config.target_num_hidden_layers == LAYERS
    full = load_source("official-full-vocab", tmp_path)  # V_d == V without d2t/t2d -> identity maps
    assert torch.equal(full.d2t, torch.zeros(VOCAB, dtype=torch.long)) and bool(full.t2d.all())
    modelopt = load_source("modelopt", tmp_path)  # t2d rebuilt from d2t, YaRN kept
    assert torch.equal(modelopt.t2d, t2d_from_d2t(modelopt.d2t, VOCAB))
    assert modelopt.config.rope_parameters["rope_type"] == "yarn" and modelopt.config.rope_parameters["factor"] == 2
    speculators = load_source("speculators", tmp_path)
    assert speculators.config.target_model_name_or_path == "tiny/target"
    embedding = speculators.get_input_embeddings()
    assert not embedding.weight.requires_grad and embedding.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("name", SOURCES)
@pytest.mark.parametrize("dialect", WRITABLE_DIALECTS)
def test_round_trip_through_every_dialect(name, dialect, tmp_path):
    draft = load_source(name, tmp_path)
    if not draft.has_embedding:
        draft.attach_target(make_tiny_target())
    draft.config.target_model_name_or_path = draft.config.target_model_name_or_path or "tiny/target"
    if name == "modelopt" and dialect == "eagle":
        with pytest.raises(ValueError, match="rope_type='yarn'"):  # the official code knows linear/dynamic only
            save_in_dialect(draft, tmp_path / "out", dialect)
        return
    out = save_in_dialect(draft, tmp_path / "out", dialect)
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    reloaded = Eagle3DraftModel.from_pretrained(out)
    assert_same_head(draft, reloaded)
    if dialect == "speculators":
        shipped = draft.get_input_embeddings().weight.to(draft.fc.weight.dtype)  # written in the head's dtype
        assert torch.equal(reloaded.get_input_embeddings().weight, shipped)
    if dialect in ("speculators", "eagle3_hf"):
        return
    again = save_in_dialect(reloaded, tmp_path / "again", "eagle3_hf")  # ... and back to the native format
    assert_same_head(draft, Eagle3DraftModel.from_pretrained(again))


def test_written_layouts_match_what_engines_load(tmp_path):
    draft = load_source("sglang", tmp_path)
    draft.attach_target(make_tiny_target())
    draft.config.target_model_name_or_path = "tiny/target"
    for dialect in ("eagle", "sglang", "speculators"):
        folder = save_in_dialect(draft, tmp_path / "out" / dialect, dialect, max_position_embeddings=256)
        config = json.loads((folder / "config.json").read_text())
        with safe_open(folder / "model.safetensors", framework="pt") as reader:
            keys = set(reader.keys())
        assert config["architectures"] == [ARCHITECTURES[dialect]]
        assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= keys
        if dialect == "speculators":
            layer = config["transformer_layer_config"]
            assert config["speculators_model_type"] == "eagle3" and "embed_tokens.weight" in keys
            assert config["eagle_aux_hidden_state_layer_ids"] == DEFAULT_IDS
            assert config["speculators_config"]["verifier"]["name_or_path"] == draft.config.target_model_name_or_path
            assert {f"layers.0.{part}" for part in LAYER_PARTS} <= keys
        else:
            layer = config
            assert config["model_type"] == "llama" and "embed_tokens.weight" not in keys
            assert keys == {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | {
                f"midlayer.{part}" for part in LAYER_PARTS
            }
            assert config["eagle_aux_hidden_state_layer_ids"] == DEFAULT_IDS  # vLLM: layer inputs
            assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # SGLang: layer outputs
            assert config["draft_vocab_size"] == DRAFT_VOCAB
            # the official code copies the target's embedding only when the key is absent
            assert ("target_hidden_size" in config) is (dialect == "sglang")
        assert layer["rope_theta"] == 1e6 and layer["max_position_embeddings"] == 256
        assert layer["tie_word_embeddings"] is False


def test_native_folders_resolve_through_auto_classes(tmp_path, tiny_draft):
    folder = save_in_dialect(tiny_draft, tmp_path / "native", "eagle3_hf")
    assert type(AutoConfig.from_pretrained(folder)) is Eagle3Config
    loaded = AutoModel.from_pretrained(folder)
    assert type(loaded) is Eagle3DraftModel
    assert_same_head(tiny_draft, loaded)
    attached = Eagle3DraftModel.from_pretrained(folder, target=make_tiny_target())
    assert attached.has_embedding and not loaded.has_embedding
    with pytest.raises(ValueError, match="target_layer_ids"):
        Eagle3DraftModel.from_pretrained(folder, target=make_tiny_target(num_hidden_layers=4))


def test_hub_ids_resolve_through_the_huggingface_cache(tmp_path):
    """A Hub id is fetched with snapshot_download into the normal cache layout; offline, the cache answers."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "cache" / "models--someone--eagle3-tiny"
    write_official(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    draft = Eagle3DraftModel.from_pretrained(
        "someone/eagle3-tiny", cache_dir=tmp_path / "cache", local_files_only=True, target_num_hidden_layers=LAYERS
    )
    assert torch.equal(draft.fc.weight, head_tensors("midlayer.")["fc.weight"])
    with pytest.raises(OSError, match="someone/missing"):
        Eagle3DraftModel.from_pretrained("someone/missing", cache_dir=tmp_path / "cache", local_files_only=True)


def test_dtype_and_device_kwargs(tmp_path):
    folder = write_sglang(tmp_path / "sglang")
    draft = Eagle3DraftModel.from_pretrained(folder, dtype=torch.float32, device_map="cpu")
    assert draft.fc.weight.dtype == torch.float32 and draft.fc.weight.device.type == "cpu"
    assert draft.d2t.dtype == torch.long and draft.t2d.dtype == torch.bool
    assert draft.rotary_emb.inv_freq.dtype == torch.float32
    assert torch.equal(draft.fc.weight, head_tensors("midlayer.", dtype=torch.bfloat16, seed=1)["fc.weight"].float())
    draft, info = Eagle3DraftModel.from_pretrained(folder, torch_dtype=torch.float16, output_loading_info=True)
    assert draft.fc.weight.dtype == torch.float16 and not any(info.values())
    with pytest.raises(ValueError, match="placed whole"):
        Eagle3DraftModel.from_pretrained(folder, device_map={"fc": "cpu", "layers": "cpu"})
    with pytest.raises(TypeError, match="not_a_field"):
        Eagle3DraftModel.from_pretrained(folder, not_a_field=1)


def test_target_kwarg_fills_layer_count_and_attaches(tmp_path):
    target = make_tiny_target()
    draft = Eagle3DraftModel.from_pretrained(write_official(tmp_path / "official"), target=target)
    assert draft.config.target_layer_ids == DEFAULT_IDS and draft.has_embedding
    assert draft.config.max_position_embeddings == target.config.max_position_embeddings  # not the 2048 placeholder
    with pytest.raises(ValueError, match="vocab_size mismatch"):  # attach_target's check, through a converted head
        Eagle3DraftModel.from_pretrained(tmp_path / "official", target=make_tiny_target(vocab_size=96))
    draft = Eagle3DraftModel.from_pretrained(tmp_path / "official", target_num_hidden_layers=12)
    with pytest.raises(ValueError, match="defaults for a 12-layer target"):
        draft.attach_target(target)


def long_context_logits(draft: Eagle3DraftModel, target) -> torch.Tensor:
    """Logits at positions 1000-1003, past the 2048 placeholder's scale for a factor-4 dynamic RoPE."""
    if not draft.has_embedding:
        draft.attach_target(target)
    hidden = torch.randn(1, 4, 3 * H, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(1000, 1004)[None]
    return draft(torch.tensor([[1, 5, 9, 20]]), target_hidden_states=hidden, position_ids=positions).logits


# name -> (rope_scaling of an official head (2048 positions), max_position_embeddings after target= (256 positions))
ROPE_SCALINGS = {
    "dynamic": ({"type": "dynamic", "factor": 4.0}, 2048),  # transformers rescales beyond max_position_embeddings
    "yarn": ({"rope_type": "yarn", "factor": 4.0}, 2048),  # original_max_position_embeddings defaults to it
    "linear": ({"type": "linear", "factor": 4.0}, 256),  # does not read it: the target's value replaces 2048
    # Reads only original_max_position_embeddings, which defaults to the file's max_position_embeddings.
    "llama3": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}, 256),
}


@pytest.mark.parametrize("rope", ROPE_SCALINGS)
def test_the_target_never_changes_the_rope(rope, tmp_path):
    scaling, positions = ROPE_SCALINGS[rope]
    # The official code implements only linear and dynamic scaling: the others are SGLang heads of that layout.
    dialect = {} if rope in ("dynamic", "linear") else {"architectures": ["LlamaForCausalLMEagle3"]}
    folder = write_official(tmp_path / "official", rope_scaling=scaling, **dialect)
    target = make_tiny_target()
    plain = Eagle3DraftModel.from_pretrained(folder, target_num_hidden_layers=LAYERS, dtype=torch.float32)
    attached = Eagle3DraftModel.from_pretrained(folder, target=target, dtype=torch.float32)
    expected = long_context_logits(plain, target)
    assert torch.equal(long_context_logits(attached, target), expected)
    assert attached.config.max_position_embeddings == positions
    assert attached.config.rope_parameters == plain.config.rope_parameters
    if rope in ("yarn", "llama3"):
        assert attached.config.rope_parameters["original_max_position_embeddings"] == 2048  # the file's
    # Exports reload to the same outputs; the CLI writes the target's value except where the RoPE reads it.
    target.save_pretrained(tmp_path / "target")
    assert convert_command.main([str(folder), str(tmp_path / "cli"), "--to", "sglang", "--target",
                                 str(tmp_path / "target"), "--dtype", "float32"]) == 0  # fmt: skip
    written = json.loads((tmp_path / "cli" / "config.json").read_text())["max_position_embeddings"]
    assert written == (2048 if rope == "dynamic" else 256)
    for out in (save_in_dialect(attached, tmp_path / "api", "sglang"), tmp_path / "cli"):
        assert torch.equal(long_context_logits(Eagle3DraftModel.from_pretrained(out), target), expected)
    if rope == "dynamic":
        with pytest.raises(ValueError, match="would change its outputs"):
            save_in_dialect(plain, tmp_path / "refused", "sglang", max_position_embeddings=256)
        assert not (tmp_path / "refused").exists()
    else:
        out = save_in_dialect(plain, tmp_path / "resized", "sglang", max_position_embeddings=256)
        assert torch.equal(long_context_logits(Eagle3DraftModel.from_pretrained(out), target), expected)


def test_modelopt_without_lm_head_needs_the_target(tmp_path):
    folder = write_modelopt(tmp_path / "modelopt", lm_head=False)
    with pytest.raises(CheckpointFormatError, match="no lm_head.weight"):
        Eagle3DraftModel.from_pretrained(folder)
    target = make_tiny_target()
    draft = Eagle3DraftModel.from_pretrained(folder, target=target)
    assert torch.equal(draft.lm_head.weight, target.lm_head.weight)


def corrupt(tmp_path, name, edit_config=None, edit_tensors=None):
    """Write the `name` fixture, then rewrite its config and/or tensors."""
    folder = SOURCES[name][0](tmp_path / name)
    if edit_config:
        config = json.loads((folder / "config.json").read_text())
        edit_config(config)
        (folder / "config.json").write_text(json.dumps(config))
    if edit_tensors:
        (file,) = weight_files(folder)
        tensors = load_checkpoint_tensors([file])
        edit_tensors(tensors)
        save_file(tensors, file) if file.suffix == ".safetensors" else torch.save(tensors, file)
    return folder


def _set(key, value):
    return lambda mapping: mapping.__setitem__(key, value)


BAD_INPUTS = {  # name -> (fixture, config edit, tensor edit, error pattern)
    "missing tensor": ("official-bin", None, lambda t: t.pop("midlayer.mlp.up_proj.weight"),
                       r"missing \['midlayer.mlp.up_proj.weight'\]"),
    "wrong shape": ("sglang", None, _set("fc.weight", torch.zeros(H, 2 * H)), r"fc.weight has shape \(32, 64\)"),
    "d2t length": ("sglang", _set("draft_vocab_size", 48), None, "d2t has shape.*draft_vocab_size=48"),
    "t2d count": ("official-bin", None, lambda t: t["t2d"].__setitem__(0, not t["t2d"][0]),
                  "t2d marks 6[35] target ids but config.json says draft_vocab_size=64"),
    "d2t order": ("modelopt", None, lambda t: t.__setitem__("d2t", t["d2t"].flip(0)), "strictly increasing"),
    "no hidden_size": ("sglang", lambda c: c.pop("hidden_size"), None, "missing required field hidden_size"),
    "no layer count": ("official-bin", None, None, "target_num_hidden_layers=L"),
    "switch of another engine": ("modelopt", _set("norm_output", True), None,
                                 "norm_output=true, but the modelopt dialect's engine has no such switch"),
    "sliding layers without a window": ("speculators", lambda c: c["transformer_layer_config"].update(
        layer_types=["sliding_attention"]), None, "draft_sliding_window=None: sliding layers need a positive window"),
    "id conventions disagree": ("sglang", _set("eagle_aux_hidden_state_layer_ids", [1, 3, 4]), None, "different"),
    "eagle-1": ("modelopt", lambda c: c.pop("draft_vocab_size"),
                lambda t: [t.pop(k) for k in list(t) if "hidden_norm" in k], "EAGLE-1/EAGLE-2"),
    "string size": ("sglang", _set("draft_vocab_size", "64"), None, "field 'draft_vocab_size'"),
    "float size": ("speculators", lambda c: c["transformer_layer_config"].__setitem__("hidden_size", 32.0), None,
                   r"transformer_layer_config.hidden_size=32.0 is not a positive integer"),
    "unknown rope type": ("sglang", _set("rope_scaling", {"type": "su", "factor": 2.0}), None, "rope_type='su'"),
    "rope without factor": ("sglang", _set("rope_scaling", {"type": "linear"}), None, "required keys.*'factor'"),
    "rope_scaling string": ("sglang", _set("rope_scaling", "linear"), None, "rope_scaling must be a JSON object"),
    "eagle_config list": ("sglang", _set("eagle_config", [1, 3, 4]), None, "eagle_config must be a JSON object"),
    "fractional d2t": ("sglang", None, lambda t: t.__setitem__("d2t", t["d2t"].float() + 0.5), "non-integer"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_raises_naming_the_problem(case, tmp_path):
    fixture, edit_config, edit_tensors, pattern = BAD_INPUTS[case]
    folder = corrupt(tmp_path, fixture, edit_config, edit_tensors)
    kwargs = {} if case == "no layer count" else SOURCES[fixture][1]
    with pytest.raises(CheckpointFormatError, match=pattern) as error:
        Eagle3DraftModel.from_pretrained(folder, **kwargs)
    assert str(folder) in str(error.value)


@pytest.mark.parametrize("flag", ["--max-position-embeddings", "--speculative-tokens", "--target-num-hidden-layers"])
def test_cli_refuses_a_count_below_one(flag, tmp_path, capsys):
    with pytest.raises(SystemExit):
        convert_command.main([str(tmp_path / "any"), str(tmp_path / "out"), "--to", "sglang", flag, "-5"])
    assert f"{flag} -5: expected >= 1" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_cli_reports_a_bad_config_on_one_line(tmp_path, capsys):
    folder = corrupt(tmp_path, "sglang", _set("draft_vocab_size", "64"))
    assert convert_command.main([str(folder), str(tmp_path / "out"), "--to", "eagle3_hf"]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"eagle3-hf convert: error: {folder / 'config.json'}: ")
    native = save_in_dialect(load_source("sglang", tmp_path / "b"), tmp_path / "native", "eagle3_hf")
    config = json.loads((native / "config.json").read_text())
    (native / "config.json").write_text(json.dumps({**config, "hidden_size": 32.0}))
    with pytest.raises(CheckpointFormatError, match="invalid config.json.*hidden_size"):
        Eagle3DraftModel.from_pretrained(native)
    # a config of another size than the weights: named as such, also on the command line
    (native / "config.json").write_text(json.dumps({**config, "intermediate_size": 2 * config["intermediate_size"]}))
    with pytest.raises(CheckpointFormatError, match="tensors of another shape than config.json"):
        Eagle3DraftModel.from_pretrained(native)
    capsys.readouterr()
    assert convert_command.main([str(native), str(tmp_path / "out2"), "--to", "sglang"]) == 1
    assert "tensors of another shape than config.json" in capsys.readouterr().err
    assert not (tmp_path / "out2").exists()


def test_both_weight_files_warn_and_safetensors_is_read(tmp_path, caplog):
    folder = write_official(tmp_path / "official")  # pytorch_model.bin
    other = head_tensors("midlayer.", seed=5)
    save_file(other, folder / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger="eagle3_hf.checkpoints.files"):
        draft = Eagle3DraftModel.from_pretrained(folder, target_num_hidden_layers=LAYERS)
    assert torch.equal(draft.fc.weight, other["fc.weight"])
    assert "pytorch_model.bin and model.safetensors; reading model.safetensors" in caplog.text


def test_unknown_folders_and_truncated_files(tmp_path):
    target_folder = tmp_path / "a-target"
    make_tiny_target().save_pretrained(target_folder)
    with pytest.raises(CheckpointFormatError, match="not an EAGLE-3 checkpoint in any known dialect"):
        Eagle3DraftModel.from_pretrained(target_folder)
    native = save_in_dialect(load_source("sglang", tmp_path / "b"), tmp_path / "native", "eagle3_hf")
    for folder in (write_sglang(tmp_path / "sglang"), native):
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
        with pytest.raises(CheckpointFormatError, match=re.escape(str(folder / "model.safetensors")) + ".*truncated"):
            Eagle3DraftModel.from_pretrained(folder)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointFormatError, match="no config.json"):
        Eagle3DraftModel.from_pretrained(tmp_path / "empty")


def test_native_loads_are_strict_too(tmp_path, tiny_draft):
    folder = save_in_dialect(tiny_draft, tmp_path / "native", "eagle3_hf")
    tensors = load_checkpoint_tensors([folder / "model.safetensors"])
    tensors.pop("norm.weight")
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointFormatError, match="norm.weight"):
        Eagle3DraftModel.from_pretrained(folder)


def test_official_export_needs_the_default_taps(tmp_path):
    target = make_tiny_target()  # L = 8: the official code taps [2, 4, 5]
    shifted = Eagle3DraftModel.from_target(target, draft_vocab_size=DRAFT_VOCAB, target_layer_ids=[1, 4, 7])
    with pytest.raises(ValueError, match=r"always taps \[2, L//2, L-3\].*\[1, 4, 7\].*L=8"):
        save_in_dialect(shifted, tmp_path / "official", "eagle")
    assert not (tmp_path / "official").exists()
    save_in_dialect(shifted, tmp_path / "sglang", "sglang")  # SGLang and vLLM read the recorded ids
    shifted.config.target_num_hidden_layers = None  # L unknown: [1, 4, 7] are the defaults of no L
    with pytest.raises(ValueError, match="always taps"):
        save_in_dialect(shifted, tmp_path / "official", "eagle")


def test_native_card_names_the_destination(tmp_path, tiny_draft):
    folder = save_in_dialect(tiny_draft, tmp_path / "myhead", "eagle3_hf")
    card = (folder / "README.md").read_text()
    assert ".partial-" not in card and f'draft_id = "{folder}"' in card


def test_export_refusals_and_atomic_writes(tmp_path, tiny_draft, monkeypatch):
    deep = Eagle3DraftModel.from_target(make_tiny_target(), num_hidden_layers=2)
    for dialect in ("eagle", "sglang"):
        with pytest.raises(ValueError, match="exactly one layer"):
            save_in_dialect(deep, tmp_path / "deep", dialect)
    headless = load_source("sglang", tmp_path)
    with pytest.raises(ValueError, match="embed_tokens.weight"):
        save_in_dialect(headless, tmp_path / "spec", "speculators")
    assert not (tmp_path / "deep").exists() and not (tmp_path / "spec").exists()

    save_in_dialect(tiny_draft, tmp_path / "out", "sglang")
    with pytest.raises(FileExistsError, match="overwrite"):
        save_in_dialect(tiny_draft, tmp_path / "out", "eagle")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(writing, "save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_in_dialect(tiny_draft, tmp_path / "out", "eagle", overwrite=True)
    with pytest.raises(KeyboardInterrupt):
        save_in_dialect(tiny_draft, tmp_path / "fresh", "eagle")
    assert sorted(p.name for p in tmp_path.iterdir() if "out" in p.name or "fresh" in p.name) == ["out"]
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    monkeypatch.undo()
    save_in_dialect(tiny_draft, tmp_path / "out", "eagle", overwrite=True)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_cli_round_trip(tmp_path, capsys):
    official = write_official(tmp_path / "official")
    target = tmp_path / "target"
    make_tiny_target().save_pretrained(target)
    assert cli_main(["convert", str(official), str(tmp_path / "sglang"), "--to", "sglang",
                     "--target-num-hidden-layers", "8"]) == 0  # fmt: skip
    assert "(eagle) ->" in capsys.readouterr().out
    assert convert_command.main([str(tmp_path / "sglang"), str(tmp_path / "spec"), "--to", "speculators",
                                 "--target", str(target)]) == 0  # fmt: skip
    assert convert_command.main([str(tmp_path / "spec"), str(tmp_path / "back"), "--to", "eagle"]) == 0
    first = Eagle3DraftModel.from_pretrained(official, target_num_hidden_layers=LAYERS)
    last = Eagle3DraftModel.from_pretrained(tmp_path / "back")
    for key, tensor in first.state_dict().items():
        assert torch.equal(tensor, last.state_dict()[key]), key
    spec = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert spec["speculators_config"]["verifier"] == {
        "name_or_path": str(target),
        "architectures": ["LlamaForCausalLM"],
    }
    assert spec["transformer_layer_config"]["max_position_embeddings"] == 256  # the target's, not 2048
    assert convert_command.main([str(official), str(tmp_path / "x"), "--to", "sglang"]) == 1
    assert "target_num_hidden_layers" in capsys.readouterr().err
    assert convert_command.DIALECTS == WRITABLE_DIALECTS


def test_module_entry_point_help(monkeypatch, capsys):
    """`python -m eagle3_hf.commands.convert --help`, run in-process (a subprocess would re-import torch)."""
    monkeypatch.setattr(sys, "argv", ["convert", "--help"])
    monkeypatch.delitem(sys.modules, "eagle3_hf.commands.convert")  # as a fresh `python -m` would find it
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("eagle3_hf.commands.convert", run_name="__main__")
    assert exit_info.value.code == 0 and "--to {eagle3_hf,eagle,sglang,speculators}" in capsys.readouterr().out


# ------------------------------------------------------------------------------- the official loader's rules
# SafeAILab/EAGLE is not installable; these pin what its loader does with the files we write (eagle/model/
# configs.py EConfig, cnets.py Model and LlamaAttention._init_rope, ea_model.py EaModel.__init__; checked at
# commit cb7e084), as listed in docs/checkpoint-dialects.md.
def official_export(tmp_path, **overrides):
    """An `eagle` export of a converted official head (3 default taps, head_dim = H / heads) with `overrides`."""
    draft = Eagle3DraftModel.from_pretrained(write_official(tmp_path / "src"), target_num_hidden_layers=LAYERS)
    for key, value in overrides.items():
        setattr(draft.config, key, value)
    folder = save_in_dialect(draft, tmp_path / "out", "eagle", max_position_embeddings=256)
    with safe_open(folder / "model.safetensors", framework="pt") as reader:
        keys = set(reader.keys())
    return draft, json.loads((folder / "config.json").read_text()), keys


def test_official_exports_leave_target_hidden_size_out_so_the_target_embedding_is_copied(tmp_path):
    # cnets.Model: `if load_emb and not hasattr(config, "target_hidden_size")` copies the target's embedding;
    # with the key present (even null) it keeps a random one and loads non-strictly, silently.
    _, config, keys = official_export(tmp_path)
    assert "target_hidden_size" not in config and "embed_tokens.weight" not in keys
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= keys


def test_official_exports_refuse_a_wider_target_without_an_own_embedding(tmp_path):
    draft = Eagle3DraftModel.from_pretrained(write_official(tmp_path / "src"), target_num_hidden_layers=LAYERS)
    draft.config.target_hidden_size = 2 * H  # a config-only change: the refusal comes before the tensors
    with pytest.raises(ValueError, match="target_hidden_size=64 != hidden_size=32"):
        save_in_dialect(draft, tmp_path / "out", "eagle")
    assert not (tmp_path / "out").exists()


def test_official_exports_write_rope_scaling_as_econfig_requires_it(tmp_path):
    # EConfig._rope_scaling_validation: a dict of exactly two fields, type in (linear, dynamic), factor a float > 1;
    # LlamaAttention._init_rope then builds the scaled RoPE at base 10000, without reading rope_theta.
    rope = {"rope_type": "linear", "factor": 2, "rope_theta": 10000.0}
    _, config, _ = official_export(tmp_path, rope_parameters=rope)
    assert config["rope_scaling"] == {"type": "linear", "factor": 2.0}
    assert isinstance(config["rope_scaling"]["factor"], float) and "rope_theta" not in config
    _, config, _ = official_export(tmp_path / "default")
    assert config["rope_scaling"] is None and config["rope_theta"] == 10000.0  # read when rope_scaling is null


def test_official_exports_refuse_what_the_official_rope_would_compute_differently(tmp_path):
    draft = Eagle3DraftModel.from_pretrained(write_official(tmp_path / "src"), target_num_hidden_layers=LAYERS)
    draft.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}
    with pytest.raises(ValueError, match="base 10000 whenever rope_scaling is set"):
        save_in_dialect(draft, tmp_path / "out", "eagle")
    draft.config.rope_parameters = {"rope_type": "linear", "factor": 1.0, "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="float > 1"):
        save_in_dialect(draft, tmp_path / "out", "eagle")


def test_official_heads_with_rope_scaling_read_at_base_10000_whatever_rope_theta_says(tmp_path, caplog):
    scaled = {"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_theta": 500000.0}
    with caplog.at_level(logging.WARNING):
        draft = Eagle3DraftModel.from_pretrained(write_official(tmp_path / "a", **scaled), target_num_hidden_layers=8)
    assert draft.config.rope_parameters == {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert "rope_theta=500000.0 is ignored" in caplog.text
    # our earlier three-key form is read the same way; a type the official code lacks is refused
    three = {"rope_scaling": {"type": "linear", "rope_type": "linear", "factor": 2.0}}
    draft = Eagle3DraftModel.from_pretrained(write_official(tmp_path / "b", **three), target_num_hidden_layers=8)
    assert draft.config.rope_parameters["rope_type"] == "linear"
    with pytest.raises(CheckpointFormatError, match="implements only"):
        Eagle3DraftModel.from_pretrained(
            write_official(tmp_path / "c", rope_scaling={"type": "yarn", "factor": 2.0}), target_num_hidden_layers=8
        )


def test_official_exports_drop_the_maps_of_a_full_vocabulary_and_ship_a_trained_embedding(tmp_path):
    # EaModel deletes d2t/t2d when vocab_size == draft_vocab_size; a shipped embed_tokens.weight replaces the
    # target's copy (load_state_dict(strict=False) runs after it), so the official code runs a trained embedding.
    draft = Eagle3DraftModel.from_target(make_tiny_target(), trained_embedding=True)  # full vocabulary
    torch.nn.init.normal_(draft.embed_tokens.weight)
    folder = save_in_dialect(draft, tmp_path / "out", "eagle")
    tensors = load_checkpoint_tensors(weight_files(folder))
    assert "d2t" not in tensors and "t2d" not in tensors
    torch.testing.assert_close(tensors["embed_tokens.weight"], draft.embed_tokens.weight)
    loaded = Eagle3DraftModel.from_pretrained(folder, target=make_tiny_target())
    assert loaded.config.trained_embedding
    torch.testing.assert_close(loaded.get_input_embeddings().weight, draft.embed_tokens.weight)


def test_single_layer_dialects_refuse_what_their_engines_cannot_run(tmp_path, tiny_target):
    cases = {
        "eagle": {"normed_feedback": True, "fc_norm": True, "num_hidden_layers": 2},
        "sglang": {
            "normed_feedback": True, "norm_before_fc": True, "norm_before_residual": True, "trained_embedding": True,
            "num_hidden_layers": 2, "target_layer_ids": [2, 4, 5, 8],
        },
    }  # fmt: skip
    for dialect, overrides in cases.items():
        for key, value in overrides.items():
            config = {"draft_vocab_size": DRAFT_VOCAB, key: value}
            if key == "num_hidden_layers":
                config["draft_layer_types"] = None
            draft = Eagle3DraftModel.from_target(tiny_target, **config)
            with pytest.raises(ValueError, match=key if key != "target_layer_ids" else "exactly 3"):
                save_in_dialect(draft, tmp_path / dialect / key, dialect)
    sliding = Eagle3DraftModel.from_target(
        tiny_target, draft_vocab_size=DRAFT_VOCAB, draft_layer_types=["sliding_attention"], draft_sliding_window=8
    )
    with pytest.raises(ValueError, match="draft_layer_types"):
        save_in_dialect(sliding, tmp_path / "sliding", "sglang")
    spec_forge_style = Eagle3DraftModel.from_target(
        tiny_target, draft_vocab_size=DRAFT_VOCAB, norm_before_lm_head=False
    )
    spec_forge_style.config.target_model_name_or_path = "tiny/target"
    with pytest.raises(ValueError, match="speculators always computes the logits after the final norm"):
        save_in_dialect(spec_forge_style, tmp_path / "nonorm", "speculators")


def test_switches_an_engine_lacks_are_refused_on_read(tmp_path):
    with pytest.raises(CheckpointFormatError, match="norm_before_fc=true, but the sglang dialect's engine"):
        Eagle3DraftModel.from_pretrained(write_sglang(tmp_path / "a", norm_before_fc=True))
    with pytest.raises(CheckpointFormatError, match="layer_types has sliding_attention layers"):
        Eagle3DraftModel.from_pretrained(
            write_sglang(tmp_path / "b", layer_types=["sliding_attention"], sliding_window=4)
        )
    with pytest.raises(CheckpointFormatError, match="fc_norm='yes' is not true/false"):
        Eagle3DraftModel.from_pretrained(write_sglang(tmp_path / "c", fc_norm="yes"))
    # SpecForge's norm_output (default true) is whether the logits are computed after the final norm
    assert Eagle3DraftModel.from_pretrained(write_sglang(tmp_path / "d")).config.norm_before_lm_head
    head = Eagle3DraftModel.from_pretrained(write_sglang(tmp_path / "e", norm_output=False)).config
    assert not head.norm_before_lm_head and not head.normed_feedback
    # speculators' norm_output feeds norm(h) back instead
    head = Eagle3DraftModel.from_pretrained(write_speculators(tmp_path / "f", norm_output=True)).config
    assert head.normed_feedback and head.norm_before_lm_head
