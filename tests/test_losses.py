import math

import pytest
import torch
import torch.nn.functional as F

from eagle3_hf.training.losses import (
    chain_acceptance_lengths,
    feature_regression_per_position,
    shift_left,
    soft_label_loss,
    soft_label_loss_per_sample,
    soft_targets,
    step_correct,
    step_loss_mask,
    step_targets,
    ttt_attention_mask,
)


def _matrix(text: str) -> torch.Tensor:
    """Parse an ASCII 0/1 matrix; `|` separators are ignored."""
    rows = [line.replace("|", " ").split() for line in text.strip().splitlines()]
    return torch.tensor([[int(v) for v in row] for row in rows], dtype=torch.bool)


class TestShift:
    def test_shift_left_zero_fills_the_end(self):
        x = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
        assert shift_left(x, 0) is x
        assert shift_left(x, 1).tolist() == [[2, 3, 4, 0], [6, 7, 8, 0]]
        assert shift_left(x, 4).tolist() == [[0, 0, 0, 0], [0, 0, 0, 0]]
        assert shift_left(x, 9).tolist() == [[0, 0, 0, 0], [0, 0, 0, 0]]
        with pytest.raises(ValueError, match="shift"):
            shift_left(x, -1)

    def test_shift_keeps_trailing_dims(self):
        x = torch.arange(12.0).reshape(1, 3, 4)
        torch.testing.assert_close(shift_left(x, 1)[0, 0], x[0, 1])
        assert shift_left(x, 1)[0, 2].abs().sum() == 0

    def test_step_loss_mask_reads_token_t_plus_2_plus_k(self):
        # loss_mask[i] marks token i; step k at index t predicts x[t + 2 + k].
        loss_mask = torch.tensor([[0, 0, 0, 1, 1, 1]])
        assert step_loss_mask(loss_mask, 0).int().tolist() == [[0, 1, 1, 1, 0, 0]]
        assert step_loss_mask(loss_mask, 2).int().tolist() == [[1, 1, 0, 0, 0, 0]]
        assert step_loss_mask(loss_mask, 4).int().tolist() == [[0, 0, 0, 0, 0, 0]]


class TestAttentionMask:
    def test_reference_example_t3_k2(self):
        expected = _matrix(
            """
            1 0 0 | 1 0 0 | 1 0 0
            1 1 0 | 0 1 0 | 0 1 0
            1 1 1 | 0 0 1 | 0 0 1
            """
        )
        mask = ttt_attention_mask(torch.ones(1, 3), step=2)
        assert mask.shape == (1, 1, 3, 9) and mask.dtype == torch.bool
        assert torch.equal(mask[0, 0], expected)

    def test_padding_keys_are_hidden_but_a_query_always_sees_itself(self):
        # Sample with its last two positions padded: no query sees padded key 2, but query 2 and 3 (themselves
        # padding, never in the loss) see their own key so that no row is empty.
        mask = ttt_attention_mask(torch.tensor([[1, 1, 0, 0]]), step=1)[0, 0]
        expected = _matrix(
            """
            1 0 0 0 | 1 0 0 0
            1 1 0 0 | 0 1 0 0
            1 1 1 0 | 0 0 1 0
            1 1 0 1 | 0 0 0 1
            """
        )
        assert torch.equal(mask, expected)
        assert mask.any(-1).all()


class TestLoss:
    def test_soft_targets_restrict_and_renormalise(self):
        t2d = torch.tensor([True, False, True, True])
        logits = torch.tensor([[[1.0, 5.0, 2.0, 0.0], [3.0, 0.0, 1.0, 0.0]]])
        probs, in_vocab = soft_targets(logits, t2d)
        torch.testing.assert_close(probs[0, 0], torch.softmax(torch.tensor([1.0, 2.0, 0.0]), -1))
        assert probs.dtype == torch.float32
        assert in_vocab.tolist() == [[False, True]]  # argmax id 1 is outside the draft vocab

    def test_hard_targets_are_one_hot_at_the_restricted_top_1(self):
        t2d = torch.tensor([True, False, True, True])
        logits = torch.tensor([[[1.0, 5.0, 2.0, 0.0], [3.0, 0.0, 1.0, 0.0]]])
        probs, in_vocab = soft_targets(logits, t2d, hard=True)
        assert probs.tolist() == [[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]]  # draft ids 1 (target 2) and 0 (target 0)
        assert in_vocab.tolist() == [[False, True]]  # the first position stays masked: its top-1 is outside

    def test_step_targets_alignment(self):
        # probs[t] is a one-hot on draft id t (target P[t]); loss_mask marks tokens 2..5.
        seq = 6
        probs = torch.eye(seq)[None]
        in_vocab = torch.ones(1, seq, dtype=torch.bool)
        in_vocab[0, 3] = False
        loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
        p1, mask1 = step_targets(probs, in_vocab, loss_mask, step=1)
        assert p1[0].argmax(-1)[:4].tolist() == [2, 3, 4, 5]  # P[t + 1 + k]
        assert p1[0, 4:].abs().sum() == 0
        # loss_mask[t + 3] = [1, 1, 1, 0, 0, 0]; in_vocab[t + 2] = [1, 0, 1, 1, 0, 0]
        assert mask1.int().tolist() == [[1, 0, 1, 0, 0, 0]]

    def test_soft_label_loss_averages_over_all_positions(self):
        torch.manual_seed(0)
        logits = torch.randn(2, 3, 5)
        probs = torch.softmax(torch.randn(2, 3, 5), -1)
        mask = torch.tensor([[1, 0, 1], [0, 0, 1]], dtype=torch.bool)
        expected = 0.0
        for b in range(2):
            for t in range(3):
                if mask[b, t]:
                    expected -= (probs[b, t] * F.log_softmax(logits[b, t], -1)).sum() / 6
        torch.testing.assert_close(soft_label_loss(logits, probs, mask), expected)
        assert soft_label_loss_per_sample(logits, probs, mask).shape == (2,)

    def test_one_hot_target_gives_cross_entropy(self):
        logits = torch.tensor([[[2.0, 0.0, -1.0]]])
        probs = torch.tensor([[[0.0, 1.0, 0.0]]])
        mask = torch.ones(1, 1, dtype=torch.bool)
        torch.testing.assert_close(soft_label_loss(logits, probs, mask), F.cross_entropy(logits[0], torch.tensor([1])))

    def test_correct_and_acceptance_lengths(self):
        logits = torch.tensor([[[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]]])
        probs = torch.tensor([[[0.2, 0.8], [0.3, 0.7], [0.9, 0.1]]])
        mask = torch.tensor([[True, True, False]])
        assert step_correct(logits, probs, mask).tolist() == [[True, False, False]]
        correct = torch.tensor(
            [
                [[1, 1, 0, 1]],  # step 0
                [[1, 0, 1, 1]],  # step 1
                [[0, 1, 1, 1]],  # step 2
            ],
            dtype=torch.bool,
        )
        # the chain stops at the first miss; +1 for the target's bonus token
        assert chain_acceptance_lengths(correct).tolist() == [[3.0, 2.0, 1.0, 4.0]]

    def test_feature_regression_is_smooth_l1_mean_over_hidden(self):
        draft = torch.tensor([[[0.0, 0.0], [3.0, 0.0]]])
        target = torch.tensor([[[0.5, 0.0], [0.0, 0.0]]])
        per_position = feature_regression_per_position(draft, target)
        assert per_position.shape == (1, 2)
        assert math.isclose(per_position[0, 0].item(), 0.5 * 0.25 / 2)  # 0.5 x^2 below 1
        assert math.isclose(per_position[0, 1].item(), 2.5 / 2)  # |x| - 0.5 above 1
        with pytest.raises(ValueError, match="hidden_size"):
            feature_regression_per_position(draft, torch.zeros(1, 2, 3))
