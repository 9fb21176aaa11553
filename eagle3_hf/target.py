"""Capture the target features EAGLE-3 reads: the hidden states entering decoder layers `target_layer_ids`.

Transformers' `output_hidden_states` accepts a list of indices and keeps only those layers (no extra memory for
the others). Index `i` is the input of decoder layer `i` (index 0 is the embeddings), which is the EAGLE layer id,
so the ids are passed through unchanged. Index `L` would be the *post-norm* output and is never used.
"""

import torch
from transformers import PreTrainedModel


def hidden_states_request(layer_ids: list[int]) -> list[int]:
    """The `output_hidden_states=` value that captures exactly `layer_ids` (EAGLE ids == HF indices)."""
    return list(layer_ids)


def gather_target_features(hidden_states: tuple[torch.Tensor | None, ...], layer_ids: list[int]) -> torch.Tensor:
    """Concatenate the selected hidden states low -> high.

    Args:
        hidden_states: the target output's `hidden_states` tuple (`L + 1` entries, `None` where not captured),
            each `(batch, seq, target_hidden_size)`.
        layer_ids: EAGLE layer ids, e.g. `[2, L // 2, L - 3]`.

    Returns:
        `(batch, seq, len(layer_ids) * target_hidden_size)`.
    """
    selected = []
    for index in layer_ids:
        if index >= len(hidden_states) - 1:
            raise ValueError(f"layer id {index} is out of range for a target with {len(hidden_states) - 1} layers.")
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
    outputs = target(**forward_kwargs, output_hidden_states=hidden_states_request(layer_ids))
    return outputs, gather_target_features(outputs.hidden_states, layer_ids)
