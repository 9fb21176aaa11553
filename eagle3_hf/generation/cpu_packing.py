"""Pre-packed MKL weights for the few-row matrix products of speculative decoding on CPU.

Verifying a draft tree feeds the target `N` tokens at once (`N` = 4 to 16), so every linear layer multiplies an
`(N, in)` input by its weight. On CPU, PyTorch's fp32 `F.linear` handles one row with a streaming matrix-vector
kernel, but for a few rows it calls MKL's general GEMM, which re-packs the *whole weight* into its blocked layout
on every call. For a small model that packing costs more than the product itself. Measured on SmolLM2-135M (2-core
Xeon, torch 2.13, `scripts/measure_verify_cost.py --threads 2`): one target forward over 8 tokens costs 2.3x a
one-token step with stock weights, and 1.5x with weights packed once for 8 rows. Packing once for the tree size
therefore cuts the cost of every verification round, which is what bounds the speedup on CPU.

`pack_linear_weights(model, batch_sizes)` turns every plain `nn.Linear` of `model` into an `MklPackedLinear` that
keeps its parameters (same tensors, same `state_dict`) and adds one packed copy of the weight per listed row count.
Inputs with another row count (the one-token step of plain decoding, the prompt prefill) take the stock `F.linear`
path, so plain `generate` on a packed model computes exactly what it computed before. Packed products round
differently from stock GEMM in the last bits, as any change of GEMM kernel does (the stock kernel for 8 rows
already differs from the one for 1 row). Memory: one extra copy of the linear weights per packed row count.

Whether packing pays depends on the CPU: on a 2-core AMD EPYC (session 17) the packed kernel was 8% slower than
stock GEMM for SmolLM2's 8-row products, where stock MKL does not seem to re-pack. So the defaults
(`generate`'s `pack_for_tree_decoding`, and `pack_for_decoding(mode="auto")`) time both kernels once per model and
row count (`packing_pays`) and pack only where packing saves at least `PACKING_MIN_SAVING`.

`unpack_linear_weights(model)` restores plain `nn.Linear` layers. Only float32 weights on CPU are packed, with an
MKL build of PyTorch (the default x86 wheels); a stale pack (the weight was modified, moved or cast) is rebuilt or
bypassed, never used.
"""

import statistics
import time
import weakref

import torch
import torch.nn.functional as F
from torch import nn


def mkl_packing_available() -> bool:
    """True when this PyTorch build has the MKL packed-GEMM operators used here."""
    return bool(torch._C.has_mkl) and hasattr(torch.ops.mkl, "_mkl_linear")


def _is_packable(weight: torch.Tensor) -> bool:
    """The packed kernel serves float32 weights on CPU only."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32


class MklPackedLinear(nn.Linear):
    """`nn.Linear` whose weight is also kept packed for MKL, for a fixed set of input row counts.

    Created in place from an `nn.Linear` by `pack_linear_weights` (the module object, its parameters and hooks stay
    the same). `forward` uses the packed weight when the input has exactly one of the packed row counts, no gradient
    is needed and the weight is unchanged since packing; otherwise it is `nn.Linear.forward`.
    """

    # row count -> (weight version, weight data pointer, packed weight)
    _mkl_packs: dict[int, tuple[int, int, torch.Tensor]]

    def _packed_weight(self, rows: int) -> torch.Tensor | None:
        entry = self._mkl_packs.get(rows)
        if entry is None:
            return None
        weight = self.weight
        if not _is_packable(weight):
            return None
        version, data_ptr, packed = entry
        if version != weight._version or data_ptr != weight.data_ptr():
            # the weight was modified in place or replaced since packing: pack it again
            packed = torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), rows)
            self._mkl_packs[rows] = (weight._version, weight.data_ptr(), packed)
        return packed

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.numel() // input.shape[-1] if input.numel() else 0
        needs_grad = torch.is_grad_enabled() and (input.requires_grad or self.weight.requires_grad)
        packed = None if needs_grad or input.dtype != torch.float32 else self._packed_weight(rows)
        if packed is None:
            return F.linear(input, self.weight, self.bias)
        flat = input.reshape(rows, self.in_features).contiguous()
        output = torch.ops.mkl._mkl_linear(flat, packed, self.weight, self.bias, rows)
        return output.reshape(*input.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, packed_rows={sorted(self._mkl_packs)}"


@torch.no_grad()
def pack_linear_weights(model: nn.Module, batch_sizes) -> int:
    """Pack the weight of every plain `nn.Linear` in `model` for inputs of `batch_sizes` rows (in place).

    Args:
        model (`nn.Module`): e.g. the target `PreTrainedModel`, float32 on CPU.
        batch_sizes (iterable of `int`): input row counts to pack for (`batch * seq` of the linear's input), e.g.
            `[tree_total_tokens]` for tree verification. 1 is refused: the stock one-row kernel is faster.

    Returns:
        The number of linear layers packed. Calling it again adds row counts; `unpack_linear_weights` undoes it.
    """
    if not mkl_packing_available():
        raise RuntimeError(
            "pack_linear_weights needs a PyTorch build with MKL (torch._C.has_mkl is False here); the default x86 "
            "CPU wheels have it."
        )
    sizes = sorted(set(batch_sizes))
    if not sizes or any(not isinstance(size, int) or size < 2 for size in sizes):
        raise ValueError(f"batch_sizes must be ints >= 2 (one row already has the fastest kernel), got {sizes}.")
    linears = [module for module in model.modules() if isinstance(module, nn.Linear)]
    for module in linears:
        weight = module.weight
        if not _is_packable(weight):
            raise ValueError(
                f"pack_linear_weights packs float32 weights on CPU; {type(model).__name__} has a {weight.dtype} "
                f"weight on {weight.device}. Load the model with dtype=torch.float32 on CPU, or do not pack."
            )
    packed = 0
    for module in linears:
        if type(module) is nn.Linear:
            module.__class__ = MklPackedLinear
            module._mkl_packs = {}
        elif type(module) is not MklPackedLinear:
            continue  # a subclass with its own forward (quantized, LoRA, ...): leave it alone
        for size in sizes:
            if size not in module._mkl_packs:
                pack = torch.ops.mkl._mkl_reorder_linear_weight(module.weight.detach(), size)
                module._mkl_packs[size] = (module.weight._version, module.weight.data_ptr(), pack)
        packed += 1
    return packed


def unpack_linear_weights(model: nn.Module) -> int:
    """Turn every `MklPackedLinear` of `model` back into a plain `nn.Linear`; returns how many were restored."""
    restored = 0
    for module in model.modules():
        if type(module) is MklPackedLinear:
            del module._mkl_packs
            module.__class__ = nn.Linear
            restored += 1
    return restored


PACK_MODES = ("auto", "on", "off")

# Packing must save this share of the linear layers' time to be worth one more copy of their weights.
PACKING_MIN_SAVING = 0.05

# `time_linear_products` times the linear layers in model order up to this many bytes of weights: far more than any
# CPU cache, so they stream from memory as in a forward, while a large model is not packed whole only to be timed.
TIMED_WEIGHT_BYTES = 1 << 30


@torch.no_grad()
def time_linear_products(model: nn.Module, rows: int, repeats: int = 5) -> tuple[float, float]:
    """Seconds of one pass over `model`'s linear layers on `rows` input rows: `(stock, packed)`.

    Whether packing pays depends on the CPU and its MKL code path: measured on SmolLM2-135M with 8 rows (2 threads,
    torch 2.13), it cut the linear layers' time by a third on a Xeon with AVX-512, and made it 8% longer on an AMD
    EPYC. So it is timed on the machine, the way a forward meets the weights: a pass over the linear layers in model
    order (a weight shared by several layers once; the first `TIMED_WEIGHT_BYTES` of weights of a larger model),
    stock `F.linear` against the packed kernel (each weight packed for the measurement only), the two passes
    alternating which goes first, and each kind's median pass of `repeats`. Timing one layer per weight shape
    instead (sessions 2 to 28) kept that weight in cache between calls, where stock GEMM loses little: on SmolLM2
    (2-core Xeon, 8 rows) packed over stock came out 0.71-1.06 in ten tries, on both sides of
    `PACKING_MIN_SAVING`, while a pass over all layers gave 0.79-0.89 in ten, and `generate` with the target packed
    ran its trees 8-12% faster (session 29).
    `packing_pays` runs it once per model and row count: 0.6-0.7 s for SmolLM2-135M on 2 cores, with a packed copy
    of the timed weights alive meanwhile, and a few milliseconds for its head.
    """
    weights, timed_bytes = {}, 0
    for module in model.modules():
        if timed_bytes >= TIMED_WEIGHT_BYTES:
            break
        if isinstance(module, nn.Linear) and _is_packable(module.weight) and module.weight.data_ptr() not in weights:
            weights[module.weight.data_ptr()] = module
            timed_bytes += module.weight.numel() * module.weight.element_size()
    layers = []
    for layer in weights.values():
        weight, bias = layer.weight.detach(), None if layer.bias is None else layer.bias.detach()
        inputs = torch.randn(rows, layer.in_features)
        layers.append((inputs, weight, bias, torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)))

    def stock_pass() -> float:
        start = time.perf_counter()
        for inputs, weight, bias, _ in layers:
            F.linear(inputs, weight, bias)
        return time.perf_counter() - start

    def packed_pass() -> float:
        start = time.perf_counter()
        for inputs, weight, bias, pack in layers:
            torch.ops.mkl._mkl_linear(inputs, pack, weight, bias, rows)
        return time.perf_counter() - start

    stock_pass(), packed_pass()  # first calls pay for MKL's lazy set-up: untimed
    runs = {stock_pass: [], packed_pass: []}
    for repeat in range(repeats):
        for timed in (stock_pass, packed_pass) if repeat % 2 == 0 else (packed_pass, stock_pass):
            runs[timed].append(timed())
    return statistics.median(runs[stock_pass]), statistics.median(runs[packed_pass])


# model -> {rows: (stock seconds, packed seconds)}: measured once per model and row count
_TIMINGS: "weakref.WeakKeyDictionary[nn.Module, dict[int, tuple[float, float]]]" = weakref.WeakKeyDictionary()


def packing_pays(model: nn.Module, rows: int) -> bool:
    """Whether packing `model` for `rows` rows saves at least `PACKING_MIN_SAVING` of its linear layers' time on this
    machine (`time_linear_products`, once per model and row count)."""
    timings = _TIMINGS.setdefault(model, {})
    if rows not in timings:
        timings[rows] = time_linear_products(model, rows)
    stock, packed = timings[rows]
    return packed < (1 - PACKING_MIN_SAVING) * stock


def measured_packing(model: nn.Module, rows) -> tuple[list[int], list[int]]:
    """`(rows packing pays for, rows it does not)` of `model` (`packing_pays`), each sorted, without repeats."""
    rows = sorted(set(rows))
    pays = [count for count in rows if packing_pays(model, count)]
    return pays, [count for count in rows if count not in pays]


def is_packed_for(model: nn.Module, rows: int) -> bool:
    """True when every linear layer of `model` has a packed weight for inputs of `rows` rows."""
    linears = [module for module in model.modules() if isinstance(module, nn.Linear)]
    return bool(linears) and all(type(m) is MklPackedLinear and rows in m._mkl_packs for m in linears)


def is_packable_target(model: nn.Module) -> bool:
    """True when MKL is available and `model`'s (first) weight is float32 on CPU."""
    weight = next(model.parameters(), None)
    return weight is not None and mkl_packing_available() and _is_packable(weight)


def packing_would_help(model: nn.Module, rows: int) -> bool:
    """True when `model` is float32 on CPU with MKL available, `rows >= 2`, and not yet packed for `rows`."""
    return rows >= 2 and is_packable_target(model) and not is_packed_for(model, rows)


def rows_for_tree(total_tokens: int, depth: int, top_k: int, lookup_tokens: int = 0) -> tuple[list[int], list[int]]:
    """Row counts worth packing for tree decoding: `(target_rows, draft_rows)`.

    The target verifies `total_tokens` nodes per round. The head feeds `top_k` frontier nodes per level and
    re-encodes the 1 to `max(depth, lookup_tokens) + 1` tokens of each round's accepted path (a grafted
    prompt-lookup chain can be accepted beyond the tree's depth).
    """
    target_rows = [total_tokens] if total_tokens >= 2 else []
    draft_rows = sorted({top_k, *range(2, max(depth, lookup_tokens) + 2)} - {0, 1})
    return target_rows, draft_rows


def rows_for_trees(shapes) -> tuple[list[int], list[int]]:
    """`rows_for_tree` over several `(total_tokens, depth, top_k)` shapes (e.g. a `tune` sweep), merged."""
    target_rows, draft_rows = set(), set()
    for shape in shapes:
        tree_target_rows, tree_draft_rows = rows_for_tree(*shape)
        target_rows.update(tree_target_rows)
        draft_rows.update(tree_draft_rows)
    return sorted(target_rows), sorted(draft_rows)


def pack_rows(model: nn.Module, rows, measure: bool = True) -> tuple[list[int], list[int]]:
    """Pack `model`'s linear weights for `rows`-row inputs: only the row counts where `packing_pays` with `measure`,
    all of them (raising where it cannot) without. Returns `(packed row counts, row counts left stock)`."""
    packed, stock = measured_packing(model, rows) if measure else (sorted(set(rows)), [])
    if packed:
        pack_linear_weights(model, packed)
    return packed, stock


def _group_attention(target: nn.Module, draft: nn.Module | None) -> bool:
    """Switch an `sdpa` target, and then its head, to grouped-query SDPA under tree masks; whether it was done."""
    from .gqa_attention import use_grouped_sdpa

    grouped = hasattr(target, "set_attn_implementation") and use_grouped_sdpa(target)
    if grouped and draft is not None:
        use_grouped_sdpa(draft)  # the head's one layer also attends under tree masks while drafting
    return grouped


def pack_for_decoding(target: nn.Module, draft: nn.Module | None, target_rows, draft_rows, mode: str = "auto") -> str:
    """Pack `target` (and `draft`) for the given row counts according to `mode`; returns a one-line description.

    `mode`: `"on"` packs (and raises where it cannot), `"off"` does nothing, `"auto"` packs the row counts for which
    `packing_pays` on this machine, when MKL is available and the target is float32 on CPU. Packing (`"on"`, or
    `"auto"` on a packable target) also switches an `sdpa` target to `eagle3_hf.generation.gqa_attention`'s grouped
    backend (no `repeat_kv` copy under tree masks; outputs equal to `sdpa`'s). Used by `eagle3-hf demo`, `bench`,
    `tune` and `regenerate`.
    """
    if mode not in PACK_MODES:
        raise ValueError(f"pack mode {mode!r}; expected one of {PACK_MODES}.")
    if mode == "off" or (mode == "auto" and not is_packable_target(target)):
        return "stock weights"
    measure = mode == "auto"
    target_rows, slower_target = pack_rows(target, target_rows, measure)
    draft_rows, slower_draft = pack_rows(draft, draft_rows, measure) if draft is not None else ([], [])
    grouped = _group_attention(target, draft)
    parts = [f"MKL-packed weights (target rows {target_rows}, head rows {draft_rows})"]
    if not target_rows and not draft_rows:
        parts = ["stock weights"]
    if slower_target or slower_draft:
        parts.append(f"stock for target rows {slower_target}, head rows {slower_draft} (packing measured no faster)")
    if grouped:
        parts.append("grouped-query SDPA under tree masks")
    return "; ".join(parts)


def _linear_weight_bytes(model: nn.Module) -> int:
    """Bytes of one copy of the weights of `model`'s linear layers (shared weights counted once)."""
    weights = {module.weight.data_ptr(): module.weight for module in model.modules() if isinstance(module, nn.Linear)}
    return sum(weight.numel() * weight.element_size() for weight in weights.values())


def pack_for_tree_decoding(
    target: nn.Module, draft: nn.Module, node_counts, max_depth: int, top_k: int, lookup_tokens: int = 0
) -> str | None:
    """What `generate(assistant_model=head)` does on CPU: pack the target for `node_counts` rows and the head for
    the rows of its tree levels and draft updates, each where `packing_pays` on this machine, and switch `sdpa` to
    grouped-query SDPA, when the target is float32 on CPU with MKL. Returns a line naming what was packed and the
    memory it took, `None` when nothing new was decided (not packable, or settled by an earlier call).

    Measured on SmolLM2-135M (2-core Xeon): an 8-node verification costs 2.3x a plain step with stock weights and
    1.5x packed, so packing is the default where it pays; `generate(..., tree_pack_weights=False)` opts out.
    """
    if not is_packable_target(target):
        return None
    target_rows, draft_rows = rows_for_trees((n, max_depth, top_k, lookup_tokens) for n in node_counts)

    def unsettled(model: nn.Module, rows: list[int]) -> list[int]:
        return [count for count in rows if not is_packed_for(model, count) and count not in _TIMINGS.get(model, {})]

    missing = unsettled(target, target_rows)
    missing_draft = unsettled(draft, draft_rows) if is_packable_target(draft) else []
    if not missing and not missing_draft:
        return None
    missing, slower = pack_rows(target, missing)
    missing_draft, slower_draft = pack_rows(draft, missing_draft)
    extra = _linear_weight_bytes(target) * len(missing) + _linear_weight_bytes(draft) * len(missing_draft)
    _group_attention(target, draft)
    parts = []
    if missing or missing_draft:
        parts.append(
            f"MKL-packed linear weights (target rows {missing}, head rows {missing_draft}), {extra / 2**20:.0f} MiB "
            "more memory"
        )
    if slower or slower_draft:
        parts.append(f"stock weights for target rows {slower}, head rows {slower_draft} (packing measured no faster)")
    return f"Tree decoding on CPU: {'; '.join(parts)}; generate(..., tree_pack_weights=False) opts out."


__all__ = [
    "MklPackedLinear",
    "PACK_MODES",
    "is_packable_target",
    "is_packed_for",
    "packing_would_help",
    "measured_packing",
    "mkl_packing_available",
    "pack_for_decoding",
    "pack_for_tree_decoding",
    "pack_linear_weights",
    "pack_rows",
    "packing_pays",
    "rows_for_tree",
    "rows_for_trees",
    "time_linear_products",
    "unpack_linear_weights",
]
