"""Training a head: the training side of eagle3_hf, one module per step.

- `records`: reading chat records (JSON / JSONL, cut-off files, datasets, lists) and normalising them;
- `regenerate`: the target answers the user turns itself (self-distilled, resumable JSONL);
- `magpie`: the target writes user prompts itself from its template's user prefix (Magpie), filtered;
- `exclusion`: which training records overlap the benchmark's evaluation prompts;
- `data`: conversations -> `input_ids` / `loss_mask` under any chat template, `DataCollatorForEagle3`;
- `vocab`: choosing the draft vocabulary from the training answers, and its cache file;
- `heads`: the head to train (fresh from the target, or continued), with its vocabulary;
- `features`: the target's features, online or from the sharded offline cache;
- `losses`: training-time-test alignment, masks, soft-label loss, accuracy (pure tensor functions);
- `training_args`, `trainer`: `Eagle3TrainingArguments` and `Eagle3Trainer`.

Nothing is imported here: `import eagle3_hf.training.records` does not pull in `Trainer`. The classes are also
`eagle3_hf.Eagle3Trainer`, `eagle3_hf.Eagle3TrainingArguments` and `eagle3_hf.DataCollatorForEagle3`.
"""
