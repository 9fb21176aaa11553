"""`eagle3-hf env`: versions and offline assets, for bug reports."""

import argparse
import platform


def make_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog="eagle3-hf env", description="Print versions and the offline assets found.")


def main(argv: list[str] | None = None) -> int:
    make_parser().parse_args(argv)
    import torch
    import transformers

    import eagle3_hf
    from eagle3_hf.assets import ALL_ASSETS
    from eagle3_hf.cpu_features import cpu_model, describe_cpu_features

    print(
        f"eagle3_hf {eagle3_hf.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
        f"python {platform.python_version()}, cuda available: {torch.cuda.is_available()}"
    )
    print(f"cpu: {cpu_model()} ({describe_cpu_features()}), {torch.get_num_threads()} torch threads")
    for name, asset in ALL_ASSETS.items():
        try:
            print(f"{name:<11} {asset.path()}")
        except FileNotFoundError as error:
            print(f"{name:<11} missing: {error}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
