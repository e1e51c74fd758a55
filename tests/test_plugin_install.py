"""Install the package into fresh virtual environments and drive the *stock* lm-eval.

Both install modes are covered: `pip install .` (a wheel) and `pip install -e .`
(hatchling's editable wheel). Each fresh venv is made cheaply and offline: a
`--without-pip` venv whose last `.pth` line appends the running interpreter's
site-packages (lm-eval, torch, pip, hatchling come from there), then
`pip install --no-deps --no-build-isolation --no-index` of a temporary copy of the repo.
The copy gets a probe task YAML, so these tests never depend on (or touch) the real
`task_configs/` contents.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import hatchling  # noqa: F401 - the [test] extra; building the package offline needs it
import pytest
from conftest import REPO_ROOT

PROBE_TASK = "dvoting_plugin_probe"
PROBE_YAML = textwrap.dedent(
    f"""\
    task: {PROBE_TASK}
    dataset_path: json
    dataset_kwargs:
      data_files:
        test: probe.jsonl
    test_split: test
    output_type: generate_until
    doc_to_text: "{{{{question}}}}"
    doc_to_target: "{{{{answer}}}}"
    """
)
_COPY_IGNORE = shutil.ignore_patterns(
    ".venv",
    ".ci-venv",
    ".git",
    "__pycache__",
    "*.pyc",
    "*.egg-info",
    "build",
    "dist",
    "runs",
    ".pytest_cache",
)


def run(
    args: list[str | Path],
    *,
    env_extra: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """Run a command offline and quietly; fail the test with its output if it fails.

    The default working directory is a neutral one: `python -c` puts the current
    directory first on sys.path, and from the checkout that would shadow the install.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PIP_NO_INDEX="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        LM_EVAL_DVOTING_DISABLE_HOOK="",
    )
    env.update(env_extra or {})
    proc = subprocess.run(
        [str(a) for a in args],
        env=env,
        cwd=cwd or _NEUTRAL_CWD,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        pytest.fail(f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


_NEUTRAL_CWD = Path(os.path.realpath(os.sep))


class Env:
    """A fresh venv with the plugin installed, and where things landed."""

    def __init__(self, root: Path, mode: str) -> None:
        self.mode = mode
        self.src = root / "src"
        self.venv = root / "venv"
        self.bin = self.venv / ("Scripts" if os.name == "nt" else "bin")
        self.python = self.bin / "python"

    def py(self, code: str, **kwargs) -> str:
        """Run `code` with the venv's interpreter; return its stdout."""
        return run([self.python, "-c", textwrap.dedent(code)], **kwargs).stdout

    @property
    def site_packages(self) -> Path:
        return Path(self.py("import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())


def make_env(root: Path, mode: str, *, with_parent: bool = True) -> Env:
    """Copy the repo, make a venv, install the copy in `mode` ("wheel" or "editable")."""
    env = Env(root, mode)
    shutil.copytree(REPO_ROOT, env.src, ignore=_COPY_IGNORE)
    tasks = env.src / "task_configs"
    tasks.mkdir(exist_ok=True)
    (tasks / f"{PROBE_TASK}.yaml").write_text(PROBE_YAML)

    run([sys.executable, "-m", "venv", "--without-pip", env.venv])
    if with_parent:
        parent = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
        # "zzz": read last, so the venv's own installs come first on sys.path
        (env.site_packages / "zzz_parent_site_packages.pth").write_text(
            "\n".join(sorted(parent)) + "\n"
        )
        editable = ["-e"] if mode == "editable" else []
        run(
            [
                env.python,
                "-m",
                "pip",
                "install",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "-q",
                *editable,
                env.src,
            ]
        )
    else:  # no pip, no hatchling in the venv: build here, install the wheel there
        assert mode == "wheel"
        dist = root / "dist"
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "-q",
                "-w",
                dist,
                env.src,
            ]
        )
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                env.python,
                "install",
                "--no-deps",
                "--no-index",
                "-q",
                *dist.glob("*.whl"),
            ]
        )
    if with_parent:
        # The stock `lm_eval` console script, written as pip writes it for lm-eval.
        env.bin.joinpath("lm_eval").write_text(
            f"#!{env.python}\nimport sys\nfrom lm_eval.__main__ import cli_evaluate\n"
            "sys.exit(cli_evaluate())\n"
        )
        env.bin.joinpath("lm_eval").chmod(0o755)
    return env


@pytest.fixture(scope="module", params=["wheel", "editable"])
def installed(request, tmp_path_factory) -> Env:
    return make_env(tmp_path_factory.mktemp(f"install-{request.param}"), request.param)


def test_hook_files_land_in_site_packages(installed: Env) -> None:
    site = installed.site_packages
    assert (site / "lm_eval_dvoting_hook.pth").is_file()
    if installed.mode == "wheel":
        assert (site / "_lm_eval_dvoting_startup.py").is_file()
        assert (site / "lm_eval_dvoting" / "task_configs" / f"{PROBE_TASK}.yaml").is_file()
    else:  # editable: nothing copied, everything read from the source tree
        assert not (site / "lm_eval_dvoting").exists()
        assert not (site / "_lm_eval_dvoting_startup.py").exists()


def test_import_stays_light_and_hook_waits(installed: Env) -> None:
    out = installed.py("""
        import sys
        hooked = '_lm_eval_dvoting_startup' in sys.modules
        import lm_eval_dvoting, lm_eval_dvoting.integration.plugin, lm_eval_dvoting.commands.cli
        print(hooked, 'torch' in sys.modules, 'lm_eval' in sys.modules)
    """)
    assert out.split() == ["True", "False", "False"]


def test_models_resolve_and_builtins_survive(installed: Env) -> None:
    out = installed.py("""
        from lm_eval.api.registry import get_model, model_registry
        print(get_model('dvoting-llada').__name__, get_model('dvoting-dream').__name__)
        print(get_model('dummy').__name__, 'hf' in model_registry, 'vllm' in model_registry)
    """)
    assert out.split() == ["LLaDAEvalModel", "DreamEvalModel", "DummyLM", "True", "True"]


def test_task_manager_sees_our_tasks(installed: Env) -> None:
    out = installed.py("""
        from lm_eval.tasks import TaskManager
        from lm_eval_dvoting.integration.plugin import task_dir
        print(task_dir())
        print(' '.join(TaskManager(include_defaults=False).all_tasks))
    """)
    folder, tasks = out.splitlines()
    assert PROBE_TASK in tasks.split()
    expected = (
        installed.site_packages / "lm_eval_dvoting" / "task_configs"
        if installed.mode == "wheel"
        else installed.src / "task_configs"
    )
    assert Path(folder).resolve() == expected.resolve()


def _lists_our_tasks(command: list[str | Path], **kwargs) -> None:
    out = run(command, **kwargs).stdout
    assert PROBE_TASK in out
    assert "gsm8k" in out  # built-in tasks are still there


def test_stock_console_script_lists_our_tasks(installed: Env) -> None:
    # Each stock CLI run indexes all ~15k built-in task YAMLs (~30 s of CPU), so the
    # default suite runs one; the fast TaskManager test above covers both modes.
    if installed.mode != "wheel":
        pytest.skip("editable mode: see test_python_m_lm_eval_lists_our_tasks (slow)")
    _lists_our_tasks([installed.bin / "lm_eval", "ls", "tasks"])


@pytest.mark.slow
def test_python_m_lm_eval_lists_our_tasks(installed: Env) -> None:
    _lists_our_tasks([installed.python, "-m", "lm_eval", "ls", "tasks"])


@pytest.mark.slow
def test_dvoting_eval_wrapper_lists_our_tasks(installed: Env) -> None:
    # the explicit fallback works with the start-up hook switched off
    _lists_our_tasks(
        [installed.bin / "dvoting", "eval", "ls", "tasks"],
        env_extra={"LM_EVAL_DVOTING_DISABLE_HOOK": "1"},
    )


def test_dvoting_console_script(installed: Env) -> None:
    out = run([installed.bin / "dvoting", "tasks-dir"]).stdout.strip()
    assert (Path(out) / f"{PROBE_TASK}.yaml").is_file()


def test_disable_env_turns_hook_off(installed: Env) -> None:
    out = installed.py(
        """
        import sys
        from lm_eval.api.registry import get_model, model_registry
        get_model('dummy')
        print('dvoting-llada' in model_registry)
        from lm_eval_dvoting.integration import plugin
        plugin.register()  # the explicit fallback `dvoting eval` uses
        print(get_model('dvoting-llada').__name__)
    """,
        env_extra={"LM_EVAL_DVOTING_DISABLE_HOOK": "1"},
    )
    assert out.split() == ["False", "LLaDAEvalModel"]


def test_accelerate_launch_uses_same_interpreter(installed: Env, tmp_path: Path) -> None:
    if installed.mode != "wheel":
        pytest.skip("one install mode is enough: this checks accelerate, not the install")
    import accelerate  # noqa: F401 - a hard dependency: missing, it must fail loudly

    script = tmp_path / "probe.py"
    script.write_text(
        "import sys\nfrom lm_eval.api.registry import get_model\n"
        "print(sys.executable, get_model('dvoting-llada').__name__)\n"
    )
    out = run(
        [
            installed.python,
            "-m",
            "accelerate.commands.launch",
            "--cpu",
            "--num_processes",
            "1",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            script,
        ],
        env_extra={"ACCELERATE_USE_CPU": "1", "HOME": str(tmp_path)},
    ).stdout
    executable, name = out.strip().splitlines()[-1].rsplit(" ", 1)
    assert name == "LLaDAEvalModel"
    assert Path(executable).parent == installed.bin


def test_startup_without_lm_eval(tmp_path: Path) -> None:
    """A venv with the plugin but without lm-eval (or torch): start-up is unharmed."""
    env = make_env(tmp_path, "wheel", with_parent=False)
    proc = run(
        [
            env.python,
            "-c",
            textwrap.dedent("""
        import sys
        print('_lm_eval_dvoting_startup' in sys.modules)
        try:
            import lm_eval.api.registry
        except ModuleNotFoundError as exc:
            print(exc.name)
    """),
        ]
    )
    assert proc.stdout.split() == ["True", "lm_eval"]
    assert proc.stderr == ""
