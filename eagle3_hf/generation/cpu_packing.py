"""Pre-packed weights (MKL or oneDNN) for the few-row matrix products of speculative decoding on CPU.

Verifying a draft tree feeds the target `N` tokens at once (`N` = 4 to 16), so every linear layer multiplies an
`(N, in)` input by its weight. On CPU, PyTorch's fp32 `F.linear` handles one row with a streaming matrix-vector
kernel, but for a few rows it calls MKL's general GEMM, which re-packs the *whole weight* into its blocked layout
on every call. For a small model that packing costs more than the product itself. Measured on SmolLM2-135M (2-core
Xeon, torch 2.13, `scripts/measure_verify_cost.py --threads 2`): one target forward over 8 tokens costs 2.3x a
one-token step with stock weights, and 1.5x with weights packed once for 8 rows. Packing once for the tree size
therefore cuts the cost of every verification round, which is what bounds the speedup on CPU.

`pack_linear_weights(model, batch_sizes, kernel)` turns every plain `nn.Linear` of `model` into a `PackedLinear`
that keeps its parameters (same tensors, same `state_dict`) and adds one packed copy of the weight per listed row
count, for one of two kernels (`PACK_KERNELS`): MKL's packed GEMM, or oneDNN's linear on a weight reordered once
into its blocked layout (the kernel PyTorch's own CPU inductor uses for frozen linears).
Inputs with another row count (the one-token step of plain decoding, the prompt prefill) take the stock `F.linear`
path, so plain `generate` on a packed model computes exactly what it computed before. Packed products round
differently from stock GEMM in the last bits, as any change of GEMM kernel does (the stock kernel for 8 rows
already differs from the one for 1 row). Memory: one extra copy of the linear weights per packed row count.

Which kernel pays depends on the CPU. On the 2-core Xeon MKL's packed GEMM cut the linear layers' time by a third.
On a 2-core AMD EPYC with AVX-512 (sessions 17 and 34), MKL (which picks its code path by CPU vendor) was as slow
packed as stock, while oneDNN (which picks it by instruction set) ran SmolLM2's whole forward over 12 tokens in
38 ms against 70 ms stock. So the defaults (`generate`'s `pack_for_tree_decoding`, and
`pack_for_decoding(mode="auto")`) time stock and every available packed kernel once per model and row count
(`best_kernel`) and pack with the fastest where it saves at least `PACKING_MIN_SAVING`.

`unpack_linear_weights(model)` restores plain `nn.Linear` layers. Only float32 weights on CPU are packed, with a
PyTorch build that has MKL or oneDNN (the default x86 wheels have both); a stale pack (the weight was modified,
moved or cast) is rebuilt or bypassed, never used.
"""

import statistics
import time
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import nn


def mkl_packing_available() -> bool:
    """True when this PyTorch build has the MKL packed-GEMM operators used here."""
    return bool(torch._C.has_mkl) and hasattr(torch.ops.mkl, "_mkl_linear")


def onednn_packing_available() -> bool:
    """True when this PyTorch build has oneDNN's linear on a pre-reordered weight (`torch.ops.mkldnn`)."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


PACK_KERNELS = ("mkl", "onednn")
_KERNEL_NAMES = {"mkl": "MKL", "onednn": "oneDNN"}


def packing_kernels() -> list[str]:
    """The `PACK_KERNELS` this PyTorch build has."""
    available = {"mkl": mkl_packing_available(), "onednn": onednn_packing_available()}
    return [kernel for kernel in PACK_KERNELS if available[kernel]]


def packing_available() -> bool:
    """True when this PyTorch build has at least one packed kernel."""
    return bool(packing_kernels())


def pack_weight(weight: torch.Tensor, rows: int, kernel: str) -> torch.Tensor:
    """`weight` `(out, in)` packed for inputs of `rows` rows by `kernel` (an opaque tensor)."""
    if kernel == "mkl":
        return torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


def packed_linear(
    inputs: torch.Tensor, pack: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, kernel: str
) -> torch.Tensor:
    """`F.linear(inputs, weight, bias)` for `inputs` `(rows, in)` through `pack`, which is
    `pack_weight(weight, rows, kernel)`."""
    if kernel == "mkl":
        return torch.ops.mkl._mkl_linear(inputs, pack, weight, bias, inputs.shape[0])
    return torch.ops.mkldnn._linear_pointwise(inputs, pack, bias, "none", [], "")


def _is_packable(weight: torch.Tensor) -> bool:
    """The packed kernel serves float32 weights on CPU only."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32


class PackedLinear(nn.Linear):
    """`nn.Linear` whose weight is also kept packed (MKL or oneDNN), for a fixed set of input row counts.

    Created in place from an `nn.Linear` by `pack_linear_weights` (the module object, its parameters and hooks stay
    the same). `forward` uses the packed weight when the input has exactly one of the packed row counts, no gradient
    is needed and the weight is unchanged since packing; otherwise it is `nn.Linear.forward`.
    """

    # row count -> (kernel, weight version, weight data pointer, packed weight); the oneDNN row counts share one pack
    _packs: dict[int, tuple[str, int, int, torch.Tensor]]

    def _packed_weight(self, rows: int) -> tuple[str, torch.Tensor] | None:
        entry = self._packs.get(rows)
        if entry is None:
            return None
        weight = self.weight
        if not _is_packable(weight):
            return None
        kernel, version, data_ptr, packed = entry
        if version != weight._version or data_ptr != weight.data_ptr():
            # the weight was modified in place or replaced since packing: pack it again (once for all the row counts
            # that shared the stale pack)
            stale, packed = packed, pack_weight(weight.detach(), rows, kernel)
            fresh = (kernel, weight._version, weight.data_ptr(), packed)
            self._packs.update({count: fresh for count, old in self._packs.items() if old[3] is stale})
        return kernel, packed

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.numel() // input.shape[-1] if input.numel() else 0
        needs_grad = torch.is_grad_enabled() and (input.requires_grad or self.weight.requires_grad)
        packed = None if needs_grad or input.dtype != torch.float32 else self._packed_weight(rows)
        if packed is None:
            return F.linear(input, self.weight, self.bias)
        kernel, pack = packed
        flat = input.reshape(rows, self.in_features).contiguous()
        output = packed_linear(flat, pack, self.weight, self.bias, kernel)
        return output.reshape(*input.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        rows = ", ".join(f"{count}: {self._packs[count][0]}" for count in sorted(self._packs))
        return f"{super().extra_repr()}, packed_rows={{{rows}}}"


@torch.no_grad()
def pack_linear_weights(model: nn.Module, batch_sizes, kernel: str = "mkl") -> int:
    """Pack the weight of every plain `nn.Linear` in `model` for inputs of `batch_sizes` rows (in place).

    Args:
        model (`nn.Module`): e.g. the target `PreTrainedModel`, float32 on CPU.
        batch_sizes (iterable of `int`): input row counts to pack for (`batch * seq` of the linear's input), e.g.
            `[tree_total_tokens]` for tree verification. 1 is refused: one-row steps (plain decoding) keep the
            stock kernel, so plain `generate` on a packed model computes exactly what it computed before.
        kernel (`str`, *optional*, defaults to `"mkl"`): `"mkl"` (MKL's packed GEMM) or `"onednn"` (oneDNN's
            linear on a reordered weight); `best_kernel` says which is faster on this machine.

    Returns:
        The number of linear layers packed. Calling it again adds row counts (a row count packed before keeps its
        kernel); `unpack_linear_weights` undoes it.

    MKL's packed GEMM needs one copy of the weight per row count. A oneDNN pack serves any row count alike (on
    SmolLM2, one packed for 12 rows ran 4-, 8-, 16- and 20-row forwards as fast as packs made for them, with
    identical outputs), so all of a layer's oneDNN row counts share one copy, packed for the largest count of the
    first call.
    """
    if kernel not in PACK_KERNELS:
        raise ValueError(f"kernel={kernel!r}; expected one of {PACK_KERNELS}.")
    if kernel not in packing_kernels():
        raise RuntimeError(
            f"pack_linear_weights(kernel={kernel!r}) needs a PyTorch build with {_KERNEL_NAMES[kernel]} "
            f"(this one has {packing_kernels() or 'neither'}); the default x86 CPU wheels have both."
        )
    sizes = sorted(set(batch_sizes))
    if not sizes or any(not isinstance(size, int) or size < 2 for size in sizes):
        raise ValueError(f"batch_sizes must be ints >= 2 (one-row steps keep the stock kernel), got {sizes}.")
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
            module.__class__ = PackedLinear
            module._packs = {}
        elif type(module) is not PackedLinear:
            continue  # a subclass with its own forward (quantized, LoRA, ...): leave it alone
        shared = next((entry for entry in module._packs.values() if entry[0] == "onednn"), None)
        for size in sizes:
            if size in module._packs:
                continue
            if kernel == "onednn" and shared is None:
                pack = pack_weight(module.weight.detach(), sizes[-1], kernel)
                shared = (kernel, module.weight._version, module.weight.data_ptr(), pack)
            if kernel == "onednn":
                module._packs[size] = shared  # re-packed on first use if the weight changed since
            else:
                pack = pack_weight(module.weight.detach(), size, kernel)
                module._packs[size] = (kernel, module.weight._version, module.weight.data_ptr(), pack)
        packed += 1
    return packed


def weight_copies(model: nn.Module) -> int:
    """How many packed copies of its weight a packed layer of `model` keeps (0 when nothing is packed)."""
    layer = next((module for module in model.modules() if type(module) is PackedLinear), None)
    return 0 if layer is None else len({id(entry[3]) for entry in layer._packs.values()})


def unpack_linear_weights(model: nn.Module) -> int:
    """Turn every `PackedLinear` of `model` back into a plain `nn.Linear`; returns how many were restored."""
    restored = 0
    for module in model.modules():
        if type(module) is PackedLinear:
            del module._packs
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
def time_linear_products(model: nn.Module, rows: int, repeats: int = 5) -> dict[str, float]:
    """Seconds of one pass over `model`'s linear layers on `rows` input rows, by kernel: `"stock"` and each of
    `packing_kernels()`.

    Which kernel pays depends on the CPU: measured on SmolLM2-135M with 8 rows (2 threads, torch 2.13), MKL's packed
    GEMM cut the linear layers' time by a third on a Xeon with AVX-512 and made it 8% longer on an AMD EPYC, where
    oneDNN's halved it. So it is timed on the machine, the way a forward meets the weights: a pass over the linear
    layers in model order (a weight shared by several layers once; the first `TIMED_WEIGHT_BYTES` of weights of a
    larger model), stock `F.linear` against each packed kernel (each weight packed for the measurement only), the
    passes taking turns at going first, and each kind's median pass of `repeats`. Timing one layer per weight shape
    instead (sessions 2 to 28) kept that weight in cache between calls, where stock GEMM loses little: on SmolLM2
    (2-core Xeon, 8 rows) packed over stock came out 0.71-1.06 in ten tries, on both sides of
    `PACKING_MIN_SAVING`, while a pass over all layers gave 0.79-0.89 in ten, and `generate` with the target packed
    ran its trees 8-12% faster (session 29).
    `best_kernel` runs it once per model and row count: about 1 s for SmolLM2-135M on 2 cores, with a packed copy
    of the timed weights per kernel alive meanwhile, and a few milliseconds for its head. A kernel the build has but
    that fails on this machine or these weights (a `RuntimeError` while packing or running it) is left out of the
    result, with a warning, so that it is never chosen.
    """
    weights, timed_bytes = {}, 0
    for module in model.modules():
        if timed_bytes >= TIMED_WEIGHT_BYTES:
            break
        if isinstance(module, nn.Linear) and _is_packable(module.weight) and module.weight.data_ptr() not in weights:
            weights[module.weight.data_ptr()] = module
            timed_bytes += module.weight.numel() * module.weight.element_size()
    layers = [
        (
            torch.randn(rows, layer.in_features),
            layer.weight.detach(),
            None if layer.bias is None else layer.bias.detach(),
        )
        for layer in weights.values()
    ]
    packs: dict[str, list[torch.Tensor]] = {}

    def timed_pass(kernel: str) -> float:
        start = time.perf_counter()
        for index, (inputs, weight, bias) in enumerate(layers):
            if kernel == "stock":
                F.linear(inputs, weight, bias)
            else:
                packed_linear(inputs, packs[kernel][index], weight, bias, kernel)
        return time.perf_counter() - start

    timed_pass("stock")  # first calls pay for the libraries' lazy set-up: untimed
    kernels = ["stock"]
    for kernel in packing_kernels():
        try:
            packs[kernel] = [pack_weight(weight, rows, kernel) for _, weight, _ in layers]
            timed_pass(kernel)
        except RuntimeError as error:
            warnings.warn(f"{_KERNEL_NAMES[kernel]} packing failed here and is not used: {error}", stacklevel=2)
            packs.pop(kernel, None)
            continue
        kernels.append(kernel)
    runs = {kernel: [] for kernel in kernels}
    for repeat in range(repeats):
        turn = repeat % len(kernels)
        for kernel in kernels[turn:] + kernels[:turn]:
            runs[kernel].append(timed_pass(kernel))
    return {kernel: statistics.median(seconds) for kernel, seconds in runs.items()}


# model -> {rows: {kernel: seconds}}: measured once per model and row count
_TIMINGS: "weakref.WeakKeyDictionary[nn.Module, dict[int, dict[str, float]]]" = weakref.WeakKeyDictionary()


def _timings(model: nn.Module, rows: int) -> dict[str, float]:
    """`time_linear_products(model, rows)`, measured once per model and row count."""
    timings = _TIMINGS.setdefault(model, {})
    if rows not in timings:
        timings[rows] = time_linear_products(model, rows)
    return timings[rows]


def fastest_packed_kernel(model: nn.Module, rows: int) -> str | None:
    """The packed kernel with `model`'s fastest pass over `rows` rows on this machine, whether or not it beats stock
    (`None` when no packed kernel ran here)."""
    timings = _timings(model, rows)
    return min((kernel for kernel in timings if kernel != "stock"), key=timings.__getitem__, default=None)


def best_kernel(model: nn.Module, rows: int) -> str | None:
    """The packed kernel to use for `model`'s `rows`-row products: the fastest one where it saves at least
    `PACKING_MIN_SAVING` of the linear layers' time against stock `F.linear`, else `None` (stay stock). Timed once
    per model and row count (`time_linear_products`)."""
    kernel = fastest_packed_kernel(model, rows)
    timings = _timings(model, rows)
    return kernel if kernel and timings[kernel] < (1 - PACKING_MIN_SAVING) * timings["stock"] else None


def measured_packing(model: nn.Module, rows) -> tuple[dict[int, str], list[int]]:
    """`({row count: kernel} where packing pays, [row counts where it does not])` of `model` (`best_kernel`),
    sorted, without repeats."""
    kernels = {count: best_kernel(model, count) for count in sorted(set(rows))}
    return {count: kernel for count, kernel in kernels.items() if kernel}, [c for c, k in kernels.items() if not k]


def is_packed_for(model: nn.Module, rows: int) -> bool:
    """True when every linear layer of `model` has a packed weight for inputs of `rows` rows."""
    linears = [module for module in model.modules() if isinstance(module, nn.Linear)]
    return bool(linears) and all(type(m) is PackedLinear and rows in m._packs for m in linears)


def is_packable_target(model: nn.Module) -> bool:
    """True when a packed kernel is available and `model`'s (first) weight is float32 on CPU."""
    weight = next(model.parameters(), None)
    return weight is not None and packing_available() and _is_packable(weight)


def packing_would_help(model: nn.Module, rows: int) -> bool:
    """True when `model` is float32 on CPU with a packed kernel available, `rows >= 2`, and not yet packed for
    `rows`."""
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


def pack_rows(model: nn.Module, rows, measure: bool = True) -> tuple[dict[int, str], list[int]]:
    """Pack `model`'s linear weights for `rows`-row inputs: with `measure`, only the row counts where packing pays
    (`best_kernel`), each with its fastest kernel; without, all of them (raising where it cannot), with the fastest
    packed kernel whether or not it beats stock. Returns `({packed row count: kernel}, [row counts left stock])`."""
    if measure:
        packed, stock = measured_packing(model, rows)
    else:
        if not is_packable_target(model):
            pack_linear_weights(model, rows)  # raises, naming what is missing
        packed, stock = {count: fastest_packed_kernel(model, count) for count in sorted(set(rows))}, []
        if None in packed.values():
            raise RuntimeError(
                f"No packed kernel runs on this machine for {type(model).__name__}; pack mode 'auto' or 'off'."
            )
    for kernel in PACK_KERNELS:
        counts = [count for count, chosen in packed.items() if chosen == kernel]
        if counts:
            pack_linear_weights(model, counts, kernel)
    return packed, stock


def describe_rows(packed: dict[int, str]) -> str:
    """`{8: "onednn", 2: "mkl", 3: "mkl"}` -> `"[2, 3] MKL, [8] oneDNN"`; `"[]"` when nothing is packed."""
    groups = [
        f"{sorted(count for count, chosen in packed.items() if chosen == kernel)} {_KERNEL_NAMES[kernel]}"
        for kernel in PACK_KERNELS
        if kernel in packed.values()
    ]
    return ", ".join(groups) or "[]"


def _group_attention(target: nn.Module, draft: nn.Module | None) -> bool:
    """Switch an `sdpa` target, and then its head, to grouped-query SDPA under tree masks; whether it was done."""
    from .gqa_attention import use_grouped_sdpa

    grouped = hasattr(target, "set_attn_implementation") and use_grouped_sdpa(target)
    if grouped and draft is not None:
        use_grouped_sdpa(draft)  # the head's one layer also attends under tree masks while drafting
    return grouped


def pack_for_decoding(target: nn.Module, draft: nn.Module | None, target_rows, draft_rows, mode: str = "auto") -> str:
    """Pack `target` (and `draft`) for the given row counts according to `mode`; returns a one-line description.

    `mode`: `"on"` packs with the fastest packed kernel (and raises where it cannot), `"off"` does nothing,
    `"auto"` packs the row counts for which packing pays on this machine (`best_kernel`), when a packed kernel is
    available and the target is float32 on CPU. Packing (`"on"`, or
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
    draft_rows, slower_draft = pack_rows(draft, draft_rows, measure) if draft is not None else ({}, [])
    grouped = _group_attention(target, draft)
    parts = [f"packed weights (target rows {describe_rows(target_rows)}, head rows {describe_rows(draft_rows)})"]
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
    the rows of its tree levels and draft updates, each where packing pays on this machine and with the fastest
    kernel (`best_kernel`), and switch `sdpa` to grouped-query SDPA, when the target is float32 on CPU. Returns a
    line naming what was packed and the memory it took, `None` when nothing new was decided (not packable, or
    settled by an earlier call).

    Measured on SmolLM2-135M: an 8-node verification costs 2.3x a plain step with stock weights and 1.5x with
    MKL packs on a 2-core Xeon; a 12-node one 1.7x stock and 0.9x with oneDNN packs on a 2-core AMD EPYC. So packing
    is the default where it pays; `generate(..., tree_pack_weights=False)` opts out.
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
    copies = weight_copies(target), weight_copies(draft)
    missing, slower = pack_rows(target, missing)
    missing_draft, slower_draft = pack_rows(draft, missing_draft)
    extra = _linear_weight_bytes(target) * (weight_copies(target) - copies[0])
    extra += _linear_weight_bytes(draft) * (weight_copies(draft) - copies[1])
    _group_attention(target, draft)
    parts = []
    if missing or missing_draft:
        parts.append(
            f"packed linear weights (target rows {describe_rows(missing)}, head rows {describe_rows(missing_draft)}), "
            f"{extra / 2**20:.0f} MiB more memory"
        )
    if slower or slower_draft:
        parts.append(f"stock weights for target rows {slower}, head rows {slower_draft} (packing measured no faster)")
    return f"Tree decoding on CPU: {'; '.join(parts)}; generate(..., tree_pack_weights=False) opts out."


__all__ = [
    "PACK_KERNELS",
    "PACK_MODES",
    "PackedLinear",
    "best_kernel",
    "describe_rows",
    "fastest_packed_kernel",
    "is_packable_target",
    "is_packed_for",
    "packing_would_help",
    "measured_packing",
    "mkl_packing_available",
    "onednn_packing_available",
    "pack_for_decoding",
    "pack_for_tree_decoding",
    "pack_linear_weights",
    "pack_rows",
    "pack_weight",
    "packed_linear",
    "packing_available",
    "packing_kernels",
    "rows_for_tree",
    "rows_for_trees",
    "time_linear_products",
    "unpack_linear_weights",
    "weight_copies",
]
