"""One-shot GPU check of the CUDA path (issue 19): correctness on tiny targets, speed on a Llama-3.1-8B shape.

Everything is built in code from configs, with random weights: nothing is downloaded and no model file is read.
Writes `device_check.json` and `device_check.md` into `--output-dir` (rewritten after every section, so a run
stopped at its time limit still leaves what it measured).

Correctness (tiny random Llama, Qwen3, Mistral with a sliding window, Gemma3 with mixed sliding/full layers):
    - fp32 sdpa: greedy `generate(assistant_model=head)` (tree) and `eagle3_mode="chain"` against plain `generate`,
      which must be bit-identical;
    - bf16: the same comparison as a divergence rate, next to plain `generate`'s own divergence when only the batch
      shape changes (the prompt run twice in one batch), which tells numerics from bugs;
    - sampling (sampled-draft tree, top-k tree, chain) runs and returns the requested number of valid tokens.
    The heads get tokens accepted because they know the plain greedy continuation (`ContinuationDraft` below).

Speed (a Llama-3.1-8B-shaped bf16 target built on the device with random weights, and a head of the official
shape: one layer, 32k draft vocabulary):
    - a plain decoding step, and a bare target forward by token count;
    - `verify_tree` by tree size (1-64 nodes), one draft level (`TreeDrafter.grow` by depth), the draft update
      (`TreeDrafter.extend`), all timed from outside through public functions;
    - host syncs per round (`torch.cuda.set_sync_debug_mode`), per plain step and per component;
    - end-to-end tokens/s of plain `generate`, tree decoding (60 nodes, depth 6, top-k 10) and Transformers' own
      assisted loop (chain mode, 6 draft tokens) given the same drafts, at acceptance alpha 0.6 and 0.8.

    .venv/bin/python scripts/device_check.py --smoke --output-dir /tmp/check   # CPU, tiny shapes, well under 1 min
    bash scripts/device_check.sh                                              # on the GPU machine (see docs/cuda.md)

CUDA regions are timed with CUDA events after a synchronize (device work is asynchronous); whole `generate` calls
with a synchronize on both sides. Medians of several repeats after warm-up are reported.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
import warnings
from contextlib import nullcontext
from pathlib import Path


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Qwen3Config,
)
from transformers.cache_utils import DynamicCache  # noqa: E402

import eagle3_hf  # noqa: E402
from eagle3_hf import Eagle3DraftModel  # noqa: E402
from eagle3_hf.bench.measure import StepClock  # noqa: E402
from eagle3_hf.cpu_features import cpu_model, describe_cpu_features  # noqa: E402
from eagle3_hf.generation.cuda_attention import leave_sdpa_to_torch, speculative_attention_kernels  # noqa: E402
from eagle3_hf.generation.drafter import TreeDrafter  # noqa: E402
from eagle3_hf.generation.verify import attention_layer_kinds, verify_tree  # noqa: E402
from eagle3_hf.target import gather_target_features  # noqa: E402
from eagle3_hf.vocab_maps import maps_from_token_ids  # noqa: E402


REPORT_NAME = "device_check"

# meta-llama/Llama-3.1-8B-Instruct's config.json, the fields that set shapes and RoPE.
LLAMA_31_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    tie_word_embeddings=False,
)
OFFICIAL_DRAFT_VOCAB = 32000  # the released EAGLE-3 heads for Llama-3.1-8B
# The same structure, small enough for a CPU in seconds (--smoke).
SMOKE_LLAMA = dict(
    LLAMA_31_8B,
    vocab_size=2048,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=16384,  # llama3 RoPE scaling wants more than its original 8192
)
SMOKE_DRAFT_VOCAB = 512

# As the unit tests' tiny targets (tests/conftest.py): 8 layers so that the default taps [2, 4, 5] differ.
TINY_TARGET = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
# Windows of 8 tokens are crossed many times by prompts of 12-40 tokens plus the new tokens.
ARCHITECTURES = {
    "llama": (LlamaConfig, {}),
    "qwen3": (Qwen3Config, {}),
    "mistral-sliding": (MistralConfig, dict(sliding_window=8)),
    "gemma3-sliding": (Gemma3TextConfig, dict(sliding_window=8, head_dim=8)),
}
TINY_TREE = dict(tree_total_tokens=24, tree_depth=5, tree_top_k=4)
SPEED_TREE = dict(tree_total_tokens=60, tree_depth=6, tree_top_k=10)  # the GPU shape
CHAIN_TOKENS = 6  # chain mode drafts as deep as the tree
VERIFY_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 60, 64)
FORWARD_SIZES = (1, 8, 16, 32, 60, 64)
UPDATE_SIZES = (1, 4, 7)  # tokens a round hands to the head: 1 + accepted, at most depth + 1
ALPHAS = (0.6, 0.8)
E2E_METHODS = ("tree", "adaptive", "chain")
# the fixed tree once more with cuDNN's SDPA left in torch's order (`cuda_attention.leave_sdpa_to_torch`): what the
# tree loop's own backend choice is worth, in the same run
E2E_EXTRA = (("tree_cudnn", 0.8),)


# ------------------------------------------------------------------------------------------------- the drafter
class ContinuationDraft(Eagle3DraftModel):
    """A real EAGLE-3 head (its forward runs as usual, so its cost is real) whose logits are then steered by a known
    continuation: at every fed row whose sequence so far is a prefix of `continuation`, the next token of the
    continuation is proposed with probability `alpha` and withheld (logit `-inf`) otherwise. Rows off that path
    keep the head's own logits.

    Draft position `p` holds the pair `(x[p + 1], F[p])` and predicts `x[p + 2]` (see `drafter.py`), so a row at
    position `p` proposes `continuation[p + 2]`. Whether a row is on the path is tracked per cache slot on the
    device (its own token matches the continuation and every slot it attends to is on the path), so the steering
    adds no host sync: only a few small kernels per head forward, measured on their own as `oracle_overhead`.

    `rank_spread > 1` puts a proposed token at a uniformly drawn rank among the row's best `rank_spread` (rank 1
    above all by `margin`, ranks 2.. just below the one before), so that accepted paths also run through later
    siblings; with 1 it is always the head's confident top choice, which the chain mode also drafts.

    Call `steer(continuation, alpha)` before each `generate` call and `steer(None)` to turn it off.
    """

    def steer(
        self,
        continuation: torch.LongTensor | None,
        alpha: float = 1.0,
        rank_spread: int = 1,
        seed: int = 0,
        margin: float | None = None,
    ) -> "ContinuationDraft":
        device = self.d2t.device
        self.continuation = None if continuation is None else continuation.reshape(-1).to(device)
        self.alpha, self.rank_spread = alpha, rank_spread
        # a trained head is confident when right: log(V_d) + 2 over the head's best gives the proposal >= 0.88
        self.margin = math.log(self.config.draft_vocab_size) + 2.0 if margin is None else margin
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.slot_on_path = torch.zeros(0, dtype=torch.bool, device=device)
        target_ids = self.draft_to_target_ids(torch.arange(self.config.draft_vocab_size, device=device))
        self.draft_index = torch.full((self.config.vocab_size,), -1, dtype=torch.long, device=device)
        self.draft_index[target_ids] = torch.arange(self.config.draft_vocab_size, device=device)
        self.feature_forwards = 0  # forwards with target features: the prefill, then one per round
        return self

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, logits_to_keep=0, **kwargs):
        past = cache.get_seq_length() if cache is not None else 0
        out = super().forward(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            logits_to_keep=logits_to_keep,
            **kwargs,
        )
        if getattr(self, "continuation", None) is None:
            return out
        if kwargs.get("target_hidden_states") is not None:
            self.feature_forwards += 1
        device, num_rows = input_ids.device, input_ids.shape[1]
        known = self.continuation
        length = known.shape[0]
        positions = position_ids[0] if position_ids is not None else torch.arange(past, past + num_rows, device=device)
        own = (positions + 1 < length) & (input_ids[0] == known[(positions + 1).clamp(max=length - 1)])
        slots = self.slot_on_path[:past]
        if slots.shape[0] < past:  # slots fed before `steer` (not in this script's use): off the path
            slots = torch.cat([slots, torch.zeros(past - slots.shape[0], dtype=torch.bool, device=device)])
        if attention_mask is not None and attention_mask.dim() == 4:
            mask = attention_mask[0, 0]
            visible = mask if mask.dtype == torch.bool else mask == 0  # [rows, past + rows]
        else:  # causal (the prompt, accepted tokens, a chain)
            visible = torch.ones(num_rows, past + num_rows, dtype=torch.bool, device=device).tril(past)
        # in a tree every row's ancestors among its own batch are on the path if their tokens are: their own past
        # is a subset of the row's
        on_path = (~visible | torch.cat([slots, own])[None]).all(dim=-1)
        if cache is not None:
            self.slot_on_path = torch.cat([slots, on_path])
        kept = out.logits.shape[1]
        on_path, positions = on_path[num_rows - kept :], positions[num_rows - kept :]
        logits = out.logits[0].float()
        wanted = (positions + 2).clamp(max=length - 1)
        draft_id = self.draft_index[known[wanted]]
        steered = on_path & (positions + 2 < length) & (draft_id >= 0)
        hit = torch.rand(kept, generator=self.generator, device=device) < self.alpha
        column = draft_id.clamp(min=0)[:, None]
        current = logits.gather(1, column)[:, 0]
        if self.rank_spread > 1:
            best = logits.topk(self.rank_spread + 1, dim=-1).values  # [kept, spread + 1]
            rank = torch.randint(0, self.rank_spread, (kept,), generator=self.generator, device=device)
            between = (best.gather(1, (rank - 1).clamp(min=0)[:, None]) + best.gather(1, rank[:, None]))[:, 0] / 2
            proposed = torch.where(rank == 0, best[:, 0] + self.margin, between)
        else:
            proposed = logits.amax(dim=-1) + self.margin
        value = torch.where(steered & hit, proposed, torch.where(steered, float("-inf"), current))
        out.logits = logits.scatter(1, column, value[:, None])[None]
        return out


def expected_tau(alpha: float, depth: int) -> float:
    """Tokens per round when every level's proposal is right with probability `alpha`: `1 + sum alpha^i`."""
    return 1.0 + sum(alpha**i for i in range(1, depth + 1))


# ------------------------------------------------------------------------------------------------------ timing
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_region(fn, device: torch.device, repeats: int, warmup: int = 2, reset=None) -> list[float]:
    """Seconds of `fn()` per repeat; on CUDA between two events recorded after a synchronize, so the region's host
    launch time and its queued device work are both inside. `reset()` runs after each timed call, untimed."""
    for _ in range(warmup):
        fn()
        if reset is not None:
            reset()
    times = []
    for _ in range(repeats):
        synchronize(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
        if reset is not None:
            reset()
    return times


def wall(fn, device: torch.device):
    """`(result, seconds)` of a whole call, synchronized on both sides."""
    synchronize(device)
    began = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - began


def median_interval_ms(clock: StepClock, statistic=statistics.median) -> float | None:
    """Median (or `statistic`: the mean shows steps that pay a one-off cost, which the median hides) time between
    consecutive steps or rounds; None when the clock saw fewer than two."""
    gaps = clock.intervals()
    return 1e3 * statistic(gaps) if gaps else None


def count_syncs(fn, device: torch.device) -> int | None:
    """Host-device synchronizations during `fn()` as CUDA's sync debug mode reports them; None off CUDA."""
    if device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def crop_to(cache: DynamicCache, length: int) -> None:
    """Drop the entries past `length` (`DynamicCache.crop` takes the number to remove, as a negative int)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def summary_ms(times: list[float]) -> dict:
    return {"median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times), "repeats": len(times)}


# ------------------------------------------------------------------------------------------------- correctness
def tiny_target(config_class, overrides: dict, device: torch.device, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = config_class(**{**TINY_TARGET, **overrides})
    target = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(device).eval()
    quiet(target)
    return target


def quiet(target) -> None:
    """No EOS, so every call produces exactly `max_new_tokens`; a pad id, so generate does not warn."""
    target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = 0


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Index of the first differing token of two `(1, L)` sequences, None when identical."""
    a, b = a.reshape(-1).cpu(), b.reshape(-1).cpu()
    if a.shape == b.shape and torch.equal(a, b):
        return None
    n = min(a.shape[0], b.shape[0])
    differs = torch.nonzero(a[:n] != b[:n]).flatten()
    return int(differs[0]) if differs.numel() else n


def margin_at(target, reference: torch.Tensor, position: int | None) -> float | None:
    """The gap between the target's two best logits for the token at `position` of `reference` (plain generate's
    output), from one forward over the prefix: a divergence where the gap is a rounding step or two is numerics."""
    if position is None:
        return None
    with torch.no_grad():
        logits = target(reference[:, :position]).logits[0, -1].float()
    best = logits.topk(2).values
    return float(best[0] - best[1])


def check_architecture(name: str, device: torch.device, args, rng: torch.Generator, stop_at: float) -> dict:
    """Every prompt's greedy comparisons (fp32 and bf16) and, for the first ones, the sampling runs; no further
    prompt is started after `stop_at` (`time.time()`), so that a slow machine still leaves time for the speed part."""
    config_class, overrides = ARCHITECTURES[name]
    target = tiny_target(config_class, overrides, device, seed=0)
    torch.manual_seed(1)
    head = ContinuationDraft.from_target(target)
    target_bf16 = tiny_target(config_class, overrides, device, seed=0).to(torch.bfloat16)
    torch.manual_seed(1)
    head_bf16 = ContinuationDraft.from_target(target_bf16)
    vocab, new = TINY_TARGET["vocab_size"], args.tiny_new_tokens
    result = {"fp32": [], "bf16": [], "sampling": []}
    for index in range(args.prompts):
        if index and time.time() > stop_at:
            break
        length = int(torch.randint(12, 41, (1,), generator=rng))
        prompt = torch.randint(0, vocab, (1, length), generator=rng).to(device)
        greedy = dict(do_sample=False, max_new_tokens=new)
        # fp32: bit-identical or wrong
        reference = target.generate(prompt, **greedy)
        head.steer(reference, alpha=0.8, rank_spread=3, seed=index)
        tree = target.generate(prompt, assistant_model=head, return_dict_in_generate=True, **greedy, **TINY_TREE)
        head.steer(reference, alpha=0.8, rank_spread=3, seed=index)
        adaptive = target.generate(prompt, assistant_model=head, **greedy)  # the default: shapes chosen per round
        head.steer(reference, alpha=0.8, rank_spread=3, seed=index)
        chain = target.generate(prompt, assistant_model=head, eagle3_mode="chain", num_assistant_tokens=4, **greedy)
        result["fp32"].append(
            {
                "prompt_length": length,
                "tree_first_difference": first_difference(tree.sequences, reference),
                "adaptive_first_difference": first_difference(adaptive, reference),
                "chain_first_difference": first_difference(chain, reference),
                "tree_tau": tree.tau,
                "chain_rounds": head.feature_forwards,
            }
        )
        # bf16: plain generate's own divergence under another batch shape, next to the tree's and chain's
        reference_bf16 = target_bf16.generate(prompt, **greedy)
        batched = target_bf16.generate(prompt.repeat(2, 1), **greedy)[:1]
        head_bf16.steer(reference_bf16, alpha=0.8, rank_spread=3, seed=index)
        tree_bf16 = target_bf16.generate(
            prompt, assistant_model=head_bf16, return_dict_in_generate=True, **greedy, **TINY_TREE
        )
        head_bf16.steer(reference_bf16, alpha=0.8, rank_spread=3, seed=index)
        chain_bf16 = target_bf16.generate(
            prompt, assistant_model=head_bf16, eagle3_mode="chain", num_assistant_tokens=4, **greedy
        )
        case = {
            "prompt_length": length,
            "plain_batch2_first_difference": first_difference(batched, reference_bf16),
            "tree_first_difference": first_difference(tree_bf16.sequences, reference_bf16),
            "chain_first_difference": first_difference(chain_bf16, reference_bf16),
            "tree_tau": tree_bf16.tau,
        }
        for kind in ("plain_batch2", "tree", "chain"):
            case[f"{kind}_logit_margin_there"] = margin_at(
                target_bf16, reference_bf16, case[f"{kind}_first_difference"]
            )
        result["bf16"].append(case)
        if index < args.sampling_prompts:
            result["sampling"].extend(sampling_runs(target, head, prompt, reference, new, seed=index))
    return summarize_architecture(result, new)


def sampling_runs(target, head, prompt, reference, new: int, seed: int) -> list[dict]:
    """Sampling with the sampled-draft tree, the top-k tree and the chain: each must return `new` valid tokens."""
    runs = []
    variants = {
        "tree_sampled_draft": dict(tree_sampled_draft=True, **TINY_TREE),
        "tree_topk_draft": dict(tree_sampled_draft=False, **TINY_TREE),
        "chain": dict(eagle3_mode="chain", num_assistant_tokens=4),
    }
    for variant, extra in variants.items():
        head.steer(reference, alpha=0.8, rank_spread=3, seed=seed)
        torch.manual_seed(seed)
        record = {"variant": variant}
        try:
            out = target.generate(
                prompt, assistant_model=head, do_sample=True, temperature=0.8, top_p=0.95, max_new_tokens=new, **extra
            )
            tokens = out[0, prompt.shape[1] :]
            record["ok"] = bool(
                tokens.shape[0] == new and int(tokens.min()) >= 0 and int(tokens.max()) < TINY_TARGET["vocab_size"]
            )
            record["new_tokens"] = int(tokens.shape[0])
            record["rounds"] = head.feature_forwards
        except Exception as error:  # a failing variant is a finding, not a reason to stop the run
            record.update(ok=False, error=f"{type(error).__name__}: {error}")
        runs.append(record)
    return runs


def summarize_architecture(result: dict, new: int) -> dict:
    fp32, bf16 = result["fp32"], result["bf16"]

    def rate(cases, key):
        return sum(case[key] is not None for case in cases) / len(cases)

    return {
        "new_tokens": new,
        "prompts": len(fp32),
        "fp32_tree_identical": sum(c["tree_first_difference"] is None for c in fp32),
        "fp32_adaptive_identical": sum(c["adaptive_first_difference"] is None for c in fp32),
        "fp32_chain_identical": sum(c["chain_first_difference"] is None for c in fp32),
        "fp32_tree_tau_mean": statistics.mean(c["tree_tau"] for c in fp32),
        "bf16_plain_batch2_divergence_rate": rate(bf16, "plain_batch2_first_difference"),
        "bf16_tree_divergence_rate": rate(bf16, "tree_first_difference"),
        "bf16_chain_divergence_rate": rate(bf16, "chain_first_difference"),
        "bf16_tree_tau_mean": statistics.mean(c["tree_tau"] for c in bf16),
        # at each divergence, plain generate's top-2 logit gap: about one bf16 rounding step means numerics
        "bf16_divergence_logit_margins": [
            c[f"{kind}_logit_margin_there"]
            for c in bf16
            for kind in ("plain_batch2", "tree", "chain")
            if c[f"{kind}_logit_margin_there"] is not None
        ],
        "sampling_ok": all(r.get("ok") for r in result["sampling"]),
        "cases": result,
    }


def run_correctness(device: torch.device, args, report: dict, save, deadline: float) -> None:
    """The four architectures in turn, each given an equal share of the time left until `deadline`."""
    section = report.setdefault("correctness", {"architectures": {}})
    rng = torch.Generator().manual_seed(1234)
    for left, name in zip(range(len(ARCHITECTURES), 0, -1), ARCHITECTURES):
        began = time.perf_counter()
        stop_at = time.time() + (deadline - time.time()) / left
        try:
            section["architectures"][name] = check_architecture(name, device, args, rng, stop_at)
        except Exception as error:
            section["architectures"][name] = {"error": f"{type(error).__name__}: {error}"}
            report["errors"].append({"where": f"correctness/{name}", "traceback": traceback.format_exc()})
        section["architectures"][name]["seconds"] = time.perf_counter() - began
        print(f"[correctness] {name}: {one_line(section['architectures'][name])}", flush=True)
        save()
    archs = section["architectures"].values()
    section["fp32_greedy_identical"] = all(
        "error" not in a
        and a["prompts"] == a["fp32_tree_identical"] == a["fp32_adaptive_identical"] == a["fp32_chain_identical"]
        for a in archs
    )
    section["sampling_ok"] = all(a.get("sampling_ok", False) for a in archs)


def one_line(arch: dict) -> str:
    if "error" in arch:
        return arch["error"]
    return (
        f"fp32 tree {arch['fp32_tree_identical']}/{arch['prompts']} adaptive {arch['fp32_adaptive_identical']}/"
        f"{arch['prompts']} chain {arch['fp32_chain_identical']}/"
        f"{arch['prompts']} identical (tau {arch['fp32_tree_tau_mean']:.2f}); bf16 divergence plain-batch2 "
        f"{arch['bf16_plain_batch2_divergence_rate']:.2f} tree {arch['bf16_tree_divergence_rate']:.2f} chain "
        f"{arch['bf16_chain_divergence_rate']:.2f}; sampling ok {arch['sampling_ok']} ({arch['seconds']:.1f} s)"
    )


# ------------------------------------------------------------------------------------------------------- speed
def build_speed_models(device: torch.device, smoke: bool, seed: int = 0):
    """The target (bf16 on CUDA, built on `device` directly: its 16 GB of weights are never on the host), the head.

    Weights are random except for two choices that make the target's greedy continuation *stable under bf16*, so
    that the drafter's known continuation stays the one tree decoding produces: the output head holds the input
    embeddings of a fixed permutation `sigma` (row `sigma(v)` is `embedding(v) / sqrt(H)`), and the attention and
    MLP output projections are scaled by 0.01, so the residual stream stays close to the current token's embedding
    and the next token is `sigma(current)` by a logit margin of about `sqrt(H)` (64) against about 5. Shapes,
    FLOPs and kernels are the 8B model's. The draft vocabulary is a random 32k set that `sigma` maps onto itself,
    and prompts are drawn from it, so every continuation token can be proposed.
    """
    shape = SMOKE_LLAMA if smoke else LLAMA_31_8B
    draft_vocab = SMOKE_DRAFT_VOCAB if smoke else OFFICIAL_DRAFT_VOCAB
    config = LlamaConfig(**shape)
    # bf16 as served on GPUs; on a CPU (--smoke) float32, since bf16 matmuls there are emulated and slow
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(seed)
    with torch.device(device):
        target = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa").eval()
    quiet(target)
    vocab, hidden = shape["vocab_size"], shape["hidden_size"]
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        draft_vocab_ids = torch.randperm(vocab, generator=generator, device=device)[:draft_vocab].sort().values
        rest = torch.ones(vocab, dtype=torch.bool, device=device)
        rest[draft_vocab_ids] = False
        rest_ids = torch.nonzero(rest).flatten()
        sigma = torch.arange(vocab, device=device)
        sigma[draft_vocab_ids] = draft_vocab_ids[torch.randperm(draft_vocab, generator=generator, device=device)]
        sigma[rest_ids] = rest_ids[torch.randperm(rest_ids.shape[0], generator=generator, device=device)]
        embedding = target.get_input_embeddings().weight
        embedding.normal_(0.0, 1.0, generator=generator)
        output = target.get_output_embeddings().weight
        output[sigma] = embedding / math.sqrt(hidden)  # logits[sigma(v)] = <embedding(v), norm(h)> / sqrt(H)
        for module_name, module in target.named_modules():
            if module_name.endswith(("o_proj", "down_proj")):
                module.weight.mul_(0.01)
    torch.manual_seed(seed + 1)
    with torch.device(device):
        head = ContinuationDraft.from_target(target, draft_vocab_size=draft_vocab)
    d2t, t2d = maps_from_token_ids(draft_vocab_ids.cpu(), vocab)
    head.set_vocab_maps(d2t.to(device), t2d.to(device))
    return target, head, draft_vocab_ids, sigma


def run_speed(device: torch.device, args, report: dict, save, deadline: float) -> None:
    section = report.setdefault("speed", {})
    began = time.perf_counter()
    target, head, draft_vocab_ids, sigma = build_speed_models(device, args.smoke)
    section["build_seconds"] = time.perf_counter() - began
    section["target"] = {
        "shape": "tiny Llama (smoke)" if args.smoke else "Llama-3.1-8B",
        "parameters": sum(p.numel() for p in target.parameters()),
        "hidden_size": target.config.hidden_size,
        "layers": target.config.num_hidden_layers,
        "vocab_size": target.config.vocab_size,
        "dtype": str(target.dtype),
    }
    section["head"] = {
        "layers": head.config.num_hidden_layers,
        "draft_vocab_size": head.config.draft_vocab_size,
        "parameters": sum(p.numel() for p in head.parameters()),
        "target_layer_ids": list(head.config.target_layer_ids),
    }
    section["tree"], section["chain_tokens"] = dict(SPEED_TREE), CHAIN_TOKENS
    print(f"[speed] built target and head in {section['build_seconds']:.1f} s", flush=True)
    save()

    rng = torch.Generator().manual_seed(99)
    pick = torch.randint(0, draft_vocab_ids.shape[0], (1, args.prompt_length), generator=rng)
    prompt = draft_vocab_ids.cpu()[pick].to(device)
    # warm-up: cuBLAS handles, kernel selection, the first call of each code path
    target.generate(prompt, do_sample=False, max_new_tokens=4)
    head.steer(None)
    target.generate(prompt, assistant_model=head, do_sample=False, max_new_tokens=8, **SPEED_TREE)

    reference, plain_seconds = plain_baseline(target, prompt, sigma, device, args, section)
    save()
    section["sdpa_new_shapes"] = sdpa_new_shapes(target, prompt.shape[1], device, args.repeats)
    save()
    component_timings(target, head, prompt, reference, device, args, section)
    save()
    print(f"[speed] component timings done at {time.perf_counter() - began:.1f} s", flush=True)
    end_to_end(target, head, prompt, reference, plain_seconds, device, args, section, deadline)
    save()
    if device.type == "cuda" and time.time() < deadline:
        section["syncs_per_round"] = sync_counts(target, head, prompt, reference, device, args)
    else:  # not countable off CUDA, or no time left
        section["syncs_per_round"] = {"plain_per_step": None, "tree_per_round": None, "chain_per_round": None}
    head.steer(None)
    save()


def generate_with(target, head, prompt, reference, method: str, alpha: float, new: int, seed: int, streamer=None):
    """One greedy `generate` call: plain, tree (the fixed 60-node shape), tree_cudnn (the same with cuDNN's SDPA
    left in torch's order), adaptive (the round planner, starting from that shape) or chain mode, the head steered at
    acceptance `alpha`."""
    if method == "plain":
        return target.generate(prompt, do_sample=False, max_new_tokens=new, streamer=streamer)
    head.steer(reference, alpha=alpha, seed=seed)
    if method == "tree_cudnn":
        with leave_sdpa_to_torch():
            return generate_with(target, head, prompt, reference, "tree", alpha, new, seed, streamer)
    if method in ("tree", "adaptive"):
        return target.generate(
            prompt,
            assistant_model=head,
            do_sample=False,
            max_new_tokens=new,
            return_dict_in_generate=True,
            streamer=streamer,
            tree_adaptive=method == "adaptive",
            **SPEED_TREE,
        )
    return target.generate(
        prompt,
        assistant_model=head,
        eagle3_mode="chain",
        num_assistant_tokens=CHAIN_TOKENS,
        do_sample=False,
        max_new_tokens=new,
        streamer=streamer,
    )


def plain_baseline(target, prompt, sigma, device, args, section: dict) -> tuple[torch.LongTensor, float]:
    """Plain greedy `generate`: its output is the continuation every drafter proposes from, its time the baseline."""
    new, runs, runs_without_cudnn, same_without_cudnn = args.new_tokens, [], [], True
    for _ in range(args.e2e_repeats):  # interleaved: torch's default backends, then cuDNN's SDPA off
        reference, seconds = wall(lambda: generate_with(target, None, prompt, None, "plain", 0.0, new, 0), device)
        runs.append(seconds)
        with speculative_attention_kernels(device):
            out, seconds = wall(lambda: generate_with(target, None, prompt, None, "plain", 0.0, new, 0), device)
        runs_without_cudnn.append(seconds)
        same_without_cudnn &= first_difference(out, reference) is None
    clock = StepClock()
    generate_with(target, None, prompt, None, "plain", 0.0, new, 0, streamer=clock)
    generated = reference[0, prompt.shape[1] :]
    follows = (sigma[reference[0, prompt.shape[1] - 1 : -1]] == generated).float().mean()
    section["target_follows_its_permutation"] = float(follows)
    section["plain_generate"] = {
        "new_tokens": new,
        "prompt_length": prompt.shape[1],
        "seconds_median": statistics.median(runs),
        "tokens_per_s": new / statistics.median(runs),
        "step_ms_inside_generate": median_interval_ms(clock),
        "step_ms_mean_inside_generate": median_interval_ms(clock, statistics.mean),
        "seconds_runs": runs,
    }
    # the same calls with cuDNN's SDPA off throughout (as a speculative call runs every forward): a baseline that
    # does not pay cuDNN's per-shape plans either, for an honest speedup where plain decoding pays them too
    section["plain_generate_without_cudnn_sdpa"] = {
        "seconds_median": statistics.median(runs_without_cudnn),
        "tokens_per_s": new / statistics.median(runs_without_cudnn),
        "seconds_runs": runs_without_cudnn,
        "identical_to_plain": same_without_cudnn,
    }
    return reference, statistics.median(runs)


def sdpa_new_shapes(target, prompt_length: int, device: torch.device, repeats: int) -> dict:
    """One attention call of the target's shape, each at a cache length not seen before, as every round of tree
    decoding makes (ms per call, medians): a 60-row tree query under its additive mask with torch's default backend
    order, the same inside `speculative_attention_kernels` (cuDNN's SDPA off, what speculative calls use), the
    masked query at one repeated length, and a one-row unmasked query as plain decoding runs it. On CUDA 13 builds of torch, Hopper
    tries cuDNN first, which plans per shape (`eagle3_hf/generation/cuda_attention.py`): this measures what that
    costs. Keys and values are repeated to the query heads, as Transformers' sdpa path does under a mask."""
    config = target.config
    heads, head_dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    nodes, dtype = SPEED_TREE["tree_total_tokens"], target.dtype
    lengths = iter(range(prompt_length + nodes, 10**6, 7))  # every call a new length, across all variants

    def call(rows: int, length: int, masked: bool):
        query = torch.randn(1, heads, rows, head_dim, device=device, dtype=dtype)
        key, value = (torch.randn(1, heads, length, head_dim, device=device, dtype=dtype) for _ in range(2))
        mask = torch.zeros(1, 1, rows, length, device=device, dtype=dtype) if masked else None
        if masked:  # a tree's shape of mask: the nodes' own block is lower triangular
            mask[..., length - rows :] = torch.full((rows, rows), float("-inf"), device=device, dtype=dtype).triu(1)
        return lambda: torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)

    def new_lengths(rows: int, masked: bool, context) -> dict:
        times = []
        for _ in range(repeats + 1):
            fn = call(rows, next(lengths), masked)
            with context():
                times += time_region(fn, device, repeats=1, warmup=0)
        return summary_ms(times[1:])  # the first call of a variant also selects its kernels

    with torch.no_grad():
        return {
            "tree_query_new_length_default_ms": new_lengths(nodes, True, nullcontext),
            "tree_query_new_length_eagle3_ms": new_lengths(nodes, True, lambda: speculative_attention_kernels(device)),
            "tree_query_same_length_default_ms": summary_ms(
                time_region(call(nodes, prompt_length + nodes, True), device, repeats)
            ),
            "one_row_new_length_default_ms": new_lengths(1, False, nullcontext),
            "cudnn_sdp_enabled": torch.backends.cuda.cudnn_sdp_enabled(),
        }


def component_timings(target, head, prompt, reference, device, args, section: dict) -> None:
    """A round's parts timed one by one from outside, through public functions, on a cache holding the prompt."""
    repeats, layer_ids = args.repeats, list(head.config.target_layer_ids)
    layer_kinds = attention_layer_kinds(target)
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        outputs = target(input_ids=prompt, cache=cache, use_cache=True, output_hidden_states=layer_ids)
    features = gather_target_features(outputs.hidden_states, layer_ids)
    past = prompt.shape[1]

    def crop_target():
        crop_to(cache, past)

    # bare target forwards: one token as plain decoding runs it (logits of the last row), N tokens as a tree needs
    forward_ms = {}
    for num_tokens in FORWARD_SIZES:
        tokens = prompt[:, :num_tokens] if num_tokens <= past else prompt[:, :1].repeat(1, num_tokens)
        positions = torch.arange(past, past + num_tokens, device=device)[None]
        keep = 1 if num_tokens == 1 else 0

        def forward(tokens=tokens, positions=positions, keep=keep):
            with torch.no_grad():
                target(input_ids=tokens, cache=cache, position_ids=positions, use_cache=True, logits_to_keep=keep)

        forward_ms[num_tokens] = summary_ms(time_region(forward, device, repeats, reset=crop_target))
    section["target_forward_ms_by_tokens"] = forward_ms
    section["plain_step_ms"] = forward_ms[1]["median_ms"]

    # the head, on a drafter that has encoded the prompt as after the prefill
    head.steer(None)
    drafter = TreeDrafter(head, SPEED_TREE["tree_top_k"])
    drafter.extend(prompt[:, 1:], features[:, :-1])
    stable, root = drafter.stable_length, prompt[0, -1]
    depth, nodes = SPEED_TREE["tree_depth"], SPEED_TREE["tree_total_tokens"]

    verify_ms, verify_syncs = {}, {}
    for num_nodes in VERIFY_SIZES:
        tree = drafter.grow(root, depth, num_nodes)  # a real tree of that size, as the loop verifies it

        def verify(tree=tree):
            verify_tree(target, tree, cache, past, layer_ids, layer_kinds=layer_kinds)

        verify_ms[tree.num_nodes] = summary_ms(time_region(verify, device, repeats, reset=crop_target))
        verify_syncs[tree.num_nodes] = count_syncs(verify, device)
        crop_target()
    section["verify_tree_ms_by_nodes"] = verify_ms

    def grow_ms(steered: bool) -> dict:
        timings = {}
        for levels in range(1, depth + 1):
            if steered:  # the test drafter's own cost: the same trees with the steering on
                head.steer(reference, alpha=0.8, seed=levels)
                head.slot_on_path = torch.ones(stable, dtype=torch.bool, device=device)
            timings[levels] = summary_ms(
                time_region(lambda levels=levels: drafter.grow(root, levels, nodes), device, repeats)
            )
        head.steer(None)
        return timings

    grow = grow_ms(steered=False)
    grow_steered = grow_ms(steered=True)
    section["draft_grow_ms_by_depth"] = grow
    # one level = one head forward over top_k frontier nodes plus its top-k bookkeeping (level 1 needs no forward)
    section["draft_level_ms"] = (grow[depth]["median_ms"] - grow[1]["median_ms"]) / (depth - 1)
    section["oracle_overhead_ms_per_grow"] = grow_steered[depth]["median_ms"] - grow[depth]["median_ms"]

    update_ms = {}
    for num_tokens in UPDATE_SIZES:
        tokens, update_features = prompt[:, 1 : 1 + num_tokens], features[:, :num_tokens]
        update_ms[num_tokens] = summary_ms(
            time_region(
                lambda tokens=tokens, update_features=update_features: drafter.extend(tokens, update_features),
                device,
                repeats,
                reset=lambda: crop_to(drafter.cache, stable),
            )
        )
    section["draft_update_ms_by_tokens"] = update_ms
    section["syncs_by_component"] = {
        "verify_tree_by_nodes": verify_syncs,
        "draft_grow_depth_6": count_syncs(lambda: drafter.grow(root, depth, nodes), device),
        "draft_update_4_tokens": count_syncs(lambda: drafter.extend(prompt[:, 1:5], features[:, :4]), device),
    }


def end_to_end(target, head, prompt, reference, plain_seconds, device, args, section: dict, deadline: float) -> None:
    """Tokens/s of tree and chain mode at each alpha against plain generate, repeats interleaved so that drifting
    clocks affect every method alike; then one call each with a `Clock` for the median round."""
    new = args.new_tokens
    runs = {(method, alpha): [] for method in E2E_METHODS for alpha in ALPHAS}
    runs.update({key: [] for key in E2E_EXTRA})
    details = {key: [] for key in runs}
    for repeat in range(args.e2e_repeats):
        if repeat and time.time() > deadline - 2 * sum(times[-1] for times in runs.values()):
            section["e2e_note"] = f"stopped after {repeat} repeats to stay inside --time-budget-s"
            break
        for (method, alpha), times in runs.items():
            out, seconds = wall(
                lambda m=method, a=alpha, r=repeat: generate_with(target, head, prompt, reference, m, a, new, r),
                device,
            )
            times.append(seconds)
            tree = method != "chain"
            rounds = len(out.num_accepted_tokens) if tree else head.feature_forwards  # chain: one encode per round
            record = {
                "identical_to_plain": first_difference(out.sequences if tree else out, reference) is None,
                "rounds": rounds,
                "tau": out.tau if tree else (new - 1) / max(1, rounds),  # the prefill's token is no round's
            }
            if tree:
                record.update(round_phases(out))
            details[(method, alpha)].append(record)
        print(f"[speed] end-to-end repeat {repeat + 1} done", flush=True)
    e2e = {}
    for (method, alpha), times in runs.items():
        # a call of its own (the timed ones above run without a streamer), with a seed none of them used: with the
        # first run's seed it repeated that run's sequence of cache lengths, and so hid any per-shape cost
        # (docs/cuda.md, the first GPU run)
        clock = StepClock()
        if time.time() < deadline:
            generate_with(target, head, prompt, reference, method, alpha, new, seed=args.e2e_repeats, streamer=clock)
        seconds, done = statistics.median(times), details[(method, alpha)]
        e2e[f"{method}_alpha{alpha}"] = {
            "seconds_median": seconds,
            "tokens_per_s": new / seconds,
            "speedup_vs_plain": plain_seconds / seconds,
            "tau_measured": statistics.mean(d["tau"] for d in done),
            "tau_expected": expected_tau(alpha, CHAIN_TOKENS if method == "chain" else SPEED_TREE["tree_depth"]),
            "rounds": statistics.median(d["rounds"] for d in done),
            "identical_to_plain": all(d["identical_to_plain"] for d in done),
            "round_ms": median_interval_ms(clock),
        }
        if method != "chain":  # the loop's own per-phase clock (Eagle3GenerateOutput.round_seconds), first repeat
            e2e[f"{method}_alpha{alpha}"].update({k: v for k, v in done[0].items() if k in PHASE_KEYS})
    for alpha in ALPHAS:
        tree, chain = e2e[f"tree_alpha{alpha}"], e2e[f"chain_alpha{alpha}"]
        tree["speedup_vs_chain"] = chain["seconds_median"] / tree["seconds_median"]
    section["e2e"] = e2e
    nodes, best = SPEED_TREE["tree_total_tokens"], e2e[f"tree_alpha{max(ALPHAS)}"]
    forward = section["target_forward_ms_by_tokens"].get(nodes, {}).get("median_ms")
    section["round_breakdown_alpha0.8"] = {
        "round_ms": best["round_ms"],
        "target_forward_ms": forward,
        "verify_tree_ms": section["verify_tree_ms_by_nodes"].get(nodes, {}).get("median_ms"),
        "draft_grow_ms": section["draft_grow_ms_by_depth"][SPEED_TREE["tree_depth"]]["median_ms"],
        "draft_update_ms": section["draft_update_ms_by_tokens"][4]["median_ms"],
        "oracle_overhead_ms": section["oracle_overhead_ms_per_grow"],
        "not_target_forward_share": None if None in (forward, best["round_ms"]) else 1 - forward / best["round_ms"],
    }


PHASE_KEYS = ("phase_ms_median", "phase_share", "plain_step_rounds", "mean_tree_nodes")


def round_phases(out) -> dict:
    """Medians and shares of the phases the tree loop clocks itself (`round_seconds`), and how many rounds were
    plain steps (the adaptive planner's choice when a tree does not pay)."""
    phases = {name: values for name, values in (out.round_seconds or {}).items() if values}
    total = sum(sum(values) for values in phases.values())
    shapes = out.round_shapes or ()
    tree_nodes = [shape.total_tokens for shape in shapes if not shape.is_plain]
    return {
        "phase_ms_median": {name: 1e3 * statistics.median(values) for name, values in phases.items()},
        "phase_share": {name: sum(values) / total for name, values in phases.items()} if total else {},
        "plain_step_rounds": sum(1 for shape in shapes if shape.is_plain),
        "mean_tree_nodes": statistics.mean(tree_nodes) if tree_nodes else None,
    }


def sync_counts(target, head, prompt, reference, device, args) -> dict:
    """Host syncs per plain step and per round, each from a call of its own (the debug mode slows the host)."""
    new, alpha, held = args.new_tokens, max(ALPHAS), {}

    def tree_call():
        held["out"] = generate_with(target, head, prompt, reference, "tree", alpha, new, seed=0)

    plain = count_syncs(lambda: generate_with(target, head, prompt, reference, "plain", alpha, new, 0), device)
    tree = count_syncs(tree_call, device)
    chain = count_syncs(lambda: generate_with(target, head, prompt, reference, "chain", alpha, new, 0), device)
    return {
        "plain_per_step": plain / new,
        "tree_per_round": tree / len(held["out"].num_accepted_tokens),
        "chain_per_round": chain / max(1, head.feature_forwards),
    }


# ------------------------------------------------------------------------------------------------------ report
def environment(device: torch.device, args) -> dict:
    info = {
        "mode": "smoke" if args.smoke else "full",
        "device": str(device),
        "device_name": (
            torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else f"{cpu_model()} ({describe_cpu_features()})"
        ),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "eagle3_hf": eagle3_hf.__version__,
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "threads": torch.get_num_threads(),
        "arguments": vars(args),
    }
    if device.type == "cuda":
        info["cuda"] = torch.version.cuda
    return info


def fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(report: dict) -> str:
    meta = report["meta"]
    lines = [
        "# EAGLE-3 device check",
        "",
        f"Mode **{meta['mode']}** on `{meta['device']}` ({meta['device_name']}); torch {meta['torch']}, "
        f"transformers {meta['transformers']}, eagle3_hf {meta['eagle3_hf']}; "
        f"wall time {fmt(report.get('wall_seconds'), 1)} s.",
        "",
    ]
    correctness = report.get("correctness")
    if correctness:
        lines += [
            "## Correctness (tiny random targets, heads steered by the plain greedy continuation, alpha 0.8)",
            "",
            "tree: the fixed shape 24 / depth 5 / top-k 4; adaptive: `generate(assistant_model=head)` with no shape "
            '(the round planner); chain: `eagle3_mode="chain"`, 4 draft tokens.',
            "",
            f"fp32 greedy identical everywhere: **{correctness.get('fp32_greedy_identical')}**; sampling runs: "
            f"**{correctness.get('sampling_ok')}**.",
            "",
            "| architecture | prompts | fp32 identical: tree / adaptive / chain | fp32 tree tau | bf16 divergence: "
            "plain batch 2 | bf16 tree | bf16 chain | top-2 logit gaps at the divergences | sampling ok |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, arch in correctness["architectures"].items():
            if "error" in arch:
                lines.append(f"| {name} | error: {arch['error']} | | | | | | | |")
                continue
            lines.append(
                f"| {name} | {arch['prompts']} | {arch['fp32_tree_identical']} / {arch['fp32_adaptive_identical']} / "
                f"{arch['fp32_chain_identical']} | "
                f"{fmt(arch['fp32_tree_tau_mean'])} | {fmt(arch['bf16_plain_batch2_divergence_rate'])} | "
                f"{fmt(arch['bf16_tree_divergence_rate'])} | {fmt(arch['bf16_chain_divergence_rate'])} | "
                f"{', '.join(f'{m:.4f}' for m in arch['bf16_divergence_logit_margins']) or '-'} | {arch['sampling_ok']} |"
            )
        lines += [
            "",
            "bf16 divergence: the share of prompts whose output differs from plain batch-1 `generate`'s; plain batch 2 "
            "is the same prompt run twice in one batch. The gaps are plain `generate`'s top-2 logit gap where each "
            "divergence starts: a gap of one or two bf16 steps (2^(e-7) for a logit in [2^e, 2^(e+1))) is numerics.",
            "",
        ]
    speed = report.get("speed")
    if speed and "target" in speed:
        target, head = speed["target"], speed["head"]
        lines += [
            f"## Speed ({target['shape']} target, {target['parameters'] / 1e9:.2f} B parameters, {target['dtype']}; "
            f"head: {head['layers']} layer, {head['draft_vocab_size']} draft vocabulary)",
            "",
            f"Built in {fmt(speed.get('build_seconds'), 1)} s. Greedy continuation follows the built-in permutation: "
            f"{fmt(speed.get('target_follows_its_permutation'))}.",
            "",
        ]
    if speed and "plain_generate" in speed:
        plain = speed["plain_generate"]
        lines += [
            f"Plain `generate`: {fmt(plain['tokens_per_s'], 1)} tokens/s ({plain['new_tokens']} new tokens after a "
            f"{plain['prompt_length']}-token prompt); {fmt(plain['step_ms_inside_generate'])} ms per step inside "
            f"generate (mean {fmt(plain.get('step_ms_mean_inside_generate'))}), {fmt(speed.get('plain_step_ms'))} "
            "ms for a bare one-token target forward.",
            "",
        ]
        without = speed.get("plain_generate_without_cudnn_sdpa")
        if without:
            lines += [
                f"Plain `generate` with cuDNN's SDPA off throughout: {fmt(without['tokens_per_s'], 1)} tokens/s "
                f"(runs {', '.join(fmt(s) for s in without['seconds_runs'])} s against "
                f"{', '.join(fmt(s) for s in plain.get('seconds_runs', []))} s with the default backends; output "
                f"identical: {without['identical_to_plain']}).",
                "",
            ]
    if speed and "verify_tree_ms_by_nodes" in speed:
        lines += ["| tokens / nodes | bare target forward (ms) | verify_tree (ms) | syncs in verify_tree |"]
        lines += ["| --- | --- | --- | --- |"]
        forward, verify = speed["target_forward_ms_by_tokens"], speed["verify_tree_ms_by_nodes"]
        syncs = speed.get("syncs_by_component", {}).get("verify_tree_by_nodes", {})
        for size in sorted({*map(int, forward), *map(int, verify)}):
            f, v = forward.get(size, forward.get(str(size))), verify.get(size, verify.get(str(size)))
            s = syncs.get(size, syncs.get(str(size)))
            lines.append(f"| {size} | {fmt(f and f['median_ms'])} | {fmt(v and v['median_ms'])} | {fmt(s)} |")
        lines.append("")
    if speed and "draft_grow_ms_by_depth" in speed:
        grow = speed["draft_grow_ms_by_depth"]
        lines += [
            "Draft tree (`TreeDrafter.grow`, top-k 10, 60 nodes) by depth (ms): "
            + ", ".join(f"{d}: {fmt(v['median_ms'])}" for d, v in grow.items())
            + f". One draft level: **{fmt(speed['draft_level_ms'])} ms**. Steering overhead of the test drafter: "
            f"{fmt(speed['oracle_overhead_ms_per_grow'])} ms per depth-6 tree.",
            "",
            "Draft update (`TreeDrafter.extend`) by tokens (ms): "
            + ", ".join(f"{n}: {fmt(v['median_ms'])}" for n, v in speed["draft_update_ms_by_tokens"].items())
            + ".",
            "",
        ]
        comp = speed.get("syncs_by_component", {})
        lines += [
            f"Host syncs: depth-6 grow {fmt(comp.get('draft_grow_depth_6'))}, 4-token update "
            f"{fmt(comp.get('draft_update_4_tokens'))} (`-`: not countable off CUDA).",
            "",
        ]
    if speed and "sdpa_new_shapes" in speed:
        a = speed["sdpa_new_shapes"]
        lines += [
            "One attention call of the target's shape (ms, median), at a cache length new to each call as in tree "
            f"decoding: a {SPEED_TREE['tree_total_tokens']}-row tree query under its mask, default backends "
            f"{fmt(a['tree_query_new_length_default_ms']['median_ms'], 3)}, with cuDNN's SDPA off as the tree loop "
            f"runs it {fmt(a['tree_query_new_length_eagle3_ms']['median_ms'], 3)}; at one repeated length, default "
            f"{fmt(a['tree_query_same_length_default_ms']['median_ms'], 3)}; a one-row unmasked query (plain "
            f"decoding), new lengths, default {fmt(a['one_row_new_length_default_ms']['median_ms'], 3)} "
            f"(cuDNN SDPA enabled by default: {a['cudnn_sdp_enabled']}).",
            "",
        ]
    if speed and "e2e" in speed:
        lines += [
            "| method | tokens/s | speedup vs plain | vs plain without cuDNN SDPA | vs chain | tau measured / expected "
            "| round (ms) | identical to plain |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            f"| plain generate | {fmt(speed['plain_generate']['tokens_per_s'], 1)} | 1.00 | | | | | |",
        ]
        without = speed.get("plain_generate_without_cudnn_sdpa")
        for key, entry in speed["e2e"].items():
            versus = without and entry["tokens_per_s"] / without["tokens_per_s"]
            lines.append(
                f"| {key} | {fmt(entry['tokens_per_s'], 1)} | {fmt(entry['speedup_vs_plain'])} | {fmt(versus)} | "
                f"{fmt(entry.get('speedup_vs_chain'))} | {fmt(entry['tau_measured'])} / {fmt(entry['tau_expected'])} "
                f"| {fmt(entry['round_ms'])} | {entry['identical_to_plain']} |"
            )
        lines.append("")
        for key, entry in speed["e2e"].items():
            if entry.get("phase_share"):
                lines.append(
                    f"- {key}, the loop's own phase clock (`round_seconds`, synchronized): "
                    + ", ".join(
                        f"{name} {fmt(entry['phase_ms_median'][name])} ms ({fmt(100 * share, 0)}%)"
                        for name, share in entry["phase_share"].items()
                    )
                    + f"; {entry['plain_step_rounds']} plain-step rounds, {fmt(entry['mean_tree_nodes'], 1)} nodes "
                    "per tree on average."
                )
        lines.append("")
        if "e2e_note" in speed:
            lines += [speed["e2e_note"], ""]
    if speed and "round_breakdown_alpha0.8" in speed:
        b = speed["round_breakdown_alpha0.8"]
        lines += [
            f"Round at alpha 0.8: {fmt(b['round_ms'])} ms; the target's 60-token forward {fmt(b['target_forward_ms'])} "
            f"ms, verify_tree {fmt(b['verify_tree_ms'])}, grow {fmt(b['draft_grow_ms'])}, update "
            f"{fmt(b['draft_update_ms'])}, steering {fmt(b['oracle_overhead_ms'])}; everything but the target's "
            f"forward: **{fmt(b['not_target_forward_share'] and 100 * b['not_target_forward_share'], 1)}%** of a "
            "round (goal <= 15%).",
            "",
        ]
    if speed and "syncs_per_round" in speed:
        s = speed["syncs_per_round"]
        lines += [
            f"Host syncs: plain {fmt(s['plain_per_step'])} per step, tree {fmt(s['tree_per_round'])} per round, "
            f"chain {fmt(s['chain_per_round'])} per round.",
            "",
        ]
    if report["errors"]:
        lines += ["## Errors", ""]
        for error in report["errors"]:
            lines += [f"`{error['where']}`:", "", "```", error["traceback"].rstrip(), "```", ""]
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------------- main
# (smoke, full) defaults of the sizing options
SIZES = dict(
    prompts=(1, 6, "correctness prompts per architecture"),
    sampling_prompts=(1, 2, "of those, also sampled"),
    tiny_new_tokens=(16, 48, "new tokens per tiny run"),
    prompt_length=(16, 128, "speed prompt tokens"),
    new_tokens=(20, 256, "speed new tokens"),
    repeats=(2, 10, "timed repeats per component"),
    e2e_repeats=(1, 3, "end-to-end repeats"),
)


def parse_args(argv=None) -> argparse.Namespace:
    smoke = "--smoke" in (sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, few repeats (CI)")
    parser.add_argument("--output-dir", default=os.environ.get("OUT") or "runs/device_check")
    parser.add_argument(
        "--sections", default="correctness,speed", help="comma-separated: correctness, speed (default both)"
    )
    parser.add_argument("--device", default=None, help="default: cuda when available (cpu with --smoke)")
    for name, (smoke_value, full_value, text) in SIZES.items():
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=int,
            default=smoke_value if smoke else full_value,
            help=f"{text} (default {full_value}; {smoke_value} with --smoke)",
        )
    parser.add_argument(
        "--time-budget-s",
        type=float,
        default=360.0,
        help="wall-time budget: past it no further end-to-end repeat, clocked run or sync count starts (default 360)",
    )
    parser.add_argument(
        "--correctness-share",
        type=float,
        default=0.25,  # 0.35 in the first GPU run, which showed every case correct; speed needs the time now
        help="share of the budget after which correctness starts no further prompt (default 0.25)",
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.time()
    deadline = started + args.time_budget_s
    # correctness on tiny models should take well under a third of the run; past that it stops adding prompts
    correctness_deadline = started + args.correctness_share * args.time_budget_s
    if args.device:
        device = torch.device(args.device)
    else:
        device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny models are dominated by per-op overhead: more threads only add to it
    # fp32 must mean fp32 for the bit-identity check (TF32 matmuls are off by default; made sure here)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    report = {"meta": environment(device, args), "errors": []}

    def save():
        report["wall_seconds"] = time.time() - started
        (output_dir / f"{REPORT_NAME}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        try:
            text = markdown(report)
        except Exception:  # the JSON above holds the numbers; a rendering bug must not end the run
            text = "# EAGLE-3 device check\n\nThe Markdown rendering failed:\n\n```\n" + traceback.format_exc() + "```"
        (output_dir / f"{REPORT_NAME}.md").write_text(text + "\n")

    save()
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    if "correctness" in sections:
        run_correctness(device, args, report, save, correctness_deadline)
    if "speed" in sections:
        try:
            run_speed(device, args, report, save, deadline)
        except Exception:
            report["errors"].append({"where": "speed", "traceback": traceback.format_exc()})
            traceback.print_exc()
    save()
    print((output_dir / f"{REPORT_NAME}.md").read_text(), flush=True)
    correct = report.get("correctness", {}).get("fp32_greedy_identical", True)
    return 0 if correct and not report["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
