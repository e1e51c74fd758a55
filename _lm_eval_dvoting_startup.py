"""Start-up hook: makes the stock lm-eval 0.4.13 find the dvoting models and tasks.

Imported at every interpreter start by `lm_eval_dvoting_hook.pth` in site-packages.
A top-level module, not `lm_eval_dvoting._startup`, so that interpreter start does not
pay for the package's `__init__` (whatever it imports now or later).
lm-eval 0.4.13 has no plugin discovery, so this is the only way for a plain
`lm_eval --model dvoting-llada ...` (or `python -m lm_eval`, `accelerate launch -m
lm_eval`, `lm_eval.simple_evaluate(...)`) to see the plugin.

Rules this module lives by, because it runs in *every* Python process:
- stdlib only, and only modules already loaded at start-up (`os`, `sys`): no torch,
  no lm_eval, nothing that costs time;
- it never raises: a broken plugin must not break an unrelated interpreter;
- it stays inert until lm-eval itself is imported. A meta-path finder watches for
  four lm-eval modules; right after one of them has executed, the matching function of
  `lm_eval_dvoting.integration.plugin` patches it. Once all fired, the finder removes itself.

Set `LM_EVAL_DVOTING_DISABLE_HOOK=1` to turn it off; `dvoting eval` still works then.
"""

# (no `from __future__ import annotations`: even that is an import at every start)
import os
import sys

DISABLE_ENV = "LM_EVAL_DVOTING_DISABLE_HOOK"

# the lm-eval modules patched right after they executed (`plugin.on_lm_eval_imported`); a copy
# of `lm_eval_dvoting.integration.lm_eval_seam.STARTUP_MODULES`, which names every lm-eval
# internal the plugin depends on (this module may import nothing; a test keeps them equal)
_WATCHED = (
    "lm_eval.api.registry",
    "lm_eval.config.evaluate_config",
    "lm_eval.tasks.manager",
    "lm_eval.evaluator",
)


def _report(message: str) -> None:
    """Say why the hook gave up, without ever raising (stderr may be closed)."""
    try:
        sys.stderr.write(f"lm-eval-dvoting: start-up hook skipped: {message}\n")
    except Exception:
        pass


class _RunAfterExec:
    """Loader wrapper: run the real loader, then hand the fresh module to the plugin."""

    def __init__(self, loader: object, fullname: str) -> None:
        self._loader = loader
        self._fullname = fullname

    def __getattr__(self, name: str) -> object:
        # get_source, get_filename, is_package, ... all go to the real loader
        return getattr(self._loader, name)

    def create_module(self, spec: object) -> object:
        return self._loader.create_module(spec)  # type: ignore[attr-defined]

    def exec_module(self, module: object) -> None:
        self._loader.exec_module(module)  # type: ignore[attr-defined]
        # Leave no trace: the module should look exactly as if we had never been here.
        try:
            module.__loader__ = self._loader  # type: ignore[attr-defined]
            module.__spec__.loader = self._loader  # type: ignore[attr-defined]
        except Exception:
            pass
        _FINDER.fired(self._fullname, module)


class _LmEvalWatcher:
    """Meta-path finder that only ever answers for the watched lm-eval modules."""

    def __init__(self) -> None:
        self._pending = set(_WATCHED)

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname not in self._pending:
            return None  # the common case: one dict lookup per import
        try:
            # Ask the finders after us, exactly as the import system would have.
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find_spec = getattr(finder, "find_spec", None)
                if find_spec is None:
                    continue
                spec = find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
            if spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            spec.loader = _RunAfterExec(spec.loader, fullname)
            return spec
        except Exception as exc:  # fall back to the normal import, unpatched
            _report(f"{type(exc).__name__}: {exc}")
            return None

    def fired(self, fullname: str, module: object) -> None:
        """Run the plugin's patch for `module`; drop the finder once nothing is left."""
        if fullname not in self._pending:
            return
        self._pending.discard(fullname)
        if not self._pending:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
        try:
            from lm_eval_dvoting.integration import plugin

            plugin.on_lm_eval_imported(fullname, module)
        except Exception as exc:
            _report(f"{fullname}: {type(exc).__name__}: {exc}")


_FINDER = _LmEvalWatcher()


def install() -> bool:
    """Put the watcher in front of `sys.meta_path`; returns whether it is active.

    Does nothing when disabled by the environment, when already installed, or when
    lm-eval was imported before us (then nothing can be watched any more; callers
    that import lm-eval first use `lm_eval_dvoting.integration.plugin.register()` instead).
    """
    try:
        if os.environ.get(DISABLE_ENV, "").strip().lower() not in ("", "0", "false", "no"):
            return False
        if _FINDER in sys.meta_path:
            return True
        for name in list(_FINDER._pending):
            if name in sys.modules:  # too late to watch this one
                _FINDER._pending.discard(name)
        if not _FINDER._pending:
            return False
        sys.meta_path.insert(0, _FINDER)
        return True
    except Exception as exc:
        _report(f"{type(exc).__name__}: {exc}")
        return False


install()
