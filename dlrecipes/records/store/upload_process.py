"""Large uploads in a process of their own, at a lower priority than training.

An upload in the training process shares its interpreter lock: the steps that overlap one take longer (on 2 cores, about
twice as long: BENCHMARKS.md), and lowering the upload thread's priority makes it worse (a descheduled thread holding
the lock). So a training's mirror hands each large file (a checkpoint) to a small Python of its own (boto3 only:
``python -m dlrecipes.records.store.upload_process``) that runs only on CPU time training leaves (Linux's
``SCHED_IDLE``; where that is refused, ``nice`` +10): the kernel gives training the cores first. The mirror's thread
waits for each answer (its order, the pointer moved only after its checkpoint is confirmed, stay
:class:`~dlrecipes.records.store.bucket.RemoteRun`'s).

One request per line on the process's stdin: ``{"bucket", "key", "path"}``; one answer per line on its stdout:
``{"error": null}`` or the error's type and first line.  The process ends when its stdin closes, and within a
fraction of a second of its parent's end however that ends (``kill -9`` included: it never uploads for a training
that no longer holds the run's lease); a parent gone before the answer is written is no traceback.  Where it cannot be
started, or stops answering, the upload runs in the mirror's thread instead, with one warning.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

from dlrecipes.errors import first_line

LARGE = 8 * 2**20  # bytes: files this large go through the process (a checkpoint); smaller ones are not worth a trip
NICE = 10
PARENT_POLL = 0.2  # seconds between the upload process's looks at whether its training is still there


class UploadProcess:
    """The upload process of one training's mirror (started at its first large upload, ended by :meth:`close`)."""

    def __init__(self, bucket: str, transfer_threads: int):
        self.bucket, self.transfer_threads = bucket, transfer_threads
        self._process: subprocess.Popen | None = None
        self._failed = False
        self._lock = threading.Lock()

    def usable(self) -> bool:
        return not self._failed

    def upload(self, key: str, path: str, once: bool = False) -> None:
        """``path`` to ``key``, done by the process (``once``: only where the key has no object); raises what the
        upload raised (as a RuntimeError naming it; :class:`~.backend.Conflict` when ``once`` did not hold) or
        ``OSError`` when the process is gone (the caller then uploads in its own thread)."""
        from dlrecipes.records.store.backend import Conflict

        with self._lock:
            try:
                process = self._started()
                job = {"bucket": self.bucket, "key": key, "path": path, "once": once}
                process.stdin.write(json.dumps(job) + "\n")
                process.stdin.flush()
                answer = process.stdout.readline()
            except (OSError, ValueError) as exc:
                self._give_up(f"{type(exc).__name__}: {exc}")
                raise OSError("the upload process is gone") from None
            if not answer:
                self._give_up("it exited")
                raise OSError("the upload process is gone")
            answered = json.loads(answer)
        if answered.get("conflict"):
            raise Conflict(key)
        if answered.get("error"):
            raise RuntimeError(answered["error"])

    def _started(self) -> subprocess.Popen:
        if self._process is None:
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(self.transfer_threads), str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
        return self._process

    def _give_up(self, why: str) -> None:
        quiet, self._failed = self._failed, True  # after close(kill=True): the end said why
        if quiet:
            return
        print(f"warning: the upload process stopped ({why}); uploads go on in the training process", file=sys.stderr)
        self.close()

    def close(self, kill: bool = False) -> None:
        """End the process: its stdin closed and waited for (it finishes the upload it has), or with ``kill`` (the
        run's end stopped waiting for it) killed at once."""
        process, self._process = self._process, None
        if process is None:
            return
        self._failed = self._failed or kill
        try:
            if kill:
                raise OSError("not waited for")
            process.stdin.close()
            process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        finally:
            for stream in (process.stdin, process.stdout):
                try:
                    stream.close()
                except OSError:  # a pipe whose reader is gone
                    pass


def lower_priority() -> None:
    """This process runs only on CPU time training leaves (Linux's SCHED_IDLE), else at ``nice`` +10."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):
        pass
    try:
        os.nice(NICE)
    except OSError:
        pass


def _watch_parent(parent: int) -> None:
    """End this process at once when ``parent`` (the training) is gone: it is then adopted by another process."""
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL)
        os._exit(0)

    threading.Thread(target=watch, name="dlrecipes-parent-watch", daemon=True).start()


def _serve(transfer_threads: int, parent: int | None = None) -> None:
    """The process: boto3 alone (the endpoint and credentials from the environment it inherited).  The signals a
    terminal or a scheduler sends the whole group (Ctrl-C, SLURM's SIGTERM) are training's to answer: this process
    goes on uploading what it was given, and ends when training closes its stdin, or as soon as training is gone."""
    import signal

    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    if parent is not None:
        _watch_parent(parent)
    lower_priority()
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config

    from dlrecipes.records.store.backend import S3_CLIENT_CONFIG
    from dlrecipes.records.store.write_once import refused_as_written, unconditional_here, write_once, written_once

    client = boto3.session.Session().client(
        "s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL") or None, config=Config(**S3_CLIENT_CONFIG)
    )
    transfer = TransferConfig(max_concurrency=transfer_threads)
    for line in sys.stdin:
        job = json.loads(line)
        if job.get("once"):  # the writer's own key, written once: a late completion never replaces an object
            write_once(client, job["key"])
        try:
            try:
                client.upload_file(job["path"], job["bucket"], job["key"], Config=transfer)
            except Exception as exc:
                if not (job.get("once") and unconditional_here(exc)):
                    raise
                written_once(job["key"])  # a server without conditional writes: a plain write
                client.upload_file(job["path"], job["bucket"], job["key"], Config=transfer)
            answer: dict[str, Any] = {"error": None}
        except Exception as exc:  # the mirror's thread warns and keeps it pending, as for its own uploads
            first = first_line(exc, 200, "")
            conflict = bool(job.get("once")) and refused_as_written(exc)
            answer = {"error": f"{type(exc).__name__}: {first}", "conflict": conflict}
        finally:
            written_once(job["key"])
        try:
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):  # the training is gone: nobody to answer
            os._exit(0)


if __name__ == "__main__":
    _serve(int(sys.argv[1]) if len(sys.argv) > 1 else 10, int(sys.argv[2]) if len(sys.argv) > 2 else None)
