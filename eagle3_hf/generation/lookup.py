"""Prompt lookup for the draft tree: the tokens that followed an earlier occurrence of the sequence's last n-gram.

Code, quotes and edits repeat spans of the prompt verbatim, where a learned head is unsure but copying is right
(Transformers' `prompt_lookup_num_tokens` rests on the same observation). `eagle3_generate(...,
tree_lookup_tokens=m)` grafts such a continuation of up to `m` tokens onto each round's draft tree
(`tree.graft_chain`); the target verifies it with the rest of the tree, so decoding stays lossless.
"""

import torch


LOOKUP_NGRAM_SIZES = (3, 2, 1)
# A one-token match is weak evidence (common tokens recur everywhere) and every grafted token takes the place of one
# of the head's nodes, so its chain is cut to this many tokens. Measured on SmolLM2's shipped head (12 / 4 / 8 tree
# with 6 lookup tokens, T=0, 96 new tokens; session 35), tau over MT-bench's 80 first turns rose from 2.794 to 2.814,
# over 40 HumanEval prompts from 3.758 to 3.786 and over 40 held-out ShareGPT ones from 3.058 to 3.062; 1 and 3 tokens
# were no better, nor dropping one-token matches (2.803 and 2.816, 2.802 on MT-bench).
SINGLE_TOKEN_MATCH_TOKENS = 2


def prompt_lookup_chain(
    sequence: torch.LongTensor,
    max_tokens: int,
    ngram_sizes: tuple[int, ...] = LOOKUP_NGRAM_SIZES,
    single_token_match_tokens: int = SINGLE_TOKEN_MATCH_TOKENS,
) -> torch.LongTensor:
    """Up to `max_tokens` tokens that followed the most recent earlier occurrence of the last n tokens.

    The longest n of `ngram_sizes` with a match wins; the sequence's own suffix is not a match. A match of one
    token returns at most `single_token_match_tokens` tokens.

    Args:
        sequence (`torch.LongTensor` of shape `(L,)`): the prompt and everything generated, ending with the root.
        max_tokens (`int`): the most tokens to return.
        ngram_sizes (`tuple[int, ...]`, *optional*): the n tried, longest first.
        single_token_match_tokens (`int`, *optional*): the most tokens a one-token match returns.

    Returns:
        `torch.LongTensor` of shape `(m,)` with `0 <= m <= max_tokens`; empty when nothing matches.

    Example:
        >>> prompt_lookup_chain(torch.tensor([5, 6, 7, 8, 9, 5, 6]), 3).tolist()
        [7, 8, 9]
    """
    length = sequence.shape[0]
    if max_tokens > 0:
        for n in ngram_sizes:
            if length <= n:
                continue
            earlier = sequence.unfold(0, n, 1)[:-1]  # (length - n, n): every n-gram but the suffix itself
            hits = torch.nonzero((earlier == sequence[-n:]).all(dim=1)).flatten()
            if hits.numel():
                start = int(hits[-1]) + n
                length = max_tokens if n > 1 else min(max_tokens, single_token_match_tokens)
                return sequence[start : start + length]
    return sequence.new_empty(0)
