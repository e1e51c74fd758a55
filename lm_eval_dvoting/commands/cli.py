"""The `dvoting` console script.

    dvoting eval ARGS...    the stock lm-eval CLI with the plugin registered (ARGS pass
                            through unchanged; the explicit fallback for the start-up hook)
    dvoting tasks-dir       print the folder holding the dvoting task YAMLs
    dvoting compare ARGS... lm_eval_dvoting.commands.compare:main
    dvoting report ARGS...  lm_eval_dvoting.commands.report:main

Subcommands live in their own modules and are imported only when used, so
`dvoting tasks-dir` never imports torch or lm_eval.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

# name -> ("module:function" taking argv and returning an exit code or None, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "eval": (
        "lm_eval_dvoting.commands.cli:run_eval",
        "run lm-eval with the dvoting models and tasks",
    ),
    "tasks-dir": ("lm_eval_dvoting.commands.cli:print_tasks_dir", "print the dvoting task folder"),
    "compare": ("lm_eval_dvoting.commands.compare:main", "compare strategies side by side"),
    "report": ("lm_eval_dvoting.commands.report:main", "summarise results into tables and plots"),
}


def run_eval(argv: Sequence[str]) -> int | None:
    """Run lm-eval's own CLI on `argv` after registering the plugin explicitly."""
    from lm_eval_dvoting.integration import plugin

    plugin.register()  # idempotent; needed when the start-up hook is disabled or absent
    from lm_eval.__main__ import cli_evaluate

    # lm-eval's parser reads sys.argv itself (and inserts `run` for the legacy form).
    sys.argv = ["lm-eval", *argv]
    cli_evaluate()
    return 0


def print_tasks_dir(argv: Sequence[str]) -> int:
    """Print the task folder; for `lm_eval --include_path $(dvoting tasks-dir)`."""
    if argv:
        print("usage: dvoting tasks-dir", file=sys.stderr)
        return 2
    from lm_eval_dvoting.integration.plugin import task_dir

    try:
        print(task_dir())
    except FileNotFoundError as exc:
        print(f"dvoting: {exc}", file=sys.stderr)
        return 1
    return 0


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: dvoting COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def _resolve(command: str) -> Callable[[Sequence[str]], int | None]:
    """Import the function behind `command`; SystemExit with a clear message if missing."""
    target, _ = COMMANDS[command]
    module_name, _, func_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise  # the module exists but one of *its* imports is missing: show that
        raise SystemExit(
            f"dvoting {command}: not available in this installation "
            f"(module {module_name} is missing)"
        ) from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise SystemExit(f"dvoting {command}: {module_name} has no function {func_name}()")
    return func


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dvoting` console script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"dvoting: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    result = _resolve(command)(rest)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
