"""`eagle3_hf.training.diagnostics` and `eagle3-hf diagnose` on tiny models built in code."""

import json

import pytest
import torch
from datasets import Dataset

from eagle3_hf import Eagle3DraftModel
from eagle3_hf.bench.prompts import load_human_eval, load_mt_bench
from eagle3_hf.commands import diagnose as diagnose_command
from eagle3_hf.generation.tree import additive_mask
from eagle3_hf.training.diagnostics import (
    benchmark_prompt_records,
    draft_forward_ms,
    heldout_sharegpt_records,
    markdown_report,
    score_head,
)
from eagle3_hf.training.trainer import Eagle3Trainer

from .conftest import make_tiny_target
from .oracle_draft import OracleDraft
from .test_data import make_chat_tokenizer
from .test_trainer import make_args, make_sharp_target


FIRST_TOKEN = 1  # every sample starts with it, as a chat template's first token: the oracle needs one


class UnrollOracle(OracleDraft):
    """`OracleDraft` under the training-time test: the unroll passes a dict of bool masks, the oracle reads one
    additive mask (its rows then rebuild exactly the prefix plus own chain that each TTT query stands for)."""

    def forward(self, input_ids, attention_mask=None, **kwargs):
        if isinstance(attention_mask, dict):
            mask = attention_mask["full_attention"]
            attention_mask = additive_mask(mask, torch.float32) if mask.dtype == torch.bool else mask
        return super().forward(input_ids, attention_mask=attention_mask, **kwargs)


def make_samples(lengths=(12, 9, 16, 7, 14), seed: int = 0) -> Dataset:
    """Random rows after a fixed first token; the first 3 tokens play the prompt (loss_mask 0)."""
    generator = torch.Generator().manual_seed(seed)
    rows = [[FIRST_TOKEN] + torch.randint(0, 128, (n - 1,), generator=generator).tolist() for n in lengths]
    return Dataset.from_dict({"input_ids": rows, "loss_mask": [[0] * 3 + [1] * (len(r) - 3) for r in rows]})


def random_head(target, draft_vocab_size: int = 64) -> Eagle3DraftModel:
    torch.manual_seed(1)
    return Eagle3DraftModel.from_target(target, draft_vocab_size=draft_vocab_size).eval()


@pytest.fixture(scope="module")
def target():
    return make_sharp_target()


class TestScoreHead:
    def test_accuracies_are_fractions_nested_in_k_and_equal_the_trainers_metrics(self, target, tmp_path):
        draft, samples = random_head(target), make_samples()
        scores = score_head(draft, target, samples, ttt_steps=3, top_ks=(8, 1, 4), batch_size=2)
        assert list(scores.top_k_accuracy) == [1, 4, 8]
        for values in scores.top_k_accuracy.values():
            assert len(values) == 3 and all(0.0 <= value <= 1.0 for value in values)
        for step in range(3):
            top = [scores.top_k_accuracy[k][step] for k in (1, 4, 8)]
            assert top == sorted(top)
        assert scores.top_k_accuracy[8][0] > scores.top_k_accuracy[1][0]  # a random head is not always right...
        assert 1.0 <= scores.acceptance_length <= 4.0
        # a row of n tokens has loss_mask[t + 2 + k] = 1 for t in [max(0, 1 - k), n - 3 - k]: n - 3, n - 3, n - 4
        assert scores.positions == [43, 43, 38]
        assert (scores.conversations, scores.tokens) == (5, 58)
        # ... and top-1 and the acceptance length are the trainer's own eval metrics on the same data
        args = make_args(tmp_path, ttt_steps=3, per_device_eval_batch_size=3)
        metrics = Eagle3Trainer(draft, args, target_model=target, eval_dataset=samples).evaluate()
        for step in range(3):
            assert scores.top_k_accuracy[1][step] == pytest.approx(metrics[f"eval_acc_step_{step}"], abs=1e-6)
        assert scores.acceptance_length == pytest.approx(metrics["eval_acceptance_length"], abs=1e-6)

    def test_an_oracle_head_scores_far_above_a_random_one(self, target):
        samples = make_samples()
        oracle = UnrollOracle.from_target(target, draft_vocab_size=128).eval()
        oracle.reset(target, torch.tensor([[FIRST_TOKEN]]))
        right = score_head(oracle, target, samples, ttt_steps=3, batch_size=1)
        wrong = score_head(random_head(target, 128), target, samples, ttt_steps=3, batch_size=1)
        for step in range(3):
            assert right.top_k_accuracy[1][step] > 0.99
            assert right.top_k_accuracy[1][step] > wrong.top_k_accuracy[1][step] + 0.5
        # every chain runs to the end of its row (at most 3 steps): a mean well above the random head's
        assert right.acceptance_length > wrong.acceptance_length + 1.0

    def test_sampled_acceptance_is_the_overlap_of_the_two_distributions(self, target):
        samples = make_samples()
        oracle = UnrollOracle.from_target(target, draft_vocab_size=128).eval()
        oracle.reset(target, torch.tensor([[FIRST_TOKEN]]))
        right = score_head(oracle, target, samples, ttt_steps=3, batch_size=1)
        assert right.draft_vocab_mass == pytest.approx([1.0] * 3)  # the whole vocabulary
        assert right.sampled_acceptance == pytest.approx([1.0] * 3, abs=1e-4)  # q = p: every draw accepted
        draft = random_head(target, 64)
        small = score_head(draft, target, samples, ttt_steps=3, batch_size=2)
        for step in range(3):
            assert 0.0 < small.sampled_acceptance[step] < small.draft_vocab_mass[step] < 1.0
        # step 0's bound, from the target's logits alone: the mean in-vocabulary mass of P[t + 1] over t with
        # loss_mask[t + 2] = 1 (the answer positions of step 0)
        masses = []
        for row in samples:
            logits = target(torch.tensor([row["input_ids"]])).logits[0].float()
            inside = torch.softmax(logits, dim=-1)[:, draft.t2d].sum(dim=-1)
            masses += [float(inside[t + 1]) for t in range(len(row["input_ids"]) - 2) if row["loss_mask"][t + 2]]
        assert small.draft_vocab_mass[0] == pytest.approx(sum(masses) / len(masses), abs=1e-5)

    def test_bad_arguments_are_named(self, target):
        draft, samples = random_head(target), make_samples()
        with pytest.raises(ValueError, match="ttt_steps=0"):
            score_head(draft, target, samples, ttt_steps=0)
        with pytest.raises(ValueError, match=r"top_ks=\[1, 65\]"):
            score_head(draft, target, samples, top_ks=(1, 65))

    def test_markdown_report_has_a_row_per_step_and_the_costs(self, target):
        scores = score_head(random_head(target), target, make_samples(), ttt_steps=2, top_ks=(1, 4))
        table = markdown_report({"train": scores, "heldout": scores}, {1: 0.5, 4: 0.75})
        lines = table.splitlines()
        assert lines[0] == "| step k | train top-1 | train top-4 | heldout top-1 | heldout top-4 |"
        assert lines[2].startswith("| 0 | ") and lines[3].startswith("| 1 | ")
        assert "1 node 0.50 ms, 4 nodes 0.75 ms" in table
        assert "One sampled draft token accepted at temperature 1, steps 0 / 1 / 2: train " in table


def test_draft_forward_ms_times_each_node_count(target):
    timings = draft_forward_ms(random_head(target), node_counts=(1, 4, 8), context_length=32, repeats=3, warmup=1)
    assert list(timings) == [1, 4, 8] and all(ms > 0 for ms in timings.values())
    with pytest.raises(ValueError, match="node_counts"):
        draft_forward_ms(random_head(target), node_counts=(0,))


def test_heldout_records_follow_the_benchmarks_duplicate_filter():
    def record(i, prompt):
        turns = [{"from": "human", "value": prompt}, {"from": "gpt", "value": f"answer {i}"}]
        return {"id": f"r{i}", "conversations": turns}

    prompts = ["a", "b", "a ", "c", "c", "d", "e"]  # "a " repeats a training prompt, the second "c" the slice's
    records = heldout_sharegpt_records(2, start=2, source=[record(i, p) for i, p in enumerate(prompts)])
    assert [(r["id"], r["index"]) for r in records] == [("r3", 3), ("r5", 5)]
    assert records[0]["messages"] == [{"role": "user", "content": "c"}, {"role": "assistant", "content": "answer 3"}]


def test_benchmark_prompt_records_are_the_prompts_bench_decodes_without_answers():
    mt_bench = load_mt_bench(num_turns=1)
    records = benchmark_prompt_records("mt_bench", 3, start=8)
    assert [r["index"] for r in records] == [8, 9, 10]
    assert [r["id"] for r in records] == [f"mt_bench-{p.prompt_id}" for p in mt_bench[8:11]]
    assert [r["messages"] for r in records] == [[{"role": "user", "content": p.turns[0]}] for p in mt_bench[8:11]]
    both_turns = benchmark_prompt_records("mt_bench", 1, num_turns=2)[0]["messages"]
    assert [m["role"] for m in both_turns] == ["user", "user"]
    assert benchmark_prompt_records("mt_bench", 1, num_turns=None)[0]["messages"] == both_turns
    (humaneval,) = benchmark_prompt_records("humaneval", 1)
    assert humaneval["messages"] == [{"role": "user", "content": load_human_eval(1)[0].turns[0]}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("diagnose")
    tokenizer = make_chat_tokenizer()
    target = make_tiny_target(vocab_size=len(tokenizer), max_position_embeddings=512)
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    random_head(target).save_pretrained(root / "head")
    for name, count in (("train", 3), ("heldout", 4)):
        chats = [
            {
                "conversations": [
                    {"from": "human", "value": f"What is {i} plus {i}?"},
                    {"from": "gpt", "value": "x"},
                ]
            }
            for i in range(count)
        ]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(chat) + "\n" for chat in chats))
    return root


class TestCommand:
    def argv(self, root, *extra):
        return [
            f"--target={root / 'target'}",
            f"--head={root / 'head'}",
            f"--data={root / 'train.jsonl'}",
            f"--heldout-data={root / 'heldout.jsonl'}",
            "--heldout-offset=0",
            "--ttt-steps=2",
            "--top-k",
            "1",
            "2",
            "--forward-nodes",
            "1",
            "2",
            "--forward-context=8",
            "--forward-repeats=2",
            "--max-new-tokens=4",
            "--device=cpu",
            "--no_progress",
            *extra,
        ]

    def test_writes_the_report_and_reuses_a_regenerated_file_as_is(self, folders, tmp_path, capsys):
        output, kept = tmp_path / "report.json", tmp_path / "answers"
        assert diagnose_command.main(self.argv(folders, f"--output={output}", f"--regenerated-dir={kept}")) == 0
        report = json.loads(output.read_text())
        assert set(report) >= {"splits", "forward_ms", "environment", "seconds", "ttt_steps", "arguments"}
        assert list(report["forward_ms"]) == ["1", "2"]
        assert report["forward_dtype"] == "float32"  # "auto": the head's own here (conftest), else as timed
        for name, conversations in (("train", 3), ("heldout", 4)):
            split = report["splits"][name]
            assert split["conversations"] == conversations
            assert split["answers"].startswith("regenerated by the target")
            assert len(split["top1"]) == len(split["top2"]) == 2
            assert all(0 <= a <= b <= 1 for a, b in zip(split["top1"], split["top2"]))
        assert "| step k | train top-1 | train top-2 | heldout top-1 | heldout top-2 |" in capsys.readouterr().out
        # The regenerated file as --data: already the target's answers, scored as they are, to the same numbers.
        (regenerated,) = kept.glob("train-*.jsonl")
        again = tmp_path / "again.json"
        assert diagnose_command.main(self.argv(folders, f"--output={again}", f"--data={regenerated}")) == 0
        train = json.loads(again.read_text())["splits"]["train"]
        assert train["answers"].startswith("the target's own")
        assert train["top1"] == report["splits"]["train"]["top1"]

    def test_the_draft_forward_is_timed_in_the_dtype_generate_drafts_in(self, folders, tmp_path, capsys):
        output = tmp_path / "report.json"
        assert diagnose_command.main(self.argv(folders, "--draft-dtype=bfloat16", f"--output={output}")) == 0
        report = json.loads(output.read_text())
        assert report["forward_dtype"] == "bfloat16" and report["environment"]["dtype"] == "float32"
        assert report["forward_weights"] == "a bfloat16 copy of the head, stock weights"
        assert "Head timed in bfloat16: a bfloat16 copy" in capsys.readouterr().out

    def test_benchmark_prompts_as_the_heldout_side_are_answered_by_the_target(self, folders, tmp_path):
        output = tmp_path / "report.json"
        argv = self.argv(folders, "--heldout-data=mt_bench", "--heldout-limit=2", "--max-length=512")
        argv.remove("--heldout-offset=0")  # 0 is the default for a benchmark's prompts (17000 only for 'sharegpt')
        assert diagnose_command.main([*argv, "--overflow=truncate", f"--output={output}"]) == 0
        report = json.loads(output.read_text())
        heldout = report["splits"]["heldout"]
        assert heldout["source"] == "mt_bench from record 0"
        assert heldout["conversations"] == 2 and heldout["answers"].startswith("regenerated by the target")
        assert report["arguments"]["heldout_offset"] == 0

    @pytest.mark.parametrize(
        "flags, message",
        [
            (["--ttt-steps=0"], "--ttt-steps=0"),
            (["--eval-samples=2"], "--eval-samples=2"),
            (["--heldout-data=mt_bench", "--answers=given"], "come without answers"),
            (["--heldout-offset=-1"], "--heldout-offset=-1"),
            (["--draft-dtype=int8"], "--draft-dtype=int8: expected 'auto' or a floating dtype"),
            (["--max-length=0"], "--max-length=0 must be >= 1"),
            (["--data-offset=-1"], "--data-offset=-1 must be >= 0"),
            (["--heldout-data=mtbench"], "--heldout-data=mtbench: not a file, nor one of sharegpt, mt_bench"),
            (["--data=mt_bench"], "--data=mt_bench: not a file, nor one of sharegpt."),
        ],
    )
    def test_bad_flags_are_named_before_anything_loads(self, flags, message, capsys, monkeypatch):
        def never_loaded(*args, **kwargs):
            raise AssertionError("diagnose loaded the models before checking its flags")

        monkeypatch.setattr("eagle3_hf.loading.load_default_pair", never_loaded)
        with pytest.raises(SystemExit) as raised:
            diagnose_command.main(flags)
        assert raised.value.code == 2 and message in capsys.readouterr().err
