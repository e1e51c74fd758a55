"""What every benchmark suite shares: paths, flags, machine facts, the JSON and section writers.

A suite (`python -m bench SUITE`, listed in `bench/__main__.py`) parses its own sizes and
builds its parser from the flags here (`--out`, `--json`, `--quick`, `--threads`,
`--report-only`; `--repeats`, `--device`, `--dtype` for the suites that also run on a GPU), so
that a flag means the same in every suite; records the machine it ran
on with `run_facts` (or `machine_description` alone); saves its raw numbers with `save_json`
under `RESULTS` (bench/results/) unless `--json` says otherwise; and writes its own part of
BENCHMARKS.md between two marker lines with `write_section`, leaving the rest of the file as
it is.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from lm_eval_dvoting.core.decoding.static_steps import CAPTURED
from lm_eval_dvoting.integration import strict_json

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"  # every suite's raw numbers (JSON)
BENCHMARKS_MD = REPO / "BENCHMARKS.md"
Results = dict[str, Any]


# ----------------------------------------------------------------------- flags


def add_output_flags(
    p: argparse.ArgumentParser,
    json_default: Path | None,
    out_default: Path = BENCHMARKS_MD,
    report_only: bool = True,
) -> None:
    """`--out` (the Markdown written), `--json` (the raw numbers; required when `json_default`
    is None) and, unless `report_only` is False, `--report-only` (rewrite `--out` from
    `--json` without measuring anything)."""
    p.add_argument("--out", type=Path, default=out_default)
    if json_default is None:
        p.add_argument("--json", type=Path, required=True)
    else:
        p.add_argument("--json", type=Path, default=json_default)
    if report_only:
        p.add_argument(
            "--report-only", action="store_true", help="only write the section from --json"
        )


def add_section_flag(p: argparse.ArgumentParser, default: str) -> None:
    """`--section NAME`: the name in the markers of the section `--out` gets, so that another
    run (another GPU, another dtype) gets a section of its own beside the default one."""
    p.add_argument(
        "--section", default=default, help=f"the markers' name, `<!-- NAME:start -->` ({default})"
    )


def add_quick_flag(p: argparse.ArgumentParser, text: str = "tiny sizes, for a smoke test") -> None:
    """`--quick`: each suite's tiny sizes, so that a smoke run takes seconds (`text`: its help)."""
    p.add_argument("--quick", action="store_true", help=text)


def add_threads_flag(p: argparse.ArgumentParser, default: int = 1) -> None:
    """`--threads`: torch's intra-op threads (1 by default: the CPU is shared)."""
    p.add_argument(
        "--threads",
        type=int,
        default=default,
        help="torch intra-op threads (1: the CPU is shared)",
    )


def add_device_flags(p: argparse.ArgumentParser, repeats_help: str) -> None:
    """`--package`, `--repeats` (5), `--device cpu|cuda` and `--dtype float32|bfloat16`: the
    flags of a suite that also runs on a lent GPU (`parse_device_args` reads them)."""
    p.add_argument("--package", help="a checkout whose lm_eval_dvoting to measure (default: this)")
    p.add_argument("--repeats", type=int, default=5, help=f"{repeats_help} (default 5)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument(
        "--out",
        type=Path,
        help="also write the table to this Markdown file, with the command and the machine "
        "(its GPU named), e.g. a lent GPU's $OUT/refill.md",
    )


def write_table(
    out: Path | None, suite: str, argv: list[str], device: str, lines: list[str]
) -> None:
    """The table of a `add_device_flags` suite, with its command and machine, into `out`
    (nothing when `out` is None)."""
    if out is None:
        return
    launcher = launcher_for(device)
    facts = machine_description(torch.device(device))
    head = [f"Written by `{command_line(suite, argv, launcher)}`, {utc_now()}.", ""]
    head += [f"- {name}: {value}" for name, value in facts.items()] + [""]
    out.write_text("\n".join(head + lines) + "\n", encoding="utf-8")
    print(f"wrote {out}")


def parse_device_args(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`argv` parsed by `p` (built with `add_device_flags`), what cannot run refused
    (`p.error`: `--device cuda` without a CUDA device, `--repeats` below 1), and `--package`'s
    lm_eval_dvoting loaded when given (the folder measured is printed)."""
    args = p.parse_args(argv)
    if is_cuda(args.device) and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA device here; use --device cpu")
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.package:
        import_package_from(args.package)
    package = importlib.import_module("lm_eval_dvoting")
    print(f"lm_eval_dvoting from {package.__file__.rsplit('/', 2)[0]}")
    return args


def import_package_from(folder: str) -> None:
    """Make `import lm_eval_dvoting` (and its submodules, found through its `__path__`) load
    the package in `folder` (another commit's checkout), whatever was imported before."""
    package = Path(folder).resolve() / "lm_eval_dvoting"
    if not (package / "__init__.py").exists():
        raise SystemExit(f"--package {folder}: no lm_eval_dvoting/ package there")
    for name in [name for name in sys.modules if name.split(".")[0] == "lm_eval_dvoting"]:
        del sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        "lm_eval_dvoting", package / "__init__.py", submodule_search_locations=[str(package)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["lm_eval_dvoting"] = module
    spec.loader.exec_module(module)


def is_cuda(device: str | torch.device) -> bool:
    """Whether `device` is a CUDA device: `cuda` and `cuda:N` alike (a comparison with the
    string "cuda" would miss `cuda:0`, and skip a synchronisation silently)."""
    return torch.device(device).type == "cuda"


STEP_MODES = ("dynamic", "static", "graphs", "compiled")  # `cached_steps` a suite can run


def add_modes_flag(p: argparse.ArgumentParser) -> None:
    """`--modes`: the `cached_steps` modes a suite compares (`step_modes`)."""
    p.add_argument(
        "--modes",
        nargs="+",
        choices=STEP_MODES,
        help="the cached_steps modes to run (default: dynamic and static, and graphs on CUDA; "
        "compiled only when named: it compiles the pass, minutes at LLaDA-8B's shape); "
        "dynamic always runs, first: the others' tokens are compared with its",
    )


def step_modes(args: argparse.Namespace | dict[str, Any]) -> list[str]:
    """The modes a run compares (`--modes`, else the device's default), `dynamic` first;
    a mode that needs CUDA on another device is refused, naming it."""
    args = vars(args) if isinstance(args, argparse.Namespace) else args
    device, asked = args["device"], args.get("modes")
    if not asked:
        return ["dynamic", "static"] + (["graphs"] if is_cuda(device) else [])
    refused = [mode for mode in asked if mode in CAPTURED and not is_cuda(device)]
    if refused:
        raise SystemExit(
            f"--modes {' '.join(refused)} needs a CUDA device, got --device {device}: "
            "leave them out, or give --device cuda"
        )
    return ["dynamic"] + [mode for mode in STEP_MODES[1:] if mode in asked]


def refused_capture(error: BaseException) -> bool:
    """Whether `error` is a capture that `cached_steps=graphs|compiled` refused (a suite
    says it and goes on), not an error to stop on: out of memory anywhere in its chain of
    causes (a capture or a compilation wraps it) stops the run too."""
    if not str(error).startswith(tuple(f"cached_steps={mode}" for mode in CAPTURED)):
        return False
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, torch.OutOfMemoryError) or "out of memory" in str(cause):
            return False
        cause = cause.__cause__ or cause.__context__
    return True


def timed_call(fn: Any, device: str | torch.device = "cpu") -> tuple[float, Any]:
    """Seconds of one call of `fn()`, and what it returned; on a GPU the queued work is
    waited for at both edges."""
    cuda = is_cuda(device)
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn()
    if cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, result


def timed(fn: Any, device: str | torch.device = "cpu") -> float:
    """Seconds of one call of `fn()` (`timed_call`)."""
    return timed_call(fn, device)[0]


# operators that launch no kernel: views, and allocations without a fill
VIEWS = {
    *("aten::slice", "aten::select", "aten::as_strided", "aten::view", "aten::unbind"),
    *("aten::transpose", "aten::alias", "aten::expand", "aten::unsqueeze", "aten::detach"),
    *("aten::lift_fresh", "aten::empty", "aten::empty_strided", "aten::resolve_conj"),
    "aten::resolve_neg",
}


def operators(call: Any) -> int:
    """The top-level `aten::` operators `call()` runs, views left out (on a GPU each is a
    kernel launch, at a few microseconds of host time apiece)."""
    return len(top_operators(call))


def top_operators(call: Any) -> list[Any]:
    """The profiler's events of `operators`: `within(event, label)` tells those run inside a
    `torch.profiler.record_function(label)`."""
    with profile(activities=[ProfilerActivity.CPU]) as run:
        call()
    return [
        e
        for e in run.events()
        if e.name.startswith("aten::")
        and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
        and e.name not in VIEWS
    ]


def within(event: Any, name: str) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == name:
            return True
        parent = parent.cpu_parent
    return False


def add_real_shape_arguments(
    p: argparse.ArgumentParser, prompt_length: int, gen_length: int
) -> None:
    """The real-shape model's sizes (LLaDA-8B's width at reduced depth): `--layers`,
    `--width`, `--heads`, `--prompt-length`, `--gen-length`."""
    p.add_argument(
        "--layers", type=int, default=1, help="layers of the real-shape model (LLaDA-8B has 32)"
    )
    p.add_argument(
        "--width", type=int, default=4096, help="d_model of the real-shape model (MLP 3x)"
    )
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--prompt-length", type=int, default=prompt_length)
    p.add_argument("--gen-length", type=int, default=gen_length)


def args_record(args: argparse.Namespace) -> Results:
    """The parsed flags as JSON values (paths as strings), to store beside the numbers."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def launcher_for(device: str) -> str:
    """The Python a suite is started with on `device`: a lent GPU machine's `python3` (its
    image holds PyTorch), this project's virtual environment elsewhere."""
    return "python3" if is_cuda(device) else ".venv/bin/python"


def command_line(suite: str, argv: list[str], launcher: str = ".venv/bin/python") -> str:
    """How the run was started, for the record: `LAUNCHER -m bench SUITE ARGS`."""
    return f"{launcher} -m bench {suite}" + "".join(f" {a}" for a in argv)


def omp_prefix() -> str:
    """`OMP_NUM_THREADS=N ` when the environment sets it (it changes the timings), else ''."""
    threads = os.environ.get("OMP_NUM_THREADS")
    return f"OMP_NUM_THREADS={threads} " if threads is not None else ""


# ----------------------------------------------------------------------- writing


def markers(name: str) -> tuple[str, str]:
    """The marker lines around a suite's section of BENCHMARKS.md."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def write_section(path: Path, lines: list[str], start: str, end: str) -> None:
    """Replace the text between the markers `start` and `end` (inclusive), or append it;
    the rest stays as it is."""
    text = path.read_text() if path.exists() else ""
    block = "\n".join(lines)
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block + "\n"
    path.write_text(text)


def run_or_report(
    suite: str,
    argv: list[str],
    args: argparse.Namespace,
    run: Any,
    section: Any,
) -> int:
    """The `main` of a suite that keeps its numbers in `--json` and writes one section of
    `--out` between the markers `--section`: with `--report-only` the section from `--json`
    alone; else `run(args, results)` into a record of the command, the machine and the date,
    saved to `--json`, then the section (`section(results, name)`). Gradients are off for
    the run only (a caller's own setting, e.g. a test process's, is left as it was)."""
    if args.report_only:
        results = load_json(args.json)
    else:
        command = command_line(suite, argv, launcher_for(args.device))
        results = {"args": args_record(args), "meta": run_facts(command, args.device)}
        results["date"] = utc_now()
        with torch.no_grad():
            run(args, results)
        save_json(args.json, results)
    write_section(args.out, section(results, args.section), *markers(args.section))
    print(f"wrote the {args.section} section of {args.out}")
    return 0


def save_json(path: Path, results: Any, **dump_args: Any) -> None:
    """Write `results` to `path` as strict JSON (no NaN), creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(strict_json.dumps(results, **dump_args))


def load_json(path: Path) -> Any:
    """The results a suite saved at `path`."""
    return json.loads(path.read_text())


# ----------------------------------------------------------------------- machine


def machine_description(device: torch.device) -> dict[str, str]:
    """What the numbers were measured on, for BENCHMARKS.md."""
    facts: dict[str, str] = {"cpu": f"{cpu_name()}, {os.cpu_count()} logical cores visible"}
    try:
        mem_kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        facts["memory"] = f"{mem_kb / 2**20:.0f} GiB"
    except (OSError, AttributeError):
        pass
    if device.type == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(device)
    facts["torch"] = f"{torch.__version__}, {torch.get_num_threads()} intra-op thread(s)"
    facts["python"] = platform.python_version()
    facts["os"] = platform.platform()
    return facts


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> tuple[float, float, float] | None:
    """The 1/5/15-minute load averages, or None where the system has none."""
    try:
        return os.getloadavg()
    except OSError:
        return None


def uptime() -> str:
    """`uptime`'s line (load and logged-in users), or '' where it cannot run."""
    try:
        return os.popen("uptime").read().strip()
    except OSError:
        return ""


def busy_processes(limit: int = 6) -> list[str]:
    """The busiest other processes (command, %CPU) as `ps` reports them."""
    try:
        out = subprocess.run(
            ["ps", "-eo", "pid,pcpu,args", "--sort=-pcpu"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.splitlines()[1:]
    except (OSError, subprocess.SubprocessError):
        return []
    mine = os.getpid()
    rows = []
    for line in out:
        pid, pcpu, args = line.strip().split(None, 2)
        if int(pid) == mine or args.startswith("ps "):
            continue
        rows.append(f"{float(pcpu):5.1f}% {args[:90]}")
        if len(rows) == limit:
            break
    return rows


def git_commit() -> str:
    """HEAD's short hash, with a note when the working tree has changes."""

    def git(*cmd: str) -> str:
        return subprocess.run(
            ["git", *cmd], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' + uncommitted changes' if dirty else ''}"


def run_facts(command: str, device: str = "cpu") -> Results:
    """The record a CPU suite keeps of its start: command, machine, load and the other busy
    processes (the machine is shared, so they explain noisy timings)."""
    return {
        "command": command,
        "facts": machine_description(torch.device(device)),
        "load_before": load_average(),
        "uptime_before": uptime(),
        "busy": busy_processes(),
    }


def utc_now() -> str:
    """The date and time of a run, to the minute, in UTC."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
