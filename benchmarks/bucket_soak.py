"""A fault soak of runs in a bucket: tiny trainings from two "machines" against a local S3 server, faults injected
at random moments, and after each the invariants a bucket run promises, checked.

    python benchmarks/bucket_soak.py [--faults 200] [--seed 0] [--runs 3] [--json OUT]

Two machines, each with its own HOME and staging folder and a short lease (``DLRECIPES_LEASE_TERM``, 2 s), train
and resume a few runs in ``s3://soak/runs`` (``r0``'s checkpoints are 8 MB: they go up in parts, from the training's
upload process; the others' are tiny) on SeaweedFS (``weed``, started here on loopback, killed at the end).
Each round one machine trains a run (a new one, ``--resume`` or ``--restart``) and one fault is injected at a random
moment of it: SIGKILL of the training; SIGSTOP past its lease's term while the other machine resumes the run, then
SIGCONT; SIGKILL of its upload process; SIGSTOP of the server for a few seconds; SIGKILL of the server and a restart;
or a hostile object put in the bucket before the other machine reads the run (a pointer naming a path outside, a
damaged lease, a recipe importing code from the bucket), taken away after. Every command is forked from a process
that imported torch once (tests/forked.py), so a round takes seconds.

After each round, for every run in the bucket: the pointer is one dlrecipes wrote and names a checkpoint the bucket
has, of the run's lineage, that loads as tensors; history.csv has no row past the committed step; ``dlrecipes runs``
shows no run further than its commit; no code from the bucket ran; no file was written outside the staging folders;
and every command ended within its bound with at most one error line and no traceback. A violation is printed when
it is found; the totals, the seed and the time are printed at the end (and written with ``--json``).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TERM = "2"  # seconds: the lease's term
BOUND = 150.0  # seconds any command may take (the bounded waits' stated limits and the training itself)
EPOCHS = 10
LARGE_RUN = "r0"  # its checkpoints are 8 MB: uploaded in parts, by the upload process (the others' are tiny)
RECIPE = f"""
model: {{name: cnn_simple, width: 4, hidden: 16}}
dataset: {{name: digits, image_size: 8, augment: false}}
trainer:
  max_duration: {EPOCHS}ep
  batch_size: 64
  num_workers: 0
  progress_bar: false
  device: cpu
  train_subset_num_batches: 3
  eval_subset_num_batches: 1
optimizer: {{name: sgd, lr: 0.05}}
checkpoint: {{save_interval: 1ep, keep: 2, upload_wait: 20}}
plots: false
runs_dir: s3://soak/runs
"""
EVIL = "from pathlib import Path\nPath({marker!r}).write_text('code from the bucket ran')\n"
FAULTS = ("kill", "freeze", "kill-upload", "stop-server", "kill-server", "hostile")


@dataclass
class Soak:
    folder: Path
    server: Any
    rng: random.Random
    machines: dict[str, dict[str, str]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    commands: int = 0
    rounds: int = 0

    @property
    def marker(self) -> Path:
        return self.folder / "code-ran"

    @property
    def outside(self) -> Path:
        return self.folder / "outside"

    def machine(self, name: str) -> dict[str, str]:
        if name not in self.machines:
            home = self.folder / name
            (home / "staging").mkdir(parents=True, exist_ok=True)
            self.machines[name] = {
                **os.environ,
                **self.server.env(),
                "HOME": str(home),
                "DLRECIPES_STAGING_DIR": str(home / "staging"),
                "DLRECIPES_LEASE_TERM": TERM,
                "DLRECIPES_BUCKET_STALL": "20",
                "PYTHONUNBUFFERED": "1",
            }
        return self.machines[name]

    def injected(self) -> int:
        """Faults injected into a command still running (a kill after a training's end is not one)."""
        return sum(n for kind, n in self.faults.items() if "(" not in kind)

    def violation(self, what: str) -> None:
        self.violations.append(f"round {self.rounds}: {what}")
        print(f"VIOLATION round {self.rounds}: {what}", flush=True)

    # --- commands ------------------------------------------------------------------------------------------

    def start(self, machine: str, *args: str) -> Command:
        from tests import forked

        self.commands += 1
        n = self.commands
        out, err = self.folder / "logs" / f"{n}.out", self.folder / "logs" / f"{n}.err"
        out.parent.mkdir(exist_ok=True)
        handle = forked.start(list(args), cwd=self.folder, out=out, err=err, env=self.machine(machine))
        return Command(handle, list(args), err, time.monotonic())

    def finish(self, command: Command, killed: bool = False) -> int | None:
        """The command waited for (within its bound: past it, killed and a violation); its output checked unless
        this soak killed it: at most one error line, no traceback, nothing "unexpected"."""
        left = BOUND - (time.monotonic() - command.began)
        code = command.handle.wait(max(1.0, left))
        if code is None:
            command.handle.kill()
            command.handle.wait()
            self.violation(f"`{' '.join(command.args[:3])}` did not end within {BOUND:.0f} s")
            return None
        if killed or code in (-signal.SIGKILL,):
            return code
        stderr = command.err.read_text(errors="replace") if command.err.exists() else ""
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        if len(errors) > 1 or "Traceback" in stderr or "unexpected" in stderr:
            self.violation(f"`{' '.join(command.args[:3])}` exit {code}: {stderr[-1500:]!r}")
        if code not in (0, 1, 2, 130, 143):
            self.violation(f"`{' '.join(command.args[:3])}` exit {code}: {stderr[-800:]!r}")
        return code

    def train(self, machine: str, run: str, how: str) -> Command:
        extra = {"new": [], "resume": ["--resume"], "restart": ["--restart"]}[how]
        if run == LARGE_RUN:
            extra.append("model.hidden=4096")
        return self.start(machine, "train", str(self.folder / "tiny.yaml"), f"run_name={run}", *extra)

    # --- faults --------------------------------------------------------------------------------------------

    def round(self, runs: int) -> None:
        self.rounds += 1
        fault = self.rng.choice(FAULTS)
        run = LARGE_RUN if fault == "kill-upload" else f"r{self.rng.randrange(runs)}"  # (only r0 uses the process)
        machine, other = self.rng.sample(["a", "b"], 2)
        exists = bool(self.server.keys("soak", f"runs/{run}/recipe.yaml"))
        how = "new" if not exists else self.rng.choice(["resume", "resume", "restart"])
        if fault == "hostile" and exists:
            self._count(fault)
            return self._hostile(run, other)
        if fault == "hostile":  # nothing to be hostile in yet: the run is made, and killed at a random moment
            fault = "kill"
        command = self.train(machine, run, how)
        # a random moment of the training (its start included): a tiny run takes about 3 s, r0 about 8
        time.sleep(self.rng.uniform(0.2, 6.0 if run == LARGE_RUN else 3.0))
        getattr(self, "_" + fault.replace("-", "_"))(command, run, other)

    def _count(self, fault: str) -> None:
        self.faults[fault] = self.faults.get(fault, 0) + 1

    def _kill(self, command: Command, run: str, other: str) -> None:
        self._count("kill" if command.handle.poll() is None else "kill (after its end)")
        command.handle.send_signal(signal.SIGKILL)
        self.finish(command, killed=True)

    def _freeze(self, command: Command, run: str, other: str) -> None:
        self._count("freeze" if command.handle.poll() is None else "freeze (after its end)")
        command.handle.send_signal(signal.SIGSTOP)
        _children(command.handle.pid, signal.SIGSTOP)
        time.sleep(float(TERM) + self.rng.uniform(0.5, 2.0))
        resumed = self.train(other, run, "resume")
        time.sleep(self.rng.uniform(0.0, 4.0))  # the other machine's training at a random moment when this wakes
        _children(command.handle.pid, signal.SIGCONT)
        command.handle.send_signal(signal.SIGCONT)
        self.finish(command)
        self.finish(resumed)

    def _kill_upload(self, command: Command, run: str, other: str) -> None:
        killed = _children(command.handle.pid, signal.SIGKILL, "upload_process")
        self._count("kill-upload" if killed else "kill-upload (none running)")
        self.finish(command)

    def _stop_server(self, command: Command, run: str, other: str) -> None:
        self._count("stop-server")
        os.killpg(self.server.process.pid, signal.SIGSTOP)
        time.sleep(self.rng.uniform(1.0, 4.0))
        os.killpg(self.server.process.pid, signal.SIGCONT)
        self.finish(command)

    def _kill_server(self, command: Command, run: str, other: str) -> None:
        self._count("kill-server")
        self.server.kill()
        time.sleep(self.rng.uniform(0.5, 2.0))
        self.server.restart("soak")
        self.finish(command)

    def _hostile(self, run: str, reader: str) -> None:
        """A hostile object in a run, read by the other machine (eval, --resume): refused in one line or read as
        data; then taken away."""
        client = self.server.client()
        kind = self.rng.choice(["pointer", "lease", "imports"])
        key = {
            "pointer": f"runs/{run}/checkpoints/latest.txt",
            "lease": f"runs/{run}/run.lease",
            "imports": f"runs/{run}/recipe.yaml",
        }[kind]
        try:
            before = client.get_object(Bucket="soak", Key=key)["Body"].read()
        except Exception:
            before = None
        if kind == "pointer":
            body = f"../../../../{self.outside.name}/x.pt\nwriter w00000000\nlineage w00000000@0-0\n".encode()
        elif kind == "lease":
            body = json.dumps({"token": "t", "host": "h", "pid": 1, "expires": 1e308}).encode()
        else:
            evil = EVIL.format(marker=str(self.marker))
            client.put_object(Bucket="soak", Key=f"runs/{run}/evil.py", Body=evil.encode())
            body = (before or b"").replace(b"runs_dir:", b"imports: [./evil.py]\nruns_dir:", 1)
        client.put_object(Bucket="soak", Key=key, Body=body)
        command = self.rng.choice([["eval", f"s3://soak/runs/{run}"], None])
        if command is None:
            self.finish(self.train(reader, run, "resume"))
        else:
            self.finish(self.start(reader, *command))
        if before is None:
            client.delete_object(Bucket="soak", Key=key)
        else:
            client.put_object(Bucket="soak", Key=key, Body=before)
        client.delete_object(Bucket="soak", Key=f"runs/{run}/evil.py")
        import shutil  # the reader's copy of what it was given goes too (its user would clear it)

        shutil.rmtree(Path(self.machine(reader)["DLRECIPES_STAGING_DIR"]) / "soak" / "runs" / run, ignore_errors=True)

    # --- invariants ----------------------------------------------------------------------------------------

    def check(self) -> None:
        """Every run in the bucket as it promises (see the module docstring)."""
        from dlrecipes.records.layout import periodic_progress
        from dlrecipes.records.store.commit import parse_pointer

        keys = self.server.keys("soak", "runs/")
        runs = sorted({key.split("/")[1] for key in keys if key.count("/") >= 2})
        committed: dict[str, int] = {}
        for run in runs:
            held = {key[len(f"runs/{run}/") :] for key in keys if key.startswith(f"runs/{run}/")}
            if _aside(run) and "recipe.yaml" not in held and not self._being_copied(run):
                self.violation(f"{run}: a run moved aside, not whole and named by no move: {sorted(held)[:6]}")
            if "checkpoints/latest.txt" not in held:
                if "history.csv" in held and _rows(self.server.read("soak", f"runs/{run}/history.csv")):
                    self.violation(f"{run}: history rows with no commit")
                continue
            raw = self.server.read("soak", f"runs/{run}/checkpoints/latest.txt")
            try:
                pointer = parse_pointer(raw, f"runs/{run}/checkpoints/latest.txt", "soak")
            except Exception as exc:
                self.violation(f"{run}: the pointer is not one dlrecipes wrote ({exc})")
                continue
            if f"checkpoints/{pointer.checkpoint}" not in held:
                self.violation(f"{run}: the pointer names {pointer.checkpoint}, which the bucket does not have")
                continue
            if not pointer.follows(pointer.checkpoint):
                self.violation(f"{run}: the committed {pointer.checkpoint} is not of the run's lineage")
            if not _loads(self.server.read("soak", f"runs/{run}/checkpoints/{pointer.checkpoint}"), self.folder):
                self.violation(f"{run}: the committed {pointer.checkpoint} does not load as tensors")
            step = periodic_progress(Path(pointer.checkpoint))[1]
            committed[run] = periodic_progress(Path(pointer.checkpoint))[0]
            if "history.csv" in held:
                steps = [int(r["step"]) for r in _rows(self.server.read("soak", f"runs/{run}/history.csv"))]
                if steps and max(steps) > step:
                    self.violation(f"{run}: history.csv reaches step {max(steps)}, the commit {step}")
        self._listed(committed)
        for run in runs:  # runs moved aside by --restart, checked once: removed, so that the bucket does not fill
            if _aside(run) and "recipe.yaml" in {k.rsplit("/", 1)[-1] for k in keys if k.startswith(f"runs/{run}/")}:
                for key in (k for k in keys if k.startswith(f"runs/{run}/")):
                    self.server.client().delete_object(Bucket="soak", Key=key)
        if self.marker.exists():
            self.violation("code from the bucket ran")
        if self.outside.exists() and any(self.outside.iterdir()):
            self.violation(f"files outside the staging folders: {list(self.outside.iterdir())[:3]}")

    def _being_copied(self, aside: str) -> bool:
        """Whether the run ``aside`` was being moved to names it in its marker as a copy cut off (the next --restart
        of that run removes it)."""
        original = aside.split(".", 1)[0]
        try:
            marker = json.loads(self.server.read("soak", f"runs/{original}/moving-aside.json"))
        except Exception:
            return False
        return isinstance(marker, dict) and marker.get("aside") == aside and marker.get("copying") is True

    def _listed(self, committed: dict[str, int]) -> None:
        """``dlrecipes runs`` shows no run further than its commit."""
        from tests import forked

        listed = forked.run(["runs", "s3://soak/runs", "--json"], self.folder, 120, self.machine("a"))
        if listed.returncode != 0:
            if "error:" not in listed.stderr or "Traceback" in listed.stderr:
                self.violation(f"runs failed: {listed.stderr[-800:]!r}")
            return
        for row in json.loads(listed.stdout or "[]"):
            run = str(row.get("run", "")).rsplit("/", 1)[-1]
            done = str(row.get("epochs", "0/0")).split("/")[0]
            if run in committed and done.isdigit() and int(done) > committed[run]:
                self.violation(f"runs shows {run} at {row.get('epochs')}, the commit at epoch {committed[run]}")


@dataclass
class Command:
    handle: Any
    args: list[str]
    err: Path
    began: float


def _children(pid: int, signum: int, named: str = "") -> int:
    """``signum`` to the processes ``pid`` started (``named``: those whose command line has it); how many."""
    sent = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and named in cmdline:
            try:
                os.kill(int(entry.name), signum)
                sent += 1
            except ProcessLookupError:
                pass
    return sent


def _aside(run: str) -> bool:
    """Whether ``run`` is a run moved aside (``r0.restarted-<time>``, ``.failed-``, ``.diverged-``)."""
    return any(f".{why}-" in run for why in ("restarted", "failed", "diverged"))


def _rows(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode(errors="replace"))))


def _loads(data: bytes, folder: Path) -> bool:
    """Whether a checkpoint's bytes load as dlrecipes loads one (its tensor records whole)."""
    from dlrecipes.records.store.bucket import damage

    path = folder / "checked" / "ep1-ba1-rank0.pt"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    return damage(path) is None


def soak(faults: int, seed: int, runs: int, folder: Path) -> dict[str, Any]:
    from tests.s3_server import start_s3_server

    server = start_s3_server(folder / "s3", volume_mb=1024, volume_max=32)  # room for what the rounds write
    try:
        server.create_bucket("soak")
        (folder / "tiny.yaml").write_text(RECIPE)
        state = Soak(folder, server, random.Random(seed))
        began = time.monotonic()
        while state.injected() < faults:
            state.round(runs)
            state.check()
            done = state.injected()
            print(
                f"{done}/{faults} faults, {len(state.violations)} violations, {time.monotonic() - began:.0f} s",
                flush=True,
            )
    finally:
        server.kill()
    return {
        "faults": state.injected(),
        "by_kind": state.faults,
        "commands": state.commands,
        "violations": state.violations,
        "seed": seed,
        "seconds": round(time.monotonic() - began, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=3, help="run addresses the rounds share")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dlrecipes-soak-") as tmp:
        result = soak(args.faults, args.seed, args.runs, Path(tmp))
    print(
        f"{result['faults']} faults ({', '.join(f'{k} {v}' for k, v in sorted(result['by_kind'].items()))}), "
        f"{result['commands']} commands, {len(result['violations'])} violations, seed {result['seed']}, "
        f"{result['seconds']:.0f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(1 if result["violations"] else 0)


if __name__ == "__main__":
    main()
