"""The registration logic and the start-up hook, without installing anything.

Hook behaviour is checked in subprocesses (the hook acts at import time, so each case
needs a fresh interpreter) that import `_lm_eval_dvoting_startup` from the checkout,
as the installed `.pth` file would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from lm_eval_dvoting.commands import cli
from lm_eval_dvoting.integration import plugin


def run_hooked(code: str, **env_extra: str) -> str:
    """Run `code` in a fresh interpreter with the start-up hook loaded first."""
    env = {k: v for k, v in os.environ.items() if k != "LM_EVAL_DVOTING_DISABLE_HOOK"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    env.update(env_extra)
    prelude = "import _lm_eval_dvoting_startup\n"
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "start-up hook skipped" not in proc.stderr, proc.stderr
    return proc.stdout


def test_models_match_pyproject_entry_points() -> None:
    # the one conditional import: tomllib is in the standard library from Python 3.11 only,
    # and requires-python is >=3.10 (no TOML reader is a dependency there)
    tomllib = pytest.importorskip(
        "tomllib", reason="tomllib is in the standard library from Python 3.11"
    )
    meta = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert meta["entry-points"]["lm_eval.models"] == plugin.MODELS
    assert meta["entry-points"]["lm_eval.tasks"] == {
        "dvoting": "lm_eval_dvoting.integration.plugin:TASK_DIR"
    }
    assert meta["scripts"] == {"dvoting": "lm_eval_dvoting.commands.cli:main"}


def test_task_dir_is_the_source_folder_in_a_checkout() -> None:
    assert plugin.task_dir() == REPO_ROOT / "task_configs"
    assert plugin.TASK_DIR == str(REPO_ROOT / "task_configs")


def test_include_path_gets_our_folder_first(tmp_path: Path) -> None:
    ours = tmp_path / "ours"
    ours.mkdir()
    assert plugin._with_our_tasks(None, ours) == [ours]
    assert plugin._with_our_tasks("x", ours) == [ours, "x"]
    assert plugin._with_our_tasks(["a", Path("b")], ours) == [ours, "a", Path("b")]
    assert plugin._with_our_tasks(str(ours), ours) == str(ours)  # given already: as is


def test_hook_waits_for_lm_eval() -> None:
    out = run_hooked("""
        import sys
        import lm_eval_dvoting, lm_eval_dvoting.integration.plugin, lm_eval_dvoting.commands.cli
        print('torch' in sys.modules, 'lm_eval' in sys.modules,
              type(sys.meta_path[0]).__name__)
    """)
    assert out.split() == ["False", "False", "_LmEvalWatcher"]


def test_hook_registers_models_and_keeps_builtins() -> None:
    out = run_hooked("""
        import sys
        from lm_eval.api.registry import get_model, model_registry
        print(model_registry.get('dvoting-llada').__name__, get_model('dummy').__name__,
              'hf' in model_registry)
        # the class's own @register_model (if harness.py adds one) is the same entry
        from lm_eval.api.registry import register_model
        from lm_eval_dvoting.integration.harness import DreamEvalModel
        register_model('dvoting-dream')(DreamEvalModel)
        print(get_model('dvoting-dream') is DreamEvalModel)
        # the watcher leaves once all the watched modules ran (the harness imports the
        # task manager, through lm_eval.evaluator; the registry and lm_eval.config come
        # before it), and not before
        watching = any(type(f).__name__ == '_LmEvalWatcher' for f in sys.meta_path)
        print(watching != ('lm_eval.tasks.manager' in sys.modules))
    """)
    assert out.split() == ["LLaDAEvalModel", "DummyLM", "True", "True", "True"]


def test_hook_adds_task_folder_to_every_task_manager(tmp_path: Path) -> None:
    out = run_hooked(f"""
        from lm_eval.tasks import TaskManager
        tm = TaskManager(include_defaults=False, include_path={str(tmp_path)!r})
        print([str(p) for p in tm.include_path])
        print(TaskManager.__init__.__name__)
    """)
    paths, name = out.strip().splitlines()
    assert eval(paths) == [str(REPO_ROOT / "task_configs"), str(tmp_path)]
    assert name == "__init__"


def test_hook_can_be_disabled() -> None:
    out = run_hooked(
        """
        import sys
        from lm_eval.api.registry import get_model, model_registry
        get_model('dummy')
        from lm_eval.tasks import TaskManager
        print('dvoting-llada' in model_registry, hasattr(TaskManager.__init__, '__wrapped__'),
              len(sys.meta_path) == len([f for f in sys.meta_path
                                         if type(f).__name__ != '_LmEvalWatcher']))
    """,
        LM_EVAL_DVOTING_DISABLE_HOOK="1",
    )
    assert out.split() == ["False", "False", "True"]


def test_hook_steps_aside_for_native_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    assert plugin.native_discovery() is False  # lm-eval 0.4.13 has none
    monkeypatch.setattr(plugin, "native_discovery", lambda: True)
    assert plugin.register_models() == []
    assert plugin.patch_task_manager() is False


def test_explicit_register_is_idempotent() -> None:
    out = run_hooked("""
        from lm_eval_dvoting.integration import plugin
        from lm_eval.api.registry import model_registry
        plugin.register(); plugin.register()
        print(plugin.register_models(), model_registry.get('dvoting-dream').__name__)
    """)
    assert out.split() == ["[]", "DreamEvalModel"]


def test_startup_cost_is_small() -> None:
    # What every interpreter start pays: the hook module alone. It must import nothing
    # (os and sys are loaded already), in particular not the package or typing.
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import _lm_eval_dvoting_startup"],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    # "import time: self | cumulative | <indent>name"; children precede their parent
    rows = [
        line.split("|")
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    ]
    names = [row[2] for row in rows]
    at = next(i for i, n in enumerate(names) if n.strip() == "_lm_eval_dvoting_startup")
    depth = len(names[at]) - len(names[at].lstrip())
    children = []
    for name in reversed(names[:at]):
        if len(name) - len(name.lstrip()) <= depth:
            break
        children.append(name.strip())
    assert children == []
    assert int(rows[at][1]) < 50_000  # microseconds; ~0.3 ms on an idle machine


# ---- the `dvoting` command ------------------------------------------------------------


def test_cli_usage_and_unknown_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "tasks-dir" in capsys.readouterr().out
    assert cli.main(["--help"]) == 0
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_cli_tasks_dir(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tasks-dir"]) == 0
    assert capsys.readouterr().out.strip() == str(REPO_ROOT / "task_configs")


def test_cli_missing_subcommand_module_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(cli.COMMANDS, "later", ("lm_eval_dvoting.not_written_yet:main", "?"))
    with pytest.raises(SystemExit, match="not available in this installation"):
        cli.main(["later"])


def test_cli_dispatches_with_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setitem(cli.COMMANDS, "echo", ("lm_eval_dvoting.commands.cli:_test_echo", "?"))
    monkeypatch.setattr(cli, "_test_echo", lambda argv: seen.append(list(argv)) or 3, raising=False)
    assert cli.main(["echo", "--x", "1"]) == 3
    assert seen == [["--x", "1"]]


# ---- what the hook changes in lm-eval besides registration ------------------------------

RESULTS = {
    "results": {
        "dvoting_arith": {
            "alias": "dvoting_arith",
            "exact_match,extract": 0.5,
            "exact_match_stderr,extract": 0.1,
            "dvoting_trace,extract": 20,
            "dvoting_trace_stderr,extract": "N/A",
            "nfe,extract": 14.0,
            "nfe_stderr,extract": "N/A",
        }
    },
    "versions": {"dvoting_arith": 1.0},
    "n-shot": {"dvoting_arith": 0},
    "higher_is_better": {"dvoting_arith": {"exact_match": True, "nfe": False}},
}


def test_printed_table_leaves_out_the_trace() -> None:
    # through the hook, as the CLI reaches it: `from lm_eval.utils import make_table` at print
    out = run_hooked(f"""
        import copy, json
        import lm_eval.tasks
        from lm_eval.utils import make_table
        results = {RESULTS!r}
        before = copy.deepcopy(results)
        print(make_table(results))
        print(json.dumps(results == before))
    """)
    table, unchanged = out.rstrip().rsplit("\n", 1)
    assert "dvoting_trace" not in table
    rows = [line.split("|")[5].strip() for line in table.splitlines()[2:]]
    assert rows == ["exact_match", "nfe"]
    assert unchanged == "true"  # the results (and so the results JSON) keep the count


def test_table_filter_keeps_other_metrics_and_shapes() -> None:
    shown = plugin._shown_metrics(RESULTS["results"]["dvoting_arith"])
    assert sorted(shown) == [
        "alias",
        "exact_match,extract",
        "exact_match_stderr,extract",
        "nfe,extract",
        "nfe_stderr,extract",
    ]
    assert plugin._shown_metrics("not a dict") == "not a dict"


@pytest.mark.parametrize(
    "tasks, ours",
    [
        ("dvoting_arith", True),
        (["dvoting_arith,dvoting_gsm8k"], True),
        ("dvoting_reasoning", True),
        ([" dvoting_arith ", "dvoting_mmlu"], True),
        ("dvoting_arith,gsm8k_cot_zeroshot", False),
        ("gsm8k", False),
        ("dvoting", False),
        ("dvoting_*", False),
        ("task_configs/dvoting_arith.yaml", False),
        ("", False),
        ([], False),
        (None, False),
        ([{"task": "dvoting_arith"}], False),
    ],
)
def test_asks_only_ours(tasks: object, ours: bool) -> None:
    assert plugin.asks_only_ours(tasks) is ours


def test_process_tasks_sets_only_ours_for_its_call() -> None:
    class EvaluatorConfig:
        def __init__(self, tasks: object) -> None:
            self.tasks = tasks

        def process_tasks(self, metadata: object = None) -> bool:
            if metadata == "fail":
                raise RuntimeError("lm-eval failed")
            return plugin._ONLY_OURS.get()

    module = type(sys)("fake_evaluate_config")
    module.EvaluatorConfig = EvaluatorConfig
    assert plugin.patch_process_tasks(module) is True
    assert plugin.patch_process_tasks(module) is True  # once only
    assert EvaluatorConfig("dvoting_arith").process_tasks() is True
    assert EvaluatorConfig("dvoting_arith,gsm8k").process_tasks() is False
    with pytest.raises(RuntimeError):
        EvaluatorConfig("dvoting_arith").process_tasks("fail")
    assert plugin._ONLY_OURS.get() is False  # reset after each call, failed or not


def test_cli_task_list_of_ours_skips_lm_evals_index() -> None:
    # the CLI's own resolution of `--tasks`; the module is imported before the task
    # manager, which process_tasks imports only inside the call
    out = run_hooked("""
        from lm_eval.config.evaluate_config import EvaluatorConfig
        cfg = EvaluatorConfig(tasks="dvoting_arith,dvoting_reasoning")
        manager = cfg.process_tasks({})
        print(cfg.tasks, "gsm8k" in manager.all_tasks, "dvoting_gsm8k" in manager.all_tasks)
    """)
    # (a stock name gets lm-eval's full index: test_process_tasks_sets_only_ours_for_its_call
    # and test_asks_only_ours, without the ~20 s of CPU time that index costs)
    assert out.strip() == "['dvoting_arith', 'dvoting_reasoning'] False True"
