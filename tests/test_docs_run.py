"""The docs run as written (issue 34): every command in a code block of README.md and docs/*.md is executed, in
the order a reader meets it, or is marked right by it as needing what a CPU test machine has not: a GPU, a
network (downloads, installs) or a cluster.

How a page runs:

- The README's tour runs as one sequence in a fresh directory that looks like a checkout (`recipes/`,
  `examples/`, `benchmarks/`, ... linked from the repository; no `runs/`). Every other page then runs in a
  copy of what the tour left behind, as a reader who took the tour would have it (`runs/quickstart`, the
  tour's sweep), so the tour's training is shared and each page trains only what it shows.
- What a reader brings along is made by the test: `photos/` and `cat.jpg` (images to predict), and
  `data/pets/{train,val}/<class>/` (an image folder to convert).
- A real run would take minutes, so the test appends tiny overrides to the documented command (the command
  itself is the one the page shows): `train` and `sweep` get `trainer.max_duration=1ep
  trainer.train_subset_num_batches=2 trainer.eval_subset_num_batches=2`, `bench` and `profile` two steps
  (see TINY).
- `dlrecipes ...` runs in a process forked from a server that has imported torch and Composer once (a fresh
  process per command: its own exit code, output, plugins and working directory, without 6 s of imports each);
  anything else runs through bash.
- A command passes when it exits 0, or, shown in a `$ ` transcript followed by `error: ...`, when it exits 2
  with that error. Key facts (files a command says it writes) are checked; the exact output is not, as it is
  free to change.

How a command is marked as not runnable here: its shell comment says `needs` and names a GPU, a network or a
cluster (`# needs two GPUs and a network (CIFAR-10)`), or an HTML comment on the line above its code block
says so for the whole block (`<!-- docs test: needs a network (installs packages) -->`). A benchmark script
(minutes even at its smallest) says which test runs it at tiny sizes (`# ... (tests/test_benchmarks.py runs it
at tiny sizes)`; that test must name the script), or that it is `a measurement of minutes`
(benchmarks/time_to_accuracy.py: about a minute with one epoch, on 2 cores).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import forked
from .conftest import REPO, image_folders

NEEDS = re.compile(r"\bneeds\b.*?\b(GPUs?|network|cluster)\b")
RUN_ELSEWHERE = re.compile(r"\b(tests/test_\w+\.py) runs it\b")
MEASUREMENT = re.compile(r"\ba measurement of minutes\b")
TINY_TRAINING = ["trainer.max_duration=1ep", "trainer.train_subset_num_batches=2", "trainer.eval_subset_num_batches=2"]
TINY = {  # appended to a documented command whose real run takes minutes
    ("dlrecipes", "train"): TINY_TRAINING,
    ("dlrecipes", "sweep"): TINY_TRAINING,
    ("dlrecipes", "bench"): ["--steps", "2", "--rounds", "2", "--warmup", "1"],
    ("dlrecipes", "profile"): ["--batch", "2", "--warmup", "1", "--repeats", "1"],
}
NOT_RUN_HERE = {  # pages whose commands this test leaves alone, and why
    "docs/benchmarks.md": "generated from BENCHMARKS.md: a record of measurements (each command took minutes or "
    "a GPU); tests/test_benchmarks.py runs the scripts at tiny sizes",
}
CHECKOUT = ["recipes", "examples", "benchmarks", "scripts", "tests", "requirements", "cli.py", "pyproject.toml"]


@dataclass
class Command:
    page: str
    line: int
    text: str  # as the page shows it (continuations joined), shell comment included
    words: list[str]  # without the comment
    error: str = ""  # the error a transcript shows after it
    needs: str = ""  # why it is not run here


def _pages() -> list[str]:
    """README.md, then the site's pages in the order of its navigation."""
    nav = re.findall(r":\s*([\w/-]+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), flags=re.M)
    return ["README.md", *(f"docs/{page}" for page in nav)]


def commands(page: str) -> list[Command]:
    """The commands of a page's shell code blocks (and `$ ` transcripts), with what marks them."""
    found, lines = [], (REPO / page).read_text().splitlines()
    fence = None
    for number, line in enumerate(lines, 1):
        if not line.startswith("```"):
            continue
        if fence is None:
            fence = number
            continue
        language, body, start = lines[fence - 1][3:].strip(), lines[fence : number - 1], fence
        fence = None
        above = next((lines[i].strip() for i in range(start - 2, -1, -1) if lines[i].strip()), "")
        block_needs = NEEDS.search(above) if above.startswith("<!--") else None
        transcript = language == "" and any(b.startswith("$ ") for b in body)
        if language not in ("bash", "sh", "console") and not transcript:
            continue
        joined: list[tuple[int, str]] = []
        for i, text in enumerate(body):
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1].rstrip() + " " + text.strip())
            else:
                joined.append((start + 1 + i, text))
        for i, (at, text) in enumerate(joined):
            if transcript and not text.startswith("$ "):
                continue
            text = text.removeprefix("$ ").strip()
            words, comment = shlex.split(text, comments=True), _comment(text)
            if not words:
                continue
            after = joined[i + 1][1].strip() if transcript and i + 1 < len(joined) else ""
            error = after.removeprefix("error: ") if after.startswith("error: ") else ""
            needs = NEEDS.search(comment) or block_needs or RUN_ELSEWHERE.search(comment) or MEASUREMENT.search(comment)
            found.append(Command(page, at, text, words, error, needs.group(0) if needs else ""))
    return found


def _comment(line: str) -> str:
    """A shell line's comment: from the first `#` outside quotes that starts a word."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[i + 1 :].strip()
    return ""


def test_every_command_in_the_docs_is_run_or_marked():
    """Each page is run here or named in NOT_RUN_HERE with a reason; a command marked as run by another test is
    named by that test; the tour is there."""
    pages = _pages()
    on_disk = {"README.md", *(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))}
    assert on_disk <= set(pages) and set(NOT_RUN_HERE) <= on_disk, on_disk ^ set(pages)
    everything = [c for page in pages if page not in NOT_RUN_HERE for c in commands(page)]
    for command in everything:
        elsewhere = RUN_ELSEWHERE.search(command.needs)
        if elsewhere:
            script = next(w for w in command.words if w.endswith(".py"))
            assert Path(script).name in (REPO / elsewhere.group(1)).read_text(), f"{command.page}:{command.line}"
    tour = [c for c in everything if c.page == "README.md" and not c.needs]
    assert len(tour) >= 8 and tour[0].words[:2] == ["dlrecipes", "train"], [c.text for c in tour]
    assert len([c for c in everything if not c.needs]) >= 30
    sample = (REPO / "README.md").read_text().split("\n```\nrun ", 1)[1].split("```", 1)[0]
    shown = re.findall(r"runs/(\S+?)[\s;]", sample)
    assert len(set(shown)) == 1 and re.fullmatch(r"quickstart-\d{8}-\d{6}", shown[0]), shown  # train's default


# ---- running them -------------------------------------------------------------------------------------------


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else "(nothing: the process ended before writing)"


def _run(command: Command, workspace: Path, timeout: int = 300) -> tuple[int, str, str]:
    words = list(command.words)
    key = (words[0], words[1]) if len(words) > 1 else (words[0], "")
    words += TINY.get(key, [])
    out, err = workspace / ".docs-test.out", workspace / ".docs-test.err"
    if words[0] == "dlrecipes":
        child = forked.start(words[1:], workspace, out, err)
        try:
            ended = child.wait(timeout)
        except subprocess.TimeoutExpired:  # a new Python's (DLRECIPES_TEST_FORK=0) way of saying it
            ended = None
        if ended is None:
            child.kill()
            child.wait()
            return 124, _read(out), _read(err) + f"\n(killed after {timeout} s)"
        return child.returncode, _read(out), _read(err)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        ["bash", "-c", shlex.join(words)], cwd=workspace, capture_output=True, text=True, timeout=timeout, env=env
    )
    return result.returncode, result.stdout, result.stderr


def run_page(page: str, workspace: Path) -> tuple[list[str], dict[str, tuple[int, str, str]]]:
    """Run a page's unmarked commands in order; the failures, and each command's (exit code, stdout, stderr)."""
    failures, results = [], {}
    for command in commands(page):
        if command.needs:
            continue
        started = time.monotonic()
        code, out, err = results[command.text] = _run(command, workspace)
        print(f"{time.monotonic() - started:5.1f}s exit {code}  {page}:{command.line}  {command.text[:90]}")
        expected = 2 if command.error else 0
        shown = command.error.removesuffix("...").removesuffix(", ").strip()[:60]
        if code != expected or (shown and not err.startswith(f"error: {shown}")):
            failures.append(
                f"{page}:{command.line}: `{command.text}` exited {code} (expected {expected}"
                f"{', error: ' + shown if shown else ''}):\n{(out + err)[-1500:]}"
            )
    return failures, results


def _checkout(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name in CHECKOUT:
        (path / name).symlink_to(REPO / name)
    photos = image_folders(path / "reader", ["a"], per_class=2)
    shutil.move(photos / "train" / "a", path / "photos")
    shutil.move(photos / "val" / "a" / "0.jpg", path / "cat.jpg")
    shutil.rmtree(path / "reader")
    image_folders(path / "data" / "pets", ["cat", "dog"], per_class=3, size=(48, 40))
    return path


@pytest.fixture(scope="session")
def tour(tmp_path_factory):
    """The README's tour, run once in a fresh checkout-like directory: (that directory, failures, results)."""
    workspace = _checkout(tmp_path_factory.mktemp("tour") / "dlrecipes")
    failures, results = run_page("README.md", workspace)
    return workspace, failures, results


@pytest.mark.slow
def test_the_readme_tour_runs_as_written(tour):
    workspace, failures, results = tour
    assert not failures, "\n\n".join(failures)
    train = next(r for text, r in results.items() if text.startswith("dlrecipes train recipes/quickstart.yaml run_"))
    assert train[1].startswith("run runs/quickstart |") or "run runs/quickstart |" in train[1] + train[2]
    assert (workspace / "runs" / "quickstart" / "checkpoints" / "latest-rank0.pt").is_file()
    assert (workspace / "runs" / "quickstart" / "eval").is_dir()  # eval's report
    assert len(list((workspace / "runs").glob("quickstart-sweep/*/summary.json"))) >= 2
    assert (workspace / "runs" / "quickstart-sweep" / "summary.csv").is_file()


PAGES = [page for page in _pages()[1:] if page not in NOT_RUN_HERE and any(not c.needs for c in commands(page))]


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_a_docs_page_runs_as_written(page, tour, tmp_path):
    """The page's commands, in order, where a reader who took the README's tour would run them."""
    workspace = tmp_path / "dlrecipes"
    shutil.copytree(tour[0], workspace, symlinks=True)
    failures, _ = run_page(page, workspace)
    assert not failures, "\n\n".join(failures)
    written = {
        "docs/after-training.md": ["preds.csv", "runs/quickstart/export/model.onnx"],
        "docs/seeing-the-run.md": ["compare.png"],
        "docs/fast-data-loading.md": ["data/pets/.dlrecipes-cache/train-256.npy", "data/pets_ffcv/train.beton"],
        "docs/recipes.md": ["runs/exp1/checkpoints/best.pt", "runs/exp2/summary.json"],
    }
    missing = [name for name in written.get(page, []) if not (workspace / name).exists()]
    assert not missing, f"{page}: its commands should have written {missing}"
