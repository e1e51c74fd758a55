"""Mutation testing of the scoring core with mutmut 3 (docs/MUTATION.md).

    .venv/bin/python tools/mutation.py                     # every module, one after another
    .venv/bin/python tools/mutation.py answers metrics     # some of them
    .venv/bin/python tools/mutation.py strategies --max-children 2

For each module it runs mutmut against that module's fast test files only (MODULES
below), then prints the mutation score (killed / total), every surviving mutant with its
diff, and the file that lists the survivors judged equivalent (docs/mutation_equivalent.md).
Survivors listed there are reported as such, not as failures; the exit status is 1 when
any other mutant survived.

Why a wrapper rather than a bare `mutmut run` (which also works, with pyproject.toml's
[tool.mutmut] settings: every module of its only_mutate against all their tests): mutmut keeps one
`mutants/` folder and resets every result when the test selection changes, and a run over
all modules costs the slowest module's tests for every function. So each module gets its
own test selection and its own results folder, `.mutation/<module>/`, moved to `mutants/`
for the run and back afterwards; a rerun only tests mutants of functions that changed.

Not part of CI: it is slow (minutes per module on 2 cores; see docs/MUTATION.md).
This script must not import lm_eval_dvoting: mutmut puts the mutated copy first on
sys.path, and a module imported before that would be the un-mutated one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, NamedTuple

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "lm_eval_dvoting"
RESULTS = REPO / ".mutation"
# What outlives a checkout: each module's per-mutant results (mutmut's meta file: exit code
# per mutant, hash per function) and its last summary, tracked in git. `.mutation/` is
# git-ignored (it holds whole copies of the package), so without these every new clone
# started the hours-long runs from nothing; seeded from them, mutmut keeps the result of
# every mutant whose function is unchanged and tests only the rest.
STATE = REPO / "tools" / "mutation_state"
# mutmut statuses that count as caught: a failing test, or a mutant that hangs (an endless
# loop; a user would notice that too, as would the suite's time limit), or one whose test
# process died by a signal (mutmut's "segfault": SIGSEGV, or a SIGKILL, which a loop that
# also eats memory draws from mutmut's hard limit or the kernel's OOM killer). A SIGKILL can
# also hit a neighbouring mutant's process when memory runs out, so the report names every
# "segfault" mutant: retest such a mutant alone before trusting its kill.
DETECTED = ("killed", "timeout", "segfault")


def survived(status: str) -> bool:
    """Whether a mutant with this mutmut status is a survivor: tested, and neither killed,
    hung nor crashed (DETECTED; "not checked": an interrupted run never reached it)."""
    return status not in (*DETECTED, "not checked")


EQUIVALENT_FILE = REPO / "docs" / "mutation_equivalent.md"
KILLS = "tests/test_mutation_kills.py"

# the property tests that drive the real harness on the demo model (seconds per example):
# they belong to harness.py's run, not to the pure modules', where every answers.py mutant
# would pay for them
HARNESS_PROPERTIES = [
    "--deselect",
    "tests/test_properties.py::test_batch_and_order_invariance_over_random_request_mixes",
    "--deselect",
    "tests/test_properties.py::test_request_mixes_are_not_vacuous",
]
HARNESS_TESTS = [
    "tests/test_harness.py",
    "tests/test_harness_conventions.py",
    "tests/test_properties.py",
    "tests/test_input_faults.py",
    "tests/test_run_controls.py",
    "tests/test_likelihood.py",
    "tests/test_result_cache.py",
    "tests/test_reliability.py",
    "tests/test_decoder_ablation.py",
    "tests/test_harness_likelihood.py",
    "tests/test_llada2_harness.py",
    "tests/test_rfg.py",
    "tests/test_length_checks.py",
    KILLS,
]
# module -> the pytest arguments selecting the fast tests that exercise it (mutmut then
# runs, per mutant, only those of them that call the mutated function)
MODULES: dict[str, list[str]] = {
    "answers": [
        "tests/test_answers.py",
        "tests/test_answer_conformance.py",
        "tests/test_properties.py",
        KILLS,
        *HARNESS_PROPERTIES,
    ],
    # the value a box states (issue 38), read through answers.py
    "latex_value": ["tests/test_answer_conformance.py", "tests/test_answers.py"],
    "metrics": ["tests/test_metrics.py", KILLS],
    "strategies": [
        "tests/test_strategies.py",
        "tests/test_properties.py",
        "tests/test_confidence_strategies.py",
        "tests/test_temporal.py",
        "tests/test_block_diffusion.py",
        "tests/test_rfg.py",
        "tests/test_length_checks.py",
        KILLS,
        *HARNESS_PROPERTIES,
    ],
    # the temporal vote and its per-step logs (the report's figures are read from them)
    "temporal": ["tests/test_temporal.py", "tests/test_report.py", KILLS],
    # RFG's guided model and the LoRA adapters it may guide (issue 21)
    "guidance": ["tests/test_rfg.py", KILLS],
    "models.adapters": ["tests/test_adapters.py", "tests/test_rfg.py", KILLS],
    # the decoder's units (lm_eval_dvoting/core/decoding/), one run each
    **{
        f"decoding.{unit}": [
            "tests/test_decoding.py",
            "tests/test_caches.py",
            "tests/test_confidence_decoder.py",
            "tests/test_block_diffusion.py",
            KILLS,
        ]
        for unit in ("state", "rules", "caches", "rows", "blocks")
    },
    # the MoE families' modules (issue 22): the upstream-logits fixtures and block diffusion
    **{
        f"models.{unit}": [
            "tests/test_models_moe.py",
            "tests/test_block_diffusion.py",
            "tests/test_parallelize.py",
        ]
        for unit in ("llada2", "llada_moe", "moe")
    },
    "likelihood": ["tests/test_likelihood.py", KILLS],
    # harness.py is exercised through lm-eval end to end: its run is by far the slowest
    # (about 1,260 mutants; see docs/MUTATION.md for the time it takes)
    "harness": HARNESS_TESTS,
    # the harness's units below the lm-eval class (issue 20), exercised through it
    "request_planning": HARNESS_TESTS,
    "bookkeeping": HARNESS_TESTS,
    "arg_parsing": HARNESS_TESTS,
}


def diff_pin(diff: str) -> str:
    """A short fingerprint of what a mutant changes: its removed and added lines, without the
    hunk headers (whose line numbers move when code elsewhere in the file changes)."""
    changed = [
        line.rstrip()
        for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("---", "+++"))
    ]
    return hashlib.sha1("\n".join(changed).encode("utf-8")).hexdigest()[:8]


class Equivalent(NamedTuple):
    """One entry of the equivalents file: why the mutant cannot be told from the original, and
    the `diff_pin` of the mutation that reason was written for (None: an entry from before
    pins; it still excuses its survivor, and the report counts it as unpinned)."""

    reason: str
    pin: str | None


def equivalent_mutants(path: Path | None = None) -> dict[str, Equivalent]:
    """Mutant name -> its entry, from the ``- `name` [pin]: reason`` lines of the equivalents
    file."""
    path = path or EQUIVALENT_FILE
    if not path.exists():
        return {}
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^\s*[-*]\s+`([^`]+)`(?:\s+\[([0-9a-f]{8})\])?\s*[:—-]\s*(.+)$", line)
        if match:
            found[match.group(1)] = Equivalent(match.group(3).strip(), match.group(2))
    return found


def excuses(entry: Equivalent | None, diff: str | None) -> bool:
    """Whether an equivalents entry excuses a survivor with this diff. mutmut renumbers a
    function's mutants when the function changes, so an entry's name can come to denote
    another, observable mutation: a pinned entry excuses only the mutation it was pinned to."""
    if entry is None:
        return False
    return entry.pin is None or diff is None or entry.pin == diff_pin(diff)


def _run_one(module: str, max_children: int, retest: list[str]) -> None:
    """In a fresh interpreter (mutmut's state is global): run mutmut on one module inside
    the `mutants/` folder the parent prepared, and write summary.json there.

    `retest`: mutants to test again although they have a result (mutmut keeps a result
    until the mutated function changes, so survivors would not see new tests)."""
    from mutmut.__main__ import _run
    from mutmut.configuration import config
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    cfg = config()
    source = _source(module)
    cfg.only_mutate = [source]
    cfg.pytest_add_cli_args_test_selection = list(MODULES[module])
    try:
        _run(retest, max_children)
    except SystemExit as stop:  # mutmut exits on a failing clean run; keep what it saved
        if stop.code not in (None, 0):
            print(f"mutmut stopped with exit status {stop.code}", file=sys.stderr)
            raise
    data = SourceFileMutationData(path=Path(source))
    data.load()
    statuses = {name: status_by_exit_code[code] for name, code in data.exit_code_by_key.items()}
    survivors = sorted(name for name, status in statuses.items() if survived(status))
    summary = {
        "module": module,
        "tests": MODULES[module],
        "total": len(statuses),
        "killed": sum(status in DETECTED for status in statuses.values()),
        "status": statuses,
        "diffs": {name: get_diff_for_mutant(name, path=Path(source)) for name in survivors},
    }
    Path("mutants", "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")


def _source(module: str) -> str:
    """The file of a module name, in whichever folder of the package holds it: `answers` ->
    lm_eval_dvoting/core/answers.py, `decoding.rules` -> lm_eval_dvoting/core/decoding/rules.py,
    `models.adapters` -> lm_eval_dvoting/models/adapters.py, `harness` ->
    lm_eval_dvoting/integration/harness.py."""
    relative = Path(*module.split(".")).with_suffix(".py")
    package = REPO / PACKAGE
    found = [
        path for path in (package / relative, *package.glob(f"*/{relative}")) if path.is_file()
    ]
    if len(found) != 1:
        raise SystemExit(
            f"module {module!r}: {len(found)} files of {PACKAGE} are {relative} "
            f"({', '.join(str(p.relative_to(REPO)) for p in found) or 'none'}); "
            "name it in MODULES so that exactly one file matches"
        )
    return found[0].relative_to(REPO).as_posix()


def _tracked(module: str) -> tuple[Path, Path]:
    """The tracked copies of `module`'s mutmut meta file and of its last summary."""
    return STATE / f"{module}.meta.json", STATE / f"{module}.summary.json"


def save_state(module: str, folder: Path) -> bool:
    """Copy `module`'s per-mutant results (and its summary, once a run has written one)
    from a results folder (`mutants/` during a run, `.mutation/<module>/` after it) into
    the tracked state; False when the folder holds no results of that module yet.

    mutmut saves the meta file after every mutant, so a copy taken during a run keeps
    everything tested so far (`--save-state`)."""
    meta = folder / f"{_source(module)}.meta"
    if not meta.exists():
        return False
    STATE.mkdir(exist_ok=True)
    tracked_meta, tracked_summary = _tracked(module)
    # one line per mutant, so that git diffs of the state stay readable
    data = json.loads(meta.read_text(encoding="utf-8"))
    tracked_meta.write_text(json.dumps(data, indent=0, sort_keys=True) + "\n", encoding="utf-8")
    summary = folder / "summary.json"
    # a summary older than the meta file describes an earlier run (a run in progress has not
    # written its own yet): keep the tracked one until the run ends
    if summary.exists() and summary.stat().st_mtime >= meta.stat().st_mtime - 1:
        shutil.copyfile(summary, tracked_summary)
    return True


def _seed_from_state(module: str, mutants: Path) -> None:
    """Start a module's first run in this checkout from its tracked results: mutmut then
    regenerates the mutants, keeps the exit code of every mutant whose function's hash is
    unchanged and marks the others untested."""
    tracked_meta, tracked_summary = _tracked(module)
    if not tracked_meta.exists():
        return
    meta = mutants / f"{_source(module)}.meta"
    meta.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tracked_meta, meta)
    if tracked_summary.exists():
        shutil.copyfile(tracked_summary, mutants / "summary.json")


def _survivors(folder: Path, module: str) -> list[str]:
    """The mutants of `module` whose last result in `folder` is neither a kill nor untested."""
    from mutmut.stats import status_by_exit_code

    meta_file = folder / f"{_source(module)}.meta"
    if not meta_file.exists():
        return []
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    return [
        name
        for name, code in meta["exit_code_by_key"].items()
        if survived(status_by_exit_code[code])
    ]


def unjudged(
    survivors: list[str], equivalents: dict[str, Equivalent], diff_of: Callable[[str], str]
) -> list[str]:
    """The survivors worth testing again: all but those a *pinned* entry excuses at their
    current diff (judged equivalent already; retesting one costs its whole test selection,
    minutes for harness.py). Unpinned entries were never checked against a diff: retested."""
    judged = {
        name
        for name in survivors
        if name in equivalents
        and equivalents[name].pin is not None
        and excuses(equivalents[name], diff_of(name))
    }
    return [name for name in survivors if name not in judged]


def _mutant_diff(module: str) -> Callable[[str], str]:
    """A mutant's diff, read from `mutants/` (mutmut resolves it from the working directory)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    def diff_of(name: str) -> str:
        here = Path.cwd()
        os.chdir(REPO)
        try:
            return get_diff_for_mutant(name, path=Path(_source(module)))
        finally:
            os.chdir(here)

    return diff_of


def _take_results(module: str, fresh_stats: bool) -> tuple[Path, Path, dict | None]:
    """Move `module`'s kept results (seeded from the tracked state on a first run) into
    `mutants/` for mutmut; (mutants/, the kept folder, the summary of the run before)."""
    mutants, kept = REPO / "mutants", RESULTS / module
    if mutants.exists():
        raise SystemExit(
            f"{mutants} exists (a bare `mutmut run`, or an interrupted run of this "
            "script): delete it or move it to .mutation/<module>/ first"
        )
    RESULTS.mkdir(exist_ok=True)
    if not kept.exists():
        _seed_from_state(module, kept)
    summary_file = kept / "summary.json"
    earlier = (
        json.loads(summary_file.read_text(encoding="utf-8")) if summary_file.exists() else None
    )
    if kept.exists():
        kept.rename(mutants)
        if fresh_stats:
            # mutmut's map from each function to the tests that call it comes from its stats;
            # kept across runs it went stale once code moved (harness.py's _load_checkpoint
            # mapped to 2 tests instead of every model-building test, so 26 of its mutants
            # "survived"). Fresh stats cost minutes; the per-mutant results are kept (but
            # mutmut then cannot re-test callers of functions changed since the last run).
            (mutants / "mutmut-stats.json").unlink(missing_ok=True)
    return mutants, kept, earlier


def _mutmut_env() -> dict[str, str]:
    """The environment of the `--one` child that runs mutmut."""
    return {
        **os.environ,
        # the tests run from mutants/, whose parent is the checkout: point them at the
        # benchmark data beside the checkout, or every test that needs them would skip
        "DVOTING_SHARED_DIR": str(REPO.parent / "shared"),
        # in one process: mutmut records which tests call each function in its own
        # process, which pytest-xdist's workers (the suite's `-n 2`) would hide from
        # it. Set here rather than in [tool.mutmut]'s pytest args, whose change would
        # make mutmut discard every result it kept.
        "PYTEST_ADDOPTS": f"{os.environ.get('PYTEST_ADDOPTS', '')} -n 0".strip(),
    }


def _retest_survivors(module: str, mutants: Path, run: Callable[[list[str]], object]):
    """`--survivors-only`: test again the recorded survivors that no pinned equivalents
    entry excuses at their current diff; the finished child process (a success when none)."""
    survivors = _survivors(mutants, module)
    retest = unjudged(survivors, equivalent_mutants(), _mutant_diff(module))
    print(
        f"Testing the {len(retest)} survivors of {module} again "
        f"({len(survivors) - len(retest)} more are pinned equivalents at their current "
        "diff: not retested)"
    )
    return run(retest) if retest else subprocess.CompletedProcess([], 0)


def _retest_earlier(module: str, mutants: Path, earlier: dict, run: Callable, done):
    """After a full run: the earlier run's survivors that still survive, tested again
    against the tests as they are now; the last finished child process."""
    retest = [name for name, status in earlier["status"].items() if survived(status)]
    current = json.loads((mutants / "summary.json").read_text(encoding="utf-8"))["status"]
    retest = [name for name in retest if current.get(name) not in (None, *DETECTED)]
    if not retest:
        return done
    print(f"Testing the {len(retest)} earlier survivors of {module} again")
    return run(retest)


def run_module(
    module: str, max_children: int, fresh_stats: bool = False, survivors_only: bool = False
) -> dict:
    """Run mutmut on `module` in its own results folder and return its summary.

    `survivors_only`: test only the survivors recorded so far, against the tests as they
    are now (to confirm new kill tests without waiting for the untested mutants)."""
    mutants, kept, earlier = _take_results(module, fresh_stats)
    # run from the repository root: mutmut reads pyproject.toml and the paths from there
    command = [sys.executable, __file__, "--one", module, "--max-children", str(max_children)]
    env = _mutmut_env()

    def run(retest: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(command + retest, cwd=REPO, env=env)

    try:
        if survivors_only:
            done = _retest_survivors(module, mutants, run)
        else:
            # new mutants (functions changed since) and the ones not reached last time
            done = run([])
            if done.returncode == 0 and earlier is not None:
                done = _retest_earlier(module, mutants, earlier, run, done)
    finally:
        if mutants.exists():
            mutants.rename(kept)
        save_state(module, kept)
    if done.returncode != 0 or not (kept / "summary.json").exists():
        raise SystemExit(
            f"mutmut failed on {module} (exit status {done.returncode}); "
            f"its output is above, its files in {kept}"
        )
    return json.loads((kept / "summary.json").read_text(encoding="utf-8"))


def _score_lines(summary: dict, equivalent: dict[str, Equivalent]) -> list[str]:
    """A module's score line, and the line naming its crashed mutants if any."""
    statuses, diffs = summary["status"], summary["diffs"]
    # "not checked": the run was interrupted before testing it (a rerun continues)
    unchecked = sum(status == "not checked" for status in statuses.values())
    survivors = [name for name, status in statuses.items() if survived(status)]
    listed = [name for name in survivors if excuses(equivalent.get(name), diffs.get(name))]
    unpinned = sum(equivalent[name].pin is None for name in listed)
    total = len(statuses) - unchecked
    killed = sum(status in DETECTED for status in statuses.values())
    score = 100.0 * killed / total if total else 100.0
    lines = [
        f"  {summary['module']:<11} {killed:>4} / {total:<4} = {score:5.1f} %"
        f"   survivors: {len(survivors)} ({len(listed)} equivalent"
        + (f", {unpinned} of them unpinned" if unpinned else "")
        + ")"
        + (f"   NOT CHECKED: {unchecked} (interrupted; run again)" if unchecked else "")
    ]
    crashed = sorted(name for name, status in statuses.items() if status == "segfault")
    if crashed:
        lines.append(
            "    counted as caught, but their tests died by a signal (retest each alone to "
            f"rule out the OOM killer hitting a neighbour): {', '.join(crashed)}"
        )
    return lines


def _unexcused(summaries: list[dict], equivalent: dict[str, Equivalent]) -> list[str]:
    """One block per survivor that no equivalents entry excuses: its name, status and diff."""
    blocks = []
    for summary in summaries:
        for name in sorted(summary["status"]):
            status, diff = summary["status"][name], summary["diffs"].get(name)
            entry = equivalent.get(name)
            if not survived(status) or excuses(entry, diff):
                continue
            block = [f"\n--- {name}: {status}"]
            if entry is not None:
                block.append(
                    f"(listed as equivalent for the mutation pinned [{entry.pin}], but this "
                    f"mutant's diff is pinned [{diff_pin(diff)}]: the function changed; re-check "
                    "the entry)"
                )
            blocks.append("\n".join(block + [diff or "(no diff)"]))
    return blocks


def report(summaries: list[dict]) -> int:
    """Print scores and survivors; return the number of survivors no equivalents entry excuses."""
    equivalent = equivalent_mutants()
    print(
        "\nMutation score per module: killed (a test failed, or the mutant hung or crashed) / "
        f"total; equivalent = survivors listed in {EQUIVALENT_FILE}"
    )
    for summary in summaries:
        print("\n".join(_score_lines(summary, equivalent)))
    unexcused = _unexcused(summaries, equivalent)
    for block in unexcused:
        print(block)
    print(f"\nSurvivors judged equivalent, one reason each: {EQUIVALENT_FILE}")
    print(f"Survivors not excused there: {len(unexcused)}")
    return len(unexcused)


def pin_equivalents(summaries: list[dict], path: Path | None = None) -> int:
    """Write the `diff_pin` of each listed survivor's current diff into its unpinned entry;
    return how many were pinned. Run it only after checking those entries' reasons against
    the diffs (`--report-only` prints them): a pin records that check."""
    diffs = {
        name: diff
        for summary in summaries
        for name, diff in summary["diffs"].items()
        if survived(summary["status"].get(name, "not checked"))
    }
    path = path or EQUIVALENT_FILE
    lines, pinned = path.read_text(encoding="utf-8").splitlines(keepends=True), 0
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*[-*]\s+`([^`]+)`)(\s*[:—-])", line)
        if match and match.group(2) in diffs:
            lines[i] = f"{match.group(1)} [{diff_pin(diffs[match.group(2)])}]{line[match.end(1) :]}"
            pinned += 1
    path.write_text("".join(lines), encoding="utf-8")
    return pinned


# The command line as data: (flag, argparse keywords), in --help's order.
FLAGS: tuple[tuple[str, dict], ...] = (
    (
        "modules",
        dict(
            nargs="*",
            metavar="MODULE",
            help=f"modules of {PACKAGE} to mutate (default: all of {', '.join(MODULES)})",
        ),
    ),
    (
        "--max-children",
        dict(type=int, default=1, help="mutants tested at once (default 1: the machine is shared)"),
    ),
    (
        "--fresh-stats",
        dict(
            action="store_true",
            help="collect mutmut's function-to-tests map afresh (after code moved between "
            "functions or modules: a stale map reports false survivors)",
        ),
    ),
    (
        "--report-only",
        dict(action="store_true", help="print the scores of the last runs without running mutmut"),
    ),
    (
        "--survivors-only",
        dict(
            action="store_true",
            help="test only the survivors recorded so far, against the current tests (confirms "
            "new kill tests; the untested mutants stay untested); survivors that a pinned "
            "equivalents entry excuses at their current diff are not retested",
        ),
    ),
    (
        "--save-state",
        dict(
            action="store_true",
            help=f"copy the results tested so far (of a run in progress too) into "
            f"{STATE.relative_to(REPO)}/, tracked in git, without running mutmut",
        ),
    ),
    (
        "--pin-equivalents",
        dict(
            action="store_true",
            help=f"after checking the listed survivors' reasons against their diffs, pin each "
            f"unpinned entry of {EQUIVALENT_FILE.relative_to(REPO)} to its mutant's current "
            "diff (a pinned entry stops excusing its mutant once the mutation changes)",
        ),
    ),
    ("--one", dict(help=argparse.SUPPRESS)),
)


def argument_parser() -> argparse.ArgumentParser:
    """The command line (`FLAGS`)."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for flag, keywords in FLAGS:
        parser.add_argument(flag, **keywords)
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse unknown modules, a --max-children below 1 and a missing mutmut."""
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; choose from {', '.join(MODULES)}")
    if args.max_children < 1:
        parser.error(f"--max-children must be at least 1, got {args.max_children}")
    if shutil.which("mutmut", path=str(Path(sys.executable).parent)) is None:
        try:
            import mutmut  # noqa: F401
        except ImportError:
            parser.error("mutmut is not installed: pip install -e '.[mutation]'")


def save_module_state(module: str) -> None:
    """`--save-state` for one module: from a run in progress (mutants/) or a finished or
    stopped one (.mutation/<module>/)."""
    for folder in (REPO / "mutants", RESULTS / module):
        if save_state(module, folder):
            print(f"{module}: results of {folder} saved in {STATE.relative_to(REPO)}/")
            return


def last_summary(module: str) -> dict | None:
    """The summary of `module`'s last run in this checkout, else its tracked one, else None."""
    for summary_file in (RESULTS / module / "summary.json", _tracked(module)[1]):
        if summary_file.exists():
            return json.loads(summary_file.read_text(encoding="utf-8"))
    return None


def main(argv: list[str] | None = None) -> int:
    """Run (or report, pin, save) the modules asked for; 1 when a survivor is not excused."""
    parser = argument_parser()
    args = parser.parse_args(argv)
    if args.one:
        _run_one(args.one, args.max_children, args.modules)  # here: mutant names to retest
        return 0
    check_args(parser, args)
    os.chdir(REPO)
    modules = args.modules or list(MODULES)
    if args.save_state:
        for module in modules:
            save_module_state(module)
        return 0
    if args.report_only or args.pin_equivalents:
        summaries = [s for s in map(last_summary, modules) if s is not None]
    else:
        summaries = [
            run_module(module, args.max_children, args.fresh_stats, args.survivors_only)
            for module in modules
        ]
    if args.pin_equivalents:
        print(f"{pin_equivalents(summaries)} entries of {EQUIVALENT_FILE.relative_to(REPO)} pinned")
    return 1 if report(summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
