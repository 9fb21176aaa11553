"""`Eagle3TrainingArguments`: `TrainingArguments` plus the EAGLE-3 fields, with the reference recipe's defaults."""

from dataclasses import dataclass, field

from transformers import TrainingArguments


FEATURE_MODES = ("online", "offline")
FEATURE_CACHE_DTYPES = ("bfloat16", "float16", "float32")


@dataclass
class Eagle3TrainingArguments(TrainingArguments):
    r"""
    Arguments of [`Eagle3Trainer`] and `eagle3-hf train`. Every [`~transformers.TrainingArguments`] field is
    available; the defaults below that differ from Transformers' come from the reference recipe
    (`SafeAILab/EAGLE`, `eagle/traineagle3`): AdamW betas `(0.9, 0.95)`, weight decay 0, gradient clipping 0.5,
    learning rate 5e-5 with a linear warm-up over the first 1.5% of steps (12k of 800k) then linear decay,
    micro-batch 1 with gradient accumulation 2, seed 0. The reference trains 40 epochs in fp16 with DeepSpeed
    ZeRO-2; epochs and precision are left to you.

    Parameters that control the training-time test:

        ttt_steps (`int`, *optional*, defaults to `7`):
            Number of unrolled draft steps per batch (the "training-time test"). `1` is the no-TTT ablation.
        ttt_step_loss_decay (`float`, *optional*, defaults to `0.8`):
            Step `k` is weighted `ttt_step_loss_decay ** k`.
        feature_regression_weight (`float`, *optional*, defaults to `0.0`):
            Weight of EAGLE-1's SmoothL1 feature-regression loss (draft `norm(g_0[t])` vs the target's final hidden
            state at `t + 1`). An ablation: EAGLE-3 uses none.

    Parameters that control the target and its features:

        target_model_name_or_path (`str`, *optional*):
            Hub id or local path of the target; `eagle3-hf train` loads the offline SmolLM2-135M-Instruct when unset.
        max_length (`int`, *optional*, defaults to `2048`):
            Longest tokenized conversation kept; longer ones are dropped, not truncated (as the reference does).
        feature_mode (`str`, *optional*, defaults to `"online"`):
            `"online"`: the frozen target runs in every training step. `"offline"`: target features and final hidden
            states are read from a cache built beforehand in `feature_cache_dir` (target logits are recomputed
            from them with the target's `lm_head`).
        feature_cache_dir (`str`, *optional*):
            Folder of the offline feature cache; required when `feature_mode="offline"`.
        feature_cache_dtype (`str`, *optional*, defaults to `"bfloat16"`):
            Storage dtype of the offline cache (`"bfloat16"`, `"float16"` or `"float32"`).
        hard_labels (`bool`, *optional*, defaults to `False`):
            Ablation: train on one-hot labels at the target's top-1 token (cross-entropy) instead of the target's
            distribution over the draft vocabulary.
        single_feature (`bool`, *optional*, defaults to `False`):
            Ablation: fuse only the top feature, `target_layer_ids=[L - 3]`, instead of `[2, L // 2, L - 3]`.
    """

    # --- EAGLE-3 training-time test ---
    ttt_steps: int = field(default=7, metadata={"help": "Unrolled draft steps per batch (1 = no training-time test)."})
    ttt_step_loss_decay: float = field(default=0.8, metadata={"help": "Step k of the unroll is weighted decay**k."})
    hard_labels: bool = field(
        default=False,
        metadata={
            "help": "Ablation: cross-entropy on the target's top-1 token instead of its distribution over the draft "
            "vocabulary (EAGLE-3 and the peers train on the distribution)."
        },
    )
    feature_regression_weight: float = field(
        default=0.0,
        metadata={"help": "Weight of EAGLE-1's SmoothL1 feature-regression loss (ablation; EAGLE-3 uses 0)."},
    )
    # --- target and features ---
    target_model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Target model: a folder, a Hub id, a .gguf file, or 'smollm2' (the default: the offline "
            "SmolLM2-135M-Instruct GGUF).",
            "aliases": ["--target"],
        },
    )
    max_length: int = field(default=2048, metadata={"help": "Drop tokenized conversations longer than this."})
    feature_mode: str = field(
        default="online",
        metadata={"help": "Where target features come from.", "choices": list(FEATURE_MODES)},
    )
    feature_cache_dir: str | None = field(
        default=None, metadata={"help": "Folder of the offline feature cache (feature_mode='offline')."}
    )
    feature_cache_dtype: str = field(
        default="bfloat16",
        metadata={"help": "Storage dtype of the offline feature cache.", "choices": list(FEATURE_CACHE_DTYPES)},
    )
    single_feature: bool = field(
        default=False, metadata={"help": "Ablation: fuse only target layer L-3 instead of [2, L//2, L-3]."}
    )

    # --- defaults from the reference recipe ---
    learning_rate: float = field(default=5e-5, metadata={"help": "Peak AdamW learning rate."})
    adam_beta2: float = field(default=0.95, metadata={"help": "AdamW beta2."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    max_grad_norm: float = field(default=0.5, metadata={"help": "Gradient clipping norm."})
    warmup_steps: float = field(
        default=0.015, metadata={"help": "Linear warm-up: steps (>= 1) or a fraction of all steps (< 1)."}
    )
    per_device_train_batch_size: int = field(default=1, metadata={"help": "Micro-batch size per device."})
    gradient_accumulation_steps: int = field(default=2, metadata={"help": "Micro-batches per optimizer step."})
    seed: int = field(default=0, metadata={"help": "Random seed set at the beginning of training."})
    # Every head parameter takes part in every step, so DDP need not search for unused ones.
    ddp_find_unused_parameters: bool | None = field(
        default=False, metadata={"help": "DDP find_unused_parameters (all head parameters are used)."}
    )
    # The batches carry `loss_mask` (and offline features), which the draft's forward does not take.
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Keep False: loss_mask and cached features are not forward() arguments."}
    )

    def __post_init__(self):
        super().__post_init__()
        if self.ttt_steps < 1:
            raise ValueError(f"ttt_steps={self.ttt_steps}: at least 1 draft step is needed.")
        if not 0.0 < self.ttt_step_loss_decay <= 1.0:
            raise ValueError(f"ttt_step_loss_decay={self.ttt_step_loss_decay} must be in (0, 1].")
        if self.feature_regression_weight < 0:
            raise ValueError(f"feature_regression_weight={self.feature_regression_weight} must be >= 0.")
        if self.max_length < 3:
            raise ValueError(f"max_length={self.max_length}: a training sample needs at least 3 tokens.")
        if self.feature_mode not in FEATURE_MODES:
            raise ValueError(f"feature_mode={self.feature_mode!r}; expected one of {FEATURE_MODES}.")
        if self.feature_mode == "offline" and not self.feature_cache_dir:
            raise ValueError("feature_mode='offline' needs feature_cache_dir (where the feature cache lives).")
        if self.feature_cache_dtype not in FEATURE_CACHE_DTYPES:
            raise ValueError(
                f"feature_cache_dtype={self.feature_cache_dtype!r}; expected one of {FEATURE_CACHE_DTYPES}."
            )
        if self.remove_unused_columns:
            raise ValueError(
                "remove_unused_columns=True would drop loss_mask (not an argument of the draft's forward); keep False."
            )


__all__ = ["Eagle3TrainingArguments"]
