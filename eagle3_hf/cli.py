"""`eagle3-hf` command line: `eagle3-hf <command> [args]`.

Each command lives in `eagle3_hf/commands/<command>.py` with `make_parser()` and `main(argv)`, and also runs as
`python -m eagle3_hf.commands.<command>`. Modules are imported only when their command runs, so
`eagle3-hf --help` stays fast.
"""

import importlib
import sys


# command name -> (module, one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "env": ("eagle3_hf.commands.env", "print versions and the offline assets found"),
    "regenerate": ("eagle3_hf.commands.regenerate", "answer chat data with the target itself (resumable JSONL)"),
    "magpie": ("eagle3_hf.commands.magpie", "the target writes user prompts itself (Magpie), filtered, as JSONL"),
    "check-data": ("eagle3_hf.commands.check_data", "find training records that overlap the evaluation prompts"),
    "vocab": ("eagle3_hf.commands.vocab", "choose the draft vocabulary from the training data (d2t/t2d file)"),
    "train": ("eagle3_hf.commands.train", "train an EAGLE-3 head with the Transformers Trainer (online/offline)"),
    "convert": ("eagle3_hf.commands.convert", "convert a head between checkpoint dialects"),
    "push": ("eagle3_hf.commands.push", "upload a head to the Hub in a serving format, with its model card"),
    "demo": ("eagle3_hf.commands.demo", "SmolLM2 + the shipped head: stream answers, print tau and speedup"),
    "bench": ("eagle3_hf.commands.bench", "tau / tokens/s / speedup on MT-bench, HumanEval, held-out ShareGPT"),
    "tune": ("eagle3_hf.commands.tune", "pick the fastest draft-tree shape for this target and machine"),
    "diagnose": ("eagle3_hf.commands.diagnose", "per-step accuracy on trained vs held-out chats, draft forward cost"),
}


def _usage() -> str:
    lines = ["usage: eagle3-hf <command> [args]", "", "commands:"]
    lines += [f"  {name:<12} {description}" for name, (_, description) in COMMANDS.items()]
    lines += ["", "Run `eagle3-hf <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"eagle3-hf: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
