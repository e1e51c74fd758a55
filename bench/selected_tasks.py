"""Suite `selected-tasks`: time from start to lm-eval's "Selected Tasks" line, wall and CPU,
then stop.

    python -m bench selected-tasks --model dvoting-llada --model_args pretrained=tiny-arith \\
        --tasks dvoting_arith --device cpu --limit 1

takes the arguments of `lm_eval` and runs lm-eval's own CLI in this process (the start-up
hook included, as `lm_eval` would), up to the point where lm-eval has resolved `--tasks`
and logs "Selected Tasks"; it prints the seconds since this module was imported (wall, and
CPU: user + system of this process) and exits before any model is loaded. CPU time is the
figure to compare on a shared machine; wall time on a quiet one.
"""

from __future__ import annotations

import logging
import os
import sys
import time

WALL_START = time.perf_counter()


class _StopAtSelectedTasks(logging.Handler):
    """Prints the times when lm-eval logs "Selected Tasks", then ends the process."""

    def emit(self, record: logging.LogRecord) -> None:
        if not record.getMessage().startswith("Selected Tasks"):
            return
        wall = time.perf_counter() - WALL_START
        times = os.times()
        print(
            f"to 'Selected Tasks': wall {wall:.1f} s, CPU {times.user + times.system:.1f} s "
            f"(user {times.user:.1f}, sys {times.system:.1f})",
            flush=True,
        )
        os._exit(0)  # stop here: what follows (model, data, requests) is not measured


def main(argv: list[str] | None = None) -> None:
    """Run lm-eval's CLI with `argv` (lm_eval's arguments; default: this process's)."""
    logging.getLogger("lm_eval").addHandler(_StopAtSelectedTasks())
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()
    raise SystemExit("lm-eval ended without logging 'Selected Tasks'")


if __name__ == "__main__":
    main()
