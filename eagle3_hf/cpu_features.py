"""What the CPU computes fast: named in every speed claim, and checked before work in half precision.

Our CPUs differ in what matters most here. With `avx512_bf16` (or AMX) oneDNN computes bfloat16 matrix products
in hardware, and a bfloat16 training step or draft forward is faster than a float32 one; without it (AVX2 only, or
AVX-512 without the bfloat16 extension) every bfloat16 product is converted and computed in float32, and is far
slower. Measured on a 2-core AMD EPYC with AVX2 only (session 36): stage 7's recipe with a two-layer head took
about 110 s a step in bfloat16 (`--bf16 true --target_dtype bfloat16`) against 12 s in float32, where a 2-core AMD
EPYC with `avx512_bf16` took 2.7 s in bfloat16. float16 is alike (`avx512_fp16` or AMX-FP16).

`torch.cpu.get_capabilities` (torch >= 2.13) says what the CPU has; older torch only names its vector width
(`torch.backends.cpu.get_cpu_capability`), so "can't tell" is a possible answer and never triggers a warning.
"""

import platform
from collections.abc import Mapping

import torch
from transformers.utils import logging


logger = logging.get_logger(__name__)

# capability flags (`torch.cpu.get_capabilities` keys) that compute each half precision in hardware
HARDWARE_FLAGS = {
    torch.bfloat16: ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16"),
    torch.float16: ("avx512_fp16", "amx_fp16", "fp16_arith"),
}


def cpu_model() -> str:
    """The CPU's model name (`/proc/cpuinfo` on Linux), else what `platform` knows: speed claims name the machine."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_capabilities() -> Mapping | None:
    """The CPU's instruction-set flags (`torch.cpu.get_capabilities()`), or None where this torch cannot say."""
    get_capabilities = getattr(torch.cpu, "get_capabilities", None)
    if get_capabilities is None:
        return None
    try:
        return get_capabilities()
    except RuntimeError:  # cpuinfo could not read the processor
        return None


def computes_in_hardware(dtype: torch.dtype, capabilities: Mapping | None = None) -> bool | None:
    """Whether the CPU multiplies `dtype` matrices with its own instructions: True for float32 and wider, True or
    False for bfloat16 / float16 by `HARDWARE_FLAGS`, None where the capabilities are unknown."""
    if dtype not in HARDWARE_FLAGS:
        return True
    capabilities = cpu_capabilities() if capabilities is None else capabilities
    if capabilities is None:
        return None
    return any(capabilities.get(flag, False) for flag in HARDWARE_FLAGS[dtype])


def describe_cpu_features(capabilities: Mapping | None = None) -> str:
    """The CPU's vector width and half-precision hardware in a few words, e.g. `"AVX2"`, `"AVX512, avx512_bf16"`,
    `"AVX512, avx512_bf16, amx_bf16"`: what a speed measured on this CPU depends on."""
    width = torch.backends.cpu.get_cpu_capability()
    capabilities = cpu_capabilities() if capabilities is None else capabilities
    if capabilities is None:
        return width
    flags = [flag for flags in HARDWARE_FLAGS.values() for flag in flags if capabilities.get(flag, False)]
    return ", ".join([width, *flags])


def warn_if_emulated(dtype: torch.dtype | str, what: str, device: torch.device | str = "cpu") -> bool:
    """Log a warning when `what` (e.g. `"--target_dtype bfloat16"`) asks for `dtype` on a CPU that has no
    instructions for it, so that the run is many times slower than in float32. Returns whether it warned."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if torch.device(device).type != "cpu" or computes_in_hardware(dtype) is not False:
        return False
    logger.warning(
        f"{what}: this CPU ({describe_cpu_features()}) has no {str(dtype).removeprefix('torch.')} instructions "
        f"(one of {', '.join(HARDWARE_FLAGS[dtype])}), so every matrix product converts to float32 and is many "
        "times slower than in float32 itself (a training step about 9x). Use float32 on this machine."
    )
    return True
