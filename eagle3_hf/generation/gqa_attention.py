"""SDPA attention that keeps grouped-query attention grouped under a 4-D mask, for cheaper tree verification.

Transformers' `sdpa` backend passes `enable_gqa=True` to `torch.nn.functional.scaled_dot_product_attention` only
when there is no mask (the CUDA kernels fall back to the math path otherwise). A tree verification always has a
mask, so every layer first copies its keys and values `num_attention_heads / num_key_value_heads` times
(`repeat_kv`). On CPU that copy is pure overhead: for SmolLM2-135M (9 query / 3 key-value heads) it was 8 ms of a
63 ms forward over 8 tree nodes after a 200-token prefix (2-core Xeon, 2 threads), and the forward took 57 ms
without it. (`scripts/measure_verify_cost.py --gqa` measures it.)

`use_grouped_sdpa(model)` registers the backend `"eagle3_grouped_sdpa"` with Transformers' `AttentionInterface`
(and `sdpa`'s mask builder with `AttentionMaskInterface`) and switches `model` to it. Cases the grouped call does
not cover (attention biases, soft-capping, attention weights, models without key-value groups) go to the stock
`sdpa` function unchanged. `use_grouped_sdpa(model, False)` switches back to `sdpa`.
"""

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask


GROUPED_SDPA = "eagle3_grouped_sdpa"


def grouped_sdpa_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """An `AttentionInterface` function: `sdpa` with `enable_gqa=True` whatever the mask.

    Args:
        query (`torch.Tensor` of shape `(batch, heads, q_len, head_dim)`), key and value (`(batch, kv_heads,
        kv_len, head_dim)`): as Transformers' attention modules pass them.
        attention_mask (`torch.Tensor` of shape `(batch or 1, 1, q_len, kv_len)`, *optional*): boolean or additive.

    Returns:
        `(output, None)` with output of shape `(batch, q_len, heads, head_dim)`, as `sdpa_attention_forward`.
    """
    groups = getattr(module, "num_key_value_groups", 1)
    special = kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
    if groups == 1 or special or kwargs.get("output_attentions", False) or key.shape[-1] != value.shape[-1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = query.shape[2] > 1 and attention_mask is None and is_causal
    output = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=is_causal,
        enable_gqa=True,
    )
    return output.transpose(1, 2).contiguous(), None


def register_grouped_sdpa() -> None:
    """Register `"eagle3_grouped_sdpa"` (idempotent); it builds its masks as `sdpa` does."""
    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention_forward)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)


def use_grouped_sdpa(model: PreTrainedModel, enable: bool = True) -> bool:
    """Switch `model` from `sdpa` to the grouped backend (or back with `enable=False`); True when it changed.

    A model on another backend (eager, flash-attention, ...) is left as it is.
    """
    current = model.config._attn_implementation
    if enable and current == "sdpa":
        register_grouped_sdpa()
        model.set_attn_implementation(GROUPED_SDPA)
        return True
    if not enable and current == GROUPED_SDPA:
        model.set_attn_implementation("sdpa")
        return True
    return False


__all__ = ["GROUPED_SDPA", "grouped_sdpa_attention_forward", "register_grouped_sdpa", "use_grouped_sdpa"]
