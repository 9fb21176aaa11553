"""Capture the target features EAGLE-3 reads: the hidden states entering decoder layers `target_layer_ids`.

Transformers' `output_hidden_states` accepts a list of indices and keeps only those layers (no extra memory for
the others). Index `i` is the input of decoder layer `i` (index 0 is the embeddings), which is the EAGLE layer id,
so the ids are passed through unchanged. Id `L` (speculators' `--include-last-layer`) is the last layer's output
*before* the final norm, which is not Transformers' `hidden_states[L]` (that one is after the norm): it is captured
from the final norm's input by `capture_last_layer_output`.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel


def hidden_states_request(layer_ids: list[int]) -> list[int]:
    """The `output_hidden_states=` value that captures exactly `layer_ids` (EAGLE ids == HF indices)."""
    return list(layer_ids)


@contextmanager
def capture_last_layer_output(target: PreTrainedModel) -> Iterator[dict]:
    """While the block runs, `captured["hidden"]` is the input of the target's final norm at its latest forward:
    the last decoder layer's output `(batch, seq, hidden_size)` before the norm, i.e. EAGLE layer id `L`."""
    norm = getattr(target.get_decoder(), "norm", None)
    if not isinstance(norm, torch.nn.Module):
        raise ValueError(
            f"{type(target).__name__} has no final norm module (`get_decoder().norm`) to read the last layer's "
            "pre-norm output (layer id L) from."
        )
    captured: dict = {}
    handle = norm.register_forward_pre_hook(lambda module, args: captured.__setitem__("hidden", args[0]))
    try:
        yield captured
    finally:
        handle.remove()


def gather_target_features(
    hidden_states: tuple[torch.Tensor | None, ...],
    layer_ids: list[int],
    last_layer_output: torch.Tensor | None = None,
) -> torch.Tensor:
    """Concatenate the selected hidden states low -> high.

    Args:
        hidden_states: the target output's `hidden_states` tuple (`L + 1` entries, `None` where not captured),
            each `(batch, seq, target_hidden_size)`.
        layer_ids: EAGLE layer ids, e.g. `[2, L // 2, L - 3]`; `L` itself needs `last_layer_output`.
        last_layer_output (`torch.Tensor` of shape `(batch, seq, target_hidden_size)`, *optional*): the last
            layer's pre-norm output (`capture_last_layer_output`), used for id `L`.

    Returns:
        `(batch, seq, len(layer_ids) * target_hidden_size)`.
    """
    num_layers = len(hidden_states) - 1
    selected = []
    for index in layer_ids:
        if index > num_layers:
            raise ValueError(f"layer id {index} is out of range for a target with {num_layers} layers.")
        if index == num_layers:
            if last_layer_output is None:
                raise ValueError(
                    f"layer id {index} = L is the last layer's output before the final norm, which hidden_states "
                    f"does not hold (hidden_states[{index}] is after the norm); run the target under "
                    "eagle3_hf.target.capture_last_layer_output(target) and pass its output as last_layer_output."
                )
            selected.append(last_layer_output)
            continue
        state = hidden_states[index]
        if state is None:
            raise ValueError(f"hidden_states[{index}] was not captured; pass output_hidden_states={layer_ids}.")
        selected.append(state)
    return torch.cat(selected, dim=-1)


@torch.no_grad()
def target_forward_with_features(
    target: PreTrainedModel, layer_ids: list[int], **forward_kwargs
) -> tuple[object, torch.Tensor]:
    """Run `target(**forward_kwargs)` capturing only `layer_ids`; returns `(outputs, features)`.

    `features` is `(batch, seq, len(layer_ids) * target_hidden_size)`.
    """
    with capture_last_layer_output(target) as captured:
        outputs = target(**forward_kwargs, output_hidden_states=hidden_states_request(layer_ids))
    return outputs, gather_target_features(outputs.hidden_states, layer_ids, captured.get("hidden"))
