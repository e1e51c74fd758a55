"""Hatchling build hook: what the editable wheel force-includes.

The normal wheel force-includes the start-up `.pth` file and copies `task_configs/`
into the package. An editable install must get the `.pth` file too (it is what makes
the stock lm-eval CLI see the plugin), but no copies of `task_configs/` or of the
start-up module: both are then read from the source tree (on sys.path through the
editable install's own `_lm_eval_dvoting.pth`, which `site` reads first as it sorts
the names), so edits apply without reinstalling.
"""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

HOOK_PTH = "lm_eval_dvoting_hook.pth"


class EditableIncludes(BuildHookInterface):
    """Restrict the editable wheel's force-include to the start-up hook file."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name == "wheel" and version == "editable":
            build_data["force_include_editable"] = {HOOK_PTH: HOOK_PTH}
