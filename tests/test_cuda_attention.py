"""`speculative_attention_kernels`: a speculative `generate` call runs with cuDNN's SDPA off on CUDA, and only there;
the tree and draft functions also enter it on their own."""

from contextlib import contextmanager, nullcontext

import pytest
import torch

from eagle3_hf.generation import candidate_generator, cuda_attention, decoding, drafter, integration, verify
from eagle3_hf.generation.cuda_attention import speculative_attention_kernels


@pytest.fixture
def cudnn_sdp_restored():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_cuda_context_turns_cudnn_sdpa_off_and_restores_it(cudnn_sdp_restored):
    torch.backends.cuda.enable_cudnn_sdp(True)
    flash, efficient = torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled()
    with speculative_attention_kernels(torch.device("cuda", 0)):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        # the caller's other choices stay as they were
        assert torch.backends.cuda.flash_sdp_enabled() == flash
        assert torch.backends.cuda.mem_efficient_sdp_enabled() == efficient
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_cuda_context_restores_the_setting_after_an_error(cudnn_sdp_restored):
    torch.backends.cuda.enable_cudnn_sdp(True)
    with pytest.raises(RuntimeError, match="inside"):
        with speculative_attention_kernels("cuda"):
            raise RuntimeError("inside")
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_a_caller_who_turned_cudnn_off_keeps_it_off(cudnn_sdp_restored):
    torch.backends.cuda.enable_cudnn_sdp(False)
    with speculative_attention_kernels("cuda"):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert not torch.backends.cuda.cudnn_sdp_enabled()


def test_inside_leave_sdpa_to_torch_the_choice_is_torchs(cudnn_sdp_restored):
    torch.backends.cuda.enable_cudnn_sdp(True)
    with cuda_attention.leave_sdpa_to_torch():
        with speculative_attention_kernels("cuda"):
            assert torch.backends.cuda.cudnn_sdp_enabled()
    with speculative_attention_kernels("cuda"):  # and only inside it
        assert not torch.backends.cuda.cudnn_sdp_enabled()


def test_cpu_context_changes_nothing(cudnn_sdp_restored):
    torch.backends.cuda.enable_cudnn_sdp(True)
    with speculative_attention_kernels(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled()


@pytest.fixture
def forwards_in_context(monkeypatch):
    """Tracks whether a forward runs inside `speculative_attention_kernels` (`entered["depth"] > 0`), wherever the
    generation modules enter it; the context is taken as if on CUDA."""
    entered = {"depth": 0}

    @contextmanager
    def spy(device):
        entered["depth"] += 1
        try:
            with cuda_attention._without_cudnn_sdpa():
                yield
        finally:
            entered["depth"] -= 1

    for module in (verify, drafter, candidate_generator, decoding, integration):
        monkeypatch.setattr(module, "speculative_attention_kernels", spy)
    return entered


def _record_forwards(model, inside: list, entered: dict):
    """Hook `model`'s forward to note, per call, its query length and whether it ran inside the context."""

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids")
        inside.append((ids.shape[1], entered["depth"] > 0, torch.backends.cuda.cudnn_sdp_enabled()))

    return model.register_forward_pre_hook(hook, with_kwargs=True)


def _generate_forwards(target, draft, entered: dict, **generate_kwargs) -> tuple[list, list]:
    """(target forwards, head forwards) of one greedy `generate` call on a 12-token prompt, with `draft` as the
    assistant (None: plain `generate`), as `_record_forwards` notes them."""
    target_calls, head_calls = [], []
    handles = [_record_forwards(target, target_calls, entered)]
    if draft is not None:
        handles.append(_record_forwards(draft, head_calls, entered))
        generate_kwargs["assistant_model"] = draft
    try:
        prompt = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
        target.generate(prompt, do_sample=False, **generate_kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return target_calls, head_calls


def _tree_generate_forwards(target, draft, entered: dict) -> tuple[list, list]:
    """`_generate_forwards` of a small greedy tree call: 12 new tokens, 6-node trees of depth 3."""
    return _generate_forwards(target, draft, entered, max_new_tokens=12, tree_total_tokens=6, tree_depth=3)


def test_tree_decoding_runs_every_forward_off_cudnn(tiny_target, tiny_draft, forwards_in_context, cudnn_sdp_restored):
    torch.backends.cuda.enable_cudnn_sdp(True)
    target_calls, head_calls = _tree_generate_forwards(tiny_target, tiny_draft, forwards_in_context)
    prefill, *rounds = target_calls
    assert prefill[0] == 12 and any(call[0] == 1 for call in rounds) and any(call[0] > 1 for call in rounds)
    # the prefill, every tree and every plain step (the last round, with no room left for a draft), and the head
    assert all(inside and not cudnn for _, inside, cudnn in target_calls + head_calls), (target_calls, head_calls)
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_tree_and_draft_functions_enter_the_context_themselves(
    tiny_target, tiny_draft, forwards_in_context, cudnn_sdp_restored, monkeypatch
):
    torch.backends.cuda.enable_cudnn_sdp(True)
    monkeypatch.setattr(decoding, "speculative_attention_kernels", lambda device: nullcontext())  # the loop's own off
    target_calls, head_calls = _tree_generate_forwards(tiny_target, tiny_draft, forwards_in_context)
    prefill, *rounds = target_calls
    trees = [call for call in rounds if call[0] > 1]
    plain_steps = [call for call in rounds if call[0] == 1]
    assert not prefill[1] and plain_steps and all(not inside and cudnn for _, inside, cudnn in plain_steps)
    assert trees and all(inside and not cudnn for _, inside, cudnn in trees), target_calls
    assert head_calls and all(inside and not cudnn for _, inside, cudnn in head_calls), head_calls


def test_chain_mode_runs_every_forward_off_cudnn(tiny_target, tiny_draft, forwards_in_context, cudnn_sdp_restored):
    torch.backends.cuda.enable_cudnn_sdp(True)
    target_calls, head_calls = _generate_forwards(
        tiny_target, tiny_draft, forwards_in_context, eagle3_mode="chain", max_new_tokens=8
    )
    # the assisted loop's target verifications as well as the chain drafter's head forwards
    assert target_calls and all(inside and not cudnn for _, inside, cudnn in target_calls), target_calls
    assert head_calls and all(inside and not cudnn for _, inside, cudnn in head_calls), head_calls
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_plain_generate_keeps_the_default_backends(tiny_target, forwards_in_context, cudnn_sdp_restored):
    torch.backends.cuda.enable_cudnn_sdp(True)
    target_calls, _ = _generate_forwards(tiny_target, None, forwards_in_context, max_new_tokens=4)
    assert target_calls and all(not inside and cudnn for _, inside, cudnn in target_calls), target_calls
