"""`Eagle3Trainer`: trains an EAGLE-3 draft head with the Transformers `Trainer` and the training-time test.

The trainer holds the frozen target (`target_model=`): it is never handed to the optimizer, never saved and runs in
eval mode without gradients. `compute_loss` keeps `Trainer`'s signature and reads top to bottom:

1. target outputs: online (the target runs on the batch) or offline (cached features; logits recomputed with the
   target's `lm_head`), see `eagle3_hf.training.features`;
2. the training-time test: `ttt_steps` calls of the draft's own `forward`, sharing one `DynamicCache` that
   accumulates the keys of all previous steps (gradients flow through them), each with the 4-D mask of
   `losses.ttt_attention_mask`, RoPE positions `t + k` and input hidden `fc(features)` then the draft's own output;
3. the loss `sum_k decay**k * loss_k` and per-step metrics (`loss_step_k`, `acc_step_k`, `acceptance_length`,
   and `padding_share`, the padded share of the batch's positions), summed per micro-batch, reduced over processes
   and averaged in `log()`.

Checkpoints are the head alone (`Eagle3DraftModel.save_pretrained`), loadable with `Eagle3DraftModel.from_pretrained`.
"""

from collections import defaultdict
from collections.abc import Iterator

import torch
from datasets import Dataset
from transformers import PreTrainedModel, Trainer
from transformers.cache_utils import DynamicCache
from transformers.trainer_pt_utils import LengthGroupedSampler

from ..configuration_eagle3 import Eagle3Config
from ..generation.tree import additive_mask
from ..modeling_eagle3 import Eagle3DraftModel, Eagle3DraftOutput
from .data import DataCollatorForEagle3
from .features import CachedFeatureDataset, TargetOutputs, offline_target_outputs, online_target_outputs
from .losses import (
    chain_acceptance_lengths,
    feature_regression_per_position,
    shift_left,
    soft_label_loss_per_sample,
    soft_targets,
    step_correct,
    step_loss_mask,
    step_targets,
    ttt_attention_mask,
)
from .training_args import Eagle3TrainingArguments


def unroll_training_time_test(
    model,
    config: Eagle3Config,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor,
    features: torch.Tensor,
    steps: int,
) -> Iterator[Eagle3DraftOutput]:
    """Run the `steps` draft steps of the training-time test, yielding each step's output (with gradients).

    Step `k` feeds tokens `x[t + 1 + k]` at RoPE positions `t + k`, with hidden `fc(features)` at `k = 0` and the
    previous step's pre-norm output after. One `DynamicCache` accumulates every step's keys, so with the mask of
    `ttt_attention_mask` query `(t, k)` sees the step-0 keys `t' <= t` and its own chain `(t, 1..k)`: exactly what
    a drafted token sees at inference (the prefix encoded with target features, plus its ancestors).

    Args:
        model: the draft head, possibly wrapped (DDP, ...); called as `model(input_ids=..., ...)`.
        config (`Eagle3Config`): the head's config (attention backend, cache layout).
        input_ids (`torch.LongTensor` of shape `(batch, seq)`) and attention_mask (`(batch, seq)`, 1 = real token).
        features (`torch.Tensor` of shape `(batch, seq, len(target_layer_ids) * target_hidden_size)`).
        steps (`int`): number of unrolled steps.
    """
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
    cache = DynamicCache(config=config)
    hidden = None
    for step in range(steps):
        masks = {"full_attention": ttt_attention_mask(attention_mask, step)}
        if config.draft_sliding_window is not None:  # the head's own rule (key index = position) does not fit here
            masks["sliding_attention"] = ttt_attention_mask(attention_mask, step, config.draft_sliding_window)
        if config._attn_implementation != "sdpa":
            # Eager adds the mask to the scores, so it must be additive; fp32 promotes any score dtype safely.
            masks = {kind: additive_mask(mask, torch.float32) for kind, mask in masks.items()}
        own_input = {"target_hidden_states": features} if step == 0 else {"hidden_states": hidden}
        outputs = model(
            input_ids=shift_left(input_ids, 1 + step),
            attention_mask=masks,
            position_ids=positions + step,
            cache=cache,
            use_cache=True,
            **own_input,
        )
        hidden = outputs.hidden_states
        yield outputs


def _check_feature_caches(datasets, config, target_model) -> None:
    """`FeatureCache.check_matches` for every `CachedFeatureDataset` among `datasets` (or the values of a dict)."""
    for dataset in datasets:
        for member in dataset.values() if isinstance(dataset, dict) else [dataset]:
            if isinstance(member, CachedFeatureDataset):
                # Features of other taps or another target have the right shapes often enough to train silently.
                member.cache.check_matches(config, target_model)


class Eagle3Trainer(Trainer):
    """Trainer for EAGLE-3 draft heads ([paper](https://huggingface.co/papers/2503.01840)).

    Args:
        model (`Eagle3DraftModel`): the head to train, e.g. `Eagle3DraftModel.from_target(target)`.
        args (`Eagle3TrainingArguments`, *optional*): defaults to `Eagle3TrainingArguments()`.
        target_model (`PreTrainedModel`): the frozen target. Its input embedding is attached to the head.
        data_collator (*optional*): defaults to `DataCollatorForEagle3` (it also pads cached per-token features).
        train_dataset / eval_dataset: samples with `input_ids` and `loss_mask` (`loss_mask[i] = 1` iff token `i`
            is an assistant token to learn); for `feature_mode="offline"`, a `CachedFeatureDataset`, whose cache
            must hold the head's layer taps of this target (checked here, `FeatureCache.check_matches`).
        processing_class (*optional*): the target's tokenizer; saved with checkpoints, gives the pad id.
        **kwargs: any other `Trainer` argument (`callbacks`, `optimizers`, ...).
    """

    _tag_names = ["eagle3", "speculative-decoding"]
    _name = "EAGLE-3"
    # compute_loss returns a per-micro-batch mean; Trainer divides it by the gradient-accumulation steps.
    loss_is_scaled_for_ga = False

    def __init__(
        self,
        model: Eagle3DraftModel,
        args: Eagle3TrainingArguments | None = None,
        target_model: PreTrainedModel | None = None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        **kwargs,
    ):
        if not isinstance(model, Eagle3DraftModel):
            raise TypeError(f"Eagle3Trainer trains an Eagle3DraftModel; got model of type {type(model).__name__}.")
        if target_model is None:
            raise ValueError("Eagle3Trainer needs the frozen target: pass target_model=<the target PreTrainedModel>.")
        args = args if args is not None else Eagle3TrainingArguments()
        if not isinstance(args, Eagle3TrainingArguments):
            raise TypeError(f"args must be Eagle3TrainingArguments; got {type(args).__name__}.")
        _check_feature_caches([train_dataset, eval_dataset], model.config, target_model)
        target_model.eval()
        target_model.requires_grad_(False)
        model.attach_target(target_model)
        if data_collator is None:
            pad_token_id = getattr(processing_class, "pad_token_id", None) or 0
            data_collator = DataCollatorForEagle3(pad_token_id=pad_token_id)
        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            **kwargs,
        )
        if getattr(target_model, "hf_device_map", None) is None:
            target_model.to(self.accelerator.device)
        self.target_model = target_model
        # name -> [numerator, denominator], summed over the micro-batches of all processes and divided in `log`.
        self._metrics = {"train": defaultdict(lambda: [0.0, 0.0]), "eval": defaultdict(lambda: [0.0, 0.0])}

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """`Trainer.evaluate`; a `CachedFeatureDataset` passed here is checked against the head and target first."""
        if eval_dataset is not None and not isinstance(eval_dataset, str):  # a str names one of the eval datasets
            _check_feature_caches([eval_dataset], self.model.config, self.target_model)
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def _get_train_sampler(self, train_dataset=None):
        """Trainer's sampler; for `train_sampling_strategy="group_by_length"` the lengths come from the token ids.

        Trainer would otherwise read every sample once to learn its length (the tokenized rows carry no length
        column: the collator pads per-token columns only), which for a `CachedFeatureDataset` means loading every
        cached feature.
        """
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        tokens = dataset.dataset if isinstance(dataset, CachedFeatureDataset) else dataset
        if self.args.train_sampling_strategy != "group_by_length" or not isinstance(tokens, Dataset):
            return super()._get_train_sampler(train_dataset)
        lengths = [len(ids) for ids in tokens["input_ids"]]
        return LengthGroupedSampler(
            self.args.train_batch_size * self.args.gradient_accumulation_steps, lengths=lengths
        )

    # ------------------------------------------------------------------------------------------------ the loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The weighted training-time-test loss of one micro-batch (`num_items_in_batch` is unused: the loss is
        averaged over all `B * T` positions as in the reference)."""
        mode = "train" if self.model.training else "eval"
        draft = self.accelerator.unwrap_model(model)
        if not draft.has_embedding:
            draft.attach_target(self.target_model)
        target_outputs = self._target_outputs(draft, inputs)
        loss, stats = self._training_time_test(model, draft, inputs, target_outputs)
        self._record_metrics(mode, stats)
        return (loss, stats) if return_outputs else loss

    def _target_outputs(self, draft: Eagle3DraftModel, inputs: dict) -> TargetOutputs:
        offline = "target_hidden_states" in inputs
        if offline != (self.args.feature_mode == "offline"):
            raise ValueError(
                f"feature_mode={self.args.feature_mode!r} but the batch "
                f"{'carries' if offline else 'lacks'} cached target_hidden_states. Offline training needs a "
                "CachedFeatureDataset (eagle3_hf.training.features); online training needs plain "
                "input_ids/loss_mask samples."
            )
        if offline:
            return offline_target_outputs(
                self.target_model, inputs["target_hidden_states"], inputs["final_hidden_states"]
            )
        return online_target_outputs(
            self.target_model,
            inputs["input_ids"],
            inputs["attention_mask"],
            draft.config.target_layer_ids,
            with_final_hidden=self.args.feature_regression_weight > 0,
        )

    def _training_time_test(
        self, model, draft: Eagle3DraftModel, inputs: dict, target_outputs: TargetOutputs
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Unroll `ttt_steps` draft steps; returns the weighted loss and per-sample statistics `{name: (batch,)}`."""
        input_ids, attention_mask, loss_mask = inputs["input_ids"], inputs["attention_mask"], inputs["loss_mask"]
        probs, in_draft_vocab = soft_targets(target_outputs.logits, draft.t2d, hard=self.args.hard_labels)
        loss, stats, correct = 0.0, {}, []
        steps = unroll_training_time_test(
            model, draft.config, input_ids, attention_mask, target_outputs.features, self.args.ttt_steps
        )
        for step, outputs in enumerate(steps):
            step_probs, position_mask = step_targets(probs, in_draft_vocab, loss_mask, step)
            step_loss = soft_label_loss_per_sample(outputs.logits, step_probs, position_mask)
            loss = loss + self.args.ttt_step_loss_decay**step * step_loss.mean()
            with torch.no_grad():
                correct.append(step_correct(outputs.logits, step_probs, position_mask))
                stats[f"loss_step_{step}"] = step_loss.detach()
                stats[f"acc_step_{step}/sum"] = correct[-1].sum(-1).float()
                stats[f"acc_step_{step}/count"] = step_loss_mask(loss_mask, step).sum(-1).float()
            if step == 0 and self.args.feature_regression_weight > 0:
                regression = self._feature_regression(draft, outputs.hidden_states, target_outputs, loss_mask, stats)
                loss = loss + self.args.feature_regression_weight * regression
        with torch.no_grad():
            valid = step_loss_mask(loss_mask, 0)
            lengths = chain_acceptance_lengths(torch.stack(correct))
            stats["acceptance_length/sum"] = (lengths * valid).sum(-1)
            stats["acceptance_length/count"] = valid.sum(-1).float()
            # The share of the batch's positions that are padding: the compute a length-grouping sampler saves.
            stats["padding_share/sum"] = (attention_mask.shape[1] - attention_mask.sum(-1)).float()
            stats["padding_share/count"] = torch.full_like(stats["padding_share/sum"], attention_mask.shape[1])
        return loss, stats

    def _feature_regression(
        self, draft: Eagle3DraftModel, hidden: torch.Tensor, target_outputs: TargetOutputs, loss_mask, stats: dict
    ) -> torch.Tensor:
        """EAGLE-1's SmoothL1 between `norm(g_0[t])` and the target's final hidden state at `t + 1` (ablation)."""
        per_position = feature_regression_per_position(
            draft.norm(hidden), shift_left(target_outputs.final_hidden_states, 1).to(hidden.device)
        )
        mask = step_loss_mask(loss_mask, 0).float()
        with torch.no_grad():
            stats["feature_regression_loss/sum"] = (per_position * mask).sum(-1).detach()
            stats["feature_regression_loss/count"] = mask.sum(-1)
        return (per_position * mask).sum() / (mask.sum() + 1e-5)

    # -------------------------------------------------------------------------------------------------- saving
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the head alone (the target is not an attribute of the head), then write or update its model card."""
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            from ..checkpoints.model_card import write_model_card

            write_model_card(output_dir or self.args.output_dir, self.model, training=self._training_summary())

    def _training_summary(self) -> dict:
        """The recipe so far, for the model card's training section."""
        args = self.args
        precision = "bf16 mixed" if args.bf16 else "fp16 mixed" if args.fp16 else str(self.model.dtype).split(".")[-1]
        losses = [entry["loss"] for entry in self.state.log_history if "loss" in entry]
        summary = {
            "steps": self.state.global_step,
            "epochs": round(self.state.epoch or 0.0, 2),
            "batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
            "learning_rate": args.learning_rate,
            "max_length": args.max_length,
            "ttt_steps": args.ttt_steps,
            "draft_vocab_size": self.model.config.draft_vocab_size,
            "precision": precision,
        }
        return {**summary, "final_loss": round(losses[-1], 4)} if losses else summary

    # ------------------------------------------------------------------------------------------------- metrics
    def _record_metrics(self, mode: str, stats: dict[str, torch.Tensor]) -> None:
        """Add one micro-batch's statistics `{name: (batch,)}`, summed over processes, to the metrics of `mode`.

        `name/sum` + `name/count` pairs become the ratio `name`; any other `name` is a per-sample value, averaged
        over the samples (a `name/sum` with a count of 1 per sample).

        Sums and counts are reduced, not the samples gathered with `gather_for_metrics`: Trainer fetches all
        micro-batches of an accumulation window before running the first (`get_batch_samples`), so the dataloader
        already reports its end during the last window and `gather_for_metrics` would cut each of its micro-batches
        to the epoch's remainder, dropping samples. Reduced sums count every sample once in one process; under DDP,
        the few samples that `even_batches` repeats to fill the last batch count twice, as in Trainer's `loss`.
        """
        columns = {}
        for name, values in stats.items():
            if "/" in name:
                columns[name] = values
            else:
                columns[f"{name}/sum"], columns[f"{name}/count"] = values, torch.ones_like(values)
        names = sorted(columns)  # the same order on every process
        totals = self.accelerator.reduce(torch.stack([columns[name].float().sum() for name in names]), reduction="sum")
        for name, total in zip(names, totals.cpu().tolist()):
            metric, part = name.split("/")
            self._metrics[mode][metric][0 if part == "sum" else 1] += total

    def _pop_metrics(self, mode: str, prefix: str | None = None) -> dict[str, float]:
        """Average the recorded metrics of `mode`, clear them, and prefix their names (`eval_acc_step_0`, ...)."""
        metrics = {name: num / den for name, (num, den) in self._metrics[mode].items() if den > 0}
        self._metrics[mode].clear()
        return {f"{prefix}_{name}" if prefix else name: value for name, value in metrics.items()}

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        # Trainer prefixes its own eval metrics with "eval_"; match that format.
        super().log({**logs, **self._pop_metrics(mode, "eval" if mode == "eval" else None)}, start_time)

    def evaluation_loop(self, *args, **kwargs):
        """Trainer's loop, plus the TTT metrics in the returned metrics (so `evaluate()` returns them too)."""
        output = super().evaluation_loop(*args, **kwargs)
        prefix = kwargs.get("metric_key_prefix", args[4] if len(args) > 4 else "eval")
        output.metrics.update(self._pop_metrics("eval", prefix))
        return output

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Evaluation is the training loss and its metrics, without gradients; no logits are returned."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None


__all__ = ["Eagle3Trainer", "unroll_training_time_test"]
