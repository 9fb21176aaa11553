"""Shared fixtures: tiny targets built in code, offline."""

import importlib.util
import os
from pathlib import Path


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

from eagle3_hf import Eagle3DraftModel  # noqa: E402


# Tiny models are dominated by per-op overhead: one thread is faster, and much faster when the cores are shared.
torch.set_num_threads(1)


SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
    """The module `scripts/<name>.py` (scripts are files, not a package), imported without running its `main`."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY_TARGET_KWARGS = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def make_tiny_target(config_class=LlamaConfig, seed: int = 0, attn_implementation: str = "sdpa", **overrides):
    """A seeded random causal LM of any architecture from a tiny config (8 layers, hidden 32, vocab 128)."""
    torch.manual_seed(seed)
    config = config_class(**{**TINY_TARGET_KWARGS, **overrides})
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    return model.eval()


@pytest.fixture
def tiny_target():
    return make_tiny_target()


@pytest.fixture
def tiny_draft(tiny_target):
    torch.manual_seed(1)
    return Eagle3DraftModel.from_target(tiny_target, draft_vocab_size=64)


@pytest.fixture(autouse=True)
def packing_pays_on_tiny_models(request, monkeypatch):
    """`generate` packs weights where timing says packing pays (`cpu_packing.best_kernel`); on tiny models that
    timing is noise, and whether a test's run is packed would change its last-bit rounding from run to run. So tests
    see packing pay (what every machine did before the measurement), except the real-model ones, which measure."""
    if request.node.get_closest_marker("real_model") is None:
        from eagle3_hf.generation import cpu_packing

        def packing_pays(model, rows, repeats=5):  # the first available kernel (MKL on x86) wins the tie
            return {"stock": 1.0, **dict.fromkeys(cpu_packing.packing_kernels(), 0.5)}

        monkeypatch.setattr(cpu_packing, "time_linear_products", packing_pays)


@pytest.fixture(autouse=True)
def heads_draft_in_their_own_dtype(request, monkeypatch):
    """`generate` drafts with a bfloat16 copy of a float32 head where timing says it is faster
    (`draft_precision.auto_draft_dtype`); on tiny models that timing is noise, and tests that drive the head they
    pass (oracle drafts, recorded trees) need it to draft itself. So tests see the head draft in its own dtype,
    except the real-model ones, which measure; `tests/test_draft_precision.py` tests the choice itself."""
    if request.node.get_closest_marker("real_model") is None:
        from eagle3_hf.generation import draft_precision

        monkeypatch.setattr(draft_precision, "auto_draft_dtype", lambda draft, rows: draft.fc.weight.dtype)
