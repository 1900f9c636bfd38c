"""The docs: a README that starts right, a site that builds without a broken link and shows in a browser what
its Markdown says, reference pages that match the code, and every recipe command they show valid (they run
as written in tests/test_docs_run.py)."""

from __future__ import annotations

import html
import html.parser
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
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


def test_ci_runs_the_readme_test_command():
    """.ci/run installs and runs exactly the README's second command (chromium included: it renders the site
    for test_the_site_shows_what_the_markdown_says), and Getting started shows the README's two commands."""
    readme = (REPO / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.startswith("apt-get ")]
    assert len(readme) == 2 and ci == [readme[1]] and " chromium " in readme[1]
    assert "\n".join(readme) in (REPO / "docs" / "getting-started.md").read_text()


def test_the_docs_show_recipe_commands():
    assert len(COMMANDS) >= 15 and any(path.startswith("docs/") for path, _, _ in COMMANDS)


@pytest.mark.parametrize("path, command, error", COMMANDS, ids=[f"{p}:{i}" for i, (p, _, _) in enumerate(COMMANDS)])
def test_every_recipe_command_in_the_docs_validates(path, command, error):
    """Each validates, or, shown with its error, fails with that error (as far as the docs print it)."""
    from dlrecipes.api import resolve
    from dlrecipes.errors import UserError

    words = shlex.split(command, comments=True)
    words = words[words.index("dlrecipes") + 2 :] if "dlrecipes" in words else words[2:]
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
        resolve(
            REPO / recipe,
            overrides,
            [str(REPO / p) for p in plugins],
            check_device="device" in error.lower() or "gpu" in error.lower(),
            check_data=False,
        )
    assert str(raised.value).startswith(error.removesuffix("...").removesuffix(", ").strip()[:60]), str(raised.value)


@pytest.mark.parametrize(
    "override",
    [
        "trainer.device=gpu",
        "trainer.precision=amp_bf16",
        "trainer.device_train_microbatch_size=auto",
        "trainer.fsdp={}",
    ],
)
def test_a_gpu_recipe_checked_without_a_gpu_points_at_skip_device_check(override, monkeypatch):
    """The README's tour validates a GPU recipe; on a laptop each "needs a GPU" error says how to check the
    rest of the recipe there, in its one line."""
    import torch

    from dlrecipes.api import resolve
    from dlrecipes.errors import UserError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError) as raised:
        resolve(REPO / "recipes" / "quickstart.yaml", ["trainer.device=auto", override], check_data=False)
    message = str(raised.value)
    assert "--skip-device-check" in message and "\n" not in message and len(message) < 1000, message
    resolve(
        REPO / "recipes" / "quickstart.yaml", ["trainer.device=auto", override], check_device=False, check_data=False
    )


def test_validate_without_a_gpu_says_so_in_one_line_and_skip_device_check_passes():
    """The tour's `dlrecipes validate recipes/imagenet100_fast.yaml --no-data-check` on a machine without a GPU
    (CUDA hidden): exit 2, one line naming --skip-device-check; with it, the recipe validates."""
    hidden = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, "-m", "dlrecipes", "validate", "recipes/imagenet100_fast.yaml", "--no-data-check"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, env=hidden)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: trainer.device: ") and result.stderr.count("\n") == 1, result.stderr
    assert "--skip-device-check" in result.stderr and len(result.stderr) < 1000
    result = subprocess.run(
        [*command, "--skip-device-check"], cwd=REPO, capture_output=True, text=True, timeout=120, env=hidden
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_reference_pages_match_the_code():
    result = subprocess.run(
        [sys.executable, "scripts/reference_docs.py", "--check"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr


NO_MKDOCS = importlib.util.find_spec("mkdocs") is None
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The docs site, built as CI and `mkdocs build --strict` build it."""
    site = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return site


@pytest.mark.skipif(NO_MKDOCS, reason="the docs extra is not installed")
def test_the_site_builds_strictly(site):
    assert (site / "reference" / "recipe" / "index.html").is_file()


@pytest.mark.skipif(NO_MKDOCS, reason="the docs extra is not installed (pip install -e '.[docs]')")
@pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (apt-get install -y chromium): "
    "the built site is not rendered as a reader sees it",
)
def test_the_site_shows_what_the_markdown_says(site):
    """Every page of the built site, rendered by headless Chromium, shows its Markdown's code (blocks and
    spans), its placeholders (`<model>`, `&lt;run dir&gt;`) and its tables cell by cell: nothing swallowed as an
    HTML tag, nothing turned into emphasis (the generated reference once showed "the network: {name: ,
    ...params}")."""
    sources = sorted((REPO / "docs").rglob("*.md"))
    pages = {source: site / source.relative_to(REPO / "docs").with_suffix("") / "index.html" for source in sources}
    pages[REPO / "docs" / "index.md"] = site / "index.html"
    assert all(page.is_file() for page in pages.values()), [str(p) for p in pages.values() if not p.is_file()]
    doms = _render_in_chromium([page.as_uri() for page in pages.values()])
    problems = []
    for source, page in pages.items():
        fragments, tables = _what_the_markdown_shows(source.read_text())
        text, shown_tables = _what_the_page_shows(doms[page.as_uri()])
        name = source.relative_to(REPO)
        problems += [f"{name}: not shown: {f!r}" for f in fragments if f not in text]
        if len(tables) != len(shown_tables):
            problems.append(f"{name}: {len(tables)} tables in the Markdown, {len(shown_tables)} on the page")
            continue
        for table, shown in zip(tables, shown_tables):
            for row, shown_row in zip(table, shown):
                problems += [
                    f"{name}: table cell {cell!r} shows as {got!r}" for cell, got in zip(row, shown_row) if cell != got
                ]
            if [len(r) for r in table] != [len(r) for r in shown]:
                problems.append(f"{name}: table starting {table[0]} has other rows or columns on the page")
    assert not problems, "\n".join(problems[:40])


def _normal(text: str) -> str:
    return " ".join(text.split())


def _visible(markdown: str) -> str:
    """The text inline Markdown shows: code spans verbatim, link texts, escapes and entities resolved."""
    parts = re.split(r"(`+)(.+?)\1", markdown, flags=re.S)
    shown = []
    for i in range(0, len(parts), 3):
        text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", parts[i]).replace("**", "")
        shown.append(html.unescape(re.sub(r"\\(.)", r"\1", text)))
        if i + 2 < len(parts):
            shown.append(parts[i + 2].strip(" ").replace("\\|", "|"))
    return _normal("".join(shown))


def _what_the_markdown_shows(markdown: str) -> tuple[list[str], list[list[list[str]]]]:
    """A page's code lines, code spans and placeholders (text that must appear as written), and its tables."""
    markdown = re.sub(r"<!--.*?-->", "", markdown, flags=re.S)
    fragments: list[str] = []
    tables: list[list[list[str]]] = []
    prose: list[str] = []
    in_code, in_table = False, False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            in_code, in_table = not in_code, False
            continue
        if in_code:
            fragments += [_normal(line)] if line.strip() else []
            continue
        if line.strip().startswith("|"):
            cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
            if not in_table:
                tables.append([])
            in_table = True
            if not all(re.fullmatch(r"\s*:?-+:?\s*", c) for c in cells):
                tables[-1].append([_visible(c) for c in cells])
            continue
        in_table = False
        prose.append(line)
    for paragraph in "\n".join(prose).split("\n\n"):
        fragments += [_normal(code) for _, code in re.findall(r"(`+)(.+?)\1", paragraph, flags=re.S)]
        outside = re.sub(r"(`+)(.+?)\1", " ", paragraph, flags=re.S)
        fragments += [html.unescape(p) for p in re.findall(r"&lt;[^&\n]+?&gt;|<(?![!/])[^<>\n]+>", outside)]
    for table in tables:
        for row in table:
            for cell in row:
                outside = re.sub(r"(`+)(.+?)\1", " ", cell)
                fragments += re.findall(r"<[^<>]+>", outside)  # a cell's placeholders, named on their own too
    return [f for f in fragments if f], tables


class _Page(html.parser.HTMLParser):
    """The text of a rendered page's article, and its tables' cells."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth, self.skip = 0, 0
        self.text: list[str] = []
        self.tables: list[list[list[str]]] = []
        self.cell: list[str] | None = None

    BLOCKS = {"p", "li", "td", "th", "tr", "pre", "div", "br", "h1", "h2", "h3", "h4", "h5", "h6", "table", "ul", "ol"}

    def handle_starttag(self, tag, attrs):
        if tag in self.BLOCKS:
            self.text.append(" ")
        if tag == "article":
            self.depth += 1
        elif tag in ("script", "style"):
            self.skip += 1
        elif self.depth and tag == "table":
            self.tables.append([])
        elif self.depth and tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif self.depth and tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if tag in self.BLOCKS:
            self.text.append(" ")
        if tag == "article":
            self.depth -= 1
        elif tag in ("script", "style"):
            self.skip -= 1
        elif tag in ("td", "th") and self.cell is not None and self.tables and self.tables[-1]:
            self.tables[-1][-1].append(_normal("".join(self.cell)))
            self.cell = None

    def handle_data(self, data):
        if self.depth and not self.skip:
            self.text.append(data)
            if self.cell is not None:
                self.cell.append(data)


def _what_the_page_shows(dom: str) -> tuple[str, list[list[list[str]]]]:
    page = _Page()
    page.feed(dom)
    return _normal("".join(page.text)), page.tables


def _render_in_chromium(urls: list[str]) -> dict[str, str]:
    """The DOM of each page after Chromium has parsed and scripted it: one headless browser, driven over the
    DevTools protocol on a pipe (fd 3 in, fd 4 out), with every host name unresolvable (the site is local; the
    theme's web fonts would otherwise wait for DNS)."""
    to_chromium, chromium_in = os.pipe()
    chromium_out, from_chromium = os.pipe()

    def on_fds_3_and_4():
        inherited = os.dup(to_chromium), os.dup(from_chromium)  # dup2 onto the same number keeps close-on-exec
        os.dup2(inherited[0], 3)
        os.dup2(inherited[1], 4)

    browser = subprocess.Popen(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-pipe",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "about:blank",
        ],
        preexec_fn=on_fds_3_and_4,
        close_fds=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(to_chromium)
    os.close(from_chromium)
    commands, replies = os.fdopen(chromium_in, "wb", buffering=0), os.fdopen(chromium_out, "rb", buffering=0)
    pending, counter = b"", iter(range(1, 1_000_000))

    def call(method: str, params: dict | None = None, session: str | None = None) -> dict:
        nonlocal pending
        number = next(counter)
        commands.write(
            json.dumps(
                {"id": number, "method": method, "params": params or {}, **({"sessionId": session} if session else {})}
            ).encode()
            + b"\0"
        )
        while True:
            while b"\0" not in pending:
                chunk = replies.read(1 << 16)
                assert chunk, f"chromium closed its DevTools pipe (exit {browser.poll()})"
                pending += chunk
            message, pending = pending.split(b"\0", 1)
            reply = json.loads(message)
            if reply.get("id") == number:
                assert "error" not in reply, (method, reply["error"])
                return reply["result"]

    def evaluate(expression: str, session: str):
        return call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)["result"]["value"]

    doms = {}
    try:
        target = call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for url in urls:
            call("Page.navigate", {"url": url}, session)
            deadline = time.monotonic() + 30
            while not (
                evaluate("location.href", session) == url
                and evaluate("document.readyState", session) in ("interactive", "complete")
            ):
                assert time.monotonic() < deadline, f"chromium did not load {url}"
                time.sleep(0.01)
            doms[url] = evaluate("document.documentElement.outerHTML", session)
        call("Browser.close")
        browser.wait(timeout=30)
    finally:
        if browser.poll() is None:
            browser.kill()
            browser.wait()
        commands.close()
        replies.close()
    return doms
