"""The package's structure as the next contributor reads it: modules per folder, the
longest functions, and the circles in the import graph.

    python tools/structure.py            # all three reports
    python tools/structure.py --check    # exit 1 on an import circle, a layer crossed
                                         # or a function over the limit (tests run this)

Every import counts, a function-local one too: a local import only delays a circle.
Layers, lowest first: `core` and `models` (the algorithm and the networks) import no
`integration` (lm-eval) or `commands` module; `integration` imports no `commands` module.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "lm_eval_dvoting"
MAX_FUNCTION_LINES = 40
# folder -> folders it must not import from
FORBIDDEN = {
    "core": ("integration", "commands"),
    "models": ("integration", "commands"),
    "integration": ("commands",),
}
# functions allowed over the limit, each with its reason ("path::name": reason)
LONG_FUNCTION_EXCEPTIONS: dict[str, str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_files(*roots: str) -> list[Path]:
    """The .py files under `roots`, but in hidden folders (bench/.fastdllm/: others' code)."""
    found = (p for root in roots for p in (ROOT / root).rglob("*.py"))
    return sorted(
        p for p in found if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
    )


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package modules `path` imports anywhere in it (a package counts as its __init__)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in modules and name != PACKAGE}


def import_graph() -> dict[str, set[str]]:
    files = package_files(PACKAGE)
    modules = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, modules) - {module_name(p)} for p in files}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else ""


def crossings(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{source} imports {target}"
        for source, targets in graph.items()
        for target in targets
        if layer_of(target) in FORBIDDEN.get(layer_of(source), ())
    )


def long_functions(roots: tuple[str, ...], limit: int) -> list[tuple[int, str]]:
    rows = []
    for path in package_files(*roots):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    rows.append((length, f"{path.relative_to(ROOT)}::{node.name}"))
    return sorted(rows, reverse=True)


def modules_per_folder() -> dict[str, tuple[int, int]]:
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for path in package_files(PACKAGE):
        folder = str(path.parent.relative_to(ROOT))
        counts[folder][0] += 1
        counts[folder][1] += len(path.read_text().splitlines())
    return {folder: (n, lines) for folder, (n, lines) in sorted(counts.items())}


CHECKED_ROOTS = (PACKAGE, "bench", "tools")


def report() -> None:
    print("modules per folder (files, lines):")
    for folder, (n, lines) in modules_per_folder().items():
        print(f"  {folder:<40} {n:>3} {lines:>6}")
    print(f"\nfunctions over {MAX_FUNCTION_LINES} lines:")
    for length, name in long_functions(CHECKED_ROOTS, MAX_FUNCTION_LINES):
        print(f"  {length:>4}  {name}")
    graph = import_graph()
    print("\nimport circles:", circles(graph) or "none")
    print("layer crossings:", crossings(graph) or "none")


def problems() -> list[str]:
    graph = import_graph()
    found = [f"import circle: {' <-> '.join(c)}" for c in circles(graph)]
    found += [f"layer crossed: {c}" for c in crossings(graph)]
    found += [
        f"function of {length} lines (limit {MAX_FUNCTION_LINES}): {name}"
        for length, name in long_functions(CHECKED_ROOTS, MAX_FUNCTION_LINES)
        if name not in LONG_FUNCTION_EXCEPTIONS
    ]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 on any problem")
    args = parser.parse_args(argv)
    if not args.check:
        report()
        return 0
    found = problems()
    print("\n".join(found) or "structure: no circle, no layer crossed, no long function")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
