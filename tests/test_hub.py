"""The Hub workflow: the exact upload folder per format, `push_to_hub` against a mocked `HfApi`, `eagle3-hf push`."""

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch
from huggingface_hub import ModelCard
from huggingface_hub.constants import is_offline_mode

from eagle3_hf import Eagle3DraftModel
from eagle3_hf.checkpoints.hub import FORMATS, STALE_FILE_PATTERNS, prepare_upload_folder, push_to_hub
from eagle3_hf.checkpoints.model_card import create_or_update_model_card
from eagle3_hf.checkpoints.writing import save_in_dialect
from eagle3_hf.cli import main as cli_main
from eagle3_hf.commands import push as push_command

from .conftest import make_tiny_target
from .test_model_card import RESULTS, TRAINING, section


TARGET_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
UPLOAD_FILES = ["README.md", "config.json", "model.safetensors"]
ARCHITECTURES = {
    "eagle3_hf": ["Eagle3DraftModel"],
    "sglang": ["LlamaForCausalLMEagle3"],
    "speculators": ["Eagle3Speculator"],
    "eagle": ["LlamaForCausalLM"],
}


@pytest.fixture
def target():
    model = make_tiny_target()
    model.name_or_path = TARGET_ID
    return model


@pytest.fixture
def draft(target):
    torch.manual_seed(1)
    return Eagle3DraftModel.from_target(target, draft_vocab_size=64)


@pytest.fixture
def head_folder(draft, tmp_path):
    """A native checkpoint folder whose card has a training record and a user's own section."""
    folder = save_in_dialect(draft, tmp_path / "head", "eagle3_hf")
    create_or_update_model_card(folder, draft, training=TRAINING)
    readme = folder / "README.md"
    readme.write_text(readme.read_text() + "\n## Notes\n\nMy own words.\n")
    return folder


def assert_same_head(loaded: Eagle3DraftModel, draft: Eagle3DraftModel) -> None:
    expected, actual = draft.state_dict(), loaded.state_dict()
    assert actual.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(actual[key], tensor), key
    for field in ("target_layer_ids", "draft_vocab_size", "target_hidden_size", "target_model_name_or_path"):
        assert getattr(loaded.config, field) == getattr(draft.config, field), field


class FakeHub:
    """`HfApi` stand-in: records calls and keeps a copy of each uploaded folder (the real one is a temp dir)."""

    def __init__(self, remote_card: str | None = None):
        self.api = MagicMock(name="HfApi()")
        self.api_class = MagicMock(name="HfApi", return_value=self.api)
        self.api.create_repo.return_value = SimpleNamespace(repo_id="me/smol-eagle3")
        self.api.file_exists.return_value = remote_card is not None
        self.api.hf_hub_download.side_effect = lambda repo_id, filename, **kw: self._download(remote_card, **kw)
        self.api.upload_folder.side_effect = self._upload
        self.uploaded: dict[str, bytes] = {}

    @staticmethod
    def _download(text: str, local_dir: Path, **kwargs) -> str:
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        (Path(local_dir) / "README.md").write_text(text)
        return str(Path(local_dir) / "README.md")

    def _upload(self, folder_path: Path, **kwargs):
        folder = Path(folder_path)
        self.uploaded = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        return SimpleNamespace(commit_url="https://huggingface.co/me/smol-eagle3/commit/0123abc")

    def materialize(self, folder: Path) -> Path:
        folder.mkdir(parents=True)
        for name, content in self.uploaded.items():
            (folder / name).write_bytes(content)
        return folder


@pytest.fixture
def fake_hub(monkeypatch):
    hub = FakeHub()
    monkeypatch.setattr("eagle3_hf.checkpoints.hub.HfApi", hub.api_class)
    return hub


class TestPrepareUploadFolder:
    @pytest.mark.parametrize("format", FORMATS)
    def test_exact_file_set_loads_back(self, draft, tmp_path, format):
        files = prepare_upload_folder(draft, tmp_path / "upload", format, repo_id="me/smol-eagle3")
        assert files == UPLOAD_FILES
        config = json.loads((tmp_path / "upload" / "config.json").read_text())
        assert config["architectures"] == ARCHITECTURES[format]
        assert_same_head(Eagle3DraftModel.from_pretrained(tmp_path / "upload"), draft)
        card = ModelCard.load(tmp_path / "upload" / "README.md")
        assert card.data.library_name == "eagle3_hf" and card.data.base_model == TARGET_ID
        assert "me/smol-eagle3" in section(card.text, "usage")

    @pytest.mark.parametrize("format", FORMATS)
    def test_loads_back_by_hub_id_from_the_hub_cache(self, draft, target, tmp_path, format):
        # The uploaded file set, laid out as huggingface_hub caches a download, loads by repo id (offline).
        repo_id, commit = f"me/smol-eagle3-{format}", "0" * 40
        repo_cache = tmp_path / "cache" / f"models--{repo_id.replace('/', '--')}"
        prepare_upload_folder(draft, repo_cache / "snapshots" / commit, format, target=target)
        (repo_cache / "refs").mkdir()
        (repo_cache / "refs" / "main").write_text(commit)
        assert_same_head(Eagle3DraftModel.from_pretrained(repo_id, cache_dir=tmp_path / "cache"), draft)

    def test_folder_source_keeps_its_card_history(self, draft, head_folder, tmp_path):
        files = prepare_upload_folder(head_folder, tmp_path / "upload", "sglang", repo_id="me/smol-eagle3")
        assert files == UPLOAD_FILES
        text = (tmp_path / "upload" / "README.md").read_text()
        assert text.endswith("## Notes\n\nMy own words.\n")
        assert "| Optimizer steps | 1,200 |" in section(text, "training")
        assert "--speculative-draft-model-path me/smol-eagle3" in section(text, "usage")
        assert_same_head(Eagle3DraftModel.from_pretrained(tmp_path / "upload"), draft)

    def test_speculators_needs_the_targets_embedding(self, draft, head_folder, target, tmp_path):
        with pytest.raises(ValueError, match="embed_tokens"):
            prepare_upload_folder(head_folder, tmp_path / "refused", "speculators")
        assert not (tmp_path / "refused").exists()
        files = prepare_upload_folder(head_folder, tmp_path / "upload", "speculators", target=target)
        assert files == UPLOAD_FILES
        loaded = Eagle3DraftModel.from_pretrained(tmp_path / "upload")
        assert torch.equal(loaded.get_input_embeddings().weight, target.get_input_embeddings().weight)
        assert_same_head(loaded, draft)

    def test_base_card_text_and_metadata_are_kept(self, draft, tmp_path):
        base = tmp_path / "hub_README.md"
        base.write_text("---\nlanguage: en\nlicense: mit\n---\n\n# Our head\n\nWritten on the Hub.\n")
        prepare_upload_folder(draft, tmp_path / "upload", "sglang", base_card=base, results=RESULTS)
        card = ModelCard.load(tmp_path / "upload" / "README.md")
        assert card.text.startswith("\n# Our head\n\nWritten on the Hub.\n\n<!-- eagle3_hf:begin summary -->")
        assert card.data.language == "en" and card.data.license == "mit" and "sglang" in card.data.tags
        assert "| mt_bench | 0 | tree | 2.71 |" in section(card.text, "results")
        prepare_upload_folder(draft, tmp_path / "upload2", "sglang", base_card=base, license="cc-by-4.0")
        assert ModelCard.load(tmp_path / "upload2" / "README.md").data.license == "cc-by-4.0"

    def test_refuses_a_non_empty_folder_an_unknown_format_and_a_non_head(self, draft, tmp_path):
        (tmp_path / "busy").mkdir()
        (tmp_path / "busy" / "file.txt").write_text("x")
        with pytest.raises(FileExistsError, match="busy"):
            prepare_upload_folder(draft, tmp_path / "busy")
        with pytest.raises(ValueError, match="format='gguf'"):
            prepare_upload_folder(draft, tmp_path / "upload", "gguf")
        with pytest.raises(ValueError, match="model_or_folder"):
            prepare_upload_folder(tmp_path / "missing", tmp_path / "upload")


class TestPushToHub:
    def test_calls_and_uploaded_files(self, draft, fake_hub, tmp_path):
        commit = push_to_hub(draft, "smol-eagle3", private=True, token="hf_test", results=RESULTS)
        assert commit.commit_url.endswith("0123abc")
        fake_hub.api_class.assert_called_once_with(token="hf_test")
        fake_hub.api.create_repo.assert_called_once_with("smol-eagle3", private=True, exist_ok=True, repo_type="model")
        fake_hub.api.create_branch.assert_not_called()
        # The repo id the Hub resolved (with the namespace) is used from then on.
        fake_hub.api.file_exists.assert_called_once_with(
            "me/smol-eagle3", "README.md", repo_type="model", revision=None
        )
        fake_hub.api.hf_hub_download.assert_not_called()
        kwargs = fake_hub.api.upload_folder.call_args.kwargs
        assert {key: value for key, value in kwargs.items() if key != "folder_path"} == dict(
            repo_id="me/smol-eagle3",
            repo_type="model",
            commit_message="Upload EAGLE-3 draft head (sglang format)",
            commit_description=None,
            revision=None,
            create_pr=False,
            delete_patterns=STALE_FILE_PATTERNS,
        )
        assert sorted(fake_hub.uploaded) == UPLOAD_FILES
        folder = fake_hub.materialize(tmp_path / "downloaded")
        assert_same_head(Eagle3DraftModel.from_pretrained(folder), draft)
        text = (folder / "README.md").read_text()
        assert 'draft_id = "me/smol-eagle3"' in section(text, "usage") and "2.71" in section(text, "results")

    def test_the_card_on_the_hub_is_updated_not_replaced(self, draft, monkeypatch):
        remote = "---\nlanguage: en\ntags:\n- mine\n---\n\n# Hub card\n\nEdited on the Hub.\n"
        hub = FakeHub(remote_card=remote)
        monkeypatch.setattr("eagle3_hf.checkpoints.hub.HfApi", hub.api_class)
        push_to_hub(draft, "me/smol-eagle3", format="speculators", revision="dev", commit_message="v2")
        hub.api.create_branch.assert_called_once_with("me/smol-eagle3", branch="dev", exist_ok=True, repo_type="model")
        assert hub.api.hf_hub_download.call_args.kwargs["revision"] == "dev"
        assert hub.api.upload_folder.call_args.kwargs["revision"] == "dev"
        assert hub.api.upload_folder.call_args.kwargs["commit_message"] == "v2"
        card = ModelCard(hub.uploaded["README.md"].decode())
        assert card.text.startswith("\n# Hub card\n\nEdited on the Hub.\n")
        assert card.data.language == "en" and {"mine", "speculators", "vllm"} <= set(card.data.tags)

    def test_bad_format_fails_before_any_hub_call(self, draft, fake_hub):
        with pytest.raises(ValueError, match="format='gguf'"):
            push_to_hub(draft, "me/smol-eagle3", format="gguf")
        fake_hub.api_class.assert_not_called()

    def test_a_refused_export_creates_no_repo_or_branch(self, draft, fake_hub):
        draft.set_input_embeddings(None)  # the speculators format ships the embedding
        with pytest.raises(ValueError, match="embed_tokens"):
            push_to_hub(draft, "me/smol-eagle3", format="speculators", revision="v1")
        fake_hub.api.create_repo.assert_not_called()
        fake_hub.api.create_branch.assert_not_called()
        fake_hub.api.upload_folder.assert_not_called()

    def test_the_model_method_uploads_our_card(self, draft, fake_hub, monkeypatch):
        # Transformers' own push (a generic card, overwriting ours) must not run, nor reach the network.
        refuse = MagicMock(side_effect=AssertionError("transformers' generic push_to_hub was used"))
        monkeypatch.setattr("transformers.utils.hub.hf_api", refuse)
        draft.push_to_hub("me/smol-eagle3", commit_message="from the model")
        assert sorted(fake_hub.uploaded) == UPLOAD_FILES
        card = ModelCard(fake_hub.uploaded["README.md"].decode())
        assert card.data.library_name == "eagle3_hf" and "me/smol-eagle3" in section(card.text, "usage")

    def test_real_upload_round_trip(self, draft):
        repo_id = os.environ.get("EAGLE3_HF_TEST_HUB_REPO")
        if is_offline_mode():
            pytest.skip("real Hub upload: HF_HUB_OFFLINE=1 is set (the test suite runs offline)")
        if not repo_id:
            pytest.skip("real Hub upload: set EAGLE3_HF_TEST_HUB_REPO=<user>/<scratch repo> and log in to run it")
        push_to_hub(draft, repo_id, format="sglang", commit_message="eagle3_hf test upload")
        assert_same_head(Eagle3DraftModel.from_pretrained(repo_id, force_download=True), draft)


class TestPushCommand:
    def test_dry_run_prints_the_files_and_the_card(self, head_folder, capsys, monkeypatch):
        monkeypatch.setattr(
            "eagle3_hf.checkpoints.hub.HfApi", MagicMock(side_effect=AssertionError("a dry run calls no Hub API"))
        )
        assert cli_main(["push", str(head_folder), "me/smol-eagle3", "--dry-run", "--format", "eagle"]) == 0
        out = capsys.readouterr().out
        assert "would upload 3 files to https://huggingface.co/me/smol-eagle3 (eagle):" in out
        listed = re.findall(r"^  (\S+)  \(\d+(?:\.\d)? [KMG]?B\)$", out, re.MULTILINE)
        assert listed == UPLOAD_FILES
        card = out.split("--- README.md ---\n", 1)[1]
        assert ModelCard(card).data.base_model == TARGET_ID
        assert "vllm serve" in section(card, "usage") and "sglang.launch_server" not in section(card, "usage")
        assert card.endswith("## Notes\n\nMy own words.\n")

    def test_push_passes_the_options_through(self, head_folder, fake_hub, tmp_path, capsys):
        results = tmp_path / "results.json"
        results.write_text(json.dumps(RESULTS))
        argv = [str(head_folder), "smol-eagle3", "--private", "--commit-message", "m", "--results", str(results)]
        assert push_command.main(argv) == 0
        assert "Uploaded to https://huggingface.co/me/smol-eagle3/commit/0123abc" in capsys.readouterr().out
        fake_hub.api.create_repo.assert_called_once_with("smol-eagle3", private=True, exist_ok=True, repo_type="model")
        assert fake_hub.api.upload_folder.call_args.kwargs["commit_message"] == "m"
        assert "2.71" in section(fake_hub.uploaded["README.md"].decode(), "results")

    def test_push_opens_a_pull_request_on_a_branch_with_the_card_options(self, head_folder, fake_hub, tmp_path):
        training = tmp_path / "training.json"
        training.write_text(json.dumps({"Optimizer steps": "9,999"}))
        argv = [str(head_folder), "me/smol-eagle3", "--revision", "dev", "--create-pr", "--training", str(training)]
        argv += ["--dataset", "my-org/chats", "--license", "mit"]
        assert push_command.main(argv) == 0
        fake_hub.api.create_branch.assert_called_once_with(
            "me/smol-eagle3", branch="dev", exist_ok=True, repo_type="model"
        )
        upload = fake_hub.api.upload_folder.call_args.kwargs
        assert upload["revision"] == "dev" and upload["create_pr"] is True
        card = ModelCard(fake_hub.uploaded["README.md"].decode())
        assert card.data.license == "mit" and card.data.datasets == ["my-org/chats"]
        assert "9,999" in section(card.text, "training")

    def test_unreadable_json_is_reported(self, head_folder, tmp_path):
        (tmp_path / "bad.json").write_text("{")
        with pytest.raises(SystemExit, match="--results"):
            push_command.main([str(head_folder), "me/x", "--dry-run", "--results", str(tmp_path / "bad.json")])
        (tmp_path / "list.json").write_text("[1, 2]")
        with pytest.raises(SystemExit, match=r"--training .*list.json: expected a JSON object, found a list"):
            push_command.main([str(head_folder), "me/x", "--dry-run", "--training", str(tmp_path / "list.json")])

    def test_an_invalid_repo_id_is_refused_even_in_a_dry_run(self, head_folder, capsys):
        with pytest.raises(SystemExit):
            push_command.main([str(head_folder), "not a/valid id!!", "--dry-run"])
        assert "repo_id 'not a/valid id!!': Repo id must use alphanumeric chars" in capsys.readouterr().err

    def test_a_folder_that_is_no_checkpoint_is_named_without_a_traceback(self, tmp_path):
        (tmp_path / "empty").mkdir()
        with pytest.raises(SystemExit, match=r"eagle3-hf push: .*empty.*config.json"):
            push_command.main([str(tmp_path / "empty"), "me/x", "--dry-run"])
