"""`eagle3_generate`: EAGLE-3 speculative decoding with an EAGLE-2 dynamic draft tree, as a `generate()` callable.

Each round the draft head grows a tree from the last token (`drafter.py`), the target verifies the whole tree in
one forward (`verify.py`), the longest acceptable path plus one bonus token is emitted (`tree.py`), and the target's
KV cache keeps exactly the accepted path (`kv_cache.py`). The output is what `target.generate()` alone would
produce: bit-identical tokens under greedy decoding, the same distribution under sampling.

Usage, after `import eagle3_hf`:

    target.generate(input_ids, assistant_model=draft, max_new_tokens=128)            # tree decoding
    target.generate(input_ids, custom_generate=eagle3_generate, draft_model=draft)   # the same, explicitly
"""

import math
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.generation import GenerateDecoderOnlyOutput, LogitsProcessorList, StoppingCriteriaList
from transformers.utils import logging

from ..modeling_eagle3 import Eagle3DraftModel
from ..target import gather_target_features
from .cost_model import PLAIN_STEP, PlannerConfig, RoundPlanner, TreeShape
from .cpu_packing import is_packable_target, pack_for_tree_decoding
from .cuda_attention import speculative_attention_kernels
from .draft_precision import drafting_head
from .drafter import TreeDrafter
from .kv_cache import end_past_recording, keep_tree_entries
from .lookup import prompt_lookup_chain
from .threads import ThreadChoice, ThreadChooser, candidate_thread_counts
from .tree import DraftTree, append_chain, graft_chain, greedy_accept, sample_accept
from .verify import (
    attention_layer_kinds,
    capturing_taps,
    check_stateless_processors,
    check_tree_attention,
    check_tree_cache,
    process_tree_logits,
    verify_tree,
)


logger = logging.get_logger(__name__)


@dataclass(frozen=True)
class TreeSettings:
    """Shape of the draft tree.

    Args:
        total_tokens (`int`): nodes verified per round, root included (EAGLE's `total_token`).
        depth (`int`): levels below the root, i.e. the most draft tokens one round can accept (EAGLE's
            `depth + 1`: its `depth` counts the expansions after the first level).
        top_k (`int`): children proposed per expanded node, and nodes expanded per level.
        lookup_tokens (`int`, defaults to 0): graft up to this many prompt-lookup tokens onto each tree, in place of
            its weakest leaves (`lookup.py`); 0 turns it off.
    """

    total_tokens: int
    depth: int
    top_k: int
    lookup_tokens: int = 0

    @property
    def max_nodes(self) -> int:
        """The most nodes a tree of this depth and width can hold: `1 + top_k + (depth - 1) * top_k**2`."""
        return 1 + self.top_k + (self.depth - 1) * self.top_k**2

    def lookup_room(self, sampled: bool) -> int:
        """The most prompt-lookup tokens one tree holds: grafted onto a top-k tree, every node but the root; appended
        to a sampled tree, at most half of them (`(total_tokens - 1) // 2`; see `_TreeDecoder._draft_tree`)."""
        return (self.total_tokens - 1) // 2 if sampled else self.total_tokens - 1


# Chosen with scripts/measure_round_overhead.py on SmolLM2-135M, 2-core CPU (docs/decoding.md): there a 16-node
# verification costs 2x a plain step and every draft level a head forward, so the cheapest tree that still branches
# (break-even tau 1.95 with an 8k-vocabulary head, 2.6 with the full vocabulary) wins. On a GPU pass e.g. 60 / 6 / 10.
DEFAULT_TREE = TreeSettings(total_tokens=8, depth=3, top_k=4)


def resolve_tree_settings(
    draft: Eagle3DraftModel,
    total_tokens: int | None,
    depth: int | None,
    top_k: int | None,
    lookup_tokens: int | None = None,
) -> TreeSettings:
    """Per-call values, else the draft's `generation_config.tree_*` attributes, else `DEFAULT_TREE`.

    `total_tokens` is capped at what `depth` and `top_k` can produce.
    """
    draft_config = _draft_generation_config(draft)
    values = {}
    requested = (("total_tokens", total_tokens), ("depth", depth), ("top_k", top_k), ("lookup_tokens", lookup_tokens))
    for name, value in requested:
        if value is None:
            value = getattr(draft_config, f"tree_{name}", None)
        if value is None:
            value = getattr(DEFAULT_TREE, name)
        smallest = 0 if name == "lookup_tokens" else 1
        if not isinstance(value, int) or value < smallest:
            kind = "a non-negative" if smallest == 0 else "a positive"
            raise ValueError(f"tree_{name} must be {kind} int, got {value!r}.")
        values[name] = value
    settings = TreeSettings(**values)
    return TreeSettings(**{**values, "total_tokens": min(settings.total_tokens, settings.max_nodes)})


# head -> (its folder, the generation config read from it): read once, not at every `generate` call (6 ms)
_FOLDER_GENERATION_CONFIGS: "weakref.WeakKeyDictionary[Eagle3DraftModel, tuple]" = weakref.WeakKeyDictionary()


def _draft_generation_config(draft: Eagle3DraftModel) -> GenerationConfig | None:
    """The head's generation config: its attribute, else the `generation_config.json` of a head loaded from a local
    folder (`from_pretrained` loads generation configs only for models that can generate, which a head cannot)."""
    config = getattr(draft, "generation_config", None)
    if config is not None:
        return config
    folder, read = _FOLDER_GENERATION_CONFIGS.get(draft, (None, None))
    if folder != draft.name_or_path:
        path = Path(draft.name_or_path or "")
        has_file = bool(draft.name_or_path) and (path / "generation_config.json").is_file()
        folder, read = draft.name_or_path, GenerationConfig.from_pretrained(path) if has_file else None
        _FOLDER_GENERATION_CONFIGS[draft] = (folder, read)
    return read


@dataclass
class Eagle3GenerateOutput(GenerateDecoderOnlyOutput):
    """[`~generation.GenerateDecoderOnlyOutput`] plus what the tree decoding did.

    Args:
        num_accepted_tokens (`torch.LongTensor` of shape `(num_rounds,)`):
            Tokens each verification round produced, accepted draft tokens **plus the bonus token** (before any
            cut by the stopping criteria), so `tau = num_accepted_tokens.float().mean()`. The first new token comes
            from the prefill and belongs to no round.
        draft_trees (`tuple[DraftTree]`, *optional*, returned with `output_draft_trees=True`):
            The tree verified in each round (on CPU).
        accepted_paths (`tuple[torch.LongTensor]`, *optional*, returned with `output_draft_trees=True`):
            Per round, the accepted node indices of that round's tree, root first.
        round_shapes (`tuple[TreeShape]`):
            The shape each round ran with (`TreeShape(total_tokens, depth)`; `depth=0` is a plain step without a
            draft, which the adaptive planner chooses when speculation does not pay).
        round_confidences (`tuple[float | None]`):
            Per round, the head's root confidence (`TreeDrafter.root_confidence`) the round's tree was drafted from,
            or, for a plain step, the one it was chosen with (`None` when the head had not read the newest token:
            a plain step after another, or the first round). What the planner's confidence buckets count.
        round_threads (`tuple[int]`):
            The torch thread count each round ran with (`threads.ThreadChooser`: fewer than the caller's while another
            process contends for the cores).
        round_seconds (`dict[str, tuple[float]]`):
            Wall time of each round's phases: `"draft"` (growing the tree, with any deferred draft update),
            `"verify"` (the target's forward), `"update"` (encoding the accepted tokens into the draft), `"other"`
            (acceptance, emitting, the cache) and `"planner"` (choosing the shape: the cost model's own cost).
    """

    num_accepted_tokens: torch.LongTensor | None = None
    draft_trees: tuple[DraftTree, ...] | None = None
    accepted_paths: tuple[torch.LongTensor, ...] | None = None
    round_shapes: tuple[TreeShape, ...] | None = None
    round_confidences: tuple[float | None, ...] | None = None
    round_threads: tuple[int, ...] | None = None
    round_seconds: dict[str, tuple[float, ...]] | None = None

    @property
    def tau(self) -> float:
        """Mean tokens per verification round (the paper's acceptance length), `nan` when no round ran."""
        return float(self.num_accepted_tokens.float().mean())


def prepare_draft(draft: Eagle3DraftModel, target: PreTrainedModel) -> Eagle3DraftModel:
    """Attach the target's embedding when the draft has none, and move/cast it to the target's device and dtype."""
    if not isinstance(draft, Eagle3DraftModel):
        raise TypeError(f"draft_model must be an Eagle3DraftModel, got {type(draft).__name__}.")
    if not draft.has_embedding:
        draft.attach_target(target)
    text_config = target.config.get_text_config()
    if draft.config.vocab_size != text_config.vocab_size:
        raise ValueError(
            f"The draft's vocab_size={draft.config.vocab_size} differs from the target's {text_config.vocab_size}."
        )
    if max(draft.config.target_layer_ids) > text_config.num_hidden_layers:  # L itself: the last layer's output
        raise ValueError(
            f"The draft's target_layer_ids={draft.config.target_layer_ids} do not fit a target with "
            f"{text_config.num_hidden_layers} layers."
        )
    output_embeddings = target.get_output_embeddings()
    device = output_embeddings.weight.device if output_embeddings is not None else target.device
    if draft.fc.weight.device != device or draft.fc.weight.dtype != target.dtype:
        draft.to(device=device, dtype=target.dtype)
    return draft


def _check_request(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    generation_config: GenerationConfig,
    model_kwargs: dict,
) -> None:
    """Clear errors for what tree decoding does not do."""
    if model.config.is_encoder_decoder:
        raise ValueError("EAGLE-3 tree decoding supports decoder-only causal LMs only.")
    if generation_config.num_beams > 1 or generation_config.num_return_sequences > 1:
        raise ValueError("EAGLE-3 tree decoding does not support num_beams > 1 or num_return_sequences > 1.")
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"EAGLE-3 tree decoding supports batch size 1 only, got input_ids of shape {tuple(input_ids.shape)}; "
            "call generate once per prompt."
        )
    if generation_config.output_attentions or generation_config.output_hidden_states:
        raise ValueError("EAGLE-3 tree decoding cannot return attentions or hidden states (output_* flags).")
    unknown = set(model_kwargs) - {"attention_mask", "cache", "logits_to_keep", "position_ids", "use_cache"}
    if unknown:
        raise ValueError(f"EAGLE-3 tree decoding does not support these generate() arguments: {sorted(unknown)}.")
    check_tree_attention(model)
    check_stateless_processors(logits_processor)
    cache = model_kwargs.get("cache")
    if cache is not None and (not isinstance(cache, DynamicCache) or cache.get_seq_length() > 0):
        raise ValueError("EAGLE-3 tree decoding needs a fresh, empty DynamicCache (or none).")
    if getattr(cache, "offloading", False):
        # keep_tree_entries rewrites layers in place, behind the back of the offloading prefetch
        raise ValueError("EAGLE-3 tree decoding does not support DynamicCache(offloading=True); pass a plain one.")


def eagle3_generate(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    draft_model: Eagle3DraftModel | None = None,
    tree_total_tokens: int | None = None,
    tree_depth: int | None = None,
    tree_top_k: int | None = None,
    tree_lookup_tokens: int | None = None,
    tree_sampled_draft: bool = True,
    tree_adaptive: bool | None = None,
    tree_pack_weights: bool | None = None,
    tree_draft_dtype: torch.dtype | str | None = None,
    tree_planner: RoundPlanner | None = None,
    tree_adapt_threads: bool | ThreadChooser | None = None,
    eagle3_streamer=None,
    output_draft_trees: bool = False,
    **model_kwargs,
) -> Eagle3GenerateOutput | torch.LongTensor:
    r"""EAGLE-3 tree decoding; pass as `target.generate(input_ids, custom_generate=eagle3_generate, draft_model=d)`.

    `generate()` prepares the generation config, logits processors, stopping criteria and cache; this loop honours
    greedy and sampling (temperature, top-k, top-p and every stateless logits processor, applied to each tree node
    with that node's own prefix; `guidance_scale` and SynthID watermarking keep state and are refused),
    `max_new_tokens` / `max_length`, any `eos_token_id`(s) and stopping criteria (checked after every emitted token)
    and `return_dict_in_generate` (with `output_scores` / `output_logits`).

    Args:
        draft_model ([`Eagle3DraftModel`]): the draft head. Its embedding is attached from the target when
            missing; it is moved and cast to the target's (last) device and dtype when they differ.
        tree_total_tokens (`int`, *optional*): nodes verified per round, root included.
        tree_depth (`int`, *optional*): levels below the root (most draft tokens accepted per round).
        tree_top_k (`int`, *optional*): children per expanded node and nodes expanded per level.
        tree_lookup_tokens (`int`, *optional*): graft up to this many prompt-lookup tokens (the continuation of the
            latest earlier occurrence of the last 3, 2 or 1 tokens) onto each tree, replacing its lowest-scoring
            leaves so that the node count stays `tree_total_tokens`; 0 (the default) turns it off.
            The four default to the draft's `generation_config.tree_*` attributes, then to `DEFAULT_TREE`.
            Passing `tree_total_tokens`, `tree_depth` or `tree_top_k` pins that shape for every round.
        tree_sampled_draft (`bool`, defaults to `True`): when sampling, draw each node's children from the head's
            distribution at the sampling temperature (`TreeDrafter.grow_sampled`) and verify them by recursive
            rejection sampling, instead of taking the head's top-k; more draft tokens are accepted. Greedy decoding
            always uses the top-k tree. Either way the output distribution is the target's.
        tree_adaptive (`bool`, *optional*): choose each round's shape from costs and acceptance measured during
            this call (`cost_model.RoundPlanner`), plain steps without a draft included, starting from the shape
            above; `False` runs that shape every round. Defaults to `True` unless a shape argument is passed.
        tree_pack_weights (`bool`, *optional*): on CPU with float32 weights, pack (MKL or oneDNN, whichever is
            faster here) the target's and the head's linear weights for the row counts tree decoding uses and
            switch `sdpa` to grouped-query SDPA
            (`cpu_packing.pack_for_tree_decoding`; one extra copy of the linear weights per packed node count, in
            place, kept for later calls). Defaults to doing so when it applies; `False` leaves the models alone.
        tree_draft_dtype (`torch.dtype` or `str`, *optional*): the dtype the head drafts in (`"bfloat16"`,
            `torch.float32`, ...): a copy of the head in that dtype, kept for later calls, drafts the rounds; the head
            itself is left as it is. The default `"auto"` drafts with a bfloat16 copy of a float32 head on CPU where
            that is timed faster (memory-bound few-row products; `draft_precision`), else with the head. The output
            does not depend on it (the target verifies every token).
        tree_planner ([`RoundPlanner`], *optional*): the planner to ask for each round's shape (anything with its
            `choose(confidence=)`, `record_plain`, `record_deferred_update` and `record_tree(..., confidence=,
            blind=)` methods); implies `tree_adaptive`. By default each head and target keep one planner per shape
            space and temperature, so what it measured carries over to later calls.
        tree_adapt_threads (`bool` or [`ThreadChooser`], *optional*): on CPU, run each round with the torch thread
            count whose plain steps are fastest (`threads.ThreadChooser`: the caller's, unless another process
            contends for the cores; the other counts are probed with at most 1% of the time), and restore the
            caller's count when the call ends. Defaults to `True` with the default planner on CPU, `False` with
            `tree_planner=` or a fixed shape; a `ThreadChooser` is used as given (and kept by the caller).
        eagle3_streamer (`BaseStreamer`, *optional*): receives the prompt, then each round's emitted tokens.
            (`generate()` drops `streamer` before calling a custom callable, hence the name.)
        output_draft_trees (`bool`, *optional*): also return every round's tree and accepted path.

    Returns:
        `torch.LongTensor` of shape `(1, length)`, or [`Eagle3GenerateOutput`] with `return_dict_in_generate=True`.
    """
    if draft_model is None:
        raise ValueError("eagle3_generate needs `draft_model=` (generate() drops `assistant_model` for callables).")
    _check_request(model, input_ids, logits_processor, generation_config, model_kwargs)
    settings = resolve_tree_settings(draft_model, tree_total_tokens, tree_depth, tree_top_k, tree_lookup_tokens)
    pinned = any(value is not None for value in (tree_total_tokens, tree_depth, tree_top_k))
    adaptive = not pinned if tree_adaptive is None else bool(tree_adaptive)
    draft = drafting_head(prepare_draft(draft_model, model), tree_draft_dtype, rows=settings.top_k)
    planner = _prepare_rounds(model, draft, settings, adaptive, tree_pack_weights, tree_planner, generation_config)
    threads = _thread_chooser(model, draft, planner, tree_planner, tree_adapt_threads)
    sampled_draft = bool(tree_sampled_draft and generation_config.do_sample)
    decoder = _TreeDecoder(
        model,
        draft,
        settings,
        logits_processor,
        stopping_criteria,
        generation_config,
        eagle3_streamer,
        sampled_draft,
        planner,  # None: `settings` every round
        threads,  # None: the caller's thread count throughout
    )
    with torch.no_grad():
        output = decoder.run(input_ids, model_kwargs, output_draft_trees)
    return output if generation_config.return_dict_in_generate else output.sequences


def _prepare_rounds(
    model: PreTrainedModel,
    draft: Eagle3DraftModel,
    settings: TreeSettings,
    adaptive: bool,
    pack_weights: bool | None,
    planner: RoundPlanner | None,
    generation_config: GenerationConfig,
) -> RoundPlanner | None:
    """Pack CPU weights for every shape the rounds may take (unless `pack_weights is False`), and return the planner
    that picks them (`planner` when given; `None` for a fixed shape)."""
    node_counts, max_depth = _candidate_node_counts(model, settings, adaptive), _max_depth(settings, adaptive)
    if pack_weights is not False:
        packed = pack_for_tree_decoding(model, draft, node_counts, max_depth, settings.top_k, settings.lookup_tokens)
        if packed:
            logger.info(packed)
    if planner is None and adaptive:
        planner = _planner_for(draft, model, node_counts, max_depth, settings, generation_config)
    return planner


# Node counts an adaptive tree may take where every count costs no extra memory (GPU, non-float32 CPU): GEMMs of
# these sizes are as cheap as their neighbours', and the planner interpolates between the ones it measured.
ADAPTIVE_NODE_COUNTS = (4, 8, 16, 32, 64)


def _candidate_node_counts(model: PreTrainedModel, settings: TreeSettings, adaptive: bool) -> list[int]:
    """The start shape's node count alone where the target's weights are packed for it (float32 on CPU; MKL keeps a
    weight copy per count, so counts are never added on the fly), else the start's and `ADAPTIVE_NODE_COUNTS` up to
    what the tree's depth and width can hold."""
    if not adaptive or is_packable_target(model):
        return [settings.total_tokens]
    largest = TreeSettings(settings.total_tokens, _max_depth(settings, adaptive), settings.top_k).max_nodes
    return sorted({settings.total_tokens, *(n for n in ADAPTIVE_NODE_COUNTS if n <= largest)})


# head -> {(target, shape space, sampling): (weak reference to the target, planner)}. What a planner learned about
# this machine, target and head carries over from one generate call to the next (a chat's turns, a benchmark's
# prompts), instead of being paid for again by every call.
_PLANNERS: "weakref.WeakKeyDictionary[Eagle3DraftModel, dict]" = weakref.WeakKeyDictionary()
# head -> {(target, caller's thread count): (weak reference to the target, thread chooser)}, likewise
_THREAD_CHOOSERS: "weakref.WeakKeyDictionary[Eagle3DraftModel, dict]" = weakref.WeakKeyDictionary()
# planner -> the thread count its costs were timed with (a planner serves every thread count of its head and target)
_COSTS_TIMED_WITH: "weakref.WeakKeyDictionary[RoundPlanner, int]" = weakref.WeakKeyDictionary()


def _planner_for(
    draft: Eagle3DraftModel,
    model: PreTrainedModel,
    node_counts: list[int],
    max_depth: int,
    settings: TreeSettings,
    generation_config: GenerationConfig,
) -> RoundPlanner:
    """The planner of this head and target for this shape space and sampling temperature (acceptance differs with
    it), made the first time they meet."""
    sampling = (bool(generation_config.do_sample), generation_config.temperature if generation_config.do_sample else 0)
    key = (tuple(node_counts), max_depth, settings, sampling)
    return _kept(_PLANNERS, draft, model, key, lambda: new_planner(model, settings))


def _kept(store: weakref.WeakKeyDictionary, draft: Eagle3DraftModel, model: PreTrainedModel, key: tuple, make):
    """What `store` keeps for this head, target and `key`, made by `make()` the first time (or when the target it
    was made for is gone and another took its id)."""
    kept, key = store.setdefault(draft, {}), (id(model), *key)
    reference, value = kept.get(key, (None, None))
    if reference is None or reference() is not model:
        value = make()
        kept[key] = (weakref.ref(model), value)
    return value


def new_planner(model: PreTrainedModel, settings: TreeSettings, config: PlannerConfig | None = None) -> RoundPlanner:
    """A fresh planner for the shapes the adaptive default may take with `model` as target, starting from
    `settings` (e.g. `resolve_tree_settings(head, None, None, None)`), with `config`'s knobs: what `generate` makes
    for a head and target the first time they meet. Pass it as `tree_planner=` to keep it apart from the default."""
    node_counts = _candidate_node_counts(model, settings, adaptive=True)
    start = TreeShape(settings.total_tokens, settings.depth)
    return RoundPlanner(node_counts, _max_depth(settings, adaptive=True), settings.top_k, start, config)


def _max_depth(settings: TreeSettings, adaptive: bool) -> int:
    """The deepest tree the planner may try: two levels past the start shape (at least 4, at most 8)."""
    return min(max(settings.depth + 2, 4), 8) if adaptive else settings.depth


def _thread_chooser(
    model: PreTrainedModel,
    draft: Eagle3DraftModel,
    planner: RoundPlanner | None,
    own_planner: RoundPlanner | None,
    adapt: bool | ThreadChooser | None,
) -> ThreadChooser | None:
    """The `ThreadChooser` of this call on CPU (`None` elsewhere): `adapt` when one is given; with `adapt` unset (and
    the default planner) or `True`, the one this head, target and caller's thread count keep across calls (what it
    timed of the machine's load carries over), when the caller uses more than one thread; else `None`."""
    if model.device.type != "cpu":
        return None  # the device's kernels do not run on torch's CPU threads
    if isinstance(adapt, ThreadChooser):
        return adapt
    wanted = planner is not None and own_planner is None if adapt is None else adapt
    if not wanted or torch.get_num_threads() < 2:
        return None
    threads = torch.get_num_threads()
    return _kept(_THREAD_CHOOSERS, draft, model, (threads,), lambda: ThreadChooser(candidate_thread_counts(threads)))


class _PhaseClock:
    """Marks between the phases of a round, read as seconds once the device has passed them.

    On CPU a mark is `time.perf_counter()`. On CUDA it is a recorded event: marking adds no host sync to the loop
    (the device runs ahead, as it should), and the marks are read once a later host sync (the next round's
    acceptance) has made the device pass them.
    """

    def __init__(self, device: torch.device):
        self.asynchronous = device.type == "cuda"

    def mark(self) -> float | torch.cuda.Event:
        if not self.asynchronous:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, marks: list) -> list[float]:
        """Seconds between consecutive marks."""
        if not self.asynchronous:
            return [later - earlier for earlier, later in zip(marks, marks[1:])]
        marks[-1].synchronize()  # passed already unless this is the last round: then it waits for that round alone
        return [earlier.elapsed_time(later) / 1000 for earlier, later in zip(marks, marks[1:])]


class _TreeDecoder:
    """The state of one `eagle3_generate` call: sequence, caches, positions and what to report."""

    def __init__(
        self,
        model,
        draft,
        settings,
        logits_processor,
        stopping_criteria,
        generation_config,
        streamer,
        sampled_draft,
        planner: RoundPlanner | None = None,
        threads: ThreadChooser | None = None,
    ):
        self.model, self.settings, self.streamer, self.sampled_draft = model, settings, streamer, sampled_draft
        self.drafter = TreeDrafter(draft, settings.top_k)
        self.layer_ids = list(draft.config.target_layer_ids)
        self.layer_kinds = attention_layer_kinds(model)
        self.processors, self.stopping = logits_processor, stopping_criteria
        self.config = generation_config
        keep_scores = generation_config.return_dict_in_generate
        self.scores = [] if keep_scores and generation_config.output_scores else None
        self.raw_logits = [] if keep_scores and generation_config.output_logits else None
        self.accepted, self.trees, self.paths = [], [], []
        self.planner, self.threads = planner, threads
        self.shapes: list[TreeShape] = []
        self.thread_counts: list[int] = []
        self.confidences: list[float | None] = []
        self.phase_seconds = {name: [] for name in ("draft", "verify", "update", "other", "planner")}
        # (tokens (1, T), features (1, T, F), keep (T,) or None) of the prompt and of plain steps, encoded into the
        # draft before its next tree
        self.pending: list[tuple[torch.LongTensor, torch.Tensor, torch.BoolTensor | None]] = []
        self.prompt_pending = False
        self.pending_chosen = False  # whether the planner chose a plain step among them (not only thread probes)
        self.clock = _PhaseClock(model.device)
        self.unread: list[tuple] = []  # rounds whose phase marks the device may not have passed yet (CUDA)

    def run(self, input_ids: torch.LongTensor, model_kwargs: dict, output_draft_trees: bool) -> Eagle3GenerateOutput:
        input_device = input_ids.device
        self.sequences = input_ids.to(self.model.device)
        if self.streamer is not None:
            self.streamer.put(input_ids.cpu())
        cache = model_kwargs.get("cache")
        cache = DynamicCache(config=self.model.config) if cache is None else cache
        callers_threads = torch.get_num_threads()
        # every forward of the call, plain steps and the prefill included, off cuDNN's per-shape SDPA plans (CUDA)
        with speculative_attention_kernels(self.model.device):
            try:
                if self.threads is not None:  # the prompt too runs with the count the machine's load calls for
                    torch.set_num_threads(self.threads.current)
                stopped = self._prefill(cache, model_kwargs)
                if not stopped:
                    check_tree_cache(cache, self.layer_kinds)
                    cache.activate_past_recording()  # sliding layers keep their past until `keep_tree_entries` trims
                try:
                    while not stopped:
                        stopped = self._round(cache, output_draft_trees)
                finally:
                    end_past_recording(cache)  # the returned cache must work for a later plain `generate`, as stock's
            finally:
                torch.set_num_threads(callers_threads)
        if self.streamer is not None:
            self.streamer.end()
        return Eagle3GenerateOutput(
            sequences=self.sequences.to(input_device),
            scores=tuple(self.scores) if self.scores is not None else None,
            logits=tuple(self.raw_logits) if self.raw_logits is not None else None,
            cache=cache,
            num_accepted_tokens=torch.tensor(self.accepted, dtype=torch.long),
            draft_trees=tuple(self.trees) if output_draft_trees else None,
            accepted_paths=tuple(self.paths) if output_draft_trees else None,
            round_shapes=tuple(self.shapes),
            round_confidences=tuple(self.confidences),
            round_threads=tuple(self.thread_counts),
            round_seconds={name: tuple(values) for name, values in self.phase_seconds.items()},
        )

    def _prefill(self, cache: DynamicCache, model_kwargs: dict) -> bool:
        """Target forward over the prompt; choose the first token; encode the prompt into the draft."""
        attention_mask = model_kwargs.get("attention_mask")
        position_ids = model_kwargs.get("position_ids")
        length = self.sequences.shape[1]
        self.padding = None if attention_mask is None else attention_mask[0].to(self.model.device).bool()
        with capturing_taps(self.model, self.layer_ids) as captured:
            outputs = self.model(
                input_ids=self.sequences,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
                output_hidden_states=self.layer_ids,
                logits_to_keep=1,
            )
        self.position = int(position_ids[0, -1]) + 1 if position_ids is not None else length
        logits = outputs.logits[:, -1].float()
        _, scores, token = self._plain_choice(logits)
        stopped, _ = self._emit(token, scores, logits)
        if not stopped:
            features = gather_target_features(outputs.hidden_states, self.layer_ids, captured.get("hidden"))
            if self.planner is None:
                self.drafter.extend(self.sequences[:, 1:], features, keep=self.padding)
            else:  # plain steps need no draft: a generation the planner keeps plain never encodes its prompt
                self.pending.append((self.sequences[:, 1:], features, self.padding))
                self.prompt_pending = True
        return stopped

    def _shape(self) -> tuple[TreeShape, float | None, ThreadChoice | None]:
        """This round's shape (the planner's choice, or the fixed settings), the head's root confidence when it is
        known before the round (right after a tree, whose draft update has read every token; `None` otherwise), and
        its thread count (set here; `None` without a chooser): a thread probe is a plain step the planner does not
        choose."""
        start = time.perf_counter()
        threads = None
        if self.threads is not None:
            self._match_planner_costs(self.threads.current)  # its expected rate must be this count's
            expected = self.planner.expected_rate() if hasattr(self.planner, "expected_rate") else math.nan
            threads = self.threads.next_round(expected)
            if threads.threads != torch.get_num_threads():
                torch.set_num_threads(threads.threads)
        if threads is None or not threads.probe:
            self._match_planner_costs(torch.get_num_threads())
        if threads is not None and threads.probe:
            shape, confidence = PLAIN_STEP, None
        elif self.planner is None:
            shape, confidence = TreeShape(self.settings.total_tokens, self.settings.depth), None
        else:
            confidence = None if self.pending else self._root_confidence()
            shape = self.planner.choose(confidence=confidence)
        if self.planner is not None or threads is not None:
            self.phase_seconds["planner"].append(time.perf_counter() - start)
        return shape, confidence, threads

    def _match_planner_costs(self, threads: int) -> None:
        """Make the planner forget costs timed with another torch thread count than `threads` (CPU; a planner serves
        every count of its head and target: calls with and without a thread chooser, and the chooser's switches)."""
        if self.model.device.type != "cpu" or not hasattr(self.planner, "forget_costs"):
            return
        if _COSTS_TIMED_WITH.setdefault(self.planner, threads) != threads:
            self.planner.forget_costs()
            _COSTS_TIMED_WITH[self.planner] = threads

    def _root_confidence(self) -> float:
        """The head's root confidence at the temperature its trees are drawn with (greedy: 1)."""
        return self.drafter.root_confidence(self.config.temperature if self.config.do_sample else 1.0)

    def _round(self, cache: DynamicCache, output_draft_trees: bool) -> bool:
        """Draft a tree (none for a plain step), verify it, accept a path and a bonus token, compact the cache,
        update the draft (deferred after plain steps), and tell the planner what it all cost."""
        shape, confidence, threads = self._shape()
        remaining = self.config.max_length - self.sequences.shape[1]
        depth = 0 if shape.is_plain else max(0, min(shape.depth, remaining - 1))  # deeper could never be emitted
        marks = [self.clock.mark()]
        flushed = self._flush_pending() if depth > 0 else 0
        blind = confidence is None
        if blind and depth > 0:  # what the round was drafted from, for its record (and the planner's)
            confidence = self._root_confidence()
        marks.append(self.clock.mark())
        # A plain step builds no tree (a root-only one only when the trees are returned): its bookkeeping would cost
        # about 2% of a small target's step, paid on every step of a head that does not pay.
        tree = self._draft_tree(depth, remaining, shape.total_tokens) if depth > 0 or output_draft_trees else None
        marks.append(self.clock.mark())
        padding = self._padding(cache.get_seq_length())
        if tree is None or tree.num_nodes == 1:  # a plain step: the forward plain `generate` runs, no tree mask
            logits, features = self._plain_forward(cache, padding)
        else:
            logits, features = verify_tree(
                self.model, tree, cache, self.position, self.layer_ids, padding, layer_kinds=self.layer_kinds
            )
        marks.append(self.clock.mark())
        if tree is None:
            path, scores, new_tokens = self._plain_choice(logits)
        else:
            scores = process_tree_logits(self.processors, self.sequences, tree, logits)
            if self.config.do_sample:
                path, bonus = sample_accept(tree, torch.softmax(scores, dim=-1))
            else:
                path, bonus = greedy_accept(tree, scores.argmax(dim=-1))
            new_tokens = torch.cat([tree.tokens[path[1:]], bonus.reshape(1)])
        self.accepted.append(new_tokens.shape[0])
        if output_draft_trees:
            self.trees.append(tree.to("cpu"))
            self.paths.append(path.cpu())
        stopped, emitted = self._emit(new_tokens, scores[path], logits[path])
        keep_tree_entries(cache, path.shape[0] if tree is None else tree.num_nodes, path[:emitted])
        self.position += emitted
        marks.append(self.clock.mark())
        if not stopped:
            if depth > 0 or self.planner is None:
                self.drafter.extend(new_tokens[None], features[path][None])
            else:
                self.pending.append((new_tokens[None], features[path][None], None))
                self.pending_chosen = self.pending_chosen or threads is None or not threads.probe
        marks.append(self.clock.mark())
        self.shapes.append(shape if depth > 0 else PLAIN_STEP)
        self.confidences.append(confidence)
        self.thread_counts.append(torch.get_num_threads())
        tree_depth = 0 if tree is None else tree.depths.max()
        record = (self.shapes[-1], path.shape[0] - 1, tree_depth, flushed, marks, confidence, blind, threads)
        self.unread.append(record)
        self._read_rounds(final=stopped)
        return stopped

    def _plain_forward(
        self, cache: DynamicCache, padding: torch.BoolTensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The target on the last token alone, as a step of plain `generate` runs it (the model builds its own causal
        and sliding-window masks); returns `(logits (1, V), features (1, F))` like `verify_tree` on a root-only tree."""
        token = self.sequences[:, -1:]
        attention_mask = None
        if padding is not None:
            attention_mask = torch.cat([padding, padding.new_ones(1)]).long()[None]
        with capturing_taps(self.model, self.layer_ids) as captured:
            outputs = self.model(
                input_ids=token,
                attention_mask=attention_mask,
                position_ids=torch.full((1, 1), self.position, dtype=torch.long, device=token.device),
                cache=cache,
                use_cache=True,
                output_hidden_states=self.layer_ids,
                logits_to_keep=1,
            )
        features = gather_target_features(outputs.hidden_states, self.layer_ids, captured.get("hidden"))
        return outputs.logits[0].float(), features[0]

    def _plain_choice(self, logits: torch.Tensor) -> tuple[torch.LongTensor, torch.Tensor, torch.LongTensor]:
        """The next token from the target's `logits (1, V)` after the last one, as a step of plain `generate` picks it.

        Returns `(path, scores, tokens)` as a root-only tree's round would have them: the path `[0]` `(1,)`, the
        processed scores `(1, V)` and the one new token `(1,)`.
        """
        scores = self.processors(self.sequences, logits)
        if self.config.do_sample:
            token = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1)[0]
        else:
            token = scores.argmax(dim=-1)
        return torch.zeros(1, dtype=torch.long, device=logits.device), scores, token

    def _flush_pending(self) -> int:
        """Encode the tokens of the plain steps since the last tree (and the prompt, before the first tree) into the
        draft, in one forward; returns how many plain steps' tokens there were, 0 when the prompt was among them (a
        cost per plain token cannot be told apart from the prompt's then) or when they were all thread probes' (the
        planner chose no plain step, so it switched back to nothing): the planner is then not told."""
        if not self.pending:
            return 0
        tokens, features, keeps = zip(*self.pending)
        keep = None
        if any(flags is not None for flags in keeps):  # the prompt's padding flags: its padding stays masked out
            device = next(flags.device for flags in keeps if flags is not None)
            ones = [torch.ones(part.shape[1], dtype=torch.bool, device=device) for part in tokens]
            keep = torch.cat([own if flags is None else flags for own, flags in zip(ones, keeps)])
        tokens = torch.cat(tokens, dim=1)
        self.drafter.extend(tokens, torch.cat(features, dim=1), keep=keep)
        self.pending.clear()
        with_prompt, self.prompt_pending = self.prompt_pending, False
        chosen, self.pending_chosen = self.pending_chosen, False
        return tokens.shape[1] if chosen and not with_prompt else 0

    def _read_rounds(self, final: bool) -> None:
        """Turn the phase marks of finished rounds into seconds, and tell the planner what each cost and accepted
        (and the thread chooser what each cost; a thread probe is its alone).

        On CUDA the newest round's marks are read at the next round (its draft update may still run on the device,
        and reading them now would wait for it), or at the end; its planner record is one round late.
        """
        ready = self.unread if final or not self.clock.asynchronous else self.unread[:-1]
        for shape, accepted, tree_depth, flushed, marks, confidence, blind, threads in ready:
            flush, draft, verify, other, update = self.clock.seconds(marks)
            phases = (("draft", flush + draft), ("verify", verify), ("update", update), ("other", other))
            for name, seconds in phases:
                self.phase_seconds[name].append(seconds)
            if threads is not None:
                spent = draft + verify + other if shape.is_plain else flush + draft + verify + other + update
                self.threads.record(threads, shape.is_plain, spent)
            if self.planner is None or (threads is not None and threads.probe):
                continue
            if shape.is_plain:
                self.planner.record_plain(draft + verify + other)
            else:
                # `draft` without `flush`: the deferred update of earlier plain steps is theirs, not this tree's.
                # Charged to the tree, it grew with the plain streak and kept probes looking worse the longer it ran.
                self.planner.record_deferred_update(flush, flushed)
                self.planner.record_tree(
                    shape, accepted, int(tree_depth), verify, draft, update, other, confidence=confidence, blind=blind
                )
        self.unread = self.unread[len(ready) :]

    def _draft_tree(self, depth: int, remaining: int, num_nodes: int) -> DraftTree:
        """This round's tree of `num_nodes` nodes (only the root for `depth=0`), with the prompt-lookup chain when
        asked: grafted in place of the weakest nodes of a top-k tree, or (at most `(num_nodes - 1) // 2` of it)
        appended to a sampled tree grown that much smaller, since drawn nodes cannot be dropped by score."""
        root = self.sequences[0, -1]
        chain = None
        if self.settings.lookup_tokens and depth > 0:
            chain = prompt_lookup_chain(self.sequences[0], min(self.settings.lookup_tokens, remaining - 1))
        if self.sampled_draft and depth > 0:
            temperature = self.config.temperature or 1.0
            # at most half the tree goes to the chain: with 8 nodes and 6 lookup tokens at temperature 1, a chain
            # capped at 3 gave tau 1.92 / 1.87 on HumanEval / MT-bench, against 1.87 / 1.84 uncapped
            room = TreeSettings(num_nodes, depth, self.settings.top_k).lookup_room(sampled=True)
            chain_length = 0 if chain is None else min(chain.numel(), room)
            tree = self.drafter.grow_sampled(root, depth, num_nodes - chain_length, temperature)
            tree = tree if chain is None else append_chain(tree, chain[:chain_length])
            return tree.to(self.model.device)
        tree = self.drafter.grow(root, depth, num_nodes).to(self.model.device)
        return tree if chain is None else graft_chain(tree, chain)

    def _emit(self, tokens: torch.LongTensor, scores: torch.Tensor, logits: torch.Tensor) -> tuple[bool, int]:
        """Append `tokens` one at a time, checking the stopping criteria after each, as plain `generate` does.

        Returns `(stopped, number of tokens appended)`. `scores` / `logits` `(len(tokens), V)` are the rows that
        produced each token, recorded when `output_scores` / `output_logits` ask for them.
        """
        emitted, stopped = 0, False
        for token in tokens:
            self.sequences = torch.cat([self.sequences, token.reshape(1, 1)], dim=1)
            emitted += 1
            if bool(self.stopping(self.sequences, None).any()):
                stopped = True
                break
        if self.scores is not None:
            self.scores.extend(row[None] for row in scores[:emitted])
        if self.raw_logits is not None:
            self.raw_logits.extend(row[None] for row in logits[:emitted])
        if self.streamer is not None:
            self.streamer.put(tokens[:emitted].cpu())
        return stopped, emitted

    def _padding(self, cached_length: int) -> torch.BoolTensor | None:
        """Padding flags of the cached positions (only the prompt can contain padding)."""
        if self.padding is None:
            return None
        extra = torch.ones(cached_length - self.padding.shape[0], dtype=torch.bool, device=self.padding.device)
        return torch.cat([self.padding, extra])
