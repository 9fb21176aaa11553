"""Measuring heads: the prompt sets, the benchmark loop, its reports and plots.

- `prompts`: MT-bench, HumanEval and the held-out ShareGPT slice, from the offline packages;
- `measure`: timing plain decoding, prompt lookup, chain and tree mode side by side, prompt by prompt;
- `report`: the Markdown table, JSON and PNG plots of `eagle3-hf bench`;
- `plots`: drawing draft trees and training curves (matplotlib).
"""
