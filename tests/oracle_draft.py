"""A test-only EAGLE-3 head that drafts (a noisy copy of) the target's own next-token distribution.

Random tiny heads almost never get a token accepted, which would leave the tree paths of the decoding loop
untested. `OracleDraft` runs the real head (so caches, hidden states and masks are exercised as usual) and then
replaces its logits by the target's logits for the exact sequence each query row stands for. That sequence is
rebuilt from what the drafter fed so far (one token per cache slot) and the row's attention mask: the first prompt
token (which the draft never sees), then the tokens of the slots the row may attend to, in slot order.

`noise` adds seeded Gaussian noise (in units of each row's logit standard deviation) to those logits, so the
draft's top-1 is sometimes wrong while the right token usually stays among its top-k: rounds then accept paths
through later siblings, not only first children.

`sharpen(target)` makes a random tiny target's next-token distributions peaked like a trained LM's, so drafted
trees grow deep instead of wide.
"""

import torch
from torch import nn

from eagle3_hf import Eagle3DraftModel


class OracleDraft(Eagle3DraftModel):
    """Needs `draft_vocab_size == vocab_size` (identity vocabulary maps). Call `reset(target, prompt)` before each
    `generate` call."""

    def reset(self, target, prompt: torch.LongTensor, noise: float = 0.0, seed: int = 0) -> "OracleDraft":
        if getattr(self, "_oracle_target", None) is not target:
            self._memo: dict[tuple[int, ...], torch.Tensor] = {}  # the target's logits per sequence
        object.__setattr__(self, "_oracle_target", target)
        self._first_token = int(prompt[0, 0])
        self._slots: list[int] = []
        self._noise = noise
        self._generator = torch.Generator().manual_seed(seed)
        return self

    def forward(self, input_ids, attention_mask=None, cache=None, logits_to_keep=0, **kwargs):
        past = cache.get_seq_length() if cache is not None else 0
        out = super().forward(
            input_ids, attention_mask=attention_mask, cache=cache, logits_to_keep=logits_to_keep, **kwargs
        )
        del self._slots[past:]  # the drafter cropped its temporary tree entries
        self._slots.extend(input_ids[0].tolist())
        num_queries = input_ids.shape[1]
        rows = range(num_queries - logits_to_keep if logits_to_keep else 0, num_queries)
        if attention_mask is not None and attention_mask.dim() == 4:
            visible = attention_mask[0, 0] == 0  # [q, past + q]
        else:
            visible = torch.ones(num_queries, past + num_queries, dtype=torch.bool).tril(past)
        sequences = [[self._first_token] + [self._slots[j] for j in torch.nonzero(visible[r]).flatten()] for r in rows]
        logits = self._target_logits(sequences)
        if self._noise:
            scale = self._noise * logits.std(dim=-1, keepdim=True)
            logits = logits + scale * torch.randn(logits.shape, generator=self._generator)
        out.logits = logits[None].to(out.logits.dtype)
        return out

    def _target_logits(self, sequences: list[list[int]]) -> torch.Tensor:
        """The target's next-token logits after each sequence, `(len(sequences), vocab_size)` (memoised)."""
        missing = [seq for seq in sequences if tuple(seq) not in self._memo]
        with torch.no_grad():
            for length in {len(seq) for seq in missing}:  # one batched call per length
                batch = [seq for seq in missing if len(seq) == length]
                logits = self._oracle_target(torch.tensor(batch)).logits[:, -1].float()
                self._memo.update(zip(map(tuple, batch), logits))
        return torch.stack([self._memo[tuple(seq)] for seq in sequences])


def sharpen(target, factor: float = 40.0):
    """Scale the target's output head by `factor` (untying it from the input embedding if tied)."""
    head = target.get_output_embeddings()
    head.weight = nn.Parameter(head.weight.detach() * factor, requires_grad=False)
    return target
