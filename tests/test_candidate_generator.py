"""Chain mode: `Eagle3CandidateGenerator` inside Transformers' own `_assisted_decoding`."""

import copy

import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, Qwen3Config
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator
from transformers.generation.utils import _speculative_sampling

from eagle3_hf import Eagle3DraftModel
from eagle3_hf.generation import original_generate  # the stock generate, without the package's wrapper
from eagle3_hf.generation.candidate_generator import DEFAULT_NUM_ASSISTANT_TOKENS, Eagle3CandidateGenerator, chain_mode
from eagle3_hf.modeling_eagle3 import Eagle3DraftOutput
from eagle3_hf.target import gather_target_features
from eagle3_hf.vocab_maps import maps_from_token_ids

from .conftest import make_tiny_target


PROMPTS = [[1, 5, 9, 20, 33], [7, 7, 7], [3, 100, 64, 2, 90, 11, 12, 50]]


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine they thrash (10-20x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def greedy(target, ids, **kwargs):
    return original_generate(target, ids, do_sample=False, **kwargs)


def chain_greedy(target, draft, inputs, num_assistant_tokens=3, **kwargs):
    """Greedy `generate` through chain mode; returns `(sequences, generator)`."""
    with chain_mode(target, draft, num_assistant_tokens=num_assistant_tokens) as generators:
        out = original_generate(target, inputs, assistant_model=draft, do_sample=False, **kwargs)
    assert len(generators) == 1
    return out, generators[0]


class OracleDraft(Eagle3DraftModel):
    """Test-only head whose logits are the target's own next-token logits for the tokens it was fed.

    It keeps the head's real cache and hidden-state bookkeeping (via `super().forward`) and replaces the logits with
    those of a private copy of the target run on `[first_token] + fed tokens`, so it proposes exactly what the
    target will pick iff the generator feeds the right tokens at the right draft positions. It also compares the
    target features it receives with the true features of that context (`feature_errors`). Draft positions in
    `corrupt_positions` get a wrong proposal (rolled logits), to force rejections.
    """

    def bind(self, target, first_token: int, corrupt_positions=()):
        object.__setattr__(self, "oracle_target", copy.deepcopy(target))
        self.first_token, self.corrupt_positions = first_token, set(corrupt_positions)
        self.fed: list[int] = []
        self.feature_errors: list[float] = []
        return self

    def forward(self, input_ids, target_hidden_states=None, hidden_states=None, cache=None, **kwargs):
        base = super().forward(input_ids, target_hidden_states, hidden_states, cache=cache, **kwargs)
        past = cache.get_seq_length() - input_ids.shape[1]
        self.fed = self.fed[:past] + input_ids[0].tolist()
        context = torch.tensor([[self.first_token] + self.fed])
        layer_ids = self.config.target_layer_ids
        out = self.oracle_target(context, output_hidden_states=layer_ids)
        if target_hidden_states is not None:  # the pair at draft position j carries the feature of position j
            expected = gather_target_features(out.hidden_states, layer_ids)[:, past : past + input_ids.shape[1]]
            self.feature_errors.append((target_hidden_states - expected).abs().max().item())
        # draft position j predicts x[j + 2], the target's prediction at position j + 1
        target_ids = self.draft_to_target_ids(torch.arange(self.config.draft_vocab_size))
        logits = out.logits[:, past + 1 :, target_ids]
        for i in range(logits.shape[1]):
            if past + i in self.corrupt_positions:
                logits[:, i] = logits[:, i].roll(1, dims=-1)
        keep = kwargs.get("logits_to_keep", 0)
        return Eagle3DraftOutput(logits=logits[:, -keep:] if keep else logits, hidden_states=base.hidden_states)


def make_oracle(target, prompt, max_new_tokens, draft_vocab_size=64, corrupt_positions=(), **generate_kwargs):
    """An `OracleDraft` whose draft vocabulary covers the target's greedy continuation of `prompt` (so `d2t` is a
    real, non-identity map) filled up with the lowest other ids."""
    torch.manual_seed(1)
    draft = OracleDraft.from_target(target, draft_vocab_size=draft_vocab_size)
    reference = greedy(target, prompt, max_new_tokens=max_new_tokens, **generate_kwargs)
    needed = reference[0].unique()
    others = torch.tensor([i for i in range(target.config.vocab_size) if i not in set(needed.tolist())])
    d2t, t2d = maps_from_token_ids(
        torch.cat([needed, others[: draft_vocab_size - len(needed)]]), target.config.vocab_size
    )
    draft.set_vocab_maps(d2t, t2d)
    assert bool((draft.d2t != 0).any())
    return draft.bind(target, int(prompt[0, 0]), corrupt_positions), reference


def chisquare_pvalue(observed: list[int], probabilities: list[float]) -> float:
    """Goodness of fit of counts to probabilities (renormalised: float32 softmaxes do not sum to exactly 1)."""
    stats = pytest.importorskip("scipy.stats")
    total = sum(probabilities)
    expected = [sum(observed) * q / total for q in probabilities]
    return stats.chisquare(observed, expected).pvalue


def count_forwards(model):
    calls = []
    handle = model.register_forward_hook(lambda *args: calls.append(1))
    return calls, handle


# ------------------------------------------------------------------------------------------------ exactness
@pytest.mark.parametrize("config_class", [LlamaConfig, Qwen3Config])
@pytest.mark.parametrize("seed", [0, 3])
def test_greedy_output_equals_plain_greedy_with_an_untrained_head(config_class, seed):
    target = make_tiny_target(config_class, seed=seed)
    torch.manual_seed(seed + 1)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64)
    for prompt, chain_length in zip(PROMPTS, (1, 3, 5)):
        ids = torch.tensor([prompt])
        out, generator = chain_greedy(target, draft, ids, num_assistant_tokens=chain_length, max_new_tokens=12)
        torch.testing.assert_close(out, greedy(target, ids, max_new_tokens=12), rtol=0, atol=0)
        assert len(generator.num_matches) > 0 and set(generator.num_candidates) <= set(range(1, chain_length + 1))


@pytest.mark.parametrize("config_class", [LlamaConfig, Qwen3Config])
def test_oracle_head_gets_every_proposal_accepted(config_class):
    target = make_tiny_target(config_class, seed=2)
    ids = torch.tensor([PROMPTS[0]])
    draft, reference = make_oracle(target, ids, max_new_tokens=14)
    calls, handle = count_forwards(target)
    try:
        out, generator = chain_greedy(target, draft, ids, num_assistant_tokens=4, max_new_tokens=14)
    finally:
        handle.remove()
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    assert generator.num_matches == generator.num_candidates and sum(generator.num_matches) > 0
    # 14 tokens: 1 from the prefill, then rounds of 4 accepted + 1 bonus (5, 5) and a last round of 2 + 1
    assert generator.num_candidates == [4, 4, 2]
    assert len(calls) == 1 + 3 < 14
    assert generator.mean_accepted_length == pytest.approx(13 / 3)
    assert max(draft.feature_errors) < 1e-4


def test_partial_acceptance_rolls_back_the_draft_cache():
    target = make_tiny_target(seed=4)
    ids = torch.tensor([PROMPTS[2]])
    # wrong proposals at a few draft positions: rounds end early, with 0 < matches < candidates
    draft, reference = make_oracle(target, ids, max_new_tokens=20, corrupt_positions=(10, 13, 14, 21))
    out, generator = chain_greedy(target, draft, ids, num_assistant_tokens=4, max_new_tokens=20)
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    partial = [m for m, c in zip(generator.num_matches, generator.num_candidates) if 0 < m < c]
    assert partial and 0 in generator.num_matches and max(generator.num_matches) == 4
    # after each rollback the accepted tokens were re-encoded with the right target features
    assert max(draft.feature_errors) < 1e-4


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 7])
def test_length_limits(max_new_tokens):
    target = make_tiny_target(seed=5)
    ids = torch.tensor([PROMPTS[0]])
    draft, reference = make_oracle(target, ids, max_new_tokens=max_new_tokens)
    out, generator = chain_greedy(target, draft, ids, num_assistant_tokens=5, max_new_tokens=max_new_tokens)
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    # a chain is drafted only when it fits: k = min(5, max_new_tokens_left - 1)
    assert generator.num_matches == generator.num_candidates == {1: [], 2: [], 3: [1], 7: [5]}[max_new_tokens]


def test_eos_inside_an_accepted_chain_stops_there():
    target = make_tiny_target(seed=6)
    ids = torch.tensor([PROMPTS[1]])
    free_run = greedy(target, ids, max_new_tokens=16)
    eos = int(free_run[0, ids.shape[1] + 6])  # a token first produced mid-chain
    draft, reference = make_oracle(target, ids, max_new_tokens=16, eos_token_id=eos)
    out, _ = chain_greedy(target, draft, ids, num_assistant_tokens=5, max_new_tokens=16, eos_token_id=eos)
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    assert out.shape[1] < free_run.shape[1] and int(out[0, -1]) == eos


def test_logits_processors_shape_the_proposals():
    # With a repetition penalty the target's choice differs from its raw argmax; the oracle's raw logits only
    # propose the right tokens because the generator runs them through the same processors.
    target = make_tiny_target(seed=7)
    ids = torch.tensor([PROMPTS[1]])
    kwargs = dict(max_new_tokens=12, repetition_penalty=3.0, no_repeat_ngram_size=2)
    assert not torch.equal(greedy(target, ids, max_new_tokens=12), greedy(target, ids, **kwargs))
    draft, reference = make_oracle(target, ids, **kwargs)
    out, generator = chain_greedy(target, draft, ids, num_assistant_tokens=4, **kwargs)
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    assert generator.num_matches == generator.num_candidates


def test_left_padding_gives_the_head_the_unpadded_inputs():
    # Same continuation, and the head sees exactly what it sees without the padding: equal draft logits per call.
    target = make_tiny_target(seed=8)
    torch.manual_seed(0)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64)
    ids = torch.tensor([PROMPTS[0]])
    padded, mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], -1), torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    logits = {"plain": [], "padded": []}
    for name, inputs in (("plain", dict(inputs=ids)), ("padded", dict(inputs=padded, attention_mask=mask))):
        handle = draft.register_forward_hook(
            lambda module, args, out, name=name: logits[name].append(out.logits[:, -1])
        )
        try:
            out, _ = chain_greedy(target, draft, max_new_tokens=10, **inputs)
        finally:
            handle.remove()
        torch.testing.assert_close(out[:, -10:], greedy(target, ids, max_new_tokens=10)[:, -10:], rtol=0, atol=0)
    assert len(logits["plain"]) == len(logits["padded"]) > 1
    torch.testing.assert_close(torch.cat(logits["padded"]), torch.cat(logits["plain"]), rtol=1e-4, atol=1e-4)


def test_return_dict_with_scores_and_all_hidden_states():
    target = make_tiny_target(seed=9)
    ids = torch.tensor([PROMPTS[0]])
    draft, _ = make_oracle(target, ids, max_new_tokens=8)
    kwargs = dict(max_new_tokens=8, return_dict_in_generate=True, output_scores=True, output_hidden_states=True)
    out, generator = chain_greedy(target, draft, ids, **kwargs)
    reference = greedy(target, ids, **kwargs)
    torch.testing.assert_close(out.sequences, reference.sequences, rtol=0, atol=0)
    assert len(out.scores) == 8 and generator.model_kwargs_overrides == {"output_hidden_states": True}
    # every layer's hidden states come back (a superset of the tapped layers), one tuple per step as plain greedy's
    assert len(out.hidden_states) == len(reference.hidden_states) == 8
    for step, (ours, plain) in enumerate(zip(out.hidden_states, reference.hidden_states, strict=True)):
        assert len(ours) == len(plain) == target.config.num_hidden_layers + 1, step
        for layer, (mine, theirs) in enumerate(zip(ours, plain, strict=True)):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5, msg=f"step {step}, layer {layer}")


# -------------------------------------------------------------------------------------------------- sampling
def test_candidate_logits_are_one_hot_and_keep_speculative_sampling_exact():
    """`get_candidates` driven by hand: prefill pass-through, then one-hot target-vocab candidate logits (q(x) = 1),
    with which the stock `_speculative_sampling` emits exactly the target distribution p at the first position."""
    target = make_tiny_target(seed=12)
    ids = torch.tensor([PROMPTS[0]])
    draft, _ = make_oracle(target, ids, max_new_tokens=4)
    generator = Eagle3CandidateGenerator(draft, GenerationConfig(max_length=ids.shape[1] + 4), num_assistant_tokens=2)
    first = generator.get_candidates(ids, model_kwargs={}, model_outputs=None, is_first_iteration=True)
    assert first[0] is ids and first[1] is None

    with torch.no_grad():
        prefill = target(ids, **generator.model_kwargs_overrides)
        sequence = torch.cat([ids, prefill.logits[:, -1:].argmax(-1)], dim=-1)
        candidates, candidate_logits = generator.get_candidates(
            sequence, model_kwargs={}, model_outputs=prefill, is_first_iteration=False, n_last_matches=0
        )
        # the oracle proposes the target's own greedy continuation
        torch.testing.assert_close(candidates, greedy(target, ids, max_new_tokens=3), rtol=0, atol=0)
        new_logits = target(candidates).logits[:, -3:].float()
    assert candidate_logits.shape == (1, 2, target.config.vocab_size)
    assert torch.equal(candidate_logits.argmax(-1), candidates[:, -2:])
    assert torch.isinf(candidate_logits).sum() == 2 * (target.config.vocab_size - 1)

    # top-3 target distribution at the first drafted position; the proposal is its argmax
    new_logits = new_logits.masked_fill(new_logits < new_logits.topk(3, dim=-1).values[..., -1:], -float("inf"))
    p = new_logits[0, 0].softmax(-1)
    support = p.nonzero().flatten().tolist()
    torch.manual_seed(0)
    trials = 3000
    counts = dict.fromkeys(support, 0)
    for _ in range(trials):
        tokens, _ = _speculative_sampling(candidates, candidate_logits, 2, new_logits)
        counts[int(tokens[0, 0])] += 1
    assert 0.05 < p[candidates[0, -2]] < 0.95  # both the accept and the residual branch are exercised
    assert chisquare_pvalue([counts[t] for t in support], [float(p[t]) for t in support]) > 1e-3


@pytest.mark.slow
def test_sampled_generate_matches_the_target_distribution():
    """End to end through `generate(do_sample=True)`: three new tokens under top-k=2 (the prefill's token, a verified
    proposal accepted with p(x) or resampled from the residual, then the bonus) against the exact distribution of
    the 8 outcomes, by a seeded chi-square test."""
    target = make_tiny_target(seed=10)
    ids = torch.tensor([PROMPTS[0]])
    draft, _ = make_oracle(target, ids, max_new_tokens=3)

    def top2(context):
        values, tokens = target(context).logits[0, -1].topk(2)
        return tokens.tolist(), values.softmax(-1).tolist()

    exact = {}
    with torch.no_grad():
        for t1, p1 in zip(*top2(ids)):
            for t2, p2 in zip(*top2(torch.cat([ids, torch.tensor([[t1]])], -1))):
                for t3, p3 in zip(*top2(torch.cat([ids, torch.tensor([[t1, t2]])], -1))):
                    exact[(t1, t2, t3)] = p1 * p2 * p3

    torch.manual_seed(0)
    samples, counts, accepted = 150, dict.fromkeys(exact, 0), 0
    with chain_mode(target, draft, num_assistant_tokens=1) as generators:
        for _ in range(samples):
            out = original_generate(target, ids, assistant_model=draft, do_sample=True, top_k=2, max_new_tokens=3)
            counts[tuple(out[0, -3:].tolist())] += 1
            accepted += generators[-1].num_matches[0]
    assert 0 < accepted < samples
    assert chisquare_pvalue([counts[k] for k in exact], list(exact.values())) > 1e-3


# ------------------------------------------------------------------------------------------------ chain_mode
def test_chain_mode_removes_its_override_after_the_call_and_after_an_error(tiny_target, tiny_draft):
    ids = torch.tensor([PROMPTS[0]])
    assert "_get_candidate_generator" not in tiny_target.__dict__
    with chain_mode(tiny_target, tiny_draft):
        assert "_get_candidate_generator" in tiny_target.__dict__
        original_generate(tiny_target, ids, assistant_model=tiny_draft, do_sample=False, max_new_tokens=4)
    assert "_get_candidate_generator" not in tiny_target.__dict__

    def failing_draft(*args, **kwargs):
        raise RuntimeError("draft failed")

    with pytest.MonkeyPatch.context() as patch, pytest.raises(RuntimeError, match="draft failed"):
        patch.setattr(tiny_draft, "forward", failing_draft)
        with chain_mode(tiny_target, tiny_draft):
            original_generate(tiny_target, ids, assistant_model=tiny_draft, do_sample=False, max_new_tokens=4)
    assert "_get_candidate_generator" not in tiny_target.__dict__

    def earlier_override(**kwargs):  # a previous instance-level override must survive chain_mode
        raise AssertionError("not called")

    tiny_target._get_candidate_generator = earlier_override
    with pytest.raises(RuntimeError, match="boom"):
        with chain_mode(tiny_target, tiny_draft):
            raise RuntimeError("boom")
    assert tiny_target.__dict__["_get_candidate_generator"] is earlier_override


def test_other_strategies_keep_the_stock_generators(tiny_target, tiny_draft):
    ids = torch.tensor([PROMPTS[1]])
    built = []
    stock = type(tiny_target)._get_candidate_generator

    def spy(self, **kwargs):
        built.append(stock(self, **kwargs))
        return built[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(tiny_target), "_get_candidate_generator", spy)
        with chain_mode(tiny_target, tiny_draft) as generators:
            out = original_generate(tiny_target, ids, prompt_lookup_num_tokens=3, do_sample=False, max_new_tokens=8)
    assert generators == [] and [type(g) for g in built] == [PromptLookupCandidateGenerator]
    torch.testing.assert_close(out, greedy(tiny_target, ids, max_new_tokens=8), rtol=0, atol=0)


def test_each_generate_call_starts_with_a_fresh_draft_cache():
    target = make_tiny_target(seed=11)
    first, second = torch.tensor([PROMPTS[0]]), torch.tensor([PROMPTS[2]])
    draft, _ = make_oracle(target, second, max_new_tokens=10, corrupt_positions=(9, 12))
    alone, generator_alone = chain_greedy(target, draft, second, num_assistant_tokens=3, max_new_tokens=10)
    with chain_mode(target, draft, num_assistant_tokens=3) as generators:
        original_generate(target, first, assistant_model=draft, do_sample=False, max_new_tokens=10)
        draft.first_token = int(second[0, 0])
        after = original_generate(target, second, assistant_model=draft, do_sample=False, max_new_tokens=10)
    assert generators[0].draft_cache is not generators[1].draft_cache
    torch.testing.assert_close(after, alone, rtol=0, atol=0)
    assert generators[1].num_matches == generator_alone.num_matches


def test_num_assistant_tokens_resolution_and_overrides(tiny_target, tiny_draft):
    ids = torch.tensor([PROMPTS[0]])

    def built(**chain_kwargs):
        with chain_mode(tiny_target, tiny_draft, **chain_kwargs) as generators:
            original_generate(tiny_target, ids, assistant_model=tiny_draft, do_sample=False, max_new_tokens=3)
        return generators[0]

    assert built().num_assistant_tokens == DEFAULT_NUM_ASSISTANT_TOKENS
    assert built(generation_config=GenerationConfig(num_assistant_tokens=2)).num_assistant_tokens == 2
    assert (
        built(generation_config=GenerationConfig(num_assistant_tokens=2), num_assistant_tokens=7).num_assistant_tokens
        == 7
    )
    # EAGLE layer ids are HF hidden_states indices: requested as they are
    assert built().model_kwargs_overrides == {"output_hidden_states": tiny_draft.config.target_layer_ids}
    with pytest.raises(ValueError, match="num_assistant_tokens"):
        built(num_assistant_tokens=0)


def test_chain_mode_attaches_the_embedding_and_checks_the_head(tiny_target):
    torch.manual_seed(0)
    draft = Eagle3DraftModel(Eagle3DraftModel.config_from_target(tiny_target, draft_vocab_size=64))
    assert not draft.has_embedding
    with chain_mode(tiny_target, draft):
        assert draft.get_input_embeddings() is tiny_target.get_input_embeddings()

    deeper = make_tiny_target(seed=1, num_hidden_layers=12)
    misfit = Eagle3DraftModel.from_target(deeper)  # reads layer 9 of a 12-layer target
    with pytest.raises(ValueError, match="target_layer_ids"):
        with chain_mode(tiny_target, misfit):
            pass
    with pytest.raises(TypeError, match="Eagle3DraftModel"):
        with chain_mode(tiny_target, deeper):
            pass
    assert "_get_candidate_generator" not in tiny_target.__dict__
    with pytest.raises(ValueError, match="attach_target"):
        Eagle3CandidateGenerator(
            Eagle3DraftModel(draft.config), GenerationConfig(max_length=10), num_assistant_tokens=3
        )
