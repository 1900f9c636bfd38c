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

        def fit_start(self, state, logger) -> None:
            if dist.get_global_rank() == 0:  # the run's pointer taken over, before any step (store.writer)
                remote.take_commit()

        def _push(self) -> None:
            if dist.get_global_rank() == 0:
                self.background.request()

        def epoch_checkpoint(self, state, logger) -> None:
            _fenced(remote)
            self._push()

        def batch_checkpoint(self, state, logger) -> None:
            _fenced(remote)
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
            _mark_incomplete(remote, [])  # the last push brings what an earlier end left out
            done = self.background.close(wait)  # the last push, and every one still under way, done (or given up)
            if remote.offload is not None:
                remote.offload.close(kill=not done)
            if not done:
                remote.abandoned = True
                remote.pending = sorted(set(remote.pending) | set(remote._changed()), key=upload_order)
            if remote.pending:
                _name_what_is_missing(remote)

    return MirrorToBucket()


def _fenced(remote: RemoteRun) -> None:
    """A training whose lease was taken over stops at its next batch (one line naming the holder); with several
    ranks, every rank at the same batch (:func:`~dlrecipes.core.distributed.request_stop`: the others are not left
    waiting in a collective)."""
    if remote.lease is not None and remote.lease.lost is not None:  # (each batch: the import only once lost)
        from dlrecipes.core.distributed import request_stop, world_size

        if world_size() > 1:
            return request_stop(remote.lease.lost_error())
        raise remote.lease.lost_error()


def _name_what_is_missing(remote: RemoteRun) -> None:
    """summary.json names what is not in the bucket: locally, and in the bucket too while the lease is this
    process's and the server answers within seconds (a reader there then sees the run as incomplete, not finished)."""
    _mark_incomplete(remote, sorted(set(remote.pending) - {SUMMARY_FILE}))
    held = remote.lease is None or remote.lease.lost is None
    if held and (remote.local / SUMMARY_FILE).is_file():
        _quick_put(remote, SUMMARY_FILE)


def _mark_incomplete(remote: RemoteRun, missing: list[str]) -> None:
    """summary.json (local) names ``missing``, what is not in the bucket, as ``upload_incomplete`` (none: the key
    goes; the push that follows uploads the summary only once everything else is up)."""
    import json

    summary = remote.local / SUMMARY_FILE
    try:
        data = json.loads(summary.read_text())
    except (OSError, ValueError):  # no summary yet (a run stopped in its first epoch), or not ours to fix
        return
    if not isinstance(data, dict) or data.get("upload_incomplete", []) == missing:
        return
    if missing:
        data["upload_incomplete"] = missing
    else:
        del data["upload_incomplete"]
    summary.write_text(json.dumps(data, indent=2) + "\n")


def _quick_put(remote: RemoteRun, relative: str, wait: float = 5.0) -> None:
    """``relative`` uploaded from a thread of its own, waited for at most ``wait`` seconds (a hung server: left to
    finish or fail on its own, a daemon)."""
    import threading

    def put() -> None:
        try:
            remote.store().write(remote.key(relative), (remote.local / relative).read_bytes())
        except Exception:  # the local summary says it all the same
            pass

    thread = threading.Thread(target=put, name="dlrecipes-upload-mark", daemon=True)
    thread.start()
    thread.join(timeout=wait)
