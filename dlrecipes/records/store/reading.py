"""The commands after training on runs in object storage: ``eval``, ``predict``, ``export``, ``runs``, ``compare``
and ``plot`` accept ``s3://BUCKET/PREFIX/RUN`` (and ``runs``/``compare --last`` a ``s3://BUCKET/PREFIX``).

What a command reads is downloaded into a local copy (``$DLRECIPES_STAGING_DIR/pulled/BUCKET/PREFIX/RUN``, apart
from the staging folder training writes in): the run's records (recipe.yaml, summary.json, history.csv, best.json,
the eval reports and plots; not its checkpoints or exports) and only the one checkpoint the command needs (``best``,
``latest`` as the bucket's pointer names it, or a named one). A checkpoint already here with the bucket's size is not
downloaded again. What a command writes beside the run (an eval report, an export, plots) is uploaded beside it in
the bucket when it is done (never a checkpoint or the pointer: those are training's); an upload that fails is one
line naming what is not there, exit code 1 (the local copy keeps it, and the next command on the run uploads it).

What the bucket says is checked before it names a local file (:mod:`~.safe_keys`): the pointer must hold a plain
checkpoint name, and each key of the listing must land under the local copy.  ``latest`` is the newest checkpoint
that loads, as for a local run: when the pointer's does not, the older ones are brought newest first, and one note
says which was passed over and why.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from dlrecipes.errors import UserError
from dlrecipes.records.layout import (
    BEST_CHECKPOINT,
    BEST_INFO,
    CHECKPOINT_DIR,
    EXPORT_DIR,
    LEASE_FILE,
    PREPROCESS_FILE,
    RECIPE_FILE,
    REMOTE_LATEST,
    SUMMARY_FILE,
    RunDir,
    is_export_file,
    is_periodic,
    is_record,
)
from dlrecipes.records.store.access import check_access
from dlrecipes.records.store.bucket import (
    RemoteRoot,
    RemoteRun,
    damage,
    scheme_of,
    staging_base,
)
from dlrecipes.records.store.commit import Pointer, is_best, lineage_checkpoints, read_pointer, untagged
from dlrecipes.records.store.safe_keys import UnsafeKey, staged_path

PULLED_DIR = "pulled"
KEY_PATH = "run"  # what an access error names: the run argument


class UploadFailed(UserError):
    """A command's output could not be uploaded beside its run in the bucket (the local copy has it)."""

    exit_code = 1


def _pulled_root(root: RemoteRoot) -> Path:
    return staging_base() / PULLED_DIR / root.local_part()


def split_run_url(url: str) -> tuple[RemoteRoot, str]:
    """``s3://bucket/prefix/run`` -> (the root ``s3://bucket/prefix``, ``run``)."""
    parent, _, name = url.rstrip("/").rpartition("/")
    if not name or parent.endswith(":/") or parent.endswith("://") or scheme_of(parent) is None:
        raise UserError(f"{KEY_PATH}: {url!r} names no run (expected s3://BUCKET/PREFIX/RUN_NAME)")
    return RemoteRoot.parse(parent, KEY_PATH), name


class PulledRun(RemoteRun):
    """A run in the bucket, read through a local copy of what a command needs."""

    @property
    def url(self) -> str:
        return f"{self.root}/{self.name}"

    def listing(self) -> dict[str, tuple[int, float]]:
        """The run's files in the bucket: relative path -> (size, modified time)."""
        return self.store().listing(self.key("") + "/")

    def pull_records(self, listing: dict[str, tuple[int, float]] | None = None) -> dict[str, tuple[int, float]]:
        """The run's records (:func:`~dlrecipes.records.layout.is_record`: never a checkpoint, an export or a file no
        run writes, such as code beside its recipe), downloaded as they are in the bucket; an export directory's
        files (preprocess.json, no recipe.yaml). One line when the bucket has neither."""
        listing = self.listing() if listing is None else listing
        export_only = RECIPE_FILE not in listing and PREPROCESS_FILE in listing
        if RECIPE_FILE not in listing and not export_only:
            raise UserError(
                f"{self.url}: no run there (no {RECIPE_FILE} in the bucket); `dlrecipes runs {self.root}` "
                "lists the runs it has"
            )
        for relative, (size, modified) in listing.items():
            if is_export_file(relative) if export_only else is_record(relative):
                self._fetch(relative, size, modified)
        self._drop_stale_summary()
        return listing

    def _drop_stale_summary(self) -> None:
        """A summary.json written by a writer that does not hold the run's commit, or a best.json whose best lies
        outside its writer's part of the run (a fenced writer's late upload: :mod:`~.commit`), is not the run's: the
        copy goes without it (the run is shown by its history; ``--checkpoint best`` finds none), with one warning."""
        import json

        pointer = self.local / CHECKPOINT_DIR / REMOTE_LATEST
        for relative in (SUMMARY_FILE, f"{CHECKPOINT_DIR}/{BEST_INFO}"):
            record = self.local / relative
            if not (record.is_file() and pointer.is_file()):
                continue
            try:
                data = json.loads(record.read_text())
                writer, committed = data.get("writer"), self.pointer("run")
                where = (int(data.get("epoch", -1)), int(data.get("batch", -1)))
            except (ValueError, TypeError, AttributeError, UserError):
                continue
            if not isinstance(writer, str):
                continue
            stale = writer != committed.writer if relative == SUMMARY_FILE else not committed.holds(writer, where)
            if stale:
                record.unlink()
                print(
                    f"warning: {self.url}/{relative} was written by {writer}, a writer whose lease was taken over "
                    f"(the run's commit is held by {committed.writer}); it is left out",
                    file=sys.stderr,
                )

    def bring(self, relative: str) -> None:
        """One more file of the run (a plugin file its recipe names, trusted with ``--trust-plugins``), downloaded
        into the copy; one line when the bucket does not have it."""
        listing = self.listing()
        if relative not in listing:
            raise UserError(f"{self.url}: the bucket has no {relative}")
        self._fetch(relative, *listing[relative])

    def _fetch(self, relative: str, size: int, modified: float, reuse: bool = False) -> Path:
        """``relative`` from the bucket, its modified time kept (``runs`` orders by it), into the copy (a periodic
        checkpoint under the run folder's name for it, without its writer's tag: :mod:`~.commit`); ``reuse``: a local
        file of the bucket's size and modified time is taken as it (a checkpoint is not downloaded again).  The key
        is the server's word: one that would land outside the local copy is refused before anything is looked at or
        written (:func:`~.safe_keys.staged_path`). Returns the local path."""
        local = _local_name(relative)
        path = staged_path(self.local, local, self.url)
        same = path.is_file() and path.stat().st_size == size and abs(path.stat().st_mtime - modified) < 1e-3
        if not (reuse and same):
            if not self._download(relative, local):
                raise UserError(f"{self.url}: {relative} went away from the bucket while it was read")
        os.utime(path, (modified, modified))
        stat = path.stat()
        self.sent[local] = (stat.st_size, stat.st_mtime_ns)
        return path

    def pull_checkpoint(self, checkpoint: str, listing: dict[str, tuple[int, float]]) -> str:
        """The checkpoint ``checkpoint`` names (best, latest or a file of the run's checkpoints/), downloaded;
        returns what to give the local command as its ``--checkpoint``."""
        if checkpoint == "best":
            relative = self._best()
            if relative not in listing:
                raise UserError(
                    f"--checkpoint: {self.url} has no {BEST_CHECKPOINT} (its recipe monitors no metric, "
                    "or it never evaluated); use --checkpoint latest"
                )
        elif checkpoint == "latest":
            pointer = f"{CHECKPOINT_DIR}/{REMOTE_LATEST}"
            if pointer not in listing:
                raise UserError(
                    f"--checkpoint: {self.url} has no complete periodic checkpoint in the bucket; use --checkpoint best"
                )
            committed = self.pointer("--checkpoint")
            relative = f"{CHECKPOINT_DIR}/{committed.checkpoint}"
            if relative not in listing:
                raise UserError(
                    f"--checkpoint: {self.url}: the pointer names {relative}, which the bucket does not have"
                )
            return str(self._newest_that_loads(relative, listing, committed))
        else:
            relative = self._named(f"{CHECKPOINT_DIR}/{Path(checkpoint).name}", listing)
            if relative not in listing:
                held = [r for r in listing if r.startswith(CHECKPOINT_DIR + "/") and r.endswith(".pt")]
                kept = sorted({Path(_local_name(r)).name for r in held})
                raise UserError(
                    f"--checkpoint: {self.url} has no {relative} in the bucket; use best, latest or one "
                    f"of: {', '.join(kept) or '(none)'}"
                )
        path = self._fetch(relative, *listing[relative], reuse=True)
        return checkpoint if checkpoint in ("best", "latest") else str(path)

    def _best(self) -> str:
        """The bucket's key of the run's best checkpoint: the one its best.json names (each writer's best is its own:
        :mod:`~.commit`), else ``best.pt`` (runs written before)."""
        import json

        try:
            named = json.loads((self.local / CHECKPOINT_DIR / BEST_INFO).read_text()).get("file")
        except (OSError, ValueError, AttributeError):
            named = None
        return f"{CHECKPOINT_DIR}/{named if isinstance(named, str) and is_best(named) else BEST_CHECKPOINT}"

    def pointer(self, key: str) -> Pointer:
        """The run's pointer as pulled here (checked as data: :func:`~.commit.read_pointer`)."""
        pointer = f"{CHECKPOINT_DIR}/{REMOTE_LATEST}"
        return read_pointer(self.local / pointer, f"{self.url}/{pointer}", key)

    def _named(self, relative: str, listing: dict[str, tuple[int, float]]) -> str:
        """A checkpoint asked for by the run folder's name (``ep2-ba6-rank0.pt``): the bucket's key of the run's
        checkpoint of that progress, which carries its writer's tag (:mod:`~.commit`)."""
        pointer = f"{CHECKPOINT_DIR}/{REMOTE_LATEST}"
        if relative == f"{CHECKPOINT_DIR}/{BEST_CHECKPOINT}":
            return self._best()
        if relative in listing or pointer not in listing or not is_periodic(Path(relative)):
            return relative
        names = [Path(r).name for r in listing if Path(r).parent.as_posix() == CHECKPOINT_DIR]
        held = [
            n for n in lineage_checkpoints(names, self.pointer("--checkpoint")) if untagged(n) == Path(relative).name
        ]
        return f"{CHECKPOINT_DIR}/{held[0]}" if held else relative

    def _newest_that_loads(self, pointed: str, listing: dict[str, tuple[int, float]], committed: Pointer) -> Path:
        """The pointer's checkpoint ``pointed``, downloaded; when it does not load, the bucket's older ones, newest
        first, until one does, with one note naming what was skipped and why (as ``--checkpoint latest`` of a local
        run says: :func:`~dlrecipes.records.checkpoints.skipped_note`).  One holding objects beyond tensors is not
        damaged: it is returned, and the command refuses it unless trusted."""
        from dlrecipes.records.checkpoints import none_loads, skipped_note

        in_folder = [Path(r).name for r in listing if Path(r).parent.as_posix() == CHECKPOINT_DIR]
        older = [f"{CHECKPOINT_DIR}/{name}" for name in lineage_checkpoints(in_folder, committed, committed.checkpoint)]
        skipped: list[tuple[Path, str]] = []
        tried: set[str] = set()
        for relative in [pointed, *older]:
            if _local_name(relative) in tried:  # two writers' checkpoints of one progress: the later writer's was tried
                continue
            tried.add(_local_name(relative))
            path = self._fetch(relative, *listing[relative], reuse=True)
            problem = damage(path, "--checkpoint")
            if problem is None:
                if skipped:
                    print(skipped_note(skipped, path), file=sys.stderr)
                return path
            skipped.append((path, problem))
        raise none_loads(self.url, skipped)

    def _changed(self) -> list[str]:
        """What the command wrote: never a checkpoint or the pointer (those are training's to move)."""
        return [r for r in super()._changed() if r.split("/", 1)[0] != CHECKPOINT_DIR]

    def push_outputs(self, what: str) -> None:
        """Upload what the command wrote beside the run; one line (exit 1) naming what could not be."""
        self.push()
        missing = self.incomplete()
        if missing:
            raise UploadFailed(
                f"{what} is in {self.local}, but {len(missing)} file(s) of it are not in {self.url}: "
                f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
            )


def _local_name(relative: str) -> str:
    """Where a copy keeps the bucket's ``relative``: a periodic or best checkpoint under the run folder's name for
    it (without its writer's tag)."""
    if is_periodic(Path(relative)):
        return f"{CHECKPOINT_DIR}/{untagged(Path(relative).name)}"
    if Path(relative).parent.as_posix() == CHECKPOINT_DIR and is_best(Path(relative).name):
        return f"{CHECKPOINT_DIR}/{BEST_CHECKPOINT}"
    return relative


def open_run(url: str, asked: set[str] | None = None) -> PulledRun:
    """The run at ``url``, its bucket asked first (one line when it cannot be read) unless it is in ``asked``: the
    buckets a command reading several runs has asked (the one asked here is added)."""
    root, name = split_run_url(url)
    bucket = f"{root.scheme}://{root.bucket}"
    if asked is None or bucket not in asked:
        check_access(root, KEY_PATH)
    if asked is not None:
        asked.add(bucket)
    return PulledRun(root, name, RunDir(_pulled_root(root) / name).path)


def pull_runs_dir(root: RemoteRoot) -> dict[Path, str]:
    """Every run under ``s3://bucket/prefix`` (its store has asked the bucket; those with a recipe.yaml, a sweep's
    nested ones too), their records copied here; returns the copies' folders with their bucket addresses."""
    local_root = _pulled_root(root)
    holder = PulledRun(root, "", local_root)
    everything = holder.store().listing(root.key("") + "/" if root.prefix else "")
    names = sorted({key[: -len(RECIPE_FILE) - 1] for key in everything if key.endswith("/" + RECIPE_FILE)})
    urls: dict[Path, str] = {}
    for name in names:
        try:
            folder = staged_path(local_root, name, f"{root}")
        except UnsafeKey as exc:  # a name no run is written under (``a//b``, ``..``): left out, said
            print(f"warning: {exc} (a run named so is not listed)", file=sys.stderr)
            continue
        run = PulledRun(root, name, folder)
        listing = {key[len(name) + 1 :]: value for key, value in everything.items() if key.startswith(name + "/")}
        run.pull_records(listing)
        _copy_live_lease(run, LEASE_FILE in listing)
        urls[run.local] = run.url
    return urls


def _copy_live_lease(run: PulledRun, listed: bool) -> None:
    """The run's lease beside its copy while it is live (``runs`` shows the run as running on its host, as a local
    run's lock file does), removed when it is not."""
    import json

    from dlrecipes.records.store.lease import live_holder

    copy = run.local / LEASE_FILE
    try:
        held = live_holder(run.store(), run.root, run.name) if listed else None
    except Exception:  # not read: runs shows the run by its records (a live writer's lease is said at its resume)
        held = None
    if held is None:
        copy.unlink(missing_ok=True)
    else:
        copy.write_text(json.dumps(held))


class SweepMirror(PulledRun):
    """A sweep in a bucket (``runs_dir: s3://...``): its folder is staged where its points' trainings stage their
    runs (``root.staging()/<sweep>``), each point's training uploads its own run, and this mirrors the sweep's own
    files (sweep.yaml, logs/, the summaries, an Optuna journal)."""

    def _points(self) -> set[str]:
        return {recipe.relative_to(self.local).parts[0] for recipe in self.local.rglob(RECIPE_FILE)}

    def _changed(self) -> list[str]:
        points = self._points()
        return [r for r in super()._changed() if r.split("/", 1)[0] not in points]

    def pull_missing(self) -> None:
        """What the bucket has of the sweep and this machine does not (a sweep continued on another machine): its
        own files and its points' records and checkpoint pointers, never a checkpoint itself (a point's resume
        brings its own). A file here is kept as it is: it is as new as the bucket's, or newer."""
        for relative, (size, modified) in self.listing().items():
            parts = relative.split("/")
            if CHECKPOINT_DIR in parts[:-1] and parts[-1] != REMOTE_LATEST or EXPORT_DIR in parts[:-1]:
                continue
            if not (self.local / relative).exists():
                self._fetch(relative, size, modified)


def sweep_mirror(root: RemoteRoot, name: str) -> SweepMirror:
    """The sweep ``name`` under the bucket's ``runs_dir`` (which its store has asked)."""
    return SweepMirror(root, name, root.staging() / name)


def shown_paths(rows: list[dict[str, Any]], urls: dict[Path, str], root: str | None = None) -> list[dict[str, Any]]:
    """Rows describing local copies say where the runs are: their bucket addresses, and (listed under ``root``)
    their names as paths under it, so that ``exp/u1`` and ``u1`` are told apart."""
    from dlrecipes.records.store.interface import addressed_row

    for row in rows:
        path = Path(row.get("path", ""))
        if path in urls:
            addressed_row(row, path, urls)
            row["path"] = urls[path]
            if root is not None and urls[path].startswith(root.rstrip("/") + "/"):
                row["run"] = urls[path][len(root.rstrip("/")) + 1 :]
    return rows


__all__ = [
    "PulledRun",
    "SweepMirror",
    "UploadFailed",
    "open_run",
    "pull_runs_dir",
    "shown_paths",
    "split_run_url",
    "sweep_mirror",
]
