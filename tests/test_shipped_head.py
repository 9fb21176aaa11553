"""The head shipped in model_cards/ (the demo's and benchmark's default) and the real-model commands."""

import json

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModel

from eagle3_hf import Eagle3DraftModel
from eagle3_hf.loading import DEFAULT_HEAD_DIR


def test_shipped_head_loads_with_from_pretrained_and_auto_model():
    head = Eagle3DraftModel.from_pretrained(DEFAULT_HEAD_DIR)
    auto = AutoModel.from_pretrained(DEFAULT_HEAD_DIR)
    assert type(auto) is Eagle3DraftModel
    assert head.config.target_model_name_or_path == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert head.config.target_layer_ids == [2, 15, 27] and head.config.vocab_size == 49152
    for name, tensor in head.state_dict().items():
        assert torch.equal(tensor, auto.state_dict()[name]), name
    assert (DEFAULT_HEAD_DIR / "model.safetensors").stat().st_size <= 64 * 2**20


def test_shipped_card_metadata_parses():
    data = ModelCard.load(DEFAULT_HEAD_DIR / "README.md").data
    assert data.library_name == "eagle3_hf"
    assert data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert {"eagle3", "speculative-decoding"} <= set(data.tags)
    text = (DEFAULT_HEAD_DIR / "README.md").read_text()
    assert 'draft_id = "model_cards/eagle3-SmolLM2-135M-Instruct"' in text  # no path of the machine that wrote it
    assert "/work/" not in text and "/tmp/" not in text
    results = json.loads((DEFAULT_HEAD_DIR / "benchmark" / "results.json").read_text())
    assert all(row["greedy_mismatches"] == 0 for row in results["rows"])


@pytest.mark.real_model
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "no-stream"])
def test_demo_command_runs(capsys, stream):
    from eagle3_hf.bench.measure import encode_chat
    from eagle3_hf.commands.demo import main
    from eagle3_hf.loading import load_target

    assert main(["--prompts", "Say hello.", "--max-new-tokens", "12"] + ([] if stream else ["--no-stream"])) == 0
    out = capsys.readouterr().out
    assert "tau" in out and "speedup" in out and "greedy outputs identical" in out
    # the answer is printed once either way (streamed as it is drafted, or decoded at the end): plain greedy's text
    target, tokenizer = load_target()  # the demo's target; plain greedy needs no head
    input_ids = encode_chat(tokenizer, [{"role": "user", "content": "Say hello."}], target.device)
    plain = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=12)
    answer = tokenizer.decode(plain[0, input_ids.shape[1] :], skip_special_tokens=True)
    printed = out.split(">>> Say hello.\n\n", 1)[1].split("[chosen:", 1)[0]
    assert printed.strip() == answer.strip() and out.count(answer.strip()) == 1
    from eagle3_hf.generation.cpu_packing import packing_available

    # --pack-weights auto on a float32 CPU target: generate packs where it measures that packing pays
    decided = "weights: packed weights" in out or "measured packing no faster" in out
    assert decided == packing_available()


@pytest.mark.real_model
def test_bench_command_quick_run(tmp_path):
    from eagle3_hf.commands.bench import main

    code = main(
        [
            "--datasets",
            "mt_bench",
            "sharegpt",
            "--limit",
            "1",
            "--turns",
            "1",
            "--temperatures",
            "0",
            "--max-new-tokens",
            "12",
            "--output-dir",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert code == 0
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {row["method"] for row in rows} == {"plain", "prompt_lookup", "chain", "tree", "tree_lookup", "adaptive"}
    assert (tmp_path / "results.md").is_file() and (tmp_path / "speedup.png").is_file()
