"""What `dlrecipes train` prints: in a pseudo-terminal at 80 and 200 columns, and piped."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import termios

import pytest

from dlrecipes.loggers.terminal import fit_line

from . import forked
from .conftest import REPO, run_cli

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
FIELDS = [
    ("loss 0.1234", "loss 0.123"),
    ("top1 0.9312", "top1 0.931"),
    ("lr 1.20e-03", "lr 1.2e-03"),
    ("12,345 img/s", "12.3k/s"),
    ("ETA 1:02:03", "1:02:03"),
]


@pytest.mark.parametrize("width", [72, 80, 100, 120, 200])
def test_the_live_line_fits_and_never_drops_a_field(width):
    """A long run (100 epochs of 1,000 batches): the bar goes first, then the long labels."""
    line = fit_line(("train epoch 12/100", "ep 12/100"), "450/1000", FIELDS, 0.5, width)
    assert len(line) <= width - 1, line
    items = [("train epoch 12/100", "ep 12/100"), ("450/1000", "450/1000"), *FIELDS]
    assert _parse_live_line(line, items) == len(items), line  # the head, the counter and every field, each whole
    assert ("━" in line) == (width >= 120)


def test_the_live_line_check_finds_a_missing_field():
    """The check above fails when a field is left out or cut, even one whose number appears elsewhere (the rate's
    "12" is in the epoch's "12/100")."""
    items = [("train epoch 12/100", "ep 12/100"), ("450/1000", "450/1000"), *FIELDS]
    assert _parse_live_line("ep 12/100 450/1000 loss 0.123 top1 0.931 lr 1.2e-03 12.3k/s 1:02:03", items) == 7
    assert _parse_live_line("ep 12/100 450/1000 loss 0.123 top1 0.931 lr 1.2e-03 1:02:03", items) == 5
    assert _parse_live_line("ep 12/100 450/1000 loss 0.123 top1 0.931 lr 1.2e-03 12 1:02:03", items) == 5
    assert _parse_live_line("ep 12/100 450/1000 loss 0.123 top1 0.931 lr 1.2e-03 12.3k/s 1:02:03 x", items) == -1


def _parse_live_line(line: str, items: list[tuple[str, str]]) -> int:
    """How many of ``items`` (each as (full text, short text)) ``line`` shows in order, each as whole words of its
    own with nothing between them but the bar, counted up to the first one that is not next; -1 when all are
    there and something follows them."""
    words = [w for w in line.split() if not set(w) <= set("━╺#-")]
    at = 0
    for count, (full, short) in enumerate(items):
        form = next((f for f in (full, short) if words[at : at + len(f.split())] == f.split()), None)
        if form is None:
            return count
        at += len(form.split())
    return len(items) if at == len(words) else -1


def _train_in_pty(args: list[str], columns: int, interrupt_at: str = "", expect: int = 0) -> str:
    return _in_pty(["train", *args], columns, interrupt_at, expect)


def _in_pty(args: list[str], columns: int, interrupt_at: str = "", expect: int = 0) -> str:
    """``dlrecipes ARGS`` in a pseudo-terminal ``columns`` wide; with ``interrupt_at``, a SIGINT (Ctrl-C) as soon
    as that text has been printed."""
    import select
    import signal

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONUNBUFFERED"] = "1"
    process = forked.start(args, REPO, env=env, terminal=slave)
    os.close(slave)
    chunks: list[bytes] = []
    interrupted = not interrupt_at
    while True:
        if not select.select([master], [], [], 300)[0]:
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
        if not interrupted and interrupt_at.encode() in b"".join(chunks):
            os.kill(process.pid, signal.SIGINT)
            interrupted = True
    os.close(master)
    assert process.wait(300) == expect, b"".join(chunks).decode(errors="replace")[-3000:]
    return b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def _on_screen(out: str) -> list[str]:
    """The lines that stay on the screen: what follows each line's last carriage return, without colours."""
    return [ANSI.sub("", line.split("\r")[-1]) for line in out.split("\n")]


RUN = [
    "trainer.max_duration=3ep",
    "trainer.train_subset_num_batches=6",
    "trainer.progress_bar=true",
    "checkpoint.save=false",
]


@pytest.mark.slow
@pytest.mark.parametrize("columns", [80, 200])
def test_in_a_terminal_one_live_line_that_fits_and_a_summary_line_per_epoch(tiny_recipe, columns):
    out = _train_in_pty([str(tiny_recipe), *RUN, f"run_name=tty{columns}"], columns)
    assert "Config:" not in out and "*****" not in out  # Composer's banner
    assert "Cannot split tensor" not in out  # a known harmless warning
    segments = [ANSI.sub("", s) for s in re.split(r"\r|\n", out)]
    live = [s for s in segments if re.match(r"(train epoch|ep) [123]/3 ", s)]
    assert live, out[-2000:]
    for line in live:  # at 80 columns with the labels shortened ("ep 1/3", "539/s"): the full line is 85 wide
        assert len(line) <= columns - 1, line
        assert re.search(r" loss \d\.\d{3}", line) and " eval top1 " in line and " lr " in line
        assert "/s " in line and re.search(r"\d+:\d\d:\d\d", line)  # the speed (img/s, or 539/s, 3.5k/s)
        assert line.startswith("train epoch") == (columns == 200)
    if columns == 200:
        assert any("━" in line for line in live)
    lines = _on_screen(out)
    runs_dir = str(tiny_recipe.parent / "runs")  # the test's own long path: a line holding it may wrap
    assert all(len(line.replace(runs_dir, "runs")) <= columns - 1 for line in segments + lines), max(lines, key=len)
    assert lines[0].startswith(f"run {runs_dir}/tty") and "digits" in "".join(lines[:4])  # the start line, first
    headers = [line for line in lines if line.startswith("epoch ")]
    assert len(headers) == 1 and "eval loss" in headers[0] and "eval top1" in headers[0]  # one table
    assert ("train top5" in headers[0]) == ("eval top5" in headers[0]) == (columns == 200)  # given way at 80
    rows = [line.split()[0] for line in lines if re.match(r"\d/3 ", line)]
    assert rows == ["1/3", "2/3", "3/3"]  # counted from 1, like `done: 3 epochs`
    assert "done: 3 epochs" in out


@pytest.mark.slow
def test_ctrl_c_message_starts_on_a_line_of_its_own(tiny_recipe):
    out = _train_in_pty(
        [
            str(tiny_recipe),
            "trainer.max_duration=50ep",
            "trainer.progress_bar=true",
            "trainer.train_subset_num_batches=50",
            "run_name=ctrlc",
        ],
        80,
        interrupt_at="/22 loss",
        expect=75,
    )
    stopped = [line for line in _on_screen(out) if "stopped by SIGINT" in line]
    assert len(stopped) == 1 and stopped[0].startswith("stopped by SIGINT after batch"), out[-2000:]


@pytest.mark.parametrize("columns", [80, 200])
def test_list_and_version_fit_the_terminal(columns):
    out = _in_pty(["list", "models"], columns)
    lines = _on_screen(out)
    assert "cnn_simple" in out and all(len(line) <= columns for line in lines), max(lines, key=len)
    assert re.fullmatch(
        r"dlrecipes \S+ \(composer 0\.32\.1, torch \S+, python \S+\)\n?", _in_pty(["--version"], columns)
    )


@pytest.mark.parametrize("width", [40, 50, 60])
def test_on_a_narrow_terminal_fields_give_way_by_priority(width):
    line = fit_line(("train epoch 12/100", "ep 12/100"), "450/1000", FIELDS, 0.5, width, drop=(2, 3, 1, 4))
    assert len(line) <= width - 1, line
    assert line.startswith("ep 12/100 450/1000 loss 0.123")  # the epoch, the counter and the loss stay
    gone = [short for i, (_, short) in enumerate(FIELDS) if short not in line]
    order = [FIELDS[i][1] for i in (2, 3, 1, 4)]
    assert gone == [] or set(gone) == set(order[: len(gone)]), gone  # lr first, then speed, top1, ETA


@pytest.mark.slow
def test_piped_one_plain_line_per_epoch_and_no_carriage_returns(tiny_recipe):
    result = run_cli("train", str(tiny_recipe), *RUN, "run_name=piped")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "\r" not in result.stdout and "\x1b" not in result.stdout
    start, *lines = result.stdout.splitlines()
    assert (
        start.startswith(f"run {tiny_recipe.parent}/runs/piped | digits: ")
        and " train, " in start
        and "| cpu, fp32 | 1 process" in start
    )
    assert lines[0].split()[:2] == ["epoch", "loss"] and "eval top1" in lines[0] and "train top5" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["1/3", "2/3", "3/3"]  # and nothing else on stdout
    columns = lines[0].index("eval top1")
    assert all(re.match(r"0\.\d{4}", line[columns:]) for line in lines[1:])  # aligned under the header
    import csv

    with open(tiny_recipe.parent / "runs" / "piped" / "history.csv", newline="") as f:
        means = [f"{float(r['train_loss']):.4f}" for r in csv.DictReader(f)]
    assert [line.split()[1] for line in lines[1:]] == means  # the epoch's mean loss, as history.csv has it
    assert "Cannot split tensor" not in result.stderr


@pytest.mark.slow
def test_verbose_shows_composer_s_console_logging(tiny_recipe):
    result = run_cli("train", str(tiny_recipe), *RUN, "run_name=verbose", "trainer.max_duration=1ep", "--verbose")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Config:" in result.stdout + result.stderr


@pytest.mark.slow
def test_after_a_resume_the_table_the_done_line_and_the_records_agree(tiny_recipe):
    """Stopped inside epoch 2, then resumed: the resumed epoch's images/s in the table is history.csv's (counted over
    the whole epoch), and the done line's time is summary.json's (the earlier part included)."""
    import csv
    import json

    run = [
        "trainer.max_duration=2ep",
        "trainer.train_subset_num_batches=4",
        "run_name=agree",
        "--plugin",
        str(REPO / "tests" / "fault_injection.py"),
        "callbacks.fault_injection={signal_at_batch: 6}",
    ]
    stopped = run_cli("train", str(tiny_recipe), *run)
    assert stopped.returncode == 75, stopped.stderr[-2000:]
    resumed = run_cli("train", str(tiny_recipe), *run, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    run_dir = tiny_recipe.parent / "runs" / "agree"
    header, *rows = resumed.stdout.splitlines()[1:]
    column = header.index("img/s")  # the table is aligned: a value starts under its header
    with open(run_dir / "history.csv", newline="") as f:
        recorded = [f"{float(r['images_per_sec']):,.0f}" for r in csv.DictReader(f)]
    assert [row.split()[0] for row in rows] == ["2/2"] and len(recorded) == 2
    assert rows[0][column:].split()[0] == recorded[-1], (header, rows, recorded)
    summary = json.loads((run_dir / "summary.json").read_text())
    done = re.search(r"done: 2 epochs, 8 batches in (\d+\.\d)s", resumed.stderr)
    assert done and done.group(1) == f"{summary['wall_time_sec']:.1f}", (resumed.stderr[-500:], summary)


def test_a_run_resumed_inside_an_epoch_prints_one_table_header(tiny_recipe):
    """Issue 63: resumed from a checkpoint inside epoch 1 (checkpoint.save_interval 2ba, 3 batches an epoch), the
    resumed epoch's row had no train metrics (only each epoch's first batch, and every train_metrics_interval-th,
    updated them), so the next row's brought a second header. Now the first batch a process trains of an epoch
    updates them too: one header, and every row has a value in every column."""
    run = ["run_name=mid", "checkpoint.save_interval=2ba", "plots=false"]
    first = run_cli("train", str(tiny_recipe), *run, "trainer.max_duration=2ba")
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = run_cli("train", str(tiny_recipe), *run, "trainer.max_duration=2ep", "--resume")
    assert resumed.returncode == 0 and "ep0-ba2-rank0.pt" in resumed.stderr, resumed.stderr[-2000:]
    lines = resumed.stdout.splitlines()[1:]
    headers = [line for line in lines if line.startswith("epoch ")]
    assert len(headers) == 1 and "train top1" in headers[0], resumed.stdout
    rows = [line.split() for line in lines if not line.startswith("epoch ")]
    assert [row[0] for row in rows] == ["1/2", "2/2"] and all("-" not in row for row in rows), resumed.stdout


@pytest.mark.slow
def test_the_live_line_shows_this_epoch_s_loss_and_labels_evaluation_and_the_log_is_plain(tiny_recipe):
    """One batch an epoch, the loss read back only at an epoch's first batch (log_interval 1000): every live line of
    epoch N shows epoch N's mean loss (history.csv's), never '-' or the epoch before's; the monitored metric is
    labelled as the evaluation's.  The run's log holds the lines piped output has: no redraws, no escape codes."""
    import csv

    out = _train_in_pty(
        [
            str(tiny_recipe),
            "trainer.max_duration=3ep",
            "trainer.train_subset_num_batches=1",
            "trainer.progress_bar=true",
            "trainer.log_interval=1000",
            "checkpoint.save=false",
            "run_name=live",
        ],
        200,
    )
    run_dir = tiny_recipe.parent / "runs" / "live"
    with open(run_dir / "history.csv", newline="") as f:
        means = [f"{float(r['train_loss']):.4f}" for r in csv.DictReader(f)]
    live = [ANSI.sub("", s) for s in re.split(r"\r|\n", out) if ANSI.sub("", s).startswith("train epoch")]
    for epoch, mean in enumerate(means, 1):
        shown = [line for line in live if line.startswith(f"train epoch {epoch}/3")]
        assert shown and all(f" loss {mean} " in line for line in shown), (epoch, mean, shown)
    assert all(re.search(r"  eval top1 (-|\d\.\d{4})  ", line) for line in live), live
    log = (run_dir / "train-rank0.log").read_text()
    assert "\r" not in log and "\x1b" not in log and "train epoch" not in log
    assert max(len(line) for line in log.splitlines()) < 300
    printed = [line.removeprefix("[stdout]: ") for line in log.splitlines() if line.startswith("[stdout]: ")]
    on_screen = [line for line in _on_screen(out) if line.startswith(("epoch ", "1/3 ", "2/3 ", "3/3 "))]
    assert [line for line in printed if line.startswith(("epoch ", "1/3 ", "2/3 ", "3/3 "))] == on_screen
