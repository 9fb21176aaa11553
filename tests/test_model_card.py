"""Model cards: rendering, metadata, idempotent updates that keep user edits, and the usage snippet."""

import re

import pytest
import torch
import transformers
from huggingface_hub import ModelCard

from eagle3_hf import Eagle3DraftModel
from eagle3_hf.checkpoints.model_card import EAGLE3_CITATION, create_or_update_model_card, write_model_card

from .conftest import make_tiny_target


TARGET_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SECTIONS = ("summary", "usage", "training", "results", "versions", "citation")
TRAINING = {
    "data": "ShareGPT (17,671 conversations)",
    "steps": 1200,
    "max_length": 2048,
    "ttt_steps": 7,
    "wall_time": 5400.0,
    "machine": "1x H200",
    "command": "eagle3-hf train --output-dir out",
}


def bench_row(
    dataset: str, method: str, tau: float | None, tokens_per_second: float, speedup: float, tree_rounds=None
) -> dict:
    """A row as `eagle3_hf.bench.measure.summarize` writes it."""
    return dict(
        dataset=dataset,
        temperature=0.0,
        method=method,
        tau=tau,
        tokens_per_second=tokens_per_second,
        speedup=speedup,
        tree_round_share=tree_rounds,
        greedy_mismatches=0,
        generations=8,
    )


RESULTS = {
    "machine": "x86_64 cpu, torch 2.13.0",
    "command": "eagle3-hf bench --head out --max-new-tokens 64",
    "rows": [
        bench_row("mt_bench", "plain", None, 15.04, 1.0),
        bench_row("mt_bench", "tree", 2.713, 24.96, 1.6596, tree_rounds=0.537),
        bench_row("mt_bench/coding", "tree", 3.1, 30.0, 2.0),
    ],
}


@pytest.fixture
def draft():
    target = make_tiny_target()
    target.name_or_path = TARGET_ID
    torch.manual_seed(1)
    return Eagle3DraftModel.from_target(target, draft_vocab_size=64)


def section(text: str, name: str) -> str:
    match = re.search(rf"<!-- eagle3_hf:begin {name} -->\n(.*?)<!-- eagle3_hf:end {name} -->", text, re.DOTALL)
    assert match is not None, f"section {name!r} missing"
    return match.group(1)


class TestCreate:
    def test_metadata_parses_with_huggingface_hub(self, draft, tmp_path):
        create_or_update_model_card(tmp_path, draft, dataset_names=["anon8231489123/ShareGPT_Vicuna_unfiltered"])
        data = ModelCard.load(tmp_path / "README.md").data
        assert data.library_name == "eagle3_hf"
        assert data.base_model == TARGET_ID
        assert data.pipeline_tag == "text-generation"
        assert data.license == "apache-2.0"
        assert data.datasets == ["anon8231489123/ShareGPT_Vicuna_unfiltered"]
        assert data.tags == sorted(data.tags)
        assert {"eagle3", "speculative-decoding"} <= set(data.tags)

    def test_body_has_every_section_and_the_facts(self, draft, tmp_path):
        card = create_or_update_model_card(tmp_path, draft, format="sglang", repo_id="me/smol-eagle3")
        text = card.text
        for name in SECTIONS:
            section(text, name)
        summary = section(text, "summary")
        assert "`[2, 4, 5]`" in summary and "64 of the target's 128 tokens" in summary
        n_params = sum(p.numel() for p in draft.parameters())
        assert f"{n_params / 1e6:.2f} M" in summary
        usage = section(text, "usage")
        assert f'target_id = "{TARGET_ID}"' in usage and 'draft_id = "me/smol-eagle3"' in usage
        assert "assistant_model=draft" in usage
        assert f"vllm serve {TARGET_ID}" in usage and '"method": "eagle3", "model": "me/smol-eagle3"' in usage
        assert "--speculative-algorithm EAGLE3 --speculative-draft-model-path me/smol-eagle3" in usage
        assert f"- transformers: {transformers.__version__}" in section(text, "versions")
        assert EAGLE3_CITATION in section(text, "citation") and "2503.01840" in EAGLE3_CITATION
        assert "<!-- eagle3_hf:empty -->" in section(text, "training")
        assert "<!-- eagle3_hf:empty -->" in section(text, "results")

    def test_local_target_path_is_not_base_model_metadata(self, draft, tmp_path):
        # A path is invalid `base_model` metadata on the Hub; the card names it in the text only.
        draft.config.target_model_name_or_path = str(tmp_path)
        card = create_or_update_model_card(tmp_path / "head", draft)
        assert card.data.base_model is None
        assert f"`{tmp_path}`" in section(card.text, "summary")

    def test_unrecorded_target(self, draft, tmp_path):
        draft.config.target_model_name_or_path = None
        card = create_or_update_model_card(tmp_path, draft)
        assert card.data.base_model is None
        assert "not recorded: set `config.target_model_name_or_path`" in section(card.text, "summary")
        assert 'target_id = "<target-model-id>"' in section(card.text, "usage")

    def test_training_and_results_tables(self, draft, tmp_path):
        card = create_or_update_model_card(tmp_path, draft, training=TRAINING, results=RESULTS)
        training = section(card.text, "training")
        assert "| Optimizer steps | 1,200 |" in training and "| Training-time-test steps | 7 |" in training
        assert "| Wall time | 5,400 s (1.50 h) |" in training and "eagle3-hf train --output-dir out" in training
        results = section(card.text, "results")
        assert "Measured on x86_64 cpu, torch 2.13.0 with:" in results and RESULTS["command"] in results
        assert "| mt_bench | 0 | tree | 2.71 | 25.0 | 1.66× | 54% | 0 | 8 |" in results
        assert "| mt_bench | 0 | plain | – | 15.0 | 1.00× | – | 0 | 8 |" in results
        assert "coding" not in results  # per-category rows stay in the benchmark's own report
        with_interval = {**RESULTS, "rows": [{**RESULTS["rows"][1], "speedup_interval": [1.581, 1.742]}]}
        card = create_or_update_model_card(tmp_path, draft, results=with_interval)
        assert "| mt_bench | 0 | tree | 2.71 | 25.0 | 1.66× (1.58–1.74) | 54% | 0 | 8 |" in section(
            card.text, "results"
        )

    @pytest.mark.parametrize("missing", ["machine", "command"])
    def test_results_need_their_machine_and_command(self, draft, tmp_path, missing):
        with pytest.raises(ValueError, match=missing):
            create_or_update_model_card(tmp_path, draft, results={**RESULTS, missing: ""})

    def test_results_rows_are_checked(self, draft, tmp_path):
        with pytest.raises(ValueError, match=r"results\[1\]\['rows'\]\[0\] needs 'dataset' and 'method'"):
            create_or_update_model_card(tmp_path, draft, results=[RESULTS, {**RESULTS, "rows": [{"tau": 2.0}]}])
        with pytest.raises(ValueError, match="rows"):
            create_or_update_model_card(tmp_path, draft, results={**RESULTS, "rows": []})

    def test_unknown_format_is_rejected(self, draft, tmp_path):
        with pytest.raises(ValueError, match="format='gguf'"):
            create_or_update_model_card(tmp_path, draft, format="gguf")

    def test_config_is_read_from_the_folder(self, draft, tmp_path):
        draft.save_pretrained(tmp_path)
        card = create_or_update_model_card(tmp_path)
        assert card.data.base_model == TARGET_ID and "64 of the target's 128 tokens" in card.text

    @pytest.mark.parametrize("dialect", ["sglang", "speculators", "eagle"])
    def test_format_and_config_are_detected_from_the_folder(self, draft, tmp_path, dialect):
        from eagle3_hf.checkpoints.writing import save_in_dialect

        save_in_dialect(draft, tmp_path / "head", dialect)
        card = create_or_update_model_card(tmp_path / "head")  # neither the model nor the format given
        assert card.data.base_model == TARGET_ID
        assert "`[2, 4, 5]`" in section(card.text, "summary")
        assert ("sglang.launch_server" in section(card.text, "usage")) == (dialect == "sglang")
        assert ("vllm" in card.data.tags) == (dialect == "speculators")

    def test_folder_without_config_needs_the_model(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="config.json"):
            create_or_update_model_card(tmp_path)


class TestUpdate:
    def test_twice_gives_identical_bytes(self, draft, tmp_path):
        kwargs = dict(training=TRAINING, results=RESULTS, dataset_names=["a/b"], format="speculators", repo_id="me/x")
        create_or_update_model_card(tmp_path, draft, **kwargs)
        first = (tmp_path / "README.md").read_bytes()
        create_or_update_model_card(tmp_path, draft, **kwargs)
        assert (tmp_path / "README.md").read_bytes() == first
        create_or_update_model_card(tmp_path, draft, format="speculators", repo_id="me/x")  # kept sections
        assert (tmp_path / "README.md").read_bytes() == first

    def test_user_text_and_metadata_outside_the_markers_are_kept(self, draft, tmp_path):
        create_or_update_model_card(tmp_path, draft)
        readme = tmp_path / "README.md"
        text = readme.read_text()
        text = text.replace("license: apache-2.0", "language: en\nlicense: mit")
        text = text.replace("- eagle3\n", "- eagle3\n- my-tag\n")
        text = text.replace(
            "<!-- eagle3_hf:begin usage -->", "## My notes\n\nTrained on my laptop.\n\n<!-- eagle3_hf:begin usage -->"
        )
        text += "\n## Acknowledgements\n\nThanks!\n"
        # A user edit *inside* a generated section is regenerated.
        text = text.replace("## Usage", "## Usage (edited)")
        readme.write_text(text)

        card = create_or_update_model_card(tmp_path, draft, training=TRAINING, results=RESULTS)
        updated = readme.read_text()
        assert "## My notes\n\nTrained on my laptop.\n\n<!-- eagle3_hf:begin usage -->" in updated
        assert updated.endswith("## Acknowledgements\n\nThanks!\n")
        assert "## Usage (edited)" not in updated and "## Usage\n" in updated
        assert "| Optimizer steps | 1,200 |" in section(updated, "training")
        assert card.data.language == "en" and card.data.license == "mit"
        assert "my-tag" in card.data.tags and card.data.tags == sorted(card.data.tags)
        assert ModelCard.load(readme).data.to_dict() == card.data.to_dict()

    def test_explicit_license_overrides_the_cards(self, draft, tmp_path):
        create_or_update_model_card(tmp_path, draft)
        assert create_or_update_model_card(tmp_path, draft, license="mit").data.license == "mit"
        assert create_or_update_model_card(tmp_path, draft).data.license == "mit"

    def test_a_section_without_data_keeps_the_one_with_data(self, draft, tmp_path):
        create_or_update_model_card(tmp_path, draft, results=RESULTS)
        kept = section(create_or_update_model_card(tmp_path, draft, training=TRAINING).text, "results")
        assert "| mt_bench | 0 | tree | 2.71 |" in kept
        newer = {**RESULTS, "rows": [{**RESULTS["rows"][1], "tau": 3.5}]}
        replaced = section(create_or_update_model_card(tmp_path, draft, results=newer).text, "results")
        assert "| mt_bench | 0 | tree | 3.50 |" in replaced and "2.71" not in replaced

    def test_format_change_rewrites_usage_and_format_tags(self, draft, tmp_path):
        card = create_or_update_model_card(tmp_path, draft, format="speculators", repo_id="me/x")
        assert {"speculators", "vllm"} <= set(card.data.tags)
        assert "`vllm serve me/x` alone also works" in section(card.text, "usage")
        card = create_or_update_model_card(tmp_path, draft, format="eagle3_hf", repo_id="me/x")
        assert not {"speculators", "vllm", "sglang"} & set(card.data.tags)
        usage = section(card.text, "usage")
        assert "vllm serve" not in usage and "sglang.launch_server" not in usage and "--format sglang" in usage

    def test_a_card_without_markers_gets_the_sections_appended(self, draft, tmp_path):
        (tmp_path / "README.md").write_text(
            "---\nlibrary_name: transformers\ntags: []\n---\n\n# Model Card\n\nMine.\n"
        )
        card = create_or_update_model_card(tmp_path, draft)
        assert card.text.startswith("\n# Model Card\n\nMine.\n\n<!-- eagle3_hf:begin summary -->")
        assert card.data.library_name == "eagle3_hf"
        for name in SECTIONS:
            section(card.text, name)


class TestWriteModelCard:
    def test_main_process_writes_the_card(self, draft, tmp_path):
        assert write_model_card(tmp_path, draft, results=RESULTS) == tmp_path / "README.md"
        assert "2.71" in (tmp_path / "README.md").read_text()

    def test_other_processes_write_nothing(self, draft, tmp_path):
        assert write_model_card(tmp_path, draft, is_main_process=False) is None
        assert not (tmp_path / "README.md").exists()


def make_tiny_tokenizer():
    """A 128-token word-level tokenizer with a chat template, matching `make_tiny_target`'s vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<pad>", "<s>", "</s>", *"Explain speculative decoding in one sentence .".split()]
    words += [f"w{i}" for i in range(128 - len(words))]
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        chat_template="{% for m in messages %}<s> {{ m['content'] }} {% endfor %}",
    )


@pytest.mark.slow
def test_usage_snippet_runs_and_matches_greedy(tmp_path):
    target = make_tiny_target()
    target.save_pretrained(tmp_path / "target")
    make_tiny_tokenizer().save_pretrained(tmp_path / "target")
    torch.manual_seed(1)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64)
    draft.config.target_model_name_or_path = str(tmp_path / "target")
    draft.save_pretrained(tmp_path / "head")
    card = create_or_update_model_card(tmp_path / "head", draft)

    snippet = re.search(r"```python\n(.*?)```", section(card.text, "usage"), re.DOTALL).group(1)
    assert "max_new_tokens=64" in snippet
    snippet = snippet.replace("max_new_tokens=64", "max_new_tokens=8")  # the same code, a CPU-test budget
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)  # the card's own code, with local ids
    expected = namespace["target"].generate(**namespace["inputs"], do_sample=False, max_new_tokens=8)
    assert torch.equal(namespace["output"], expected)
