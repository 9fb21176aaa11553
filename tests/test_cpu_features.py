"""eagle3_hf.cpu_features: which half precisions the CPU computes in hardware, named in speed claims and warned about."""

import logging

import pytest
import torch

from eagle3_hf import cpu_features
from eagle3_hf.cpu_features import computes_in_hardware, describe_cpu_features, warn_if_emulated

from .conftest import make_tiny_target


AVX2_ONLY = {"architecture": "x86_64", "avx2": True, "avx512_f": False, "avx512_bf16": False, "amx_bf16": False}
AVX512_BF16 = {**AVX2_ONLY, "avx512_f": True, "avx512_bf16": True}


@pytest.fixture
def capabilities(monkeypatch):
    """Set what `cpu_capabilities()` reports (a mapping, or None for a torch that cannot tell)."""

    def use(mapping):
        monkeypatch.setattr(cpu_features, "cpu_capabilities", lambda: mapping)

    return use


def test_half_precisions_are_hardware_only_with_their_flags(capabilities):
    assert computes_in_hardware(torch.bfloat16, AVX2_ONLY) is False
    assert computes_in_hardware(torch.bfloat16, AVX512_BF16) is True
    assert computes_in_hardware(torch.bfloat16, {"amx_bf16": True}) is True
    assert computes_in_hardware(torch.bfloat16, {"architecture": "arm64", "bf16": True}) is True
    assert computes_in_hardware(torch.float16, AVX512_BF16) is False
    assert computes_in_hardware(torch.float16, {"avx512_fp16": True}) is True
    # float32 never needs a flag; an unknown CPU is "cannot tell", not "slow"
    assert computes_in_hardware(torch.float32, AVX2_ONLY) is True
    capabilities(None)
    assert computes_in_hardware(torch.bfloat16) is None
    assert computes_in_hardware(torch.float64) is True


def test_the_description_names_the_vector_width_and_the_half_precision_flags():
    width = torch.backends.cpu.get_cpu_capability()
    assert describe_cpu_features(AVX2_ONLY) == width
    assert describe_cpu_features({**AVX512_BF16, "amx_bf16": True}) == f"{width}, avx512_bf16, amx_bf16"
    # this machine's own description starts with its width too (whatever the CPU is)
    assert describe_cpu_features().split(", ")[0] == width


def test_emulated_half_precision_on_cpu_is_warned_about_naming_the_option(capabilities, caplog):
    capabilities(AVX2_ONLY)
    with caplog.at_level(logging.WARNING, logger="eagle3_hf.cpu_features"):
        assert warn_if_emulated("bfloat16", "--target_dtype bfloat16") is True
    assert "--target_dtype bfloat16: this CPU" in caplog.text and "no bfloat16 instructions" in caplog.text
    assert "avx512_bf16" in caplog.text and "Use float32" in caplog.text
    caplog.clear()
    # not on CPU, not a half precision, hardware support, or a CPU that cannot be read: silent
    assert warn_if_emulated(torch.bfloat16, "x", device="cuda") is False
    assert warn_if_emulated(torch.float32, "x") is False
    capabilities(AVX512_BF16)
    assert warn_if_emulated(torch.bfloat16, "x") is False
    capabilities(None)
    assert warn_if_emulated(torch.bfloat16, "x") is False
    assert caplog.text == ""


def test_loading_a_target_in_an_emulated_dtype_warns(capabilities, caplog, tmp_path):
    from eagle3_hf.loading import load_target_model

    make_tiny_target().save_pretrained(tmp_path / "target")
    capabilities(AVX2_ONLY)
    with caplog.at_level(logging.WARNING, logger="eagle3_hf.cpu_features"):
        load_target_model(tmp_path / "target", dtype="float32", device="cpu")
        assert caplog.text == ""
        model = load_target_model(tmp_path / "target", dtype="bfloat16", device="cpu")
    assert model.dtype == torch.bfloat16
    assert f"the target '{tmp_path / 'target'}' in bfloat16: this CPU" in caplog.text


def test_training_in_an_emulated_precision_warns_naming_the_flag(capabilities, tmp_path):
    from eagle3_hf.commands.train import warn_about_emulated_precision
    from eagle3_hf.training.training_args import Eagle3TrainingArguments

    args = Eagle3TrainingArguments(output_dir=str(tmp_path), use_cpu=True, bf16=True, report_to="none")
    capabilities(AVX2_ONLY)
    assert warn_about_emulated_precision(args) == ["--bf16"]
    capabilities(AVX512_BF16)
    assert warn_about_emulated_precision(args) == []
    args = Eagle3TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    capabilities(AVX2_ONLY)
    assert warn_about_emulated_precision(args) == []


def test_env_and_bench_name_the_cpu_features(capabilities, capsys):
    from eagle3_hf.commands.bench import machine_description
    from eagle3_hf.commands.env import main

    capabilities(AVX512_BF16)
    width = torch.backends.cpu.get_cpu_capability()
    assert main([]) == 0
    assert f"({width}, avx512_bf16), {torch.get_num_threads()} torch threads" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert f"({width}, avx512_bf16), " in machine_description()
