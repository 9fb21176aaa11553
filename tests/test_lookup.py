"""Prompt lookup for the draft tree: which n-gram wins, where the continuation starts, and the empty cases."""

import torch

from eagle3_hf.generation.lookup import prompt_lookup_chain


def chain(tokens, max_tokens=4, **kwargs):
    return prompt_lookup_chain(torch.tensor(tokens), max_tokens, **kwargs).tolist()


def test_the_latest_occurrence_of_the_longest_ngram_wins():
    # last 3 tokens (1 2 3) occur once earlier, followed by 9; the bigram (2 3) also occurs later, followed by 7
    assert chain([1, 2, 3, 9, 8, 2, 3, 7, 1, 2, 3]) == [9, 8, 2, 3]
    assert chain([1, 2, 3, 9, 8, 2, 3, 7, 1, 2, 3], ngram_sizes=(2,)) == [7, 1, 2, 3]  # latest bigram match
    assert chain([5, 6, 4, 6], ngram_sizes=(3, 2, 1)) == [4, 6]  # falls back to the unigram 6


def test_a_one_token_match_returns_at_most_single_token_match_tokens():
    # only the last token (6) recurs: its continuation is cut to 2 tokens; a bigram match keeps max_tokens
    assert chain([6, 1, 2, 3, 4, 5, 6], max_tokens=5) == [1, 2]
    assert chain([6, 1, 2, 3, 4, 5, 6], max_tokens=5, single_token_match_tokens=4) == [1, 2, 3, 4]
    assert chain([5, 6, 1, 2, 3, 4, 5, 6], max_tokens=5) == [1, 2, 3, 4, 5]
    assert chain([6, 1, 2, 6], max_tokens=1) == [1]


def test_max_tokens_and_the_end_of_the_sequence_cut_the_chain():
    assert chain([1, 2, 3, 1, 2], max_tokens=1) == [3]
    assert chain([4, 4], max_tokens=5) == [4]  # the continuation of the only earlier 4 is the last token
    assert chain([1, 2, 3, 1, 2], max_tokens=0) == []


def test_nothing_to_find():
    assert chain([1, 2, 3, 4]) == []
    assert chain([7]) == []
    assert chain([]) == []
