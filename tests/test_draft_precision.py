"""`draft_precision`: which dtype the head drafts in, the kept low-precision copy, and that output never changes."""

import pytest
import torch

from eagle3_hf.generation import draft_precision, original_generate
from eagle3_hf.generation.draft_precision import (
    auto_draft_dtype,
    drafting_head,
    low_precision_copy,
    low_precision_pays,
    resolve_draft_dtype,
)

from .test_decoding import peaked_target, random_prompt


AUTO_DRAFT_DTYPE = auto_draft_dtype  # conftest makes every other test's heads draft in their own dtype


@pytest.fixture
def head(tiny_target, tiny_draft):
    tiny_draft.attach_target(tiny_target)
    return tiny_draft.eval()


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        (None, None),
        ("auto", None),
        ("bfloat16", torch.bfloat16),
        (torch.float16, torch.float16),
        ("float32", torch.float32),
    ],
)
def test_the_requested_dtype_is_read_from_a_dtype_or_its_name(requested, expected):
    assert resolve_draft_dtype(requested) == expected


@pytest.mark.parametrize("requested", ["int8", "bf16", torch.int64, 16])
def test_a_wrong_draft_dtype_is_refused_by_name(requested):
    with pytest.raises(ValueError, match="tree_draft_dtype"):
        resolve_draft_dtype(requested)


def test_the_copy_shares_the_embedding_leaves_the_head_alone_and_drafts_alike(head):
    copied = low_precision_copy(head, torch.bfloat16)
    assert copied is not head and copied.fc.weight.dtype == torch.bfloat16
    assert head.fc.weight.dtype == torch.float32 and head.lm_head.weight.dtype == torch.float32
    assert copied._embedding is head._embedding  # the target's, not copied
    assert not any(p.requires_grad for p in copied.parameters())
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    features = torch.randn(1, 6, head.config.num_target_features, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = head(input_ids=ids, target_hidden_states=features).logits
        logits = copied(input_ids=ids, target_hidden_states=features).logits
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits.float(), expected, atol=0.1, rtol=0.05)


def test_the_copy_is_kept_until_the_heads_weights_change(head):
    copied = low_precision_copy(head, torch.bfloat16)
    assert low_precision_copy(head, torch.bfloat16) is copied
    with torch.no_grad():
        head.fc.weight.mul_(2.0)  # in place, as an optimizer step: the kept copy is stale
    fresh = low_precision_copy(head, torch.bfloat16)
    assert fresh is not copied
    torch.testing.assert_close(fresh.fc.weight, head.fc.weight.to(torch.bfloat16))
    head.load_state_dict({name: t.clone() for name, t in head.state_dict().items()})  # new tensors: again
    assert low_precision_copy(head, torch.bfloat16) is not fresh


@pytest.mark.parametrize(("copy_seconds", "pays"), [(0.5, True), (0.95, False)])
def test_auto_drafts_in_bfloat16_only_where_it_is_timed_faster_and_times_once(head, monkeypatch, copy_seconds, pays):
    monkeypatch.setattr(draft_precision, "auto_draft_dtype", AUTO_DRAFT_DTYPE)
    timed = []

    def forward_seconds(model, rows, repeats):
        timed.append((model.fc.weight.dtype, rows))
        return copy_seconds if model.fc.weight.dtype == torch.bfloat16 else 1.0

    monkeypatch.setattr(draft_precision, "_forward_seconds", forward_seconds)
    chosen = drafting_head(head, rows=4)
    assert (chosen.fc.weight.dtype == torch.bfloat16) is pays and (chosen is head) is not pays
    assert drafting_head(head, "auto", rows=4) is chosen  # decided and kept
    assert timed == [(torch.float32, 4), (torch.bfloat16, 4)]
    assert (torch.bfloat16 in draft_precision._COPIES[head]) is pays  # no copy kept where it does not pay
    assert low_precision_pays(head, 4) is pays


def test_auto_keeps_a_head_that_is_not_float32(head, monkeypatch):
    monkeypatch.setattr(draft_precision, "auto_draft_dtype", AUTO_DRAFT_DTYPE)
    monkeypatch.setattr(draft_precision, "_forward_seconds", lambda *args: pytest.fail("a bfloat16 head is not timed"))
    head.to(torch.bfloat16)
    assert drafting_head(head) is head and drafting_head(head, torch.float32).fc.weight.dtype == torch.float32


def test_the_real_timing_runs_both_heads(head):
    seconds = [
        draft_precision._forward_seconds(model, 4, 3) for model in (head, low_precision_copy(head, torch.bfloat16))
    ]
    assert all(0 < s < 1 for s in seconds)


# ---------------------------------------------------------------------------------------------- through generate
def test_a_bfloat16_draft_keeps_greedy_output_identical_and_the_users_head_float32(tiny_draft):
    target = peaked_target()
    for seed, length in enumerate([5, 12]):
        prompt = random_prompt(length, seed)
        expected = original_generate(target, prompt, do_sample=False, max_new_tokens=20)
        out = target.generate(
            prompt,
            assistant_model=tiny_draft,
            tree_draft_dtype="bfloat16",
            do_sample=False,
            max_new_tokens=20,
            return_dict_in_generate=True,
        )
        assert torch.equal(out.sequences, expected)
    assert tiny_draft.fc.weight.dtype == torch.float32  # the head drafted through its kept copy
    assert draft_precision._COPIES[tiny_draft][torch.bfloat16][1].fc.weight.dtype == torch.bfloat16


def test_a_bfloat16_draft_samples_with_sampled_trees(tiny_draft):
    target = peaked_target()
    torch.manual_seed(0)
    out = target.generate(
        random_prompt(8, 0),
        assistant_model=tiny_draft,
        tree_draft_dtype=torch.bfloat16,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        max_new_tokens=16,
        tree_adaptive=False,
        return_dict_in_generate=True,
        output_draft_trees=True,
    )
    assert out.sequences.shape[1] == 8 + 16 and len(out.round_shapes) >= 1
    # the trees were drawn from the head's distribution (sampled trees carry it; a root-only tree, for the last token,
    # draws nothing), by the head's bfloat16 copy
    drafted = [tree for tree in out.draft_trees if tree.num_nodes > 1]
    assert drafted and all(tree.sampled is not None and tree.draft_probs is not None for tree in drafted)
    assert draft_precision._COPIES[tiny_draft][torch.bfloat16][1].fc.weight.dtype == torch.bfloat16
    assert tiny_draft.fc.weight.dtype == torch.float32


def test_generate_refuses_a_wrong_draft_dtype_by_name(tiny_target, tiny_draft):
    with pytest.raises(ValueError, match="tree_draft_dtype='int8'"):
        tiny_target.generate(
            random_prompt(5, 0), assistant_model=tiny_draft, tree_draft_dtype="int8", max_new_tokens=4
        )


@pytest.mark.parametrize("kernel", ["mkl", "onednn"])
def test_a_packed_head_is_copied_without_its_packs_and_stays_packed(head, kernel):
    from eagle3_hf.generation.cpu_packing import PackedLinear, is_packed_for, pack_linear_weights, packing_kernels

    if kernel not in packing_kernels():
        pytest.skip(f"this build of torch cannot pack with {kernel}")
    pack_linear_weights(head, [4], kernel)
    copied = low_precision_copy(head, torch.bfloat16)
    assert is_packed_for(head, 4) and isinstance(head.lm_head, PackedLinear)
    assert not any(isinstance(module, PackedLinear) for module in copied.modules())
    assert copied.lm_head.weight.dtype == torch.bfloat16
