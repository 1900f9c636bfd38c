"""The run store's interface: :class:`RunStore` (one per ``runs_dir``), what it opens for training
(:class:`TrainingRun`) and for reading (:class:`ReadRun`), and a sweep's folder (:class:`SweepFolder`).  The
package's docstring (:mod:`dlrecipes.records.store`) says how they are used."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dlrecipes.errors import RecipeError
from dlrecipes.records.layout import RunDir

if TYPE_CHECKING:
    from dlrecipes.config.sections import RecipeConfig
    from dlrecipes.records.run_lock import HeldLock


class RunEnded(Protocol):
    """How a training ended, as the store's end check reads it (:class:`dlrecipes.fit.outcome.TrainResult`, which
    records may not import)."""

    status: str


@contextmanager
def named_by_address(addresses: Mapping[Any, str]) -> Iterator[None]:
    """A one-line error about a local copy of a run in a bucket names the bucket's file instead
    (``~/.cache/dlrecipes/staging/pulled/runs/exp/r1/summary.json`` -> ``s3://runs/exp/r1/summary.json``): where the
    user can find it.  ``addresses``: local folder -> its address."""
    from dlrecipes.errors import UserError

    try:
        yield
    except UserError as exc:
        text = addressed(str(exc), addresses)
        if text != str(exc):
            exc.args = (text, *exc.args[1:])
        raise


def addressed(text: str, addresses: Mapping[Any, str]) -> str:
    """``text`` with each local copy's folder (``addresses``: folder -> address) replaced by its address."""
    for local, address in sorted(addresses.items(), key=lambda pair: -len(str(pair[0]))):
        text = text.replace(str(local), address)
    return text


def addressed_row(row: dict[str, Any], path: Any, addresses: Mapping[Any, str]) -> dict[str, Any]:
    """A row of ``runs`` or ``compare`` about the local copy ``path``: what it says is damaged, named by address."""
    if path in addresses and isinstance(row.get("damaged"), list):
        row["damaged"] = [addressed(str(message), addresses) for message in row["damaged"]]
    return row


@dataclass(frozen=True)
class RunOptions:
    """How a command treats its run: ``resume`` it, ``restart`` it (the old one kept under another name), ``trust``
    a checkpoint's pickled Python objects (``--trust-checkpoint``), ``verbose`` output."""

    resume: bool = False
    restart: bool = False
    trust: bool = False
    verbose: bool = False

    def check(self, config: RecipeConfig) -> None:
        """``--resume`` and ``--restart`` against each other and the recipe: the one place every front end (train,
        launch, the notebook, a sweep's points) has them refused, before anything starts."""
        if self.resume and self.restart:
            raise RecipeError("--resume continues a run and --restart starts it over: give one of them")
        if self.restart and not config.run_name:
            raise RecipeError(
                "--restart: name the run to start over with run_name=... (a run without a run_name is new every time)"
            )
        if self.resume and not (config.checkpoint.save and not config.checkpoint.best_only):
            raise RecipeError("--resume needs periodic checkpoints (checkpoint.save=true, checkpoint.best_only=false)")


@dataclass(frozen=True)
class TrainingRun:
    """A run opened for training, once per command, and all the rest of the path needs of it: where it is written
    here (``run``), the validated recipe (``config``), the resolved device, the command's options, the checkpoint
    ``--resume`` continues from (found under the lock while the store opened the run: ``resume_point``), how the lines
    name the run, and how it is kept in step. Nothing changes it once its store has opened it."""

    run: RunDir
    config: RecipeConfig
    device: str = "cpu"  # resolved (resolve_device)
    options: RunOptions = RunOptions()
    resume_point: Path | None = None  # rank 0's: the checkpoint --resume continues from (None: from the start)
    shown_as: str | None = None  # how the lines name the run when not by its local folder (a bucket's address)
    fresh: bool = True  # a new run: nothing of it existed before this training
    accepted: list[str] = field(default_factory=list)  # what --resume accepted as changed (check_resume)
    lock: HeldLock | None = None  # rank 0's: run.lock (in a bucket, with its lease); None on the other ranks
    keep_in_step: Callable[[], list] = list  # the callbacks that keep the store in step, built once per training
    stored: Callable[[RunEnded], None] = lambda result: None  # the end's check: raises when the store lacks files
    addresses: dict[Path, str] = field(default_factory=dict)  # a staging folder -> its address (a bucket's)

    @classmethod
    def in_folder(
        cls,
        config: RecipeConfig,
        folder: Path,
        device: str,
        options: RunOptions = RunOptions(),
        resume_point: Path | None = None,
    ) -> TrainingRun:
        """A run in ``folder`` as it is, outside any store (no name chosen, no lock, nothing kept in step): the
        benchmarks' Trainers, and one built by hand."""
        return cls(
            RunDir(folder),
            config=config,
            device=device,
            options=options,
            resume_point=resume_point,
        )

    def named(self) -> AbstractContextManager[None]:
        """A context in which errors about the local copy name the run where it lives (:func:`named_by_address`)."""
        return named_by_address(self.addresses)

    def end(self, failed: bool) -> bool:
        """Release the lock; after a failure, a fresh run that wrote no checkpoint leaves no directory. Returns
        whether the run directory stays."""
        from dlrecipes.records.run_dir import discard_empty_run

        if self.lock is None:
            return True
        if failed and self.fresh and discard_empty_run(self.run, self.lock):  # the lock released with it
            return False
        self.lock.release()
        return True


@dataclass
class ReadRun:
    """What a command after training reads, here: ``target`` (a run directory, a checkpoint or an export folder)
    and the ``checkpoint`` to give it; ``address`` names it where it lives."""

    target: str | Path  # local: as given; a bucket's: its local copy
    checkpoint: str | None
    address: str
    push: Callable[[str], None] = lambda what: None  # puts the command's outputs beside the run (a bucket's)
    pushes: bool = False  # whether the store takes the command's outputs from here (a bucket)
    bring: Callable[[str], None] = lambda relative: None  # downloads one more file of the run (a bucket's)

    def named(self) -> AbstractContextManager[None]:
        """A context in which errors about this local copy name the run where it lives (:func:`named_by_address`)."""
        return named_by_address({self.target: self.address} if self.pushes else {})

    def put_beside(self, what: str, folder: str) -> str | None:
        """The command wrote ``folder`` inside the run's local copy (``what``: "the export"): put it beside the run
        where it lives; its address there, or None where the run is here (a local folder: written in place)."""
        if not self.pushes:
            return None
        self.push(what)
        return f"{self.address}/{folder}"

    def outputs_written(self, what: str) -> None:
        """The command wrote its outputs (``what``: "the plots"): put them beside the run where it lives (one line,
        exit code 1, naming what could not be)."""
        self.push(what)


@dataclass
class SweepFolder:
    """Where a sweep keeps its own files (``folder``: local), its ``address`` where it lives, and the ``runs_dir`` its
    points train into (``trains_into``: the folder, or the bucket's address of it)."""

    folder: Path
    address: str
    trains_into: str
    after_point: Callable[[], None] | None = None  # called as each point's training ends (a bucket's upload)
    finish: Callable[[], list[str]] = list  # the sweep's end: the files its store still lacks


class RunStore(ABC):
    """The runs of one ``runs_dir`` (see the module docstring)."""

    def __init__(self, runs_dir: str | Path):
        self.runs_dir = runs_dir

    @abstractmethod
    def check(self) -> None:
        """Whether the runs can be written there: one line when not (a bucket: asked once per command)."""

    def check_room(self, config: RecipeConfig) -> None:  # noqa: B027 (a store without limits of its own)
        """Whether a run of ``config`` fits where it would be written (a bucket: its keys' and staging paths' limits),
        asking no server: one line when not. A local folder's limits are the file system's, met as it writes."""

    @abstractmethod
    def open_for_training(self, config: RecipeConfig, device: str, options: RunOptions) -> TrainingRun:
        """The run ``config`` trains, named, set up and locked (see the module docstring)."""

    @abstractmethod
    def check_resumable(self, name: str, first_node: bool) -> None:
        """``--resume`` of ``name``, refused before any process starts when the store has no such run (locally: by
        the first node only; the others may not share its disk)."""

    @abstractmethod
    def runs(self, last: int | None) -> list[tuple[Path, str | None]]:
        """The newest ``last`` runs under the root (all: None), newest first: (local folder, address or None)."""

    @abstractmethod
    def sweep(self, name: str) -> SweepFolder:
        """The folder of the sweep ``name`` (a bucket's copy of it is downloaded first)."""

    def rows_shown(self, rows: list[dict[str, Any]], addresses: dict[Path, str]) -> list[dict[str, Any]]:
        """``runs``' rows as the user names the runs (a bucket's: by address, names as paths under the root)."""
        return rows
