"""A training's run kept in step with its bucket: the Composer callback that mirrors the staging folder as the run
goes (:func:`uploader`, through :mod:`dlrecipes.records.store.upload`'s background push), the end's bounded wait for
the uploads, and summary.json's record of what is not in the bucket (``upload_incomplete``: written when the end
gives up, cleared when a later end has everything up)."""

from __future__ import annotations

from dlrecipes.records.layout import CHECKPOINT_DIR, SUMMARY_FILE
from dlrecipes.records.store.bucket import RemoteRun, upload_order


def uploader(remote: RemoteRun, wait: float = 120.0):
    """A Composer callback that mirrors the run to the bucket at each checkpoint and after the run closes (rank 0),
    uploading in the background (:mod:`dlrecipes.records.store.upload`: training never waits for the network; the
    run's end waits for the uploads at most ``wait`` seconds); what is still not uploaded then is named in
    summary.json (``upload_incomplete``). A training whose lease was taken over stops at its next batch
    (:class:`~dlrecipes.records.store.lease.LeaseLost`)."""
    from composer.core import Callback
    from composer.utils import dist

    from dlrecipes.records.store.upload import BackgroundPush

    class MirrorToBucket(Callback):
        def __init__(self) -> None:
            self.checkpoints_seen = -1  # the checkpoints folder's mtime: one stat per batch says whether one was saved
            self.closed = False
            self.background = BackgroundPush(remote)
            if remote.root.scheme == "s3":  # checkpoints go up from a process of their own (store.upload_process)
                from dlrecipes.records.store.backend import TRANSFER_THREADS
                from dlrecipes.records.store.upload_process import UploadProcess

                remote.offload = UploadProcess(remote.root.bucket, TRANSFER_THREADS)

        def _push(self) -> None:
            if dist.get_global_rank() == 0:
                self.background.request()

        def _fenced(self) -> None:
            if remote.lease is not None and remote.lease.lost is not None:
                raise remote.lease.lost_error()

        def epoch_checkpoint(self, state, logger) -> None:
            self._fenced()
            self._push()

        def batch_checkpoint(self, state, logger) -> None:
            self._fenced()
            folder = remote.local / CHECKPOINT_DIR
            seen = folder.stat().st_mtime_ns if folder.is_dir() else -1
            if seen != self.checkpoints_seen:
                self.checkpoints_seen = seen
                self._push()

        def post_close(self) -> None:
            if self.closed:  # Composer closes again at interpreter exit
                return
            self.closed = True
            if dist.get_global_rank() != 0:
                return
            clear_incomplete(remote)  # the last push brings what an earlier end left out
            done = self.background.close(wait)  # the last push, and every one still under way, done (or given up)
            if remote.offload is not None:
                remote.offload.close(kill=not done)
            if not done:
                remote.abandoned = True
                remote.pending = sorted(set(remote.pending) | set(remote._changed()), key=upload_order)
            if remote.pending:
                mark_incomplete(remote, in_bucket=remote.lease is None or remote.lease.lost is None)

    return MirrorToBucket()


def clear_incomplete(remote: RemoteRun) -> None:
    """summary.json (local) without ``upload_incomplete``: the push that follows uploads it only once everything
    else is in the bucket, and :func:`mark_incomplete` names again what is not."""
    import json

    summary = remote.local / SUMMARY_FILE
    try:
        data = json.loads(summary.read_text())
    except (OSError, ValueError):
        return
    if isinstance(data, dict) and "upload_incomplete" in data:
        del data["upload_incomplete"]
        summary.write_text(json.dumps(data, indent=2) + "\n")


def mark_incomplete(remote: RemoteRun, in_bucket: bool = True) -> None:
    """summary.json names what is not in the bucket: locally, and with ``in_bucket`` in the bucket too when it
    answers within seconds (a reader there then sees the run as incomplete, not as finished)."""
    import json

    summary = remote.local / SUMMARY_FILE
    if not summary.is_file():
        return
    data = json.loads(summary.read_text())
    data["upload_incomplete"] = sorted(set(remote.pending) - {SUMMARY_FILE})
    summary.write_text(json.dumps(data, indent=2) + "\n")
    if in_bucket:
        _quick_put(remote, SUMMARY_FILE)


def _quick_put(remote: RemoteRun, relative: str, wait: float = 5.0) -> bool:
    """``relative`` uploaded from a thread of its own, waited for at most ``wait`` seconds (a hung server: left to
    finish or fail on its own, a daemon). Whether it was confirmed."""
    import threading

    done: list[bool] = []

    def put() -> None:
        try:
            remote.store().write(remote.key(relative), (remote.local / relative).read_bytes())
            done.append(True)
        except Exception:
            pass

    thread = threading.Thread(target=put, name="dlrecipes-upload-mark", daemon=True)
    thread.start()
    thread.join(timeout=wait)
    return bool(done)
