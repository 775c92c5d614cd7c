"""The `oscar-eval` command line: one subcommand per module, imported only when used.

Each module named in SUBCOMMANDS exposes `add_arguments(parser)` and `main(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

SUBCOMMANDS = {
    "eval": ("harness.run", "run a task on a model with a quantized KV cache and write a result JSON"),
    "tni": ("harness.tni", "per-token key/value norm statistics and picture (token-norm imbalance)"),
    "diagnose": ("harness.diagnose", "per layer and KV head: where the keys' Hadamard rotation hurts 2-bit keys"),
    "bench": ("harness.bench", "kernel and end-to-end speed and memory benchmarks"),
    "leaderboard": ("harness.report.leaderboard", "build the leaderboard (markdown + HTML) from result files"),
    "compare": ("harness.report.compare", "compare two result files; non-zero exit on a regression"),
    "bench-check": (
        "harness.bench.check",
        "a bench JSON against the kernel targets and an older run; non-zero exit on a slowdown",
    ),
    "list": ("harness.listing", "list models, methods and tasks"),
    "verify": (
        "harness.verify",
        "replay the first items of results a code change staled; exact ones take the current code digests",
    ),
}


def main(argv: list[str] | None = None) -> int:
    # transformers 5.24+ warns on every forward that takes `past_key_values` that 5.40 drops it; pyproject.toml pins
    # transformers below 5.40, so the warning says nothing a user can act on.
    warnings.filterwarnings("ignore", message=r"`past_key_values` is deprecated", category=FutureWarning)
    parser = argparse.ArgumentParser(prog="oscar-eval", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    requested = (argv if argv is not None else sys.argv[1:])[:1]
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if requested == [name]:  # import only the module that runs: torch/transformers are slow to import
            modules[name] = importlib.import_module(module_name)
            modules[name].add_arguments(p)
    args = parser.parse_args(argv)
    return int(modules[args.command].main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
