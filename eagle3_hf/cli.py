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
