"""The tree decoding loop: greedy equality with plain `generate`, lossless sampling, and the edges of the loop.

Targets are random tiny models made peaked (`sharpen`) like trained LMs; drafts are `OracleDraft`s (the target's
own next-token logits plus seeded noise), so rounds really accept several tokens, through later siblings too.
"""

import pytest
import torch
from transformers import (
    DynamicCache,
    Gemma3TextConfig,
    GenerationConfig,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)
from transformers.cache_utils import DynamicSlidingWindowLayer
from transformers.generation import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.streamers import BaseStreamer

from eagle3_hf import Eagle3DraftModel, eagle3_generate
from eagle3_hf.generation import decoding, original_generate
from eagle3_hf.generation.cost_model import PLAIN_STEP, PlannerConfig, RoundPlanner, TreeShape
from eagle3_hf.generation.threads import ThreadChoice, ThreadChooser

from .conftest import make_tiny_target
from .oracle_draft import OracleDraft, sharpen
from .test_tree import biased_sample_accept


ARCHITECTURES = {
    "llama": (LlamaConfig, {}, "sdpa"),
    "qwen3": (Qwen3Config, {}, "sdpa"),
    "qwen2-sliding": (Qwen2Config, dict(use_sliding_window=True, sliding_window=8, max_window_layers=4), "sdpa"),
    "mistral-sliding": (MistralConfig, dict(sliding_window=8), "sdpa"),
    "gemma3-sliding": (Gemma3TextConfig, dict(sliding_window=8, head_dim=8), "sdpa"),
    "gemma3-sliding-eager": (Gemma3TextConfig, dict(sliding_window=8, head_dim=8), "eager"),
}


def peaked_target(config_class=LlamaConfig, attn="sdpa", seed=0, **overrides):
    target = sharpen(make_tiny_target(config_class, seed=seed, attn_implementation=attn, **overrides))
    target.generation_config.eos_token_id = None  # run to max_new_tokens unless a test asks for an EOS
    return target


def random_prompt(length: int, seed: int, vocab: int = 128) -> torch.LongTensor:
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def tree_generate(target, draft, prompt, noise=0.3, **kwargs):
    """Tree decoding with the oracle draft; a fixed tree shape unless `tree_adaptive` or `tree_planner` is passed
    (these tests check the tree itself: the adaptive planner's plain steps would hide it)."""
    draft.reset(target, prompt, noise=noise, seed=int(prompt.sum()))
    if "tree_planner" not in kwargs:
        kwargs.setdefault("tree_adaptive", False)
    kwargs.setdefault("output_draft_trees", True)  # False: plain steps run without any tree (see _plain_choice)
    return target.generate(prompt, assistant_model=draft, return_dict_in_generate=True, **kwargs)


def later_sibling_used(tree, path) -> bool:
    """Whether the path goes through a child that is not its parent's first (best-ranked) child."""
    for node in path[1:].tolist():
        siblings = torch.nonzero(tree.parents == tree.parents[node]).flatten()
        if node != int(siblings[0]):
            return True
    return False


def assert_tree_paths_exercised(outputs):
    rounds = [(tree, path) for out in outputs for tree, path in zip(out.draft_trees, out.accepted_paths)]
    assert max(len(path) for _, path in rounds) >= 4, "no round accepted 3+ draft tokens"
    assert any(path.tolist() != list(range(len(path))) for _, path in rounds), "no non-contiguous accepted path"
    assert any(later_sibling_used(tree, path) for tree, path in rounds), "no path through a later sibling"


# ---------------------------------------------------------------------------------------------------- greedy
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_greedy_is_bit_identical_to_plain_generate(name):
    config_class, overrides, attn = ARCHITECTURES[name]
    target = peaked_target(config_class, attn, **overrides)
    draft = OracleDraft.from_target(target)
    outputs = []
    for seed, (length, noise) in enumerate([(5, 0.0), (12, 0.5), (20, 1.0), (3, 0.5)]):  # 12, 20 > window 8
        prompt = random_prompt(length, seed)
        expected = original_generate(target, prompt, do_sample=False, max_new_tokens=24)
        out = tree_generate(target, draft, prompt, noise, do_sample=False, max_new_tokens=24)
        assert torch.equal(out.sequences, expected), f"prompt {seed}"
        outputs.append(out)
    assert_tree_paths_exercised(outputs)


class ScriptedPlanner:
    """A planner that cycles through fixed shapes, plain steps included, whatever the rounds cost or accept."""

    def __init__(self, shapes):
        self.shapes, self.calls, self.recorded, self.confidences = list(shapes), 0, [], []
        self.tree_confidences = []

    def choose(self, confidence=None) -> TreeShape:
        self.calls += 1
        self.confidences.append(confidence)
        return self.shapes[(self.calls - 1) % len(self.shapes)]

    def record_plain(self, seconds):
        self.recorded.append((PLAIN_STEP, 0))

    def record_deferred_update(self, seconds, tokens):
        assert tokens == 0 or self.recorded[-1][0].is_plain  # only plain steps defer their draft update

    def record_tree(self, shape, accepted, tree_depth, *seconds, confidence, blind):
        self.recorded.append((shape, accepted))
        self.tree_confidences.append((confidence, blind))


SHAPE_CYCLE = [TreeShape(8, 3), PLAIN_STEP, PLAIN_STEP, TreeShape(4, 1), TreeShape(12, 5), PLAIN_STEP, TreeShape(6, 2)]


@pytest.mark.parametrize("name", ["llama", "qwen3", "mistral-sliding", "gemma3-sliding"])
def test_greedy_stays_identical_while_the_shape_changes_between_rounds(name):
    """Plain steps and trees of other sizes and depths in turn: the output is still plain generate's, and every
    tree after plain steps accepts tokens again (the deferred draft update keeps the head's cache right)."""
    config_class, overrides, attn = ARCHITECTURES[name]
    target = peaked_target(config_class, attn, **overrides)
    draft = OracleDraft.from_target(target)
    for seed, length in enumerate([5, 12, 20]):  # 12, 20 > window 8
        prompt = random_prompt(length, seed)
        planner = ScriptedPlanner(SHAPE_CYCLE)
        expected = original_generate(target, prompt, do_sample=False, max_new_tokens=30)
        out = tree_generate(target, draft, prompt, 0.0, do_sample=False, max_new_tokens=30, tree_planner=planner)
        assert torch.equal(out.sequences, expected), f"prompt {seed}"
        assert [shape.depth for shape in out.round_shapes[:7]] == [shape.depth for shape in SHAPE_CYCLE]
        trees_after_plain = [
            accepted
            for (before, _), (shape, accepted) in zip(planner.recorded, planner.recorded[1:])
            if before.is_plain and not shape.is_plain
        ]
        assert trees_after_plain and min(trees_after_plain) >= 1  # noise 0: the oracle's drafts are right
        assert all(shape.total_tokens == 1 for shape in out.round_shapes if shape.is_plain)


def test_the_planner_learns_the_heads_confidence_exactly_when_the_head_has_read_every_token():
    """Right after a tree the head's root confidence is known before the round (and the round is not blind); after
    the prefill or a plain step the head has not read the newest token, so the round is chosen blind, and a tree
    drafted then still records the confidence it was drafted from. At temperature 0.7 the head's logits are divided
    by it, as sampled trees draw them."""
    config_class, overrides, attn = ARCHITECTURES["llama"]
    target = peaked_target(config_class, attn, **overrides)
    draft = OracleDraft.from_target(target)
    prompt = random_prompt(12, 5)
    for sampling in (dict(do_sample=False), dict(do_sample=True, temperature=0.7, top_k=0)):
        planner = ScriptedPlanner(SHAPE_CYCLE)
        torch.manual_seed(0)
        out = tree_generate(target, draft, prompt, 0.0, max_new_tokens=24, tree_planner=planner, **sampling)
        shapes = [SHAPE_CYCLE[i % len(SHAPE_CYCLE)] for i in range(planner.calls)]
        after_tree = [False] + [not shape.is_plain for shape in shapes[:-1]]
        assert [c is not None for c in planner.confidences] == after_tree
        trees = [(i, shape) for i, shape in enumerate(shapes) if not shape.is_plain]
        assert len(planner.tree_confidences) == len(trees) >= 3
        for (i, _), (confidence, blind) in zip(trees, planner.tree_confidences):
            assert blind == (not after_tree[i]) and 0.0 < confidence <= 1.0
            if not blind:
                assert confidence == planner.confidences[i]
        # the output records each round's: a tree's as drafted, a plain step's as chosen (None when blind)
        drafted = iter(confidence for confidence, _ in planner.tree_confidences)
        expected = [next(drafted) if not shape.is_plain else planner.confidences[i] for i, shape in enumerate(shapes)]
        assert list(out.round_confidences) == expected


@pytest.mark.parametrize("name", ["llama", "gemma3-sliding"])
def test_plain_steps_without_returned_trees_give_plain_generates_tokens_and_scores(name):
    """Without `output_draft_trees` a plain step builds no tree at all: its token, processed scores and raw logits
    must still be plain generate's, with a sequence-dependent processor and a sliding window (prompts past 8)."""
    config_class, overrides, attn = ARCHITECTURES[name]
    target = peaked_target(config_class, attn, **overrides)
    draft = OracleDraft.from_target(target)
    kwargs = dict(do_sample=False, max_new_tokens=30, repetition_penalty=1.3, output_scores=True, output_logits=True)
    for seed, length in enumerate([5, 20]):
        prompt = random_prompt(length, seed)
        expected = original_generate(target, prompt, return_dict_in_generate=True, **kwargs)
        planner = ScriptedPlanner(SHAPE_CYCLE)
        out = tree_generate(target, draft, prompt, 0.3, tree_planner=planner, output_draft_trees=False, **kwargs)
        assert torch.equal(out.sequences, expected.sequences), f"prompt {seed}"
        assert out.draft_trees is None and sum(shape.is_plain for shape in out.round_shapes) >= 4
        for ours, theirs in zip(out.scores + out.logits, expected.scores + expected.logits):
            torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_a_generation_kept_plain_never_runs_the_draft_and_a_later_tree_reads_the_whole_prompt():
    """The prompt's encoding into the draft waits for the first tree, with the plain steps' tokens: a generation of
    plain steps only costs what plain `generate` costs; a tree after plain steps drafts right again (the oracle at
    noise 0 is accepted); and a padded prompt encoded late drafts the very trees it drafts encoded at once."""
    config_class, overrides, attn = ARCHITECTURES["llama"]
    target = peaked_target(config_class, attn, **overrides)
    draft = OracleDraft.from_target(target)
    calls = []
    draft.register_forward_pre_hook(lambda module, args: calls.append(1))
    prompt = random_prompt(12, 3)
    expected = original_generate(target, prompt, do_sample=False, max_new_tokens=20)
    plain_only = ScriptedPlanner([PLAIN_STEP])
    out = tree_generate(target, draft, prompt, 0.0, do_sample=False, max_new_tokens=20, tree_planner=plain_only)
    assert torch.equal(out.sequences, expected) and calls == []
    planner = ScriptedPlanner([PLAIN_STEP] * 5 + [TreeShape(6, 3)])
    out = tree_generate(target, draft, prompt, 0.0, do_sample=False, max_new_tokens=20, tree_planner=planner)
    assert torch.equal(out.sequences, expected) and calls
    assert [accepted for shape, accepted in planner.recorded if not shape.is_plain][0] >= 1

    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), prompt], dim=1)
    kwargs = dict(attention_mask=(padded != 0).long(), do_sample=False, max_new_tokens=20, tree_lookup_tokens=0)
    at_once = tree_generate(target, draft, padded, 0.3, tree_total_tokens=6, tree_depth=3, **kwargs)
    late = tree_generate(target, draft, padded, 0.3, tree_planner=ScriptedPlanner([TreeShape(6, 3)]), **kwargs)
    assert torch.equal(late.sequences, at_once.sequences)
    assert len(late.draft_trees) == len(at_once.draft_trees)
    for ours, theirs in zip(late.draft_trees, at_once.draft_trees):
        assert torch.equal(ours.tokens, theirs.tokens)


def test_the_adaptive_default_is_exact_and_reports_its_shapes_and_its_cost(llama_pair):
    """No tree argument: the planner decides each round (here, timed on a tiny model, whatever pays), starting from
    the default shape, pricing one plain step, and costing little itself."""
    target, draft = llama_pair
    prompt = random_prompt(9, 4)
    expected = original_generate(target, prompt, do_sample=False, max_new_tokens=40)
    draft.reset(target, prompt, noise=0.3, seed=1)
    out = target.generate(
        prompt, assistant_model=draft, do_sample=False, max_new_tokens=40, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, expected)
    default = decoding.DEFAULT_TREE
    assert out.round_shapes[0] == TreeShape(default.total_tokens, default.depth) and out.round_shapes[1].is_plain
    assert len(out.round_shapes) == len(out.num_accepted_tokens) == len(out.round_seconds["verify"])
    assert all(
        count == 1 for shape, count in zip(out.round_shapes, out.num_accepted_tokens.tolist()) if shape.is_plain
    )
    planner, total = sum(out.round_seconds["planner"]), sum(map(sum, out.round_seconds.values()))
    assert planner < 0.1 * total  # microseconds per round against milliseconds (measured: about 0.5%)

    # a planner of one's own for the same shape space, here kept blind: the same start, apart from the default's
    settings = decoding.resolve_tree_settings(draft, None, None, None)
    own = decoding.new_planner(target, settings, PlannerConfig(use_confidence=False))
    out = target.generate(
        prompt,
        assistant_model=draft,
        do_sample=False,
        max_new_tokens=40,
        return_dict_in_generate=True,
        tree_planner=own,
    )
    assert torch.equal(out.sequences, expected) and out.round_shapes[0] == own.start and own.tree_rounds >= 1


class ScriptedThreads(ThreadChooser):
    """A thread chooser that cycles through fixed `(threads, probe)` choices, whatever the rounds cost."""

    def __init__(self, script):
        super().__init__((2, 1))
        self.script, self.calls, self.recorded = script, 0, []

    def next_round(self, expected_rate=float("nan")) -> ThreadChoice:
        choice = ThreadChoice(*self.script[self.calls % len(self.script)])
        self.calls += 1
        self.current = choice.threads if not choice.probe else self.current
        return choice

    def record(self, choice, plain, seconds):
        self.recorded.append((choice, plain))


class CountingPlanner(RoundPlanner):
    """The default planner, counting the rounds it is told of and the times it forgot its costs."""

    told = forgot = 0

    def forget_costs(self):
        self.forgot += 1
        super().forget_costs()

    def record_plain(self, seconds):
        self.told += 1
        super().record_plain(seconds)

    def record_tree(self, *args, **kwargs):
        self.told += 1
        super().record_tree(*args, **kwargs)


def test_rounds_on_changing_thread_counts_stay_exact_and_restore_the_callers_count(llama_pair):
    """Each round runs with the count the chooser gives (probes are plain steps the planner is not told of), a
    planner whose costs were timed with another count starts them afresh (its start shape first), the output is
    still plain generate's, and the caller's thread count is back when the call ends."""
    target, draft = llama_pair
    prompt = random_prompt(9, 4)
    expected = original_generate(target, prompt, do_sample=False, max_new_tokens=40)
    settings = decoding.resolve_tree_settings(draft, None, None, None)
    planner = CountingPlanner([4, 8], 4, settings.top_k, TreeShape(8, 3))
    script = [(2, False)] * 4 + [(1, True), (1, True)] + [(1, False)] * 4 + [(2, True)]
    threads = ScriptedThreads(script)
    callers = torch.get_num_threads()
    draft.reset(target, prompt, noise=0.3, seed=1)
    kwargs = dict(do_sample=False, max_new_tokens=40, return_dict_in_generate=True)
    try:
        torch.set_num_threads(3)  # none of the script's counts
        out = target.generate(
            prompt, assistant_model=draft, tree_planner=planner, tree_adapt_threads=threads, **kwargs
        )
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(callers)
    assert torch.equal(out.sequences, expected)
    rounds = len(out.round_shapes)
    assert list(out.round_threads) == [script[i % len(script)][0] for i in range(rounds)]
    probes = [i for i in range(rounds) if script[i % len(script)][1]]
    assert all(out.round_shapes[i].is_plain for i in probes)
    assert planner.told == rounds - len(probes) and len(threads.recorded) == rounds
    # the first round on 1 thread and the first back on 2 are the start shape again: the costs were forgotten
    assert out.round_shapes[0] == out.round_shapes[6] == out.round_shapes[11] == planner.start


class FailingStreamer(BaseStreamer):
    """Raises at its `fail_at`-th `put`."""

    def __init__(self, fail_at):
        self.calls, self.fail_at = 0, fail_at

    def put(self, value):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("streamer failed")

    def end(self):
        pass


def test_the_callers_thread_count_is_restored_after_a_stop_at_the_prefill_and_after_an_error(llama_pair):
    """The prompt already runs with the chooser's count (1 here); the caller's (3) is back after a generation that
    stops at the prefill, and after one that fails midway (a streamer raising at its 4th call)."""
    target, draft = llama_pair
    prompt = random_prompt(9, 4)
    callers = torch.get_num_threads()

    def generate(**kwargs):
        threads = ScriptedThreads([(1, False)])
        threads.current = 1
        draft.reset(target, prompt, noise=0.3, seed=1)
        return target.generate(
            prompt, custom_generate=eagle3_generate, draft_model=draft, tree_adapt_threads=threads, **kwargs
        )

    seen = []
    hook = target.register_forward_pre_hook(lambda module, args: seen.append(torch.get_num_threads()))
    try:
        torch.set_num_threads(3)
        out = generate(max_new_tokens=1, do_sample=False, return_dict_in_generate=True)
        assert len(out.round_shapes) == 0 and seen == [1] and torch.get_num_threads() == 3
        with pytest.raises(RuntimeError, match="streamer failed"):
            generate(max_new_tokens=20, do_sample=False, eagle3_streamer=FailingStreamer(fail_at=4))
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(callers)
        hook.remove()


def test_thread_probes_between_trees_are_not_a_switch_the_planner_pays_for(llama_pair):
    """A planner that chose only trees is never told of a deferred draft update: the plain steps before a tree were
    all thread probes (ScriptedPlanner asserts that only a plain step of its own is followed by one)."""
    target, draft = llama_pair
    prompt = random_prompt(9, 4)
    expected = original_generate(target, prompt, do_sample=False, max_new_tokens=30)
    planner = ScriptedPlanner([TreeShape(6, 3)])
    threads = ScriptedThreads([(2, False)] * 3 + [(1, True)])
    draft.reset(target, prompt, noise=0.3, seed=1)
    kwargs = dict(do_sample=False, max_new_tokens=30, return_dict_in_generate=True)
    out = target.generate(prompt, assistant_model=draft, tree_planner=planner, tree_adapt_threads=threads, **kwargs)
    assert torch.equal(out.sequences, expected)
    assert sum(shape.is_plain for shape in out.round_shapes) >= 2 and len(planner.recorded) == planner.calls


def test_a_planner_forgets_costs_timed_with_another_thread_count_across_calls(llama_pair):
    """Calls with and without a chooser share a planner: costs timed on 2 threads are forgotten by a call on 1."""
    target, draft = llama_pair
    prompt = random_prompt(9, 4)
    settings = decoding.resolve_tree_settings(draft, None, None, None)
    planner = CountingPlanner([4, 8], 4, settings.top_k, TreeShape(8, 3))
    planner.forgot = 0  # its constructor starts the costs with `forget_costs()`
    callers = torch.get_num_threads()
    try:
        for count, forgot in ((2, 0), (2, 0), (1, 1), (1, 1)):
            torch.set_num_threads(count)
            draft.reset(target, prompt, noise=0.3, seed=1)
            target.generate(prompt, assistant_model=draft, tree_planner=planner, do_sample=False, max_new_tokens=8)
            assert planner.forgot == forgot, count
    finally:
        torch.set_num_threads(callers)


def test_the_default_adapts_threads_on_cpu_only_with_its_own_planner_and_several_threads(llama_pair):
    """`generate`'s default keeps one chooser per head, target and thread count; a planner of one's own, a fixed
    shape, `tree_adapt_threads=False` or a single thread leave the count alone."""
    target, draft = llama_pair
    callers = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        chooser = decoding._thread_chooser(target, draft, planner=object(), own_planner=None, adapt=None)
        assert chooser is not None and chooser.counts == (2, 1)
        assert decoding._thread_chooser(target, draft, object(), None, None) is chooser
        assert decoding._thread_chooser(target, draft, object(), None, False) is None
        assert decoding._thread_chooser(target, draft, object(), object(), None) is None
        assert decoding._thread_chooser(target, draft, None, None, None) is None
        assert decoding._thread_chooser(target, draft, None, None, True) is chooser
        torch.set_num_threads(1)
        assert decoding._thread_chooser(target, draft, object(), None, None) is None
    finally:
        torch.set_num_threads(callers)


def test_a_head_that_taps_the_last_layer_decodes_losslessly():
    """Layer id L (speculators' --include-last-layer) is the last layer's output before the final norm, which the
    prefill and every verification capture with a hook."""
    target = peaked_target()
    layers = target.config.num_hidden_layers
    draft = OracleDraft.from_target(target, target_layer_ids=[2, layers // 2, layers - 3, layers])
    outputs = []
    for seed, length in enumerate([5, 12]):
        prompt = random_prompt(length, seed)
        expected = original_generate(target, prompt, do_sample=False, max_new_tokens=20)
        out = tree_generate(target, draft, prompt, 0.3, do_sample=False, max_new_tokens=20)
        assert torch.equal(out.sequences, expected)
        outputs.append(out)
    assert max(len(path) for out in outputs for path in out.accepted_paths) >= 3
    with pytest.raises(ValueError, match="tap layer 8 = L"):
        target.generate(random_prompt(5, 0), assistant_model=draft, eagle3_mode="chain", max_new_tokens=4)


@pytest.mark.parametrize("processors", [dict(repetition_penalty=1.8), dict(no_repeat_ngram_size=2, min_new_tokens=8)])
def test_greedy_applies_sequence_dependent_processors_per_node(processors):
    target = peaked_target()
    draft = OracleDraft.from_target(target)
    for seed in range(3):
        prompt = random_prompt(8, seed)
        expected = original_generate(target, prompt, do_sample=False, max_new_tokens=24, **processors)
        out = tree_generate(target, draft, prompt, do_sample=False, max_new_tokens=24, **processors)
        assert torch.equal(out.sequences, expected)


def test_untrained_draft_and_explicit_custom_generate():
    target = make_tiny_target()
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64)
    prompt = random_prompt(10, 0)
    expected = original_generate(target, prompt, do_sample=False, max_new_tokens=16)
    out = target.generate(prompt, custom_generate=eagle3_generate, draft_model=draft, max_new_tokens=16)
    assert torch.equal(out, expected)


# -------------------------------------------------------------------------------------------------- sampling
def exact_distribution(target, prompt, processors, num_new: int) -> dict[tuple, float]:
    """P(next `num_new` tokens) under plain sampling, by enumerating every continuation."""
    probs = {(): 1.0}
    for _ in range(num_new):
        prefixes = list(probs)
        sequences = torch.cat([prompt.expand(len(prefixes), -1), torch.tensor(prefixes).view(len(prefixes), -1)], 1)
        with torch.no_grad():
            logits = target(sequences.long()).logits[:, -1].float()
        rows = torch.softmax(processors(sequences.long(), logits), dim=-1)
        probs = {
            prefix + (token,): probs[prefix] * float(p)
            for prefix, row in zip(prefixes, rows)
            for token, p in enumerate(row)
            if p > 0
        }
    return probs


def pooled_chi_square_p_value(counts: dict, expected: dict[tuple, float], num_samples: int) -> float:
    """Chi-square goodness of fit; cells expecting fewer than 5 samples are pooled into one."""
    from scipy.stats import chisquare

    assert set(counts) <= set(expected), "sampled a continuation plain sampling can never produce"
    observed, predicted, pooled = [], [], [0.0, 0.0]
    for sequence, p in expected.items():
        if p * num_samples >= 5:
            observed.append(counts.get(sequence, 0))
            predicted.append(p * num_samples)
        else:
            pooled[0] += counts.get(sequence, 0)
            pooled[1] += p * num_samples
    if pooled[1] > 0:
        observed.append(pooled[0])
        predicted.append(pooled[1])
    predicted = [p * sum(observed) / sum(predicted) for p in predicted]  # exact sums despite float rounding
    return float(chisquare(observed, predicted).pvalue)


SAMPLING = {
    "temperature-1": (dict(temperature=1.0, top_k=0, top_p=1.0), LogitsProcessorList()),
    "top-k-top-p": (
        dict(temperature=1.5, top_k=4, top_p=0.9),
        LogitsProcessorList([TemperatureLogitsWarper(1.5), TopKLogitsWarper(4), TopPLogitsWarper(0.9)]),
    ),
    # prompt-lookup nodes appended to the sampled tree: deterministic draft tokens next to drawn ones
    "temperature-1-lookup": (dict(temperature=1.0, top_k=0, top_p=1.0, tree_lookup_tokens=2), LogitsProcessorList()),
    # the top-k tree (the head's best tokens, q = 1 rule), alone and with lookup nodes grafted in place of leaves
    "temperature-1-top-k-tree": (
        dict(temperature=1.0, top_k=0, top_p=1.0, tree_sampled_draft=False),
        LogitsProcessorList(),
    ),
    "temperature-1-lookup-top-k-tree": (
        dict(temperature=1.0, top_k=0, top_p=1.0, tree_lookup_tokens=2, tree_sampled_draft=False),
        LogitsProcessorList(),
    ),
    # the adaptive planner, starting from the 6 / 2 / 3 tree: a tree, a plain step, then whatever its timings say
    "temperature-1-adaptive": (
        dict(temperature=1.0, top_k=0, top_p=1.0, tree_adaptive=True, output_draft_trees=False),
        LogitsProcessorList(),
    ),
    # plain steps (drawn without any tree) and trees in turn, the cycle running on across calls
    "temperature-1-plain-steps": (
        dict(
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            output_draft_trees=False,
            tree_planner=ScriptedPlanner([TreeShape(6, 2), PLAIN_STEP, PLAIN_STEP]),
        ),
        LogitsProcessorList(),
    ),
}
NUM_SAMPLES = 500
NUM_NEW = 4  # the first comes from the prefill; the next three from rounds that can accept two draft tokens


def sampled_counts(target, draft, prompt, settings, num_samples):
    counts: dict[tuple, int] = {}
    accepted = []
    torch.manual_seed(0)
    for _ in range(num_samples):
        out = tree_generate(
            target,
            draft,
            prompt,
            noise=1.0,
            do_sample=True,
            max_new_tokens=NUM_NEW,
            **settings,
            tree_total_tokens=6,
            tree_depth=2,
            tree_top_k=3,
        )
        key = tuple(out.sequences[0, prompt.shape[1] :].tolist())
        counts[key] = counts.get(key, 0) + 1
        accepted.extend(out.num_accepted_tokens.tolist())
    return counts, accepted


def small_vocab_setup():
    target = peaked_target(vocab_size=8, num_hidden_layers=2)
    for module in target.modules():  # a softer head than `sharpen` gives, so sampling has several likely paths
        if module is target.get_output_embeddings():
            module.weight.data.mul_(0.5)
    draft = OracleDraft.from_target(target, target_layer_ids=[1])
    return target, draft, torch.tensor([[1, 5, 3, 4]])


@pytest.mark.parametrize("name", list(SAMPLING))
def test_sampling_follows_the_plain_sampling_distribution(name):
    """500 tree-sampled 4-token continuations (vocab 8) against the exact distribution of plain sampling.

    Chi-square at level 1e-3 over ~70-130 observed continuations (cells expecting < 5 samples pooled). With this
    many samples the check has power against real bugs: the next test runs the same harness with a sampler that
    forgets to renormalise after a rejected sibling and gets p ~ 4e-7.
    """
    settings, processors = SAMPLING[name]
    target, draft, prompt = small_vocab_setup()
    expected = exact_distribution(target, prompt, processors, NUM_NEW)
    counts, accepted = sampled_counts(target, draft, prompt, settings, NUM_SAMPLES)
    assert max(accepted) == 3 and min(accepted) == 1  # full-depth acceptances and rejections both happened
    assert pooled_chi_square_p_value(counts, expected, NUM_SAMPLES) > 1e-3  # measured: 0.58 and 0.30


def test_sampling_check_detects_a_biased_sampler(monkeypatch):
    monkeypatch.setattr(decoding, "sample_accept", biased_sample_accept)
    settings, processors = SAMPLING["temperature-1"]
    target, draft, prompt = small_vocab_setup()
    expected = exact_distribution(target, prompt, processors, NUM_NEW)
    counts, _ = sampled_counts(target, draft, prompt, settings, NUM_SAMPLES)
    assert pooled_chi_square_p_value(counts, expected, NUM_SAMPLES) < 1e-5  # measured: 4e-7


# ----------------------------------------------------------------------------------------------------- edges
@pytest.fixture(scope="module")
def llama_pair():
    target = peaked_target()
    return target, OracleDraft.from_target(target)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3])  # the tree would be deeper than what may be emitted
def test_short_generations_stop_exactly(llama_pair, max_new_tokens):
    target, draft = llama_pair
    prompt = random_prompt(6, 1)
    expected = original_generate(target, prompt, do_sample=False, max_new_tokens=max_new_tokens)
    out = tree_generate(target, draft, prompt, 0.0, do_sample=False, max_new_tokens=max_new_tokens)
    assert torch.equal(out.sequences, expected)
    assert len(out.num_accepted_tokens) == (0 if max_new_tokens == 1 else 1)
    for tree in out.draft_trees:  # nodes that could never be emitted are not drafted
        assert int(tree.depths.max()) <= max_new_tokens - 2


def test_eos_inside_an_accepted_path_stops_where_plain_generate_stops(llama_pair):
    target, draft = llama_pair
    prompt = random_prompt(6, 4)
    free = original_generate(target, prompt, do_sample=False, max_new_tokens=20)[0, 6:].tolist()
    eos = next(token for index, token in enumerate(free) if index >= 3 and token not in free[:index])
    expected = original_generate(target, prompt, do_sample=False, max_new_tokens=20, eos_token_id=eos)
    out = tree_generate(target, draft, prompt, 0.0, do_sample=False, max_new_tokens=20, eos_token_id=eos)
    assert torch.equal(out.sequences, expected) and out.sequences[0, -1] == eos
    produced = 1 + int(out.num_accepted_tokens.sum())
    assert produced > out.sequences.shape[1] - 6, "the EOS round should have accepted tokens after the EOS"


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer of the tiny targets' 128 ids, one character each, so every id sequence has its own text (with
    the lowercase letters StopStringCriteria tokenizes as a probe)."""
    from tokenizers import Tokenizer, decoders, models

    characters = [chr(0x4E00 + i) for i in range(100)] + list("abcdefghijklmnopqrstuvwxyz01")
    backend = Tokenizer(models.BPE({character: i for i, character in enumerate(characters)}, merges=[]))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_stop_strings_stop_where_plain_generate_stops(llama_pair):
    """generate() drops `tokenizer` before calling a custom loop; the wrapper builds the StopStringCriteria."""
    target, draft = llama_pair
    tokenizer = char_tokenizer()
    prompt = random_prompt(6, 4)
    free = original_generate(target, prompt, do_sample=False, max_new_tokens=20)[0, 6:].tolist()
    index = next(i for i in range(4, 19) if free[i : i + 2] not in [free[j : j + 2] for j in range(i)])
    stop = tokenizer.decode(free[index : index + 2])  # two tokens, the first occurrence ends at index + 1
    kwargs = dict(do_sample=False, max_new_tokens=20, tokenizer=tokenizer)
    expected = original_generate(target, prompt, stop_strings=[stop], **kwargs)
    assert expected.shape[1] == 6 + index + 2
    out = tree_generate(target, draft, prompt, 0.0, stop_strings=[stop], **kwargs)
    assert torch.equal(out.sequences, expected)
    assert 1 + int(out.num_accepted_tokens.sum()) > index + 2, "the stop string should end inside an accepted path"
    # from the call's generation_config, and from the model's
    config = GenerationConfig(stop_strings=stop, do_sample=False, max_new_tokens=20)
    out = tree_generate(target, draft, prompt, 0.0, generation_config=config, tokenizer=tokenizer)
    assert torch.equal(out.sequences, expected)
    target.generation_config.stop_strings = stop
    try:
        assert torch.equal(tree_generate(target, draft, prompt, 0.0, **kwargs).sequences, expected)
    finally:
        target.generation_config.stop_strings = None


def test_token_healing_is_refused_by_name(llama_pair):
    target, draft = llama_pair
    with pytest.raises(ValueError, match="does not support token_healing=True"):
        target.generate(random_prompt(6, 0), assistant_model=draft, token_healing=True, tokenizer=char_tokenizer())


def test_several_eos_ids(llama_pair):
    target, draft = llama_pair
    prompt = random_prompt(6, 3)
    free = original_generate(target, prompt, do_sample=False, max_new_tokens=20)[0, 6:].tolist()
    eos_ids = [free[8], free[5], 127]
    expected = original_generate(target, prompt, do_sample=False, max_new_tokens=20, eos_token_id=eos_ids)
    out = tree_generate(target, draft, prompt, 0.0, do_sample=False, max_new_tokens=20, eos_token_id=eos_ids)
    assert torch.equal(out.sequences, expected) and out.sequences.shape[1] <= 6 + 6


def test_one_token_prompt_and_prompt_longer_than_the_draft_positions():
    target = peaked_target()
    draft = OracleDraft.from_target(target, max_position_embeddings=16)
    for prompt in (random_prompt(1, 4), random_prompt(40, 5)):
        expected = original_generate(target, prompt, do_sample=False, max_new_tokens=20)
        out = tree_generate(target, draft, prompt, 0.3, do_sample=False, max_new_tokens=20)
        assert torch.equal(out.sequences, expected)
        assert out.tau > 1.5


def test_repeated_calls_reuse_nothing_stale(llama_pair):
    target, draft = llama_pair
    first, other = random_prompt(7, 6), random_prompt(11, 7)
    runs = [tree_generate(target, draft, prompt, 0.3, do_sample=False, max_new_tokens=16) for prompt in (first, other)]
    again = tree_generate(target, draft, first, 0.3, do_sample=False, max_new_tokens=16)
    assert torch.equal(again.sequences, runs[0].sequences)
    assert again.num_accepted_tokens.tolist() == runs[0].num_accepted_tokens.tolist()
    assert torch.equal(runs[1].sequences, original_generate(target, other, do_sample=False, max_new_tokens=16))


class RecordingStreamer(BaseStreamer):
    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.flatten().tolist())

    def end(self):
        self.ended = True


def test_streamer_receives_the_same_tokens(llama_pair):
    target, draft = llama_pair
    prompt = random_prompt(6, 8)
    plain, tree = RecordingStreamer(), RecordingStreamer()
    original_generate(target, prompt, do_sample=False, max_new_tokens=16, streamer=plain)
    draft.reset(target, prompt)
    kwargs = dict(do_sample=False, max_new_tokens=16, streamer=tree, tree_adaptive=False)  # rounds of trees
    target.generate(prompt, assistant_model=draft, **kwargs)
    assert tree.ended and tree.chunks[0] == prompt[0].tolist()
    assert sum(tree.chunks, []) == sum(plain.chunks, [])
    assert max(len(chunk) for chunk in tree.chunks[1:]) > 1  # text arrives a round at a time


def test_scores_logits_and_tau_in_the_output_dict(llama_pair):
    target, draft = llama_pair
    prompt = random_prompt(6, 9)
    kwargs = dict(do_sample=False, max_new_tokens=12, output_scores=True, output_logits=True, repetition_penalty=1.3)
    expected = original_generate(target, prompt, return_dict_in_generate=True, **kwargs)
    out = tree_generate(target, draft, prompt, 0.3, **kwargs)
    assert torch.equal(out.sequences, expected.sequences)
    assert len(out.scores) == len(expected.scores) == 12
    for ours, theirs in zip(out.scores + out.logits, expected.scores + expected.logits):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert out.tau == pytest.approx(out.num_accepted_tokens.float().mean().item())
    assert 1 + int(out.num_accepted_tokens.sum()) >= 12
    assert len(out.draft_trees) == len(out.accepted_paths) == len(out.num_accepted_tokens)
    assert out.cache.get_seq_length() == out.sequences.shape[1] - 1  # holds exactly the accepted text


SLIDING = ["qwen2-sliding", "mistral-sliding", "gemma3-sliding"]


@pytest.mark.parametrize("name", SLIDING)
def test_user_cache_without_config_keeps_the_sliding_window(name):
    """`DynamicCache()` without a config has only full layers; the window must still come from the model config."""
    config_class, overrides, attn = ARCHITECTURES[name]
    target = peaked_target(config_class, attn, **overrides)
    draft = OracleDraft.from_target(target)
    for seed in range(2):
        prompt = random_prompt(20, seed)  # longer than the window of 8
        expected = original_generate(target, prompt, cache=DynamicCache(), do_sample=False, max_new_tokens=16)
        out = tree_generate(target, draft, prompt, 0.3, cache=DynamicCache(), do_sample=False, max_new_tokens=16)
        assert torch.equal(out.sequences, expected), f"prompt {seed}"
        assert out.cache.get_seq_length() == out.sequences.shape[1] - 1
    assert torch.equal(expected, original_generate(target, prompt, do_sample=False, max_new_tokens=16))


def test_returned_cache_is_ready_for_another_plain_turn():
    """Past recording is undone: sliding layers are back at `window - 1` entries and stay there in a second turn."""
    config_class, overrides, attn = ARCHITECTURES["gemma3-sliding"]
    target = peaked_target(config_class, attn, **overrides)
    draft = OracleDraft.from_target(target)
    prompt = random_prompt(12, 0)
    out = tree_generate(target, draft, prompt, 0.3, do_sample=False, max_new_tokens=10)
    sliding = [layer for layer in out.cache.layers if isinstance(layer, DynamicSlidingWindowLayer)]
    assert sliding and not any(layer.record_past for layer in sliding)
    assert all(layer.keys.shape[-2] == 8 - 1 for layer in sliding)
    turn2 = torch.cat([out.sequences, torch.tensor([[7, 8, 9]])], dim=1)
    continued = original_generate(target, turn2, cache=out.cache, do_sample=False, max_new_tokens=20)
    assert torch.equal(continued, original_generate(target, turn2, do_sample=False, max_new_tokens=20))
    assert all(layer.keys.shape[-2] == 8 - 1 for layer in sliding)


def test_left_padded_prompt_matches_plain_generate(llama_pair):
    target, draft = llama_pair
    prompt = torch.cat([torch.zeros(1, 3, dtype=torch.long), random_prompt(8, 10)], dim=1)
    mask = torch.ones_like(prompt)
    mask[:, :3] = 0
    expected = original_generate(target, prompt, attention_mask=mask, do_sample=False, max_new_tokens=16)
    out = tree_generate(target, draft, prompt, 0.3, attention_mask=mask, do_sample=False, max_new_tokens=16)
    assert torch.equal(out.sequences, expected)


def test_tree_settings_per_call_and_from_the_draft_generation_config(llama_pair):
    target, draft = llama_pair
    prompt = random_prompt(6, 11)
    out = tree_generate(
        target, draft, prompt, do_sample=False, max_new_tokens=12, tree_total_tokens=4, tree_depth=3, tree_top_k=1
    )
    chains = [tree.parents.tolist() == list(range(-1, tree.num_nodes - 1)) for tree in out.draft_trees]
    assert all(chains) and max(tree.num_nodes for tree in out.draft_trees) == 4  # top_k=1: a chain
    draft.generation_config = GenerationConfig(tree_total_tokens=5, tree_depth=2, tree_top_k=2)
    try:
        out = tree_generate(target, draft, prompt, do_sample=False, max_new_tokens=12)
        assert all(tree.num_nodes == 5 and int(tree.depths.max()) <= 2 for tree in out.draft_trees[:-1])
    finally:
        draft.generation_config = None
    with pytest.raises(ValueError, match="tree_depth must be a positive int"):
        tree_generate(target, draft, prompt, max_new_tokens=4, tree_depth=0)


def test_prompt_lookup_nodes_keep_greedy_identical_and_get_accepted(llama_pair):
    target, draft = llama_pair
    prompt = random_prompt(10, 21).repeat(1, 3)  # repeated spans: lookup has something to find
    plain = original_generate(target, prompt, do_sample=False, max_new_tokens=30)
    settings = dict(tree_total_tokens=6, tree_depth=2, tree_top_k=2)
    out = tree_generate(target, draft, prompt, noise=3.0, do_sample=False, max_new_tokens=30, **settings)
    grafted = tree_generate(
        target, draft, prompt, noise=3.0, do_sample=False, max_new_tokens=30, tree_lookup_tokens=4, **settings
    )
    assert torch.equal(grafted.sequences, plain) and torch.equal(out.sequences, plain)
    assert all(tree.num_nodes == 6 for tree in grafted.draft_trees[:-1])  # the node count is kept
    deeper = [path for tree, path in zip(grafted.draft_trees, grafted.accepted_paths) if len(path) > 3]
    assert deeper, "no round accepted more lookup tokens than the head's depth allows"
    with pytest.raises(ValueError, match="tree_lookup_tokens must be a non-negative int"):
        tree_generate(target, draft, prompt, max_new_tokens=4, tree_lookup_tokens=-1)


def test_sampled_trees_keep_their_size_with_lookup_chains_capped_at_half(llama_pair):
    target, draft = llama_pair
    prompt = random_prompt(10, 21).repeat(1, 3)
    settings = dict(tree_total_tokens=7, tree_depth=3, tree_top_k=3, tree_lookup_tokens=5)
    torch.manual_seed(0)
    out = tree_generate(target, draft, prompt, noise=1.0, do_sample=True, max_new_tokens=30, **settings)
    # Rounds near max_new_tokens draft shallower trees (a depth-1 tree has at most 1 + top_k nodes): keep full ones.
    trees = [tree for tree in out.draft_trees if int(tree.depths.max()) == 3]
    assert len(trees) >= len(out.draft_trees) - 3
    assert all(tree.num_nodes == 7 and tree.sampled is not None for tree in trees)
    lookup_nodes = [int((~tree.sampled[1:]).sum()) for tree in trees]
    assert max(lookup_nodes) == 3  # (7 - 1) // 2 of the 5 lookup tokens; the drawn tree keeps the rest
    assert all(int(tree.sampled.sum()) == 6 - n for tree, n in zip(trees, lookup_nodes))


def test_tree_settings_from_a_saved_head_folder(tmp_path):
    target = make_tiny_target()
    Eagle3DraftModel.from_target(target, draft_vocab_size=64).save_pretrained(tmp_path)
    GenerationConfig(tree_total_tokens=5, tree_depth=2, tree_top_k=2).save_pretrained(tmp_path)
    draft = Eagle3DraftModel.from_pretrained(tmp_path)
    out = target.generate(
        random_prompt(6, 13),
        assistant_model=draft,
        max_new_tokens=8,
        return_dict_in_generate=True,
        output_draft_trees=True,
    )
    assert out.draft_trees[0].num_nodes == 5 and int(out.draft_trees[0].depths.max()) == 2


def test_draft_gets_the_target_embedding_device_and_dtype():
    target = make_tiny_target()
    draft = Eagle3DraftModel(Eagle3DraftModel.config_from_target(target, draft_vocab_size=64)).to(torch.float64)
    assert not draft.has_embedding
    prompt = random_prompt(5, 12)
    out = target.generate(prompt, assistant_model=draft, do_sample=False, max_new_tokens=8)
    assert torch.equal(out, original_generate(target, prompt, do_sample=False, max_new_tokens=8))
    assert draft.has_embedding and draft.fc.weight.dtype == torch.float32


def test_offloaded_cache_is_refused(llama_pair):
    target, draft = llama_pair
    with pytest.raises(ValueError, match="offloading=True"):
        target.generate(random_prompt(6, 0), assistant_model=draft, cache=DynamicCache(offloading=True))


def test_batch_of_two_is_refused(llama_pair):
    target, draft = llama_pair
    with pytest.raises(ValueError, match="batch size 1"):
        target.generate(random_prompt(6, 0).repeat(2, 1), assistant_model=draft, max_new_tokens=4)
