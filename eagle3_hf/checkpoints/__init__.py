"""Checkpoints: reading and writing every EAGLE-3 dialect, Hub uploads and model cards.

- `files`: a checkpoint folder's files (local or Hub), `config.json`, weight files, `CheckpointFormatError`;
- `reading`: detecting a dialect and loading it (`Eagle3DraftModel.from_pretrained` calls
  `from_pretrained_any_dialect`);
- `writing`: `save_in_dialect`, for the dialects the serving engines read;
- `model_card`, `templates/model_card.md`: the head's model card;
- `hub`: `prepare_upload_folder` and `push_to_hub`.

See docs/checkpoint-dialects.md and docs/hub.md.
"""
