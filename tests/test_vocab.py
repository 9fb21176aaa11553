"""Draft vocabulary: d2t/t2d maps, selection from loss-masked counts (ties, fill), coverage, the keyed cache."""

import json
import logging

import pytest
import torch
from datasets import Dataset
from safetensors.torch import save_file

import eagle3_hf.training.vocab as vocab_module
from eagle3_hf import Eagle3DraftModel
from eagle3_hf.training.data import build_training_dataset, tokenizer_fingerprint
from eagle3_hf.training.heads import build_draft_head
from eagle3_hf.training.vocab import (
    build_draft_vocab,
    check_draft_vocab,
    count_loss_tokens,
    load_draft_vocab,
    load_or_build_draft_vocab,
    save_draft_vocab,
    select_draft_token_ids,
)
from eagle3_hf.vocab_maps import check_vocab_maps, maps_from_token_ids

from .test_data import CONVERSATION, make_chat_tokenizer


def tiny_dataset():
    # loss-masked ids: 2, 3, 3, 5, 3  -> counts {3: 3, 2: 1, 5: 1}
    return Dataset.from_dict(
        {"input_ids": [[1, 2, 3], [3, 3, 5], [7, 3]], "loss_mask": [[0, 1, 1], [1, 0, 1], [0, 1]]}
    )


def test_maps_from_token_ids():
    d2t, t2d = maps_from_token_ids(torch.tensor([7, 2, 4]), vocab_size=10)
    assert d2t.tolist() == [2, 3, 5]  # draft id i -> target id i + d2t[i] = 2, 4, 7
    assert t2d.nonzero().flatten().tolist() == [2, 4, 7]
    check_vocab_maps(d2t, t2d, draft_vocab_size=3, vocab_size=10)
    with pytest.raises(ValueError, match="duplicates"):
        maps_from_token_ids(torch.tensor([1, 1]), vocab_size=10)


def test_count_loss_tokens_respects_mask_and_selection():
    dataset = tiny_dataset()
    counts = count_loss_tokens(dataset, vocab_size=8)
    assert counts.tolist() == [0, 0, 1, 3, 0, 1, 0, 0]
    assert count_loss_tokens(dataset.select([2]), vocab_size=8).tolist() == [0, 0, 0, 1, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        count_loss_tokens(dataset, vocab_size=4)


@pytest.mark.parametrize(
    "size, expected, filled",
    [
        (1, [3], 0),
        (2, [2, 3], 0),  # 2 and 5 tie: the lower id wins
        (3, [2, 3, 5], 0),
        (5, [0, 1, 2, 3, 5], 2),  # only 3 ids occur: the lowest unused ids 0 and 1 fill the rest
        (8, list(range(8)), 5),
    ],
)
def test_select_most_common_sorted_and_filled(size, expected, filled):
    counts = torch.tensor([0, 0, 1, 3, 0, 1, 0, 0])
    ids, n_filled = select_draft_token_ids(counts, size)
    assert ids.tolist() == expected and n_filled == filled


def test_select_rejects_bad_sizes():
    with pytest.raises(ValueError, match="draft_vocab_size=9"):
        select_draft_token_ids(torch.zeros(8, dtype=torch.long), 9)


def test_build_coverage_and_identity():
    vocab = build_draft_vocab(tiny_dataset(), vocab_size=8, draft_vocab_size=2, tokenizer="tiny")
    assert vocab.token_ids.tolist() == [2, 3]
    assert vocab.coverage == pytest.approx(4 / 5)
    check_vocab_maps(vocab.d2t, vocab.t2d, 2, 8)
    assert vocab.metadata["coverage"] == pytest.approx(0.8) and vocab.metadata["tokenizer"] == "tiny"
    assert vocab.metadata["filled"] == 0 and vocab.metadata["distinct_tokens"] == 3
    full = build_draft_vocab(tiny_dataset(), vocab_size=8, draft_vocab_size=8)
    assert full.d2t.tolist() == [0] * 8 and full.coverage == 1.0


def test_counts_only_assistant_tokens_of_real_pipeline():
    tokenizer = make_chat_tokenizer()
    dataset = build_training_dataset([{"messages": CONVERSATION}], tokenizer)
    ids, mask = dataset[0]["input_ids"], dataset[0]["loss_mask"]
    counts = count_loss_tokens(dataset, vocab_size=len(tokenizer))
    expected = torch.bincount(torch.tensor([i for i, m in zip(ids, mask) if m]), minlength=len(tokenizer))
    assert torch.equal(counts, expected)
    assert counts[tokenizer.convert_tokens_to_ids("<|im_start|>")] == 0  # headers are not in the loss
    assert counts[tokenizer.convert_tokens_to_ids("<|im_end|>")] == 2  # the end-of-turn marker is


def test_save_load_round_trip(tmp_path):
    vocab = build_draft_vocab(tiny_dataset(), vocab_size=8, draft_vocab_size=3, tokenizer="tiny")
    save_draft_vocab(vocab, tmp_path / "vocab.safetensors")
    loaded = load_draft_vocab(tmp_path / "vocab.safetensors")
    for name in ("d2t", "t2d", "counts"):
        assert torch.equal(getattr(loaded, name), getattr(vocab, name))
    assert loaded.t2d.dtype == torch.bool and loaded.d2t.dtype == torch.long
    assert loaded.metadata == vocab.metadata
    save_file({"weight": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not a draft vocabulary file"):
        load_draft_vocab(tmp_path / "other.safetensors")


def test_cache_is_keyed_by_data_tokenizer_and_size(tmp_path, monkeypatch, caplog):
    path = tmp_path / "vocab.safetensors"
    dataset = tiny_dataset()
    first = load_or_build_draft_vocab(dataset, 8, 2, path, tokenizer="tiny")
    builds = []
    real_build = vocab_module.build_draft_vocab
    monkeypatch.setattr(vocab_module, "build_draft_vocab", lambda *a, **k: builds.append(a) or real_build(*a, **k))

    again = load_or_build_draft_vocab(tiny_dataset(), 8, 2, path, tokenizer="tiny")  # same content, same fingerprint
    assert builds == [] and torch.equal(again.d2t, first.d2t)
    with caplog.at_level(logging.WARNING, logger="eagle3_hf.training.vocab"):
        other_data = load_or_build_draft_vocab(dataset.select([2]), 8, 2, path, tokenizer="tiny")
        assert "rebuilding" in caplog.text
    assert len(builds) == 1 and other_data.token_ids.tolist() == [0, 3]
    load_or_build_draft_vocab(dataset.select([2]), 8, 3, path, tokenizer="tiny")
    load_or_build_draft_vocab(dataset.select([2]), 8, 3, path, tokenizer="other")
    assert len(builds) == 3


def test_command_line(tmp_path, capsys):
    from eagle3_hf.commands import vocab as vocab_command

    tokenizer = make_chat_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    (tmp_path / "data.jsonl").write_text('{"messages": ' + json.dumps(CONVERSATION) + "}\n")
    output = tmp_path / "vocab.safetensors"
    argv = [
        "--target",
        str(tmp_path / "tokenizer"),
        "--data",
        str(tmp_path / "data.jsonl"),
        "--draft-vocab-file",
        str(output),
        "--draft-vocab-size",
        "16",
    ]
    assert vocab_command.main(argv) == 0
    vocab = load_draft_vocab(output)
    assert vocab.t2d.shape == (len(tokenizer),) and vocab.d2t.shape == (16,)  # no model config: len(tokenizer)
    assert "coverage" in capsys.readouterr().out and vocab.metadata["tokenizer"] == str(tmp_path / "tokenizer")
    assert vocab.metadata["tokenizer_fingerprint"] == tokenizer_fingerprint(tokenizer)


def test_a_vocabulary_file_of_another_tokenizer_is_refused_naming_the_file(tmp_path, tiny_target):
    # built for a 96-id tokenizer; the tiny target has 128 ids
    path = tmp_path / "other.safetensors"
    save_draft_vocab(build_draft_vocab(tiny_dataset(), 96, 8, tokenizer="other/tok"), path)
    vocab = load_draft_vocab(path)
    with pytest.raises(ValueError, match=f"{path}: vocab_size=96 .*128.*'other/tok'"):
        check_draft_vocab(vocab, 128)
    head = Eagle3DraftModel.from_target(tiny_target, draft_vocab_size=64)
    with pytest.raises(ValueError, match=f"{path}: vocab_size=96.*vocab_size=128"):
        head.replace_draft_vocab(vocab, tiny_target)
    assert head.config.draft_vocab_size == 64  # unchanged
    with pytest.raises(ValueError, match=str(path)):
        build_draft_head(tiny_target, vocab)
    # same size, another tokenizer: caught by the recorded fingerprint
    tokenizer, other = make_chat_tokenizer(), make_chat_tokenizer(bos_token="<other>")
    same_size = build_draft_vocab(tiny_dataset(), 128, 8, tokenizer_fingerprint=tokenizer_fingerprint(tokenizer))
    check_draft_vocab(same_size, 128, tokenizer)
    with pytest.raises(ValueError, match="tokenizer_fingerprint=.*maps another tokenizer's ids"):
        check_draft_vocab(same_size, 128, other)
    old_ids = set(head.draft_to_target_ids(torch.arange(64)).tolist())
    added = len(set(same_size.token_ids.tolist()) - old_ids)  # the tokens new to the head get the target's rows
    assert head.replace_draft_vocab(same_size, tiny_target) == added and head.config.draft_vocab_size == 8


def test_command_line_reads_the_vocab_size_of_a_composite_target(tmp_path):
    """A multimodal config (Gemma 3) keeps vocab_size in its text config, as `train` reads it."""
    from transformers import Gemma3Config

    from eagle3_hf.commands import vocab as vocab_command

    make_chat_tokenizer().save_pretrained(tmp_path / "target")
    Gemma3Config().save_pretrained(tmp_path / "target")
    (tmp_path / "data.jsonl").write_text('{"messages": ' + json.dumps(CONVERSATION) + "}\n")
    argv = ["--target", str(tmp_path / "target"), "--data", str(tmp_path / "data.jsonl")]
    argv += ["--draft-vocab-file", str(tmp_path / "vocab.safetensors"), "--draft-vocab-size", "8"]
    assert vocab_command.main(argv) == 0
    vocab = load_draft_vocab(tmp_path / "vocab.safetensors")
    assert vocab.t2d.shape == (Gemma3Config().get_text_config().vocab_size,) and vocab.metadata["filled"] == 0


def test_command_data_defaults_are_train_s():
    """The dataset fingerprint covers max_length and overflow: with train's defaults, train reuses the file."""
    from eagle3_hf.commands import vocab as vocab_command
    from eagle3_hf.commands.train import DataArguments
    from eagle3_hf.training.data import build_training_dataset
    from eagle3_hf.training.training_args import Eagle3TrainingArguments

    args, data_args = vocab_command.make_parser().parse_args_into_dataclasses(["--draft-vocab-file", "v.safetensors"])
    assert data_args.overflow == DataArguments().overflow == "drop"
    assert build_training_dataset.__defaults__[1] == "drop"  # the library's default is the CLI's
    assert args.max_length == Eagle3TrainingArguments.__dataclass_fields__["max_length"].default


def test_cache_writes_are_atomic_and_a_truncated_cache_is_rebuilt(tmp_path, monkeypatch, caplog):
    path = tmp_path / "vocab.safetensors"
    first = load_or_build_draft_vocab(tiny_dataset(), 8, 2, path, tokenizer="tiny")

    def interrupted(tensors, filename, metadata=None):  # killed half-way through the write
        open(filename, "wb").write(b"\0" * 8)
        raise KeyboardInterrupt

    monkeypatch.setattr("safetensors.torch.save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_draft_vocab(build_draft_vocab(tiny_dataset(), 8, 3), path)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # the old cache, whole; no partial file left
    assert torch.equal(load_draft_vocab(path).d2t, first.d2t)

    path.write_bytes(path.read_bytes()[:-8])  # a cache cut short by an older, non-atomic write
    with pytest.raises(ValueError, match=f"{path}: unreadable"):
        load_draft_vocab(path)
    with caplog.at_level(logging.WARNING, logger="eagle3_hf.training.vocab"):
        rebuilt = load_or_build_draft_vocab(tiny_dataset(), 8, 2, path, tokenizer="tiny")
    assert f"rebuilding the draft vocabulary cache {path}" in caplog.text
    assert torch.equal(rebuilt.d2t, first.d2t) and torch.equal(load_draft_vocab(path).d2t, first.d2t)

    save_file({"weight": torch.zeros(2)}, str(path))  # some other file: an error, never overwritten
    with pytest.raises(ValueError, match="not a draft vocabulary file"):
        load_or_build_draft_vocab(tiny_dataset(), 8, 2, path, tokenizer="tiny")
