"""scripts/device_check.py --smoke: the GPU check's code runs end to end on CPU with tiny shapes and reports."""

import json
import os
import subprocess
import sys
from pathlib import Path

from eagle3_hf.cpu_features import cpu_model, describe_cpu_features


REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "device_check.py"


def test_smoke_run_reports_identical_greedy_and_every_measurement(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--output-dir", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads((tmp_path / "device_check.json").read_text())
    markdown = (tmp_path / "device_check.md").read_text()
    assert markdown.startswith("# EAGLE-3 device check")
    assert report["errors"] == []
    assert report["meta"]["mode"] == "smoke"
    assert report["meta"]["device_name"] == f"{cpu_model()} ({describe_cpu_features()})"  # e.g. "AMD EPYC (AVX2)"

    correctness = report["correctness"]
    assert set(correctness["architectures"]) == {"llama", "qwen3", "mistral-sliding", "gemma3-sliding"}
    for name, arch in correctness["architectures"].items():
        assert arch["prompts"] >= 1, name
        assert arch["fp32_tree_identical"] == arch["prompts"], name
        assert arch["fp32_adaptive_identical"] == arch["prompts"], name
        assert arch["fp32_chain_identical"] == arch["prompts"], name
        assert arch["fp32_tree_tau_mean"] > 1.0, name  # the steered head gets tokens accepted
        for key in ("bf16_plain_batch2_divergence_rate", "bf16_tree_divergence_rate", "bf16_chain_divergence_rate"):
            assert 0.0 <= arch[key] <= 1.0, (name, key)
        assert {run["variant"] for run in arch["cases"]["sampling"]} == {
            "tree_sampled_draft",
            "tree_topk_draft",
            "chain",
        }
        assert arch["sampling_ok"], (name, arch["cases"]["sampling"])
    assert correctness["fp32_greedy_identical"] and correctness["sampling_ok"]

    speed = report["speed"]
    assert speed["head"]["layers"] == 1
    assert speed["target_follows_its_permutation"] == 1.0  # the greedy continuation the drafter knows is stable
    assert speed["plain_generate"]["tokens_per_s"] > 0 and speed["plain_step_ms"] > 0
    without_cudnn = speed["plain_generate_without_cudnn_sdpa"]
    assert without_cudnn["identical_to_plain"] and len(without_cudnn["seconds_runs"]) == 1
    assert "without cuDNN" in markdown
    assert {int(n) for n in speed["verify_tree_ms_by_nodes"]} == {1, 2, 4, 8, 16, 24, 32, 48, 60, 64}
    assert set(speed["draft_grow_ms_by_depth"]) == {str(d) for d in range(1, 7)}
    assert set(speed["draft_update_ms_by_tokens"]) == {"1", "4", "7"}
    assert "draft_level_ms" in speed and "oracle_overhead_ms_per_grow" in speed
    attention = speed["sdpa_new_shapes"]  # the per-shape cost of each SDPA backend choice, one call at a time
    for variant in ("tree_query_new_length_default", "tree_query_new_length_eagle3", "one_row_new_length_default"):
        assert attention[f"{variant}_ms"]["repeats"] == 2 and attention[f"{variant}_ms"]["median_ms"] > 0, variant
    methods = ("tree", "adaptive", "chain")
    expected = {f"{method}_alpha{alpha}" for method in methods for alpha in (0.6, 0.8)} | {"tree_cudnn_alpha0.8"}
    assert set(speed["e2e"]) == expected
    for key, entry in speed["e2e"].items():
        assert entry["identical_to_plain"], key
        assert entry["tokens_per_s"] > 0 and entry["speedup_vs_plain"] > 0 and entry["tau_measured"] >= 1.0, key
        if not key.startswith("chain"):  # the tree loop's own phase clock
            assert {"draft", "verify", "update", "other"} <= set(entry["phase_share"]), key
    assert speed["e2e"]["tree_alpha0.8"]["tau_expected"] > speed["e2e"]["tree_alpha0.6"]["tau_expected"]
    assert "not_target_forward_share" in speed["round_breakdown_alpha0.8"]
    # host syncs are counted only on CUDA
    assert speed["syncs_per_round"] == {"plain_per_step": None, "tree_per_round": None, "chain_per_round": None}
