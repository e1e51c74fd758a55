"""The documentation against the code (issue 41): links resolve, every model arg the harness
accepts is documented exactly once in docs/ (and every documented one is accepted), and the
README's two commands are the ones `.ci/run` runs. Fast and offline: it reads files only.

Model args are documented as table rows whose header's first cell is `model arg` (one
backticked name per row, e.g. `| `alpha` | 0.3 | ... |`); the HFLM args the harness refuses
by name are rows of a table headed `refused model arg`.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
CHECKED = [REPO / "README.md", REPO / "task_configs" / "README.md", *sorted(DOCS.rglob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_INLINE_CODE = re.compile(r"`[^`]*`")


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks (code is not linked)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        lines.append("" if fenced else line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (repeated headings get -1, -2, ...)."""
    seen: Counter[str] = Counter()
    found = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
            seen[base] += 1
    return found


def links(path: Path) -> list[str]:
    """The link targets of a Markdown file (links and images, outside code)."""
    targets = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        targets += _LINK.findall(_INLINE_CODE.sub("", line))
    return targets


def broken_link(source: Path, target: str) -> str | None:
    """Why `target`, linked from `source`, does not resolve (None: it does)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...: not checked offline
        return None
    file_part, _, anchor = target.partition("#")
    resolved = (source.parent / file_part).resolve() if file_part else source
    if not resolved.exists():
        return f"{target}: no file {resolved}"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"{target}: no heading with anchor #{anchor} in {resolved.name}"
    return None


def test_every_relative_link_resolves():
    """Every relative link (and #anchor) in README.md, task_configs/README.md and docs/."""
    broken = [
        f"{path.relative_to(REPO)}: {problem}"
        for path in CHECKED
        for target in links(path)
        if (problem := broken_link(path, target)) is not None
    ]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_link_checker_sees_links_anchors_and_code():
    """The checker itself: a link in prose is found, one in code is not, anchors are GitHub's."""
    assert slug("Key/value caches (`cache`)") == "keyvalue-caches-cache"
    assert slug("The harness's own model args") == "the-harnesss-own-model-args"
    text = "see [a](x.md#y) and ![p](p.png)\n```\n[not](code.md)\n```\n`[no](inline.md)`\n"
    assert _LINK.findall(_INLINE_CODE.sub("", "\n".join(prose_lines(text)))) == [
        "x.md#y",
        "p.png",
    ]


# ------------------------------------------------------------------ model args


def documented_args(header: str) -> Counter[str]:
    """How often each name is a row of a docs/ table whose first header cell is `header`."""
    counts: Counter[str] = Counter()
    for path in sorted(DOCS.rglob("*.md")):
        in_table = False
        for line in prose_lines(path.read_text(encoding="utf-8")):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not line.lstrip().startswith("|"):
                in_table = False
            elif cells[0] == header:
                in_table = True
            elif in_table and not set(cells[0]) <= set("-: "):
                names = re.findall(r"`([^`]+)`", cells[0])
                assert len(names) == 1, f"{path.name}: one model arg per row, got {line!r}"
                counts[names[0]] += 1
    return counts


def test_every_model_arg_is_documented_once_and_every_documented_one_is_accepted():
    """The harness's model args (its generated signature) against the docs' tables."""
    from lm_eval_dvoting.integration.harness import DVotingEvalModel, accepted_model_args

    accepted = set(accepted_model_args())
    signature = DVotingEvalModel.__init__.__signature__  # type: ignore[attr-defined]
    assert set(signature.parameters) - {"self"} == accepted
    documented = documented_args("model arg")
    missing = sorted(accepted - set(documented))
    assert not missing, (
        f"model args the harness accepts but docs/ does not document: {missing}; add a row "
        "to a `| model arg | ... |` table (decoding settings: docs/STRATEGIES.md)"
    )
    twice = sorted(name for name, count in documented.items() if count > 1)
    assert not twice, f"model args documented more than once in docs/: {twice}"
    unknown = sorted(set(documented) - accepted)
    assert not unknown, (
        f"model args documented in docs/ that the harness does not accept: {unknown}: drop "
        "their rows or fix their names"
    )


def test_the_refused_hflm_args_are_the_ones_documented_as_refused():
    """`offload_folder` and `delta` are refused with their own messages: documented so."""
    from lm_eval_dvoting.integration import harness

    documented = documented_args("refused model arg")
    assert set(documented) == set(harness._REFUSED_HFLM_ARGS)
    assert max(documented.values()) == 1


# ------------------------------------------------------------------ the two commands


def readme_block_after(marker: str) -> str:
    """The first fenced block after `marker` in README.md, which must come before any other
    block (the two commands are the README's first)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL)
    start = text.index(marker)
    block = re.search(r"```[a-z]*\n(.*?)```", text[start:], re.DOTALL)
    assert block is not None, f"README.md: no code block after {marker!r}"
    assert block.group(1) in blocks[:2], f"README.md: {marker!r}'s command is not among the first"
    return block.group(1).strip()


def ci_commands() -> list[str]:
    """The install and test command lines `.ci/run` runs."""
    lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if re.match(r"^\s*(pip|python)\b", line)]


def test_the_readme_commands_are_the_ones_ci_runs():
    """Install + demo, then the tests: the pip commands and the pytest command of .ci/run."""
    install = [part.strip() for part in readme_block_after("**Install and run").split(" && ")]
    tests = readme_block_after("**Run the tests:**")
    ci = ci_commands()
    ci_install = [line for line in ci if line.startswith("pip ")]
    assert [p for p in install if p.startswith("pip ")] == ci_install, (install, ci)
    assert [shlex.split(tests)] == [shlex.split(line) for line in ci if "pytest" in line]
    assert install[-1].startswith("dvoting compare "), install
    demo = (DOCS / "DEMO.md").read_text(encoding="utf-8")
    assert f"```bash\n{install[-1]}\n```" in demo, "docs/DEMO.md shows another demo command"


def _is_guide(path: Path) -> bool:
    """A page written by hand (not the README, not a file a command writes)."""
    text = path.read_text(encoding="utf-8")
    generated = text.startswith("Written by") or "Written by `" in text[:200]
    return path.parent != REPO and not generated


@pytest.mark.parametrize(
    "path", [p for p in CHECKED if _is_guide(p)], ids=lambda p: str(p.relative_to(REPO))
)
def test_each_guide_starts_with_what_it_is_for(path):
    """A page under docs/ (not a generated one) says what it is for before anything else."""
    text = path.read_text(encoding="utf-8")
    first = [line for line in text.splitlines()[1:] if line.strip()][0]
    assert text.startswith("# ") and first and not first.startswith(("#", "|", "```")), path
