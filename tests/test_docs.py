"""The docs: a README that starts right, a site that builds without a broken link, reference pages that
match the code, and every recipe command they show valid."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

DOC_FILES = [REPO / "README.md", *sorted(p for p in (REPO / "docs").rglob("*.md") if "reference" not in p.parts)]
RECIPE_COMMAND = re.compile(r"^(?:\$ )?(?:\.venv/bin/)?dlrecipes (train|validate|show) ")
FLAGS_WITH_VALUES = {"--plugin"}


def _commands() -> list[tuple[str, str, str]]:
    """(file, command, the error it shows) for every `dlrecipes train|validate|show ...` line in a code block of
    the docs; a `$ ` transcript followed by an `error: ...` line shows a mistake, and that error."""
    found = []
    for path in DOC_FILES:
        language, block = None, []
        for line in path.read_text().splitlines():
            if line.startswith("```"):
                if language is None:
                    language, block = line[3:].strip(), []
                    continue
                if language in ("", "bash", "sh", "console"):
                    joined = "\n".join(block).replace("\\\n", " ").splitlines()
                    for i, command in enumerate(joined):
                        if RECIPE_COMMAND.match(command.strip()):
                            after = joined[i + 1].strip() if i + 1 < len(joined) else ""
                            shown = after.removeprefix("error: ") if after.startswith("error: ") else ""
                            found.append((str(path.relative_to(REPO)), command.strip(), shown))
                language = None
            elif language is not None:
                block.append(line)
    return found


COMMANDS = _commands()


def test_the_readme_is_short_and_starts_with_the_commands():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < 300
    head = text.split("## ", 1)[0]
    assert "pip install" in head and "dlrecipes train recipes/quickstart.yaml" in head and "pytest" in head
    assert "done: " in head and "docs/quickstart_accuracy.png" in head  # what a run shows


def test_the_docs_show_recipe_commands():
    assert len(COMMANDS) >= 15 and any(path.startswith("docs/") for path, _, _ in COMMANDS)


@pytest.mark.parametrize("path, command, error", COMMANDS, ids=[f"{p}:{i}" for i, (p, _, _) in enumerate(COMMANDS)])
def test_every_recipe_command_in_the_docs_validates(path, command, error):
    """Each validates, or, shown with its error, fails with that error (as far as the docs print it)."""
    from dlrecipes.api import resolve
    from dlrecipes.errors import UserError

    words = shlex.split(command, comments=True)
    words = words[words.index("dlrecipes") + 2:] if "dlrecipes" in words else words[2:]
    recipe, overrides, plugins = None, [], []
    skip_next = False
    for i, word in enumerate(words):
        if skip_next:
            skip_next = False
            continue
        if word in FLAGS_WITH_VALUES:
            plugins.append(words[i + 1])
            skip_next = True
        elif word.startswith("-"):
            continue
        elif recipe is None:
            recipe = word
        else:
            overrides.append(word)
    assert recipe is not None and (REPO / recipe).is_file(), f"{path}: `{command}` names no shipped recipe"
    if not error:
        resolve(REPO / recipe, overrides, [str(REPO / p) for p in plugins], check_device=False, check_data=False)
        return
    with pytest.raises(UserError) as raised:
        resolve(REPO / recipe, overrides, [str(REPO / p) for p in plugins], check_device="device" in error.lower()
                or "gpu" in error.lower(), check_data=False)
    assert str(raised.value).startswith(error.removesuffix("...").removesuffix(", ").strip()[:60]), str(raised.value)


def test_the_reference_pages_match_the_code():
    result = subprocess.run([sys.executable, "scripts/reference_docs.py", "--check"], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="the docs extra is not installed")
def test_the_site_builds_strictly(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                            cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "recipe" / "index.html").is_file()
