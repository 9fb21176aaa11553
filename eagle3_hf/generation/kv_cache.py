"""Keep only the accepted tree entries of a `DynamicCache`, along the sequence axis.

Transformers has no `Cache` method for this: `crop` trims the tail and `reorder_cache` / `batch_select_indices`
act on the batch axis. An accepted path is often non-contiguous (e.g. nodes `[0, 4, 5]`), so the path's entries are
gathered into the first free slots and the rest is cut off. Only the `A` accepted rows are copied; the prefix
stays in place.

Sliding-window layers must be recording their past (`cache.activate_past_recording()`) during the tree forward,
otherwise they would already have dropped prefix entries the next query needs. After the selection they are cut
back to their working size (`sliding_window - 1` entries), as their own `crop` does. `end_past_recording` turns
the recording off again before the cache is returned.
"""

import torch
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer


def _select_tail(layer: DynamicLayer, num_new: int, keep: torch.LongTensor) -> None:
    """Replace the last `num_new` entries of `layer` by the entries `keep` among them."""
    num_old = layer.keys.shape[-2] - num_new
    index = num_old + keep.to(layer.keys.device)
    num_kept = keep.shape[0]
    # index_select copies, so the in-place write never reads a row it has already overwritten
    layer.keys[..., num_old : num_old + num_kept, :] = layer.keys.index_select(-2, index)
    layer.values[..., num_old : num_old + num_kept, :] = layer.values.index_select(-2, index)
    layer.keys = layer.keys[..., : num_old + num_kept, :]
    layer.values = layer.values[..., : num_old + num_kept, :]


def keep_tree_entries(cache: Cache, num_new: int, keep: torch.LongTensor) -> None:
    """After a forward that appended `num_new` entries (a tree), keep only the entries `keep` among them.

    Args:
        cache (`Cache`): a `DynamicCache` whose layers are `DynamicLayer` or `DynamicSlidingWindowLayer`.
        num_new (`int`): how many entries the last forward appended (the tree size `N`).
        keep (`torch.LongTensor` of shape `(A,)`): ascending indices in `[0, N)` of the entries to keep (the
            accepted path, root first). They end up contiguous, right after the previous entries.

    Example:
        >>> from transformers.cache_utils import DynamicCache
        >>> cache = DynamicCache()
        >>> _ = cache.update(torch.arange(6.0).view(1, 1, 6, 1), torch.arange(6.0).view(1, 1, 6, 1), 0)
        >>> keep_tree_entries(cache, num_new=4, keep=torch.tensor([0, 2]))  # prefix [0, 1], tree [2, 3, 4, 5]
        >>> cache.layers[0].keys.flatten().tolist()
        [0.0, 1.0, 2.0, 4.0]
    """
    for index, layer in enumerate(cache.layers):
        if not layer.is_initialized:
            continue
        if type(layer) is DynamicSlidingWindowLayer:
            if not layer.record_past and layer.cumulative_length >= layer.sliding_window:
                raise RuntimeError(
                    f"Sliding-window layer {index} did not record its past during the tree forward; call "
                    "cache.activate_past_recording() before verifying a tree."
                )
            if keep.shape[0] < num_new:  # all kept (a plain step): nothing to move
                _select_tail(layer, num_new, keep)
            layer.cumulative_length = layer.cumulative_length - num_new + keep.shape[0]
            if layer.cumulative_length >= layer.sliding_window:
                working = layer.sliding_window - 1
                layer.keys = layer.keys[..., layer.keys.shape[-2] - working :, :]
                layer.values = layer.values[..., layer.values.shape[-2] - working :, :]
        elif type(layer) is DynamicLayer:
            if keep.shape[0] < num_new:
                _select_tail(layer, num_new, keep)
        else:
            raise TypeError(f"Cannot compact cache layer {index} of type {type(layer).__name__}.")


def end_past_recording(cache: Cache) -> None:
    """Undo `cache.activate_past_recording()` before the cache goes back to the caller, as stock `generate` does.

    A recording sliding-window layer keeps every new entry until the next `crop`, so a later plain `generate` on the
    returned cache (a second chat turn) would grow it without bound. Each recording layer is first cut back to its
    working size (`crop(0)`: the last `sliding_window - 1` entries once the window is full), then stops recording.
    """
    for layer in cache.layers:
        if getattr(layer, "record_past", False):
            layer.crop(0)
            layer.record_past = False
