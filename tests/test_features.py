import json
import re

import pytest
import torch

from eagle3_hf.training import features as features_module
from eagle3_hf.training.data import DataCollatorForEagle3
from eagle3_hf.training.features import (
    MANIFEST_FILE,
    CachedFeatureDataset,
    FeatureCache,
    FeatureCacheIncompleteError,
    build_feature_cache,
    online_target_outputs,
    plan_feature_cache,
    target_logits_from_final_hidden,
)
from eagle3_hf.training.trainer import Eagle3Trainer

from .conftest import make_tiny_target
from .test_trainer import make_args, make_dataset, make_draft, make_sharp_target


LAYERS = [2, 4, 5]
LENGTHS = (12, 9, 16, 7, 10)


def build(target, dataset, cache_dir, **kwargs):
    return build_feature_cache(
        target, dataset, cache_dir, LAYERS, **{"dtype": "float32", "samples_per_shard": 2, "verbose": False, **kwargs}
    )


class TestOnlineOutputs:
    def test_features_logits_and_final_hidden(self, tiny_target):
        ids = torch.randint(0, 128, (2, 6))
        out = online_target_outputs(tiny_target, ids, torch.ones(2, 6), LAYERS, with_final_hidden=True)
        full = tiny_target(ids, output_hidden_states=True)
        torch.testing.assert_close(out.features, torch.cat([full.hidden_states[i] for i in LAYERS], -1))
        torch.testing.assert_close(out.logits, full.logits.float())
        torch.testing.assert_close(out.final_hidden_states, full.hidden_states[-1])  # post-norm
        torch.testing.assert_close(target_logits_from_final_hidden(tiny_target, out.final_hidden_states), out.logits)
        assert online_target_outputs(tiny_target, ids, None, LAYERS).final_hidden_states is None


class TestFeatureCache:
    def test_round_trip_equals_online_features(self, tiny_target, tmp_path, capsys):
        dataset = make_dataset(LENGTHS)
        cache = build_feature_cache(tiny_target, dataset, tmp_path, LAYERS, dtype="float32", samples_per_shard=2)
        printed = capsys.readouterr().out
        assert f"{len(LENGTHS)} samples, {sum(LENGTHS)} tokens, 3 shard(s)" in printed and "GiB" in printed
        assert len(cache) == len(LENGTHS)
        for i, length in enumerate(LENGTHS):
            ids = torch.tensor([dataset[i]["input_ids"]])
            online = online_target_outputs(tiny_target, ids, None, LAYERS, with_final_hidden=True)
            item = cache[i]
            assert item["input_ids"].tolist() == dataset[i]["input_ids"]
            assert item["target_hidden_states"].shape == (length, 96)
            torch.testing.assert_close(item["target_hidden_states"], online.features[0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(
                item["final_hidden_states"], online.final_hidden_states[0], rtol=1e-5, atol=1e-5
            )
        with pytest.raises(IndexError):
            cache[len(LENGTHS)]

    def test_size_estimate_matches_the_disk(self, tiny_target, tmp_path):
        dataset = make_dataset(LENGTHS)
        for dtype, itemsize in (("float32", 4), ("bfloat16", 2)):
            cache = build(tiny_target, dataset, tmp_path / dtype, dtype=dtype)
            plan = cache.plan
            assert plan.bytes_per_token == (3 + 1) * 32 * itemsize + 4
            on_disk = sum(shard["bytes"] for shard in cache.manifest["shards"])
            # the estimate misses only the safetensors headers (well under 1 KiB per shard)
            assert 0 <= on_disk - plan.estimated_bytes < 1024 * plan.num_shards
            assert cache[0]["target_hidden_states"].dtype == getattr(torch, dtype)

    def test_interrupted_build_is_never_read_as_complete_and_resumes(self, tiny_target, tmp_path, monkeypatch):
        dataset = make_dataset(LENGTHS)
        real_write = features_module._write_shard
        written = []

        def crash_on_second_shard(tensors, path):
            if written:
                # a half-written temporary file, as a killed process would leave it
                path.with_name(f".{path.name}.999.tmp").write_bytes(b"partial")
                raise KeyboardInterrupt("killed")
            written.append(path.name)
            real_write(tensors, path)

        monkeypatch.setattr(features_module, "_write_shard", crash_on_second_shard)
        with pytest.raises(KeyboardInterrupt):
            build(tiny_target, dataset, tmp_path / "cache")
        assert not (tmp_path / "cache" / MANIFEST_FILE).exists()
        with pytest.raises(FeatureCacheIncompleteError, match="1 shard"):
            FeatureCache(tmp_path / "cache")

        resumed = []
        monkeypatch.setattr(features_module, "_write_shard", lambda t, p: (resumed.append(p.name), real_write(t, p)))
        cache = build(tiny_target, dataset, tmp_path / "cache")
        assert sorted(resumed) == ["shard-00001-of-00003.safetensors", "shard-00002-of-00003.safetensors"]
        assert not list((tmp_path / "cache").glob(".*.tmp"))
        fresh = build(tiny_target, dataset, tmp_path / "fresh")
        for i in range(len(LENGTHS)):
            for key, value in fresh[i].items():
                assert torch.equal(cache[i][key], value)
        # complete now: building again computes nothing
        resumed.clear()
        build(tiny_target, dataset, tmp_path / "cache")
        assert resumed == []

    def test_a_cache_for_other_inputs_is_refused(self, tiny_target, tmp_path):
        dataset = make_dataset(LENGTHS)
        build(tiny_target, dataset, tmp_path)
        with pytest.raises(ValueError, match="dtype"):
            build(tiny_target, dataset, tmp_path, dtype="bfloat16")
        with pytest.raises(ValueError, match="tokens_sha256"):
            build(tiny_target, make_dataset(LENGTHS, seed=5), tmp_path)
        other = make_dataset(LENGTHS, seed=5)
        with pytest.raises(ValueError, match="differ from the dataset"):
            CachedFeatureDataset(other, FeatureCache(tmp_path))[0]

    def test_a_changed_shard_is_refused(self, tiny_target, tmp_path):
        cache = build(tiny_target, make_dataset(LENGTHS), tmp_path)
        shard = tmp_path / cache.manifest["shards"][1]["file"]
        shard.write_bytes(shard.read_bytes()[:-8])
        with pytest.raises(ValueError, match="changed"):
            FeatureCache(tmp_path)

    def test_default_shards_hold_about_shard_bytes(self, tiny_target):
        dataset = make_dataset(LENGTHS)
        bytes_per_sample = (4 * 32 * 4 + 4) * sum(LENGTHS) / len(LENGTHS)
        plan = plan_feature_cache(dataset, tiny_target, LAYERS, "float32", shard_bytes=int(3 * bytes_per_sample) + 1)
        assert (plan.samples_per_shard, plan.num_shards) == (3, 2)
        assert plan_feature_cache(dataset, tiny_target, LAYERS, "float32").num_shards == 1  # 1 GiB default

    def test_plan_is_written_first(self, tiny_target, tmp_path):
        dataset = make_dataset(LENGTHS)
        plan = plan_feature_cache(dataset, tiny_target, LAYERS, "float32", 2)
        build(tiny_target, dataset, tmp_path)
        assert json.loads((tmp_path / "plan.json").read_text())["tokens_sha256"] == plan.tokens_sha256


class TestOfflineTraining:
    def test_online_and_offline_give_the_same_loss(self, tmp_path):
        target = make_sharp_target()
        dataset = make_dataset(LENGTHS)
        cache = build(target, dataset, tmp_path / "cache", batch_size=2)
        collator = DataCollatorForEagle3(pad_token_id=0)
        online_batch = collator([dataset[i] for i in range(4)])
        offline_batch = collator([CachedFeatureDataset(dataset, cache)[i] for i in range(4)])
        assert offline_batch["target_hidden_states"].shape == (4, 16, 96)

        online = Eagle3Trainer(make_draft(target), make_args(tmp_path / "on", ttt_steps=7), target_model=target)
        offline_args = make_args(
            tmp_path / "off", ttt_steps=7, feature_mode="offline", feature_cache_dir=str(cache.cache_dir)
        )
        offline = Eagle3Trainer(make_draft(target), offline_args, target_model=target)
        with torch.no_grad():
            loss_online = online.compute_loss(online.model, online_batch)
            loss_offline = offline.compute_loss(offline.model, offline_batch)
        torch.testing.assert_close(loss_offline, loss_online, rtol=1e-5, atol=1e-6)
        metrics_online, metrics_offline = online._pop_metrics("train"), offline._pop_metrics("train")
        assert metrics_online.keys() == metrics_offline.keys()
        for name, value in metrics_online.items():
            assert metrics_offline[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name

    @pytest.mark.parametrize(
        "head, target_overrides, target_name, message",
        [
            # other taps of the same width: training would run, on the wrong features
            (dict(target_layer_ids=[1, 3, 6]), {}, "org/target-A", r"layer_ids=\[2, 4, 5\].*\[1, 3, 6\]"),
            # the same taps of a wider target
            ({}, dict(hidden_size=64), "org/target-A", r"features 96 wide.*num_target_features=192"),
            ({}, {}, "org/target-B", "target_name_or_path='org/target-A' but the target is 'org/target-B'"),
        ],
        ids=["taps", "width", "target"],
    )
    @pytest.mark.parametrize("split", ["train_dataset", "eval_dataset"])
    def test_a_cache_for_another_head_or_target_is_refused(
        self, tmp_path, head, target_overrides, target_name, message, split
    ):
        built_from = make_tiny_target()
        built_from.name_or_path = "org/target-A"
        dataset = make_dataset(LENGTHS)
        cache = build(built_from, dataset, tmp_path / "cache")
        target = make_tiny_target(seed=1, **target_overrides)
        target.name_or_path = target_name
        args = make_args(tmp_path, feature_mode="offline", feature_cache_dir=str(cache.cache_dir))
        cached = {split: CachedFeatureDataset(dataset, cache)}
        with pytest.raises(ValueError, match=f"{re.escape(str(cache.cache_dir))}.*{message}"):
            Eagle3Trainer(make_draft(target, **head), args, target_model=target, **cached)

    def test_length_grouped_sampling_reads_lengths_without_loading_features(self, tmp_path, monkeypatch):
        target = make_sharp_target()
        dataset = make_dataset(LENGTHS)
        cache = build(target, dataset, tmp_path / "cache")
        args = make_args(
            tmp_path,
            feature_mode="offline",
            feature_cache_dir=str(cache.cache_dir),
            train_sampling_strategy="group_by_length",
        )
        trainer = Eagle3Trainer(
            make_draft(target), args, target_model=target, train_dataset=CachedFeatureDataset(dataset, cache)
        )
        loaded = []
        monkeypatch.setattr(FeatureCache, "__getitem__", lambda self, i: loaded.append(i) or {})
        assert trainer._get_train_sampler().lengths == list(LENGTHS)
        assert loaded == []
        monkeypatch.undo()
        trainer.train()
        assert "padding_share" in trainer.state.log_history[0]

    def test_a_cache_passed_to_evaluate_is_checked(self, tmp_path):
        target = make_tiny_target()
        target.name_or_path = "org/target-A"
        dataset = make_dataset(LENGTHS)
        cache = build(target, dataset, tmp_path / "cache")
        args = make_args(tmp_path, feature_mode="offline", feature_cache_dir=str(cache.cache_dir))
        cached = CachedFeatureDataset(dataset, cache)
        trainer = Eagle3Trainer(make_draft(target), args, target_model=target, train_dataset=cached)
        assert "eval_loss" in trainer.evaluate(eval_dataset=cached)
        other = make_tiny_target()
        other.name_or_path = "org/target-B"
        other_cache = build(other, dataset, tmp_path / "other-cache")
        with pytest.raises(ValueError, match="target_name_or_path='org/target-B' but the target is 'org/target-A'"):
            trainer.evaluate(eval_dataset=CachedFeatureDataset(dataset, other_cache))

    def test_a_cache_of_a_nameless_target_is_not_compared_by_name(self, tmp_path):
        dataset = make_dataset(LENGTHS)
        cache = build(make_tiny_target(), dataset, tmp_path / "cache")  # records the class name
        target = make_tiny_target()
        target.name_or_path = "org/target-A"
        args = make_args(tmp_path, feature_mode="offline", feature_cache_dir=str(cache.cache_dir))
        Eagle3Trainer(
            make_draft(target), args, target_model=target, train_dataset=CachedFeatureDataset(dataset, cache)
        )

    def test_offline_training_runs_from_a_bfloat16_cache(self, tmp_path):
        target = make_tiny_target()
        dataset = make_dataset(LENGTHS)
        cache = build(target, dataset, tmp_path / "cache", dtype="bfloat16")
        args = make_args(tmp_path, feature_mode="offline", feature_cache_dir=str(cache.cache_dir))
        trainer = Eagle3Trainer(
            make_draft(target), args, target_model=target, train_dataset=CachedFeatureDataset(dataset, cache)
        )
        trainer.train()
        assert "loss_step_2" in trainer.state.log_history[0]
