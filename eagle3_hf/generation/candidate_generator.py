"""Chain-mode EAGLE-3: an EAGLE-3 head driving Transformers' own assisted-decoding loop (`_assisted_decoding`).

This is the *chain* baseline next to the tree loop: every round the head drafts one chain of `num_assistant_tokens`
tokens, the stock loop verifies it with one causal target forward, accepts the longest matching prefix (or runs
`_speculative_sampling` when sampling) and rolls the target cache back with `crop`. Everything after drafting
(verification, sampling, streamers, output dicts, stopping criteria) is the stock code.

Bookkeeping, as in the reference implementation (see `eagle3-algorithm.md` §5):

- The head is fed `(token, feature)` pairs shifted by one: draft position `j` holds token `x[j + 1]` with the target
  feature `F[j]` of position `j`, so the draft position is the target position minus one, and its output predicts
  `x[j + 2]`.
- After each verify forward the accepted tokens (and the bonus token) are re-encoded with the **target's** features
  into the head's own KV cache; the KV the head computed from its own hidden states while drafting is cropped away
  first. This also performs the rollback after a rejection, whatever the number of matches.
- Drafting is greedy (argmax over the draft vocabulary, mapped to target ids through `d2t`), after the same logits
  processors the target uses (repetition penalty, suppressed tokens, ...), so that the proposals are what the
  processed target would pick.

Selecting this generator needs the private `GenerationMixin._get_candidate_generator` (there is no registry): the
`chain_mode` context manager overrides it on one target *instance* for the duration of a block.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.logits_process import LogitsProcessorList
from transformers.utils import ModelOutput

from ..modeling_eagle3 import Eagle3DraftModel
from ..target import gather_target_features
from .cuda_attention import speculative_attention_kernels
from .verify import check_stateless_processors


DEFAULT_NUM_ASSISTANT_TOKENS = 5


class Eagle3CandidateGenerator(CandidateGenerator):
    """Drafts a greedy chain of `num_assistant_tokens` tokens per round with an EAGLE-3 head.

    The first call returns `(input_ids, None)` so that the stock loop prefills the target; from then on every call
    receives the previous target forward's outputs (`requires_model_outputs`), whose hidden states at
    `draft.config.target_layer_ids` (EAGLE layer id == HF `hidden_states` index) feed the head.

    Candidate logits are returned in the **target** vocabulary as a one-hot distribution (0 at the drafted token,
    `-inf` elsewhere): drafting is deterministic, so the draft probability of a proposal is `q(x) = 1`. With
    `do_sample=True` the stock `_speculative_sampling` then accepts a proposal with probability `p(x)` and, on
    rejection, samples from `p` with `x` removed and renormalised: EAGLE's lossless rule. With greedy decoding
    they are unused (the stock loop compares argmaxes), and the output equals plain greedy decoding.

    Args:
        draft (`Eagle3DraftModel`): the head, with an embedding attached (see `Eagle3DraftModel.attach_target`).
        generation_config (`GenerationConfig`): the prepared config of the `generate` call (`max_length`,
            `output_hidden_states`).
        logits_processor (`LogitsProcessorList`, *optional*): the target's processors, applied to draft scores.
            Processors that keep state between calls (`guidance_scale`, SynthID watermarking) raise `ValueError`.
        num_assistant_tokens (`int`, defaults to 5): length of the drafted chain per round. It stays constant:
            `num_assistant_tokens_schedule` and `assistant_confidence_threshold` do not apply.

    Attributes:
        draft_cache (`DynamicCache`): the head's KV cache; holds target-feature KV for draft positions
            `0 .. num_encoded - 1` plus, between calls, the KV of the last chain's self-fed steps.
        num_candidates (`list[int]`): drafted tokens per verify round.
        num_matches (`list[int]`): accepted draft tokens per verify round (the bonus token not included).
    """

    requires_model_outputs: bool = True

    def __init__(
        self,
        draft: Eagle3DraftModel,
        generation_config: GenerationConfig,
        logits_processor: LogitsProcessorList | None = None,
        num_assistant_tokens: int = DEFAULT_NUM_ASSISTANT_TOKENS,
    ):
        if not isinstance(draft, Eagle3DraftModel):
            raise TypeError(f"Eagle3CandidateGenerator needs an Eagle3DraftModel, got {type(draft).__name__}.")
        if not draft.has_embedding:
            raise ValueError("The draft head has no token embedding; call `draft.attach_target(target)` first.")
        if int(num_assistant_tokens) < 1:
            raise ValueError(f"num_assistant_tokens must be >= 1, got {num_assistant_tokens}.")
        self.draft = draft
        self.layer_ids = list(draft.config.target_layer_ids)
        if draft.config.target_num_hidden_layers in self.layer_ids:
            raise ValueError(
                f"target_layer_ids={self.layer_ids} tap layer {draft.config.target_num_hidden_layers} = L (the last "
                "layer's output before the final norm), which Transformers' assisted loop does not return; use tree "
                "mode (the default eagle3_mode)."
            )
        self.num_assistant_tokens = int(num_assistant_tokens)
        self.max_length = generation_config.max_length
        self.logits_processor = logits_processor if logits_processor is not None else LogitsProcessorList()
        # both the draft (`_pick`) and the stock verification call them on tokens that may be rejected
        check_stateless_processors(self.logits_processor, mode="chain")
        # Only the tapped layers are kept by the target's forward (EAGLE ids are HF indices, no +1 as in DFlash).
        # A user who asked for every hidden state in the generate output still gets them all (a superset).
        wants_all = bool(generation_config.output_hidden_states)
        self.model_kwargs_overrides = {"output_hidden_states": True if wants_all else list(self.layer_ids)}

        self.draft_cache = DynamicCache(config=draft.config)
        # Target positions whose (next token, feature) pair is in `draft_cache` with target features.
        self.num_encoded = 0
        self.num_candidates: list[int] = []
        self.num_matches: list[int] = []
        self._last_num_candidates = 0
        # The target's `(1, seq)` mask and positions of the current call (see `_window`).
        self._attention_mask: torch.Tensor | None = None
        self._position_ids: torch.Tensor | None = None
        # Draft id -> target id, used to scatter draft scores into the target vocabulary for the processors.
        draft_ids = torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device)
        self._target_ids = draft.draft_to_target_ids(draft_ids)
        self._vocab_size = draft.config.vocab_size

    @property
    def num_drafting_tokens(self) -> int:
        """Tokens drafted per round, which `generate` (transformers >= 5.25) reads to size the target cache's record
        of past states for rollback: the chain's length."""
        return self.num_assistant_tokens

    @property
    def mean_accepted_length(self) -> float:
        """τ: mean tokens gained per verify round, bonus included (`mean(num_matches) + 1`); 0.0 before any."""
        if not self.num_matches:
            return 0.0
        return sum(self.num_matches) / len(self.num_matches) + 1.0

    @torch.no_grad()
    def get_candidates(
        self,
        input_ids: torch.LongTensor,
        model_kwargs: dict[str, Any] | None = None,
        model_outputs: ModelOutput | None = None,
        is_first_iteration: bool = False,
        n_last_matches: int = 0,
        **kwargs,
    ) -> tuple[torch.LongTensor, torch.FloatTensor | None]:
        """Candidates for the next verify forward.

        Args:
            input_ids (`torch.LongTensor` of shape `(1, seq)`): the confirmed sequence, ending with the bonus token.
            model_kwargs (`dict`): the target's generation kwargs (`attention_mask` and `position_ids` are read).
            model_outputs (`ModelOutput`): the previous target forward, with `hidden_states` at the tapped layers.
            is_first_iteration (`bool`): true before the prefill; the target then runs alone.
            n_last_matches (`int`): accepted tokens in the previous round (checked against our own count).

        Returns:
            `(candidate_ids, candidate_logits)`: `(1, seq + k)` ids and `(1, k, vocab_size)` one-hot scores, or
            `(input_ids, None)` when nothing is drafted (the prefill, or no room left under `max_length`).
        """
        self._last_num_candidates = 0
        if is_first_iteration:
            return input_ids, None
        if input_ids.shape[0] != 1:
            raise ValueError(f"EAGLE-3 chain mode supports batch size 1, got input_ids of shape {input_ids.shape}.")
        model_kwargs = model_kwargs or {}
        self._attention_mask = model_kwargs.get("attention_mask")
        self._position_ids = model_kwargs.get("position_ids")
        # The target verifies k candidates and adds a bonus token: stay within max_length.
        num_candidates = min(self.num_assistant_tokens, self.max_length - input_ids.shape[1] - 1)
        with speculative_attention_kernels(self.draft.device):  # masked head forwards: keep them off cuDNN's SDPA
            last_hidden, last_logits = self._encode_new_pairs(input_ids, model_outputs, n_last_matches)
            if num_candidates <= 0:
                return input_ids, None
            candidates = self._draft_chain(input_ids, last_hidden, last_logits, num_candidates)
        self._last_num_candidates = num_candidates
        candidates = candidates.to(input_ids.device)
        candidate_logits = torch.full(
            (1, num_candidates, self._vocab_size), float("-inf"), dtype=torch.float32, device=input_ids.device
        )
        candidate_logits.scatter_(-1, candidates.unsqueeze(-1), 0.0)
        return torch.cat([input_ids, candidates], dim=-1), candidate_logits

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        """Record the accepted count of the round that verified our chain (the chain length stays constant)."""
        if self._last_num_candidates > 0:
            self.num_candidates.append(self._last_num_candidates)
            self.num_matches.append(int(num_matches))

    # ------------------------------------------------------------------------------------------------ internals
    def _encode_new_pairs(
        self,
        input_ids: torch.LongTensor,
        model_outputs: ModelOutput | None,
        n_last_matches: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Drop the self-fed KV of the last chain and encode the newly confirmed pairs with target features.

        The last target forward started at target position `num_encoded` (everything before it is encoded), and
        positions up to `seq - 2` are now confirmed (`seq - 1` holds the bonus token, not yet seen by the target).

        Returns the head's pre-norm output `(1, 1, hidden_size)` and draft-vocab logits `(1, draft_vocab_size)` at
        the last encoded position, which predict the first candidate (target position `seq`).
        """
        if model_outputs is None or getattr(model_outputs, "hidden_states", None) is None:
            raise ValueError(
                "Eagle3CandidateGenerator needs the target's hidden states; `_assisted_decoding` must pass "
                f"model_outputs computed with output_hidden_states={self.layer_ids}."
            )
        seq_len = input_ids.shape[1]
        num_new = seq_len - 1 - self.num_encoded
        features = gather_target_features(model_outputs.hidden_states, self.layer_ids)
        if self.num_encoded > 0 and num_new != n_last_matches + 1:
            raise RuntimeError(
                f"Draft bookkeeping is out of step: expected {n_last_matches + 1} new confirmed tokens "
                f"(n_last_matches + 1), found {num_new}."
            )
        if not 0 < num_new <= features.shape[1]:
            raise RuntimeError(
                f"The last target forward covers {features.shape[1]} positions but {num_new} confirmed positions "
                "still need draft features."
            )
        # Rollback: the head's own-feature KV from the last chain is never kept (re-encoded below with target
        # features, which also discards whatever the target rejected).
        stale = self.draft_cache.get_seq_length() - self.num_encoded
        if stale > 0:
            self.draft_cache.crop(-stale)

        device = self.draft.device
        outputs = self.draft(
            input_ids=input_ids[:, self.num_encoded + 1 :].to(device),
            target_hidden_states=features[:, :num_new].to(device),
            cache=self.draft_cache,
            use_cache=True,
            logits_to_keep=1,
            **self._window(self.num_encoded, num_new),
        )
        self.num_encoded += num_new
        return outputs.hidden_states[:, -1:], outputs.logits[:, -1]

    def _draft_chain(
        self,
        input_ids: torch.LongTensor,
        hidden: torch.Tensor,
        logits: torch.Tensor,
        num_candidates: int,
    ) -> torch.LongTensor:
        """Greedy chain of `num_candidates` target ids `(1, num_candidates)`; each step feeds the drafted token with
        the head's own pre-norm output `hidden` `(1, 1, hidden_size)` at the next draft position."""
        device = self.draft.device
        sequence = input_ids.to(device)
        drafted = []
        for step in range(num_candidates):
            token = self._pick(sequence, logits)
            drafted.append(token)
            sequence = torch.cat([sequence, token], dim=-1)
            if step == num_candidates - 1:
                break
            outputs = self.draft(
                input_ids=token,
                hidden_states=hidden,
                cache=self.draft_cache,
                use_cache=True,
                **self._window(self.draft_cache.get_seq_length(), 1),
            )
            hidden, logits = outputs.hidden_states[:, -1:], outputs.logits[:, -1]
        return torch.cat(drafted, dim=-1)

    def _pick(self, sequence: torch.LongTensor, draft_logits: torch.Tensor) -> torch.LongTensor:
        """Argmax target id `(1, 1)` from draft-vocab logits `(1, draft_vocab_size)`, after the target's processors
        when there are any (they act on `(1, vocab_size)` target-vocab scores; ids outside the draft vocab get
        `-inf`)."""
        if len(self.logits_processor) == 0:
            return self._target_ids[draft_logits.argmax(dim=-1, keepdim=True)]
        scores = torch.full((1, self._vocab_size), float("-inf"), dtype=torch.float32, device=draft_logits.device)
        scores[:, self._target_ids] = draft_logits.float()
        scores = self.logits_processor(sequence, scores)
        return scores.argmax(dim=-1, keepdim=True)

    def _window(self, start: int, length: int) -> dict[str, torch.Tensor]:
        """Draft `attention_mask` `(1, start + length)` and `position_ids` `(1, length)` for draft positions
        `start .. start + length - 1`, derived from the target's (each is left out when the target has none).

        Draft position `j` holds the pair `(x[j + 1], F[j])`: it is attended iff `x[j]`, whose feature it carries,
        is attended by the target, and it sits at the target's position of `x[j]`. With left padding this gives the
        head exactly the pairs and positions of the unpadded prompt. Positions past the confirmed sequence
        (drafted tokens) are always attended and continue the numbering.
        """
        window = {}
        device = self.draft.device
        if self._attention_mask is not None:
            mask = self._attention_mask[:, : start + length].to(device)
            missing = start + length - mask.shape[1]
            window["attention_mask"] = torch.cat([mask, mask.new_ones(1, missing)], dim=-1) if missing else mask
        if self._position_ids is not None and self._position_ids.ndim == 2:
            positions = self._position_ids.to(device)
            last = positions.shape[1] - 1
            offsets = torch.arange(start, start + length, device=device)
            window["position_ids"] = positions[:, offsets.clamp(max=last)] + (offsets - last).clamp(min=0)
        return window


# ----------------------------------------------------------------------------------------------------- selection
def _resolve_num_assistant_tokens(generation_config: GenerationConfig | None, num_assistant_tokens: int | None) -> int:
    """Explicit argument > `generation_config.num_assistant_tokens` > `DEFAULT_NUM_ASSISTANT_TOKENS`.

    The `generation_config` seen inside `generate` cannot be used: it always carries transformers' global default
    (20), which is tuned for small assistant models, not for a one-layer head.
    """
    if num_assistant_tokens is not None:
        return int(num_assistant_tokens)
    if generation_config is not None and generation_config.num_assistant_tokens is not None:
        return int(generation_config.num_assistant_tokens)
    return DEFAULT_NUM_ASSISTANT_TOKENS


@contextmanager
def chain_mode(
    target: PreTrainedModel,
    draft: Eagle3DraftModel,
    generation_config: GenerationConfig | None = None,
    num_assistant_tokens: int | None = None,
) -> Iterator[list[Eagle3CandidateGenerator]]:
    """Make `target.generate(..., assistant_model=draft)` use `Eagle3CandidateGenerator` inside the block.

    Installs an instance-level `_get_candidate_generator` on `target` (the stock method is looked up on the
    instance by `_assisted_decoding`); calls with any other assistant, or with prompt lookup / early exit and no
    `draft`, keep the stock generators. The override is removed on exit, also after an error, and a previously
    installed instance-level override is restored. Attaches the target's embedding to `draft` when it has none.

    Args:
        target (`PreTrainedModel`): the target model (decoder-only, batch size 1 as in all assisted decoding).
        draft (`Eagle3DraftModel`): the EAGLE-3 head for `target`.
        generation_config (`GenerationConfig`, *optional*): the caller's config; only `num_assistant_tokens` is read.
        num_assistant_tokens (`int`, *optional*): chain length; overrides `generation_config`, defaults to 5.

    Yields:
        `list[Eagle3CandidateGenerator]`: the generators built inside the block, one per `generate` call (each
        starts with an empty draft cache), for reading acceptance statistics such as `num_matches`.

    Example:

    ```python
    with chain_mode(target, draft, num_assistant_tokens=4) as generators:
        out = target.generate(input_ids, assistant_model=draft, do_sample=False, max_new_tokens=64)
    print(generators[-1].mean_accepted_length)
    ```
    """
    if not isinstance(draft, Eagle3DraftModel):
        raise TypeError(f"chain_mode needs an Eagle3DraftModel as draft, got {type(draft).__name__}.")
    if target.config.is_encoder_decoder:
        raise ValueError("EAGLE-3 chain mode supports decoder-only targets only.")
    draft.check_target(target)
    if not draft.has_embedding:
        draft.attach_target(target)
    chain_length = _resolve_num_assistant_tokens(generation_config, num_assistant_tokens)
    if chain_length < 1:
        raise ValueError(f"num_assistant_tokens must be >= 1, got {chain_length}.")

    generators: list[Eagle3CandidateGenerator] = []
    previous = target.__dict__.get("_get_candidate_generator")
    stock = previous if previous is not None else type(target)._get_candidate_generator.__get__(target)

    def _get_candidate_generator(generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs, **kw):
        if kw.get("assistant_model") is not draft:
            return stock(
                generation_config=generation_config,
                input_ids=input_ids,
                inputs_tensor=inputs_tensor,
                logits_processor=logits_processor,
                model_kwargs=model_kwargs,
                **kw,
            )
        generator = Eagle3CandidateGenerator(draft, generation_config, logits_processor, chain_length)
        generators.append(generator)
        return generator

    target._get_candidate_generator = _get_candidate_generator
    try:
        yield generators
    finally:
        if previous is not None:
            target._get_candidate_generator = previous
        else:
            del target._get_candidate_generator


__all__ = ["DEFAULT_NUM_ASSISTANT_TOKENS", "Eagle3CandidateGenerator", "chain_mode"]
