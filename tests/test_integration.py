"""The `generate()` wrapper: reroutes only Eagle3DraftModel assistants, leaves everything else untouched."""

import importlib

import pytest
import torch
from transformers import AutoModelForCausalLM, Llama4TextConfig, SynthIDTextWatermarkingConfig
from transformers.generation.utils import GenerationMixin

import eagle3_hf
from eagle3_hf import Eagle3DraftModel
from eagle3_hf.generation import decoding, integration, original_generate

from .conftest import TINY_TARGET_KWARGS, make_tiny_target


PROMPT = torch.tensor([[5, 17, 42, 9, 100, 3]])


@pytest.fixture(scope="module")
def pair():
    target = make_tiny_target()
    torch.manual_seed(1)
    return target, Eagle3DraftModel.from_target(target, draft_vocab_size=64)


@pytest.fixture
def calls(monkeypatch):
    """Counts calls of the tree loop."""
    counter = []
    loop = decoding.eagle3_generate

    def counting(*args, **kwargs):
        counter.append(kwargs.get("draft_model"))
        return loop(*args, **kwargs)

    counting.__signature__ = __import__("inspect").signature(loop)
    monkeypatch.setattr(integration, "eagle3_generate", counting)
    return counter


def test_wrapper_is_installed_once_and_keeps_the_original():
    assert GenerationMixin.generate is integration.generate
    assert original_generate is integration.generate._eagle3_original_generate
    assert integration.generate.__name__ == "generate" and integration.generate.__doc__ == original_generate.__doc__
    importlib.reload(integration)  # importing again never wraps the wrapper
    integration.install_generate_wrapper()
    assert GenerationMixin.generate._eagle3_original_generate is original_generate
    assert integration.original_generate is original_generate
    importlib.reload(eagle3_hf.generation)
    assert GenerationMixin.generate._eagle3_original_generate is original_generate


def test_eagle3_assistant_is_routed_to_the_tree_loop(pair, calls):
    target, draft = pair
    expected = original_generate(target, PROMPT, do_sample=False, max_new_tokens=10)
    assert torch.equal(target.generate(PROMPT, assistant_model=draft, do_sample=False, max_new_tokens=10), expected)
    # positional assistant_model (7th positional argument of generate)
    out = target.generate(PROMPT, None, None, None, None, None, draft, do_sample=False, max_new_tokens=10)
    assert torch.equal(out, expected)
    assert calls == [draft, draft]


def test_plain_calls_and_other_assistants_are_untouched(pair, calls):
    target, _ = pair
    assistant = make_tiny_target(seed=3, num_hidden_layers=2)
    expected = original_generate(target, PROMPT, assistant_model=assistant, do_sample=False, max_new_tokens=10)
    out = target.generate(PROMPT, assistant_model=assistant, do_sample=False, max_new_tokens=10)
    assert torch.equal(out, expected)
    plain = target.generate(PROMPT, do_sample=False, max_new_tokens=10)
    assert torch.equal(plain, original_generate(target, PROMPT, do_sample=False, max_new_tokens=10))
    assert torch.equal(plain, expected)  # assisted greedy is lossless too
    assert calls == []


def test_chain_mode_runs_the_stock_assisted_loop(pair, calls):
    target, draft = pair
    expected = original_generate(target, PROMPT, do_sample=False, max_new_tokens=10)
    out = target.generate(PROMPT, assistant_model=draft, eagle3_mode="chain", do_sample=False, max_new_tokens=10)
    assert torch.equal(out, expected) and calls == []
    assert "_get_candidate_generator" not in vars(target)  # the instance hook is removed on exit


def test_clear_errors(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="eagle3_mode must be one of"):
        target.generate(PROMPT, assistant_model=draft, eagle3_mode="beam")
    with pytest.raises(ValueError, match="needs assistant_model= to be an Eagle3DraftModel"):
        target.generate(PROMPT, eagle3_mode="tree")
    with pytest.raises(ValueError, match="either an Eagle3DraftModel"):
        target.generate(PROMPT, assistant_model=draft, custom_generate=decoding.eagle3_generate)
    with pytest.raises(ValueError, match="batch size 1"):
        target.generate(PROMPT.repeat(2, 1), assistant_model=draft, max_new_tokens=4)
    with pytest.raises(ValueError, match="num_beams"):
        target.generate(PROMPT, assistant_model=draft, num_beams=2, max_new_tokens=4)


def test_flash_attention_target_is_refused(pair):
    target, draft = pair
    previous = target.config._attn_implementation
    target.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(ValueError, match="flash_attention_2.*cannot take"):
            target.generate(PROMPT, assistant_model=draft, max_new_tokens=4)
    finally:
        target.config._attn_implementation = previous


STATEFUL_PROCESSORS = {
    "guidance_scale": ("UnbatchedClassifierFreeGuidanceLogitsProcessor", 1.5),
    "watermarking_config": (
        "SynthIDTextWatermarkLogitsProcessor",
        SynthIDTextWatermarkingConfig(keys=[1, 2, 3], ngram_len=3),
    ),
}


@pytest.mark.parametrize("mode", ["tree", "chain"])
@pytest.mark.parametrize("argument", list(STATEFUL_PROCESSORS))
def test_stateful_logits_processors_are_refused(pair, mode, argument):
    """They keep state between calls; scoring rejected draft tokens would silently change the output."""
    target, draft = pair
    processor, value = STATEFUL_PROCESSORS[argument]
    with pytest.raises(ValueError, match=f"{mode} decoding cannot apply {processor} \\(generate's `{argument}=`\\)"):
        target.generate(PROMPT, assistant_model=draft, eagle3_mode=mode, max_new_tokens=4, **{argument: value})


def test_chunked_attention_target_is_refused_in_tree_mode_only():
    config = Llama4TextConfig(
        **{**TINY_TARGET_KWARGS, "head_dim": 8, "intermediate_size_mlp": 64, "num_local_experts": 2},
        attention_chunk_size=8,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    target = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    assert "chunked_attention" in config.layer_types
    torch.manual_seed(1)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64)
    with pytest.raises(ValueError, match="'chunked_attention' layers"):
        target.generate(PROMPT, assistant_model=draft, max_new_tokens=4)
    expected = original_generate(target, PROMPT, do_sample=False, max_new_tokens=8)
    out = target.generate(PROMPT, assistant_model=draft, eagle3_mode="chain", do_sample=False, max_new_tokens=8)
    assert torch.equal(out, expected)


CHAT_PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the square of a number.",
    "List three colours of the rainbow.",
]


@pytest.mark.real_model
def test_smollm2_greedy_equals_plain_generate():
    from eagle3_hf.loading import load_target

    target, tokenizer = load_target()
    draft = Eagle3DraftModel.from_target(target)
    for text in CHAT_PROMPTS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        expected = original_generate(target, ids, do_sample=False, max_new_tokens=16)
        out = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=16)
        assert torch.equal(out, expected), tokenizer.decode(out[0, ids.shape[1] :])
