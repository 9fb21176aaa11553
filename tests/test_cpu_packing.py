import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from eagle3_hf import Eagle3DraftModel
from eagle3_hf.generation.cpu_packing import (
    PackedLinear,
    mkl_packing_available,
    pack_linear_weights,
    packing_available,
    packing_kernels,
    time_linear_products,  # the real one: conftest makes packing pay in other tests
    unpack_linear_weights,
)

from .conftest import make_tiny_target


pytestmark = pytest.mark.skipif(not packing_available(), reason="this PyTorch build has neither MKL nor oneDNN")
needs_mkl = pytest.mark.skipif(not mkl_packing_available(), reason="this PyTorch build has no MKL")
KERNELS = [pytest.param(kernel) for kernel in packing_kernels()]


@pytest.mark.parametrize("kernel", KERNELS)
def test_packed_rows_match_linear_and_other_rows_are_bit_identical(kernel):
    torch.manual_seed(0)
    layer = nn.Linear(48, 80)
    stock = copy.deepcopy(layer)
    weight = layer.weight
    assert pack_linear_weights(layer, [6], kernel) == 1
    assert type(layer) is PackedLinear and layer.weight is weight  # same module, same parameter
    assert layer._packs[6][0] == kernel
    assert set(layer.state_dict()) == {"weight", "bias"}
    packed_input = torch.randn(2, 3, 48)  # 6 rows: the packed kernel
    torch.testing.assert_close(layer(packed_input), stock(packed_input), rtol=1e-5, atol=1e-5)
    for shape in [(1, 1, 48), (1, 5, 48), (7, 48)]:  # other row counts: exactly the stock computation
        x = torch.randn(shape)
        assert torch.equal(layer(x), stock(x))


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_modified_weight_is_repacked_not_served_stale(kernel):
    layer = nn.Linear(16, 24, bias=False)
    pack_linear_weights(layer, [4], kernel)
    x = torch.randn(4, 16)
    with torch.no_grad():
        layer.weight.mul_(-2.0)
    torch.testing.assert_close(layer(x), x @ layer.weight.T, rtol=1e-5, atol=1e-5)
    layer.load_state_dict({"weight": torch.randn(24, 16)})
    torch.testing.assert_close(layer(x), x @ layer.weight.T, rtol=1e-5, atol=1e-5)


def test_gradients_take_the_stock_path():
    layer = nn.Linear(8, 8)
    stock = copy.deepcopy(layer)
    pack_linear_weights(layer, [3])
    x = torch.randn(3, 8, requires_grad=True)
    x_stock = x.detach().clone().requires_grad_(True)
    output = layer(x)
    output.sum().backward()
    stock(x_stock).sum().backward()
    # the stock kernel's own numbers, bit for bit: a packed kernel would differ in rounding (or have no backward)
    assert torch.equal(output, stock(x_stock))
    assert torch.equal(x.grad, x_stock.grad)
    assert torch.equal(layer.weight.grad, stock.weight.grad) and torch.equal(layer.bias.grad, stock.bias.grad)


@needs_mkl
def test_bad_requests_raise_and_unpack_restores_plain_linears():
    model = make_tiny_target()
    with pytest.raises(ValueError, match=">= 2"):
        pack_linear_weights(model, [1])
    with pytest.raises(ValueError, match="kernel='blas'; expected one of"):
        pack_linear_weights(model, [4], "blas")
    with pytest.raises(ValueError, match="float32"):
        pack_linear_weights(copy.deepcopy(model).to(torch.bfloat16), [4])
    count = pack_linear_weights(model, [4, 8])
    assert count == sum(isinstance(m, nn.Linear) for m in model.modules()) and "packed_rows={4: mkl, 8: mkl}" in repr(
        model
    )
    assert unpack_linear_weights(model) == count
    assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize("kernel", KERNELS)
def test_tree_decoding_on_packed_models_equals_plain_generate(kernel):
    target = make_tiny_target()
    torch.manual_seed(1)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64)
    prompt = torch.randint(0, 128, (1, 9))
    plain = target.generate(prompt, do_sample=False, max_new_tokens=20)
    pack_linear_weights(target, [6], kernel)
    pack_linear_weights(draft, [2, 3], kernel)
    assert_tree_decoding_equals_plain(target, draft, prompt, plain)


def assert_tree_decoding_equals_plain(target, draft, prompt, plain=None):
    """Greedy plain `generate` on the (packed) target gives `plain` (its one-row steps are stock), and a 6-node tree
    with `draft` gives the same tokens."""
    packed_plain = target.generate(prompt, do_sample=False, max_new_tokens=20)
    assert plain is None or torch.equal(packed_plain, plain)
    tree = target.generate(
        prompt,
        assistant_model=draft,
        do_sample=False,
        max_new_tokens=20,
        tree_total_tokens=6,
        tree_depth=3,
        tree_top_k=2,
    )
    assert torch.equal(tree, packed_plain)


@needs_mkl
def test_rows_for_tree_and_pack_for_decoding_modes():
    from eagle3_hf.generation.cpu_packing import pack_for_decoding, rows_for_tree, rows_for_trees

    assert rows_for_tree(8, 3, 4) == ([8], [2, 3, 4])
    assert rows_for_tree(1, 0, 1) == ([], [])
    assert rows_for_tree(8, 3, 8, lookup_tokens=5) == ([8], [2, 3, 4, 5, 6, 8])
    assert rows_for_trees([(8, 3, 4), (16, 4, 8), (8, 3, 2)]) == ([8, 16], [2, 3, 4, 5, 8])
    target = make_tiny_target()
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64)
    assert pack_for_decoding(target, draft, [8], [2], "off") == "stock weights"
    assert not any(type(m) is PackedLinear for m in target.modules())
    assert pack_for_decoding(target.to(torch.bfloat16), draft, [8], [2], "auto") == "stock weights"
    target.float()
    description = pack_for_decoding(target, draft, [8, 6], [2], "on")  # conftest: MKL the fastest packed kernel
    assert description == (
        "packed weights (target rows [6, 8] MKL, head rows [2] MKL); grouped-query SDPA under tree masks"
    )
    assert target.config._attn_implementation == draft.config._attn_implementation == "eagle3_grouped_sdpa"
    assert type(target.lm_head) is PackedLinear and type(draft.fc) is PackedLinear
    with pytest.raises(ValueError, match="pack mode"):
        pack_for_decoding(target, draft, [8], [2], "yes")


def test_packing_would_help_until_the_tree_size_is_packed():
    from eagle3_hf.generation.cpu_packing import is_packed_for, packing_would_help

    target = make_tiny_target()
    assert packing_would_help(target, 8) and not packing_would_help(target, 1)
    pack_linear_weights(target, [6])
    assert not is_packed_for(target, 8) and packing_would_help(target, 8)
    pack_linear_weights(target, [8])
    assert is_packed_for(target, 8) and not packing_would_help(target, 8)
    assert not packing_would_help(make_tiny_target().to(torch.bfloat16), 8)


def test_the_commands_offer_the_pack_modes_pack_for_decoding_takes():
    from eagle3_hf.commands import PACK_WEIGHTS_MODES
    from eagle3_hf.generation.cpu_packing import PACK_MODES

    assert PACK_WEIGHTS_MODES == PACK_MODES


def slower_packing_for(*rows_slower):
    """A `time_linear_products` stand-in: MKL packing 10% faster than stock, except 10% slower for `rows_slower`."""

    def timings(model, rows, repeats=5):
        return {"stock": 1.0, "mkl": 1.1 if rows in rows_slower else 0.9}

    return timings


@needs_mkl
def test_auto_packs_only_the_row_counts_where_packing_measurably_pays(monkeypatch):
    from eagle3_hf.generation import cpu_packing

    monkeypatch.setattr(cpu_packing, "time_linear_products", slower_packing_for(6, 3))
    target = make_tiny_target()
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64)
    # row lists gathered from several methods repeat counts (bench's): each is named once, in order
    description = cpu_packing.pack_for_decoding(target, draft, [8, 6, 8], [3, 2, 3, 2], "auto")
    assert description == (
        "packed weights (target rows [8] MKL, head rows [2] MKL); stock for target rows [6], head rows [3] (packing "
        "measured no faster); grouped-query SDPA under tree masks"
    )
    assert cpu_packing.is_packed_for(target, 8) and not cpu_packing.is_packed_for(target, 6)
    assert cpu_packing.is_packed_for(draft, 2) and not cpu_packing.is_packed_for(draft, 3)
    # "on" packs whatever was measured
    cpu_packing.pack_for_decoding(target, draft, [6], [3], "on")
    assert cpu_packing.is_packed_for(target, 6) and cpu_packing.is_packed_for(draft, 3)


def test_generate_measures_once_and_keeps_stock_weights_where_packing_is_slower(monkeypatch):
    from eagle3_hf.generation import cpu_packing

    calls = []

    def timings(model, rows, repeats=5):
        calls.append(rows)
        return {"stock": 1.0, **dict.fromkeys(packing_kernels(), 1.1)}  # packing slower for every row count

    monkeypatch.setattr(cpu_packing, "time_linear_products", timings)
    target = make_tiny_target()
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64)
    line = cpu_packing.pack_for_tree_decoding(target, draft, [8], max_depth=3, top_k=2)
    assert line.startswith("Tree decoding on CPU: stock weights for target rows [8], head rows [2, 3, 4]")
    assert not any(type(module) is PackedLinear for module in [*target.modules(), *draft.modules()])
    assert target.config._attn_implementation == "eagle3_grouped_sdpa"
    measured = len(calls)
    assert cpu_packing.pack_for_tree_decoding(target, draft, [8], max_depth=3, top_k=2) is None  # settled
    assert len(calls) == measured


def record_stock_linear_weights(monkeypatch) -> list[int]:
    """The `data_ptr` of the weight of every stock `F.linear` call from now on, in call order."""
    calls, stock_linear = [], F.linear
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: calls.append(w.data_ptr()) or stock_linear(x, w, b))
    return calls


def test_time_linear_products_times_every_linear_layer_once_per_pass(monkeypatch):
    # a forward streams every weight through the cache, so every layer is timed, not one per shape (one layer
    # timed alone keeps its weight in cache, where stock GEMM looks as fast as packed); a shared weight counts once
    shared = nn.Linear(64, 64)
    model = nn.Sequential(nn.Linear(64, 64), shared, nn.Linear(64, 32), shared)
    stock_calls = record_stock_linear_weights(monkeypatch)
    seconds = time_linear_products(model, rows=8, repeats=3)
    assert set(seconds) == {"stock", *packing_kernels()} and all(value > 0 for value in seconds.values())
    weights = [model[0].weight.data_ptr(), shared.weight.data_ptr(), model[2].weight.data_ptr()]
    assert stock_calls == weights * 4  # the untimed first pass, then one per repeat, in model order
    assert all(type(module) is nn.Linear for module in model)  # measured on temporary packs, the model untouched


def test_time_linear_products_stops_at_the_weight_budget(monkeypatch):
    # a large model is timed on its first layers (in model order) up to the budget, not packed whole to be timed
    from eagle3_hf.generation import cpu_packing

    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64))
    monkeypatch.setattr(cpu_packing, "TIMED_WEIGHT_BYTES", 64 * 64 * 4 + 1)
    stock_calls = record_stock_linear_weights(monkeypatch)
    time_linear_products(model, rows=8, repeats=1)
    assert stock_calls == [model[0].weight.data_ptr(), model[1].weight.data_ptr()] * 2


def kernel_timings(per_rows: dict[int, dict[str, float]]):
    """A `time_linear_products` stand-in: stock 1.0, the packed kernels `per_rows[rows]` (slower for other rows)."""

    def timings(model, rows, repeats=5):
        return {"stock": 1.0, **per_rows.get(rows, dict.fromkeys(packing_kernels(), 1.1))}

    return timings


def test_best_kernel_is_the_fastest_packed_one_where_it_saves_enough(monkeypatch):
    from eagle3_hf.generation import cpu_packing

    monkeypatch.setattr(cpu_packing, "packing_kernels", lambda: ["mkl", "onednn"])
    monkeypatch.setattr(
        cpu_packing,
        "time_linear_products",
        kernel_timings(
            {8: {"mkl": 1.02, "onednn": 0.55}, 4: {"mkl": 0.8, "onednn": 0.9}, 2: {"mkl": 0.97, "onednn": 0.96}}
        ),
    )
    model = nn.Linear(8, 8)
    assert cpu_packing.best_kernel(model, 8) == "onednn"  # AMD EPYC: MKL no faster than stock, oneDNN twice as fast
    assert cpu_packing.best_kernel(model, 4) == "mkl"
    assert cpu_packing.best_kernel(model, 2) is None  # 4% saved: below PACKING_MIN_SAVING
    assert cpu_packing.fastest_packed_kernel(model, 2) == "onednn"  # what "on" packs with regardless
    assert cpu_packing.measured_packing(model, [8, 2, 4, 8]) == ({4: "mkl", 8: "onednn"}, [2])
    assert cpu_packing.describe_rows({8: "onednn", 3: "mkl", 2: "mkl"}) == "[2, 3] MKL, [8] oneDNN"
    assert cpu_packing.describe_rows({}) == "[]"


@pytest.mark.skipif(packing_kernels() != ["mkl", "onednn"], reason="needs both MKL and oneDNN")
def test_auto_packs_each_row_count_with_its_fastest_kernel_and_decodes_losslessly(monkeypatch):
    from eagle3_hf.generation import cpu_packing

    monkeypatch.setattr(
        cpu_packing,
        "time_linear_products",
        kernel_timings({6: {"mkl": 0.9, "onednn": 0.5}, 2: {"mkl": 0.7, "onednn": 0.8}}),
    )
    target = make_tiny_target()
    torch.manual_seed(1)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64)
    description = cpu_packing.pack_for_decoding(target, draft, [6], [2], "auto")
    assert description.startswith("packed weights (target rows [6] oneDNN, head rows [2] MKL)")
    assert {module._packs[6][0] for module in target.modules() if type(module) is PackedLinear} == {"onednn"}
    assert draft.fc._packs[2][0] == "mkl"
    assert_tree_decoding_equals_plain(target, draft, torch.randint(0, 128, (1, 9)))


def test_packing_with_a_kernel_this_build_lacks_names_it(monkeypatch):
    from eagle3_hf.generation import cpu_packing

    monkeypatch.setattr(cpu_packing, "packing_kernels", lambda: ["mkl"])
    with pytest.raises(RuntimeError, match=r"kernel='onednn'\) needs a PyTorch build with oneDNN"):
        pack_linear_weights(nn.Linear(4, 4), [2], "onednn")


@pytest.mark.skipif("onednn" not in packing_kernels(), reason="needs oneDNN")
def test_onednn_row_counts_share_one_pack_that_is_refreshed_for_all_of_them():
    from eagle3_hf.generation.cpu_packing import weight_copies

    torch.manual_seed(0)
    layer = nn.Linear(32, 40)
    pack_linear_weights(layer, [4, 12], "onednn")
    pack_linear_weights(layer, [6], "onednn")  # a later call reuses the pack too
    assert len({id(entry[3]) for entry in layer._packs.values()}) == 1 and weight_copies(layer) == 1
    for rows in (4, 6, 12):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        layer.weight.mul_(-1.5)
    x = torch.randn(6, 32)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert weight_copies(layer) == 1  # re-packed once, for every row count that shared the stale pack
    x = torch.randn(4, 32)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    if "mkl" in packing_kernels():
        pack_linear_weights(layer, [2, 3], "mkl")  # MKL: one copy per row count
        assert weight_copies(layer) == 3


def test_a_kernel_that_fails_here_is_timed_out_of_the_choice(monkeypatch):
    from eagle3_hf.generation import cpu_packing

    real_pack = cpu_packing.pack_weight

    def failing_onednn(weight, rows, kernel):
        if kernel == "onednn":
            raise RuntimeError("no oneDNN kernel for this CPU")
        return real_pack(weight, rows, kernel)

    monkeypatch.setattr(cpu_packing, "pack_weight", failing_onednn)
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 8))
    with pytest.warns(UserWarning, match="oneDNN packing failed here and is not used: no oneDNN kernel"):
        seconds = time_linear_products(model, rows=4, repeats=1)
    assert set(seconds) == {"stock", *packing_kernels()} - {"onednn"}


def test_with_no_packed_kernel_working_auto_stays_stock_and_on_says_why(monkeypatch):
    from eagle3_hf.generation import cpu_packing

    monkeypatch.setattr(cpu_packing, "time_linear_products", lambda model, rows, repeats=5: {"stock": 1.0})
    target = make_tiny_target()
    assert cpu_packing.best_kernel(target, 8) is None and cpu_packing.fastest_packed_kernel(target, 8) is None
    assert cpu_packing.pack_for_decoding(target, None, [8], [], "auto").startswith("stock weights")
    with pytest.raises(RuntimeError, match="No packed kernel runs on this machine for LlamaForCausalLM"):
        cpu_packing.pack_for_decoding(target, None, [8], [], "on")
