"""The engine's GPU correctness matrix: ``python benchmarks/gpu_suite.py --check`` (or this file).

One GPU, no internet. Its four sections, each within its 5-minute budget on one H100 (measured there on
2026-11-28 with torch 2.11 and Composer 0.32.1: engine 189 s, sync 85 s, compile 125 s; about 400 s for the
whole check): ``--only SECTION`` runs one, so that each fits a machine lent for 5 minutes.  Each case prints its
result, time and detail on its own line as it ends, and ``--json PATH`` is rewritten after every case, so a
run that is cut short keeps what it found; a table of them all follows, with the total time, and the exit
status is 1 on a failure:

- ``engine``: our Trainer against Composer's on {fp32, amp_bf16, amp_fp16} x {fixed microbatches with
  accumulation, ``auto``}: the recipe's training in deterministic mode, the weights and every
  logged loss compared within the stated tolerance; and FSDP on one rank with train metrics on;
- ``sync``: ``torch.cuda.set_sync_debug_mode("error")`` over steps 3-20 of cifar10_fast (synthetic
  CIFAR-sized data on the device) and of the flagship recipe on generated FFCV data (800 small JPEGs,
  batch 32: made by the first case that needs them, in a folder every case shares): any host-device
  synchronisation in those steps fails the case with the op that made it;
- ``compile``: ``trainer.compile`` against eager with no algorithm (the control), with SAM and with EMA, in a setting
  where the two differ only by rounding (no dropout, deterministic, SGD, no augmentation, full fp32,
  inductor's ``fallback_random``): every training loss and evaluation loss within the case's
  ``COMPILE_TOLERANCE``, which a SAM step that leaves its perturbation in the weights, or an EMA that evaluates
  the training weights, exceeds at least five times over (tests/test_benchmarks.py shows both on the CPU with
  eager training in place of the compiled one);
- ``ranks``, with 2 GPUs: NCCL DDP with uneven per-rank loaders (tests/engine_ranks.py, against Composer's
  Trainer), a SIGTERM stop and ``--resume`` ending with the uninterrupted run's weights.  With
  fewer GPUs they are skipped with a message, no process started.  On the CPU their ranks are forked from a
  process that has imported torch and Composer (CUDA would not survive that); only the SIGTERM case's stopped
  run goes through ``dlrecipes launch``.

Each case has its own time limit (``Case.limit``, seconds on one H100) and each section a budget (``--budget``,
300 s by default; give the two-GPU ``ranks`` section 400, its limits' sum): a case gets its limit or what is left
of its section's budget, whichever is less; past it, it is killed and fails with "no result after N s"; a case
the budget leaves no time for fails with "not run".

``--device cpu`` is its smoke version (in the test suite, its limits ``CPU_SLOWER`` times the GPU's): the fp32
fixed-microbatch comparison and the two-process cases on gloo; the cases that need CUDA are skipped.  Each case
runs in its own process, so deterministic mode, compilation and process groups never leak between cases.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # tests/forked.py and tests/engine_ranks.py, when run as `python benchmarks/...`
    sys.path.insert(1, str(ROOT))  # after the script's own folder

# max |difference| allowed between our Trainer and Composer's: weights, then each logged loss
TOLERANCE = {"fp32": (0.0, 0.0), "amp_bf16": (1e-6, 1e-6), "amp_fp16": (1e-6, 1e-6)}
# max |difference| allowed between compiled and eager training, in fp32, for each compile case: (any training
# loss, any evaluation loss).  Inductor's kernels round differently from eager's, and 12 steps of SGD grow that:
# on one H100 (2026-11-28, torch 2.11) compiled against eager differed by (4.4e-3, 7.5e-4) with no algorithm,
# (1.2e-2, 7.7e-3) with SAM (two passes a step) and (4.4e-3, 4.2e-5) with EMA.  Each tolerance is about 4 times
# that, and at most a fifth of what the broken version its case is for differs by on the CPU: a SAM step that
# keeps its perturbation, 0.30 in the training losses; an EMA that evaluates the training weights, 0.017 in the
# evaluation losses (tests/test_benchmarks.py).
COMPILE_TOLERANCE = {"none": (2e-2, 5e-3), "sam": (5e-2, 3e-2), "ema": (2e-2, 2e-3)}
DATA = "GPU_CHECK_DATA"  # the folder the runner gives every case for generated data that cases share


class Skip(Exception):
    """A case this machine cannot run (the message says why)."""


def _recipe(tmp: Path, device: str, extra: list[str]) -> tuple[Path, list[str]]:
    """The quickstart recipe (embedded digits, no download), short and deterministic."""
    return ROOT / "recipes" / "quickstart.yaml", [
        f"runs_dir={tmp}/runs",
        "trainer.max_duration=12ba",
        "trainer.train_subset_num_batches=6",
        "trainer.eval_subset_num_batches=2",
        f"trainer.device={device}",
        "trainer.deterministic=true",
        "trainer.progress_bar=false",
        "checkpoint.save=false",
        "checkpoint.monitor=null",
        *extra,
    ]


def _train(
    recipe: Path, overrides: list[str], run_dir: Path, reference: bool = False, callbacks=(), record_losses: bool = True
) -> dict:
    """Train in this process (ours, or Composer's Trainer); the weights, every batch's loss and every
    evaluation's loss (read back after each batch and evaluation, so not while a synchronisation gate is open)."""
    from composer import Trainer as ComposerTrainer
    from composer.core import Callback

    import dlrecipes.engine
    from dlrecipes import api
    from dlrecipes.builders import build_trainer
    from dlrecipes.core.devices import resolve_device
    from dlrecipes.core.outputs import EVAL_LOSS
    from dlrecipes.records.store import TrainingRun

    losses, eval_losses = [], []

    class Losses(Callback):
        def batch_end(self, state, logger):  # a read-back per batch: this is a check, not a speed run
            losses.append(float(state.total_loss_dict["loss/train/total"]))

        def eval_end(self, state, logger):  # what EMA's weights change: training losses never see them
            eval_losses.append(float(state.eval_metric_values[EVAL_LOSS]))

    class Composers(ComposerTrainer):
        def __init__(self, *args, train_metrics_interval: int = 1, **kwargs):
            super().__init__(*args, **kwargs)

    ours = dlrecipes.engine.Trainer
    dlrecipes.engine.Trainer = Composers if reference else ours
    try:
        config = api.resolve(recipe, overrides)
        opened = TrainingRun.in_folder(config, run_dir, resolve_device(config.trainer.device))
        trainer = build_trainer(opened).trainer
    finally:
        dlrecipes.engine.Trainer = ours
    trainer.state.callbacks.extend([*([Losses()] if record_losses else []), *callbacks])
    trainer.fit()
    trainer.close()
    weights = {k: v.detach().float().cpu() for k, v in trainer.state.model.state_dict().items()}
    return {
        "weights": weights,
        "losses": losses,
        "eval_losses": eval_losses,
        "micro": trainer.state.device_train_microbatch_size,
        "train_metrics": {k: float(v) for k, v in trainer.state.train_metric_values.items()},
        "device": str(next(iter(trainer.state.model.parameters())).device),
    }


def case_same_as_composer(device: str, precision: str, micro: str) -> str:
    if device == "cpu" and (precision != "fp32" or micro == "auto"):
        raise Skip("needs CUDA")
    with tempfile.TemporaryDirectory() as tmp:
        recipe, overrides = _recipe(
            Path(tmp), device, [f"trainer.precision={precision}", f"trainer.device_train_microbatch_size={micro}"]
        )
        ours = _train(recipe, overrides, Path(tmp) / "ours")
        theirs = _train(recipe, overrides, Path(tmp) / "theirs", reference=True)
    weight_diff = max((ours["weights"][k] - theirs["weights"][k]).abs().max().item() for k in ours["weights"])
    loss_diff = max(abs(a - b) for a, b in zip(ours["losses"], theirs["losses"]))
    weight_tol, loss_tol = TOLERANCE[precision]
    detail = (
        f"max abs weight diff {weight_diff:.2e} (<= {weight_tol:.0e}), max abs loss diff {loss_diff:.2e} "
        f"(<= {loss_tol:.0e}) over {len(ours['losses'])} losses; microbatch {ours['micro']}"
    )
    assert len(ours["losses"]) == len(theirs["losses"]) == 12, (
        f"{len(ours['losses'])} vs {len(theirs['losses'])} losses"
    )
    assert weight_diff <= weight_tol and loss_diff <= loss_tol, detail
    return detail


class SyncGate:
    """``torch.cuda.set_sync_debug_mode("error")`` from the end of batch ``start`` to the end of ``stop``."""

    def __init__(self, start: int = 3, stop: int = 20):
        from composer.core import Callback

        gate = self

        class Gate(Callback):
            def batch_end(self, state, logger):
                import torch

                batch = int(state.timestamp.batch)
                if batch == gate.start:
                    torch.cuda.set_sync_debug_mode("error")
                    gate.opened = True
                elif batch == gate.stop:
                    torch.cuda.set_sync_debug_mode("default")
                    gate.closed = True

            def close(self, state, logger):
                import torch

                torch.cuda.set_sync_debug_mode("default")

        self.start, self.stop, self.opened, self.closed = start, stop, False, False
        self.callback = Gate()


def _gated(recipe: Path, overrides: list[str], run_dir: Path) -> str:
    gate = SyncGate()
    _train(recipe, overrides, run_dir, callbacks=[gate.callback], record_losses=False)
    assert gate.opened and gate.closed, "the run ended before batch 20"
    return f"no synchronisation in steps {gate.start + 1}-{gate.stop}"


def case_sync_free_cifar(device: str) -> str:
    if device != "gpu":
        raise Skip("needs CUDA")
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            "dataset={name: synthetic, input_shape: [3, 32, 32], num_classes: 10, train_samples: 15360, "
            "eval_samples: 512}",
            "trainer.max_duration=24ba",
            "trainer.progress_bar=false",
            "checkpoint.save=false",
            "checkpoint.monitor=null",
            f"runs_dir={tmp}/runs",
        ]
        return _gated(ROOT / "recipes" / "cifar10_fast.yaml", overrides, Path(tmp) / "run")


def case_sync_free_flagship(device: str) -> str:
    if device != "gpu":
        raise Skip("needs CUDA")
    sys.path.insert(0, str(HERE))
    from flagship_data import Scale, flagship_data, flagship_overrides

    # the recipe as it is (its model, algorithms, FFCV decoding with progressive resizing), on less data: 800
    # JPEGs of about 256x192 stored at 160 px, 128 px crops, batch 32: 25 batches an epoch, so the gate's steps
    # have no epoch end (evaluation) among them; its learning rate scaled to the batch (not to diverge)
    scale = Scale(tiny=False, device=device)
    scale.images, scale.image_size, scale.max_res, scale.crop, scale.eval_crop = 800, (256, 192), 160, 128, 160
    scale.flagship_batch = 32
    with tempfile.TemporaryDirectory() as tmp:
        data = flagship_data(scale, Path(os.environ.get(DATA) or tmp) / "flagship")  # made once, then reused
        overrides = flagship_overrides(data, scale) + [
            "trainer.max_duration=24ba",
            "trainer.progress_bar=false",
            "checkpoint.save=false",
            "checkpoint.monitor=null",
            f"runs_dir={tmp}/runs",
            f"optimizer.lr={2.0 * 32 / 1024}",
        ]  # the recipe's 2.0 is for batch 1024
        return _gated(ROOT / "recipes" / "imagenet100_fast.yaml", overrides, Path(tmp) / "run")


def case_fsdp_with_train_metrics(device: str) -> str:
    if device != "gpu":
        raise Skip("needs CUDA (FSDP runs on NCCL)")
    port = _free_port()
    os.environ.update(
        {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1",
            "NODE_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        recipe, overrides = _recipe(
            Path(tmp), device, ["trainer.fsdp={sharding_strategy: FULL_SHARD}", "trainer.train_metrics_interval=1"]
        )
        run = _train(recipe, overrides, Path(tmp) / "run")
    top1 = run["train_metrics"].get("top1")
    assert top1 is not None and 0.0 <= top1 <= 1.0, run["train_metrics"]
    assert all(loss == loss for loss in run["losses"]), "a NaN loss"
    return f"train top1 {top1:.4f} on {run['device']}, {len(run['losses'])} finite losses"


COMPILE_ALGORITHMS = {"none": "{}", "sam": "{sam: {rho: 0.05}}", "ema": "{ema: {half_life: 10ba}}"}


def compile_setting(tmp: Path, device: str, algorithm: str) -> tuple[Path, list[str]]:
    """The quickstart recipe where compiled and eager training can differ only by rounding: no dropout (the
    model's), no data augmentation, deterministic, plain SGD (AdamW's first steps turn a rounding difference in a
    near-zero gradient into a whole step), with ``algorithm`` (a key of COMPILE_ALGORITHMS)."""
    return _recipe(
        tmp,
        device,
        [
            "model.dropout=0",
            "dataset.augment=false",
            "optimizer={name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 0.0}",
            f"algorithms={COMPILE_ALGORITHMS[algorithm]}",
        ],
    )


def loss_differences(run: dict, eager: dict) -> tuple[float, float]:
    """max |difference| of ``run``'s training losses from ``eager``'s, and of its evaluation losses."""
    for name in ("losses", "eval_losses"):
        assert len(run[name]) == len(eager[name]) > 0, f"{len(run[name])} vs {len(eager[name])} {name}"
        assert all(math.isfinite(x) for x in run[name] + eager[name]), f"a non-finite value in {name}"
    return tuple(max(abs(a - b) for a, b in zip(run[name], eager[name])) for name in ("losses", "eval_losses"))


def same_as_eager(run: dict, eager: dict, algorithm: str) -> str:
    """The compile cases' comparison: every training and evaluation loss of ``run`` within the COMPILE_TOLERANCE
    of ``algorithm``'s case from eager training's (AssertionError past it). The CPU test gives it eager runs of a
    deliberately broken SAM and EMA in place of the compiled run, so a wrong SAM step or a lost EMA swap is known
    to fail it."""
    train, evals = loss_differences(run, eager)
    train_tolerance, eval_tolerance = COMPILE_TOLERANCE[algorithm]
    detail = (
        f"max abs diff from eager: training loss {train:.2e} over {len(run['losses'])} steps (<= "
        f"{train_tolerance:.0e}), eval loss {evals:.2e} over {len(run['eval_losses'])} evaluations (<= "
        f"{eval_tolerance:.0e})"
    )
    assert train <= train_tolerance and evals <= eval_tolerance, detail
    return detail


def case_compile_with(device: str, algorithm: str) -> str:
    if device != "gpu":
        raise Skip("torch.compile of the recipe takes minutes on a CPU")
    import torch
    import torch._inductor.config

    torch._inductor.config.fallback_random = True  # eager's random ops, not inductor's own generator
    # full fp32 on both sides: TF32 convolutions round differently in whichever algorithm or layout each picks
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    with tempfile.TemporaryDirectory() as tmp:
        recipe, eager = compile_setting(Path(tmp), device, algorithm)
        compiled = _train(recipe, [*eager, "trainer.compile=true"], Path(tmp) / "compiled")
        reference = _train(recipe, eager, Path(tmp) / "eager")
    return same_as_eager(compiled, reference, algorithm)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gpus_for_two(device: str) -> None:
    if device == "gpu":
        from dlrecipes.core.devices import gpu_count

        if gpu_count() < 2:
            raise Skip(f"needs 2 GPUs ({gpu_count()} here)")


def _rank_env(rank: int, port: int) -> dict[str, str]:
    """Rank ``rank`` of 2 on this node: the environment Composer's launcher gives a training process."""
    return {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PYTHONUNBUFFERED": "1",
    }


def _ranks(scenario: str, out: Path, device: str, reference: bool = False) -> list[dict]:
    import torch

    from dlrecipes.runtime import fork_server
    from tests.forked import program

    out.mkdir(parents=True, exist_ok=True)
    port, procs = _free_port(), []
    for rank in range(2):
        env = {**_rank_env(rank, port), "ENGINE_DEVICE": device, **({"REFERENCE": "1"} if reference else {})}
        err = out / f"rank{rank}.err"
        if device == "cpu":  # forked from a process that imported torch and Composer once (CUDA would not survive it)
            procs.append(
                (
                    fork_server.start(
                        program("tests.engine_ranks"),
                        [scenario, str(out)],
                        cwd=ROOT,
                        env=env,
                        out=out / f"rank{rank}.out",
                        err=err,
                    ),
                    err,
                )
            )
        else:
            procs.append(
                (
                    subprocess.Popen(
                        [sys.executable, "-m", "tests.engine_ranks", scenario, str(out)],
                        cwd=ROOT,
                        env=env,
                        stderr=open(err, "w"),
                    ),
                    err,
                )
            )
    for proc, err in procs:
        assert proc.wait(timeout=300) == 0, err.read_text()[-2000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def case_ddp_uneven(device: str) -> str:
    import torch

    _gpus_for_two(device)
    with tempfile.TemporaryDirectory() as tmp:
        ours = _ranks("uneven", Path(tmp) / "ours", device)
        theirs = _ranks("uneven", Path(tmp) / "theirs", device, reference=True)
    for name, value in ours[0]["params"].items():
        assert torch.equal(value, ours[1]["params"][name]), f"ranks differ in {name}"
        assert torch.allclose(value, theirs[0]["params"][name], atol=1e-6), f"differs from Composer's in {name}"
    assert ours[0]["batches"] == theirs[0]["batches"] == 10 and ours[0]["samples"] == theirs[0]["samples"]
    return (
        f"{ours[0]['batches']} batches on both ranks, weights equal to Composer's; {ours[0]['reductions']} "
        "host reductions"
    )


def _launch(recipe: Path) -> list[str]:
    return [sys.executable, "-m", "dlrecipes", "launch", str(recipe), "-n", "2"]


def _two_ranks(recipe: Path, args: list[str], out: Path, device: str) -> None:
    """A two-process training to its end: through ``dlrecipes launch -n 2`` on GPUs; on the CPU, its two ranks forked
    from the process that imported torch and Composer once, with the environment Composer's launcher gives them
    (the launcher's own part, a signal to the whole job, is what the stopped run tests)."""
    if device != "cpu":
        done = subprocess.run([*_launch(recipe), *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return
    for rank, proc in enumerate(_forked_ranks(recipe, args, out)):
        assert proc.wait(timeout=600) == 0, (out / f"rank{rank}.err").read_text()[-2000:]


def _forked_ranks(recipe: Path, args: list[str], out: Path) -> list:
    """The two ranks of a CPU training, forked, their output in ``out``/rank<N>.out and .err."""
    from dlrecipes.runtime import fork_server
    from tests.forked import program

    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    return [
        fork_server.start(
            program(),
            ["train", str(recipe), *args],
            cwd=ROOT,
            env=_rank_env(rank, port),
            out=out / f"rank{rank}.out",
            err=out / f"rank{rank}.err",
        )
        for rank in range(2)
    ]


def _stopped_by_sigterm(recipe: Path, args: list[str], tmp: Path, device: str) -> str:
    """A two-process training sent SIGTERM after its second epoch: ``dlrecipes launch``'s job on GPUs, the signal to
    its process group; on the CPU, the two ranks forked and the signal to each, as the launcher passes it on (the
    launcher's own part is what tests/test_distributed.py tests). Its rank 0 output."""
    if device == "cpu":
        ranks = _forked_ranks(recipe, args, tmp / "stopped")
    else:
        job = subprocess.Popen(
            [*_launch(recipe), *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    history = tmp / "runs" / "stopped" / "history.csv"
    deadline = time.time() + 300
    while not (history.exists() and len(history.read_text().splitlines()) >= 3) and time.time() < deadline:
        time.sleep(0.2)
    if device == "cpu":
        for rank in ranks:
            rank.send_signal(signal.SIGTERM)
        codes = [rank.wait(timeout=300) for rank in ranks]
        out = "".join((tmp / "stopped" / f"rank0.{kind}").read_text() for kind in ("out", "err"))
    else:
        os.killpg(job.pid, signal.SIGTERM)
        out, _ = job.communicate(timeout=300)
        codes = [job.returncode]
    assert codes in ([75], [75, 75]) and "stopped by SIGTERM" in out, f"exit codes {codes}: {out[-2000:]}"
    return out


def case_sigterm_and_resume(device: str) -> str:
    import torch

    _gpus_for_two(device)
    with tempfile.TemporaryDirectory() as tmp:
        common = [
            f"runs_dir={tmp}/runs",
            f"trainer.device={device}",
            "trainer.deterministic=true",
            "trainer.max_duration=6ep",
            "trainer.train_subset_num_batches=4",
            "trainer.eval_subset_num_batches=1",
            "trainer.progress_bar=false",
            "checkpoint.save_interval=1ep",
            "checkpoint.keep=-1",
            "checkpoint.monitor=null",
            "trainer.batch_size=32",
        ]
        recipe = ROOT / "recipes" / "quickstart.yaml"
        _two_ranks(recipe, ["run_name=whole", *common], Path(tmp) / "whole", device)
        out = _stopped_by_sigterm(recipe, ["run_name=stopped", *common], Path(tmp), device)
        _two_ranks(recipe, ["run_name=stopped", "--resume", *common], Path(tmp) / "resumed", device)

        def final(name: str) -> dict:
            saved = torch.load(
                Path(tmp) / "runs" / name / "checkpoints" / "latest-rank0.pt", weights_only=False, map_location="cpu"
            )
            return saved["state"]["model"]

        a, b = final("whole"), final("stopped")
        diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert diff == 0.0, f"resumed weights differ from the uninterrupted run's by {diff:.3g}"
    stopped_at = out.split("stopped by SIGTERM after batch ")[1].split()[0]
    return f"stopped after batch {stopped_at} (exit 75), resumed to the end: weights equal to the uninterrupted run's"


@dataclass(frozen=True)
class Case:
    run: Callable[[str], str]
    section: str  # a key of SECTIONS: ``--only`` takes its name, and the budget is each section's
    limit: int  # seconds on one H100 (a few times what it should take): past it, the case is killed and fails
    gpus: int = 1  # on a GPU machine with fewer, skipped without starting its process


# the check's parts, each within BUDGET on one H100 (measured there on 2026-11-28, torch 2.11: engine 189 s,
# sync 85 s, compile 125 s; the whole check on one GPU about 400 s)
SECTIONS = {
    "engine": "our Trainer against Composer's in every precision, and FSDP on one rank",
    "sync": "no host-device synchronisation in the steady steps of cifar10_fast and the flagship",
    "compile": "trainer.compile against eager: no algorithm, SAM, EMA",
    "ranks": "two GPUs: NCCL DDP on uneven loaders, a SIGTERM stop and --resume",
}
CASES: dict[str, Case] = {
    **{
        f"same as Composer: {p}, {'accumulation' if m != 'auto' else 'auto microbatching'}": Case(
            lambda device, p=p, m=m: case_same_as_composer(device, p, m), "engine", 45
        )
        for p in ("fp32", "amp_bf16", "amp_fp16")
        for m in ("16", "auto")
    },
    "FSDP (1 rank) with train metrics": Case(case_fsdp_with_train_metrics, "engine", 60),
    "no sync in steps 3-20: cifar10_fast": Case(case_sync_free_cifar, "sync", 60),
    "no sync in steps 3-20: imagenet100_fast on FFCV": Case(case_sync_free_flagship, "sync", 120),  # FFCV's numba
    "trainer.compile, no algorithm (the control)": Case(
        lambda device: case_compile_with(device, "none"), "compile", 120
    ),
    "trainer.compile with SAM": Case(lambda device: case_compile_with(device, "sam"), "compile", 90),  # cache warm
    "trainer.compile with EMA": Case(lambda device: case_compile_with(device, "ema"), "compile", 90),
    "2 ranks: DDP with uneven loaders": Case(case_ddp_uneven, "ranks", 120, gpus=2),
    "2 ranks: SIGTERM stop, then --resume": Case(case_sigterm_and_resume, "ranks", 240, gpus=2),
}
BUDGET = 300  # seconds for each section by default: a machine lent for 5 minutes runs any one of them
CPU_SLOWER = 4  # the smoke version's limits: the GPU's times this (2 shared cores, maybe under coverage)


def run_case(name: str, device: str) -> dict:
    """One case in this process: {"result": pass|fail|skip, "detail": ...}."""
    try:
        return {"result": "pass", "detail": CASES[name].run(device)}
    except Skip as skip:
        return {"result": "skip", "detail": str(skip)}
    except Exception as exc:  # a failed check: its message is the table's detail
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        return {"result": "fail", "detail": f"{type(exc).__name__}: {first[:300]}"}


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()] if path.exists() else []
    return lines[-1].strip()[-200:] if lines else "(none)"


def _case_in_its_own_process(name: str, device: str, tmp: Path, limit: float, data: Path) -> dict:
    """One case in a process (and process group) of its own, killed after ``limit`` seconds: a new Python with a
    GPU; on the CPU, forked from a process that imported torch and Composer once (CUDA would not survive it)."""
    args = ["--device", device, "--case", name, "--json", str(tmp / "row.json")]
    env = {**os.environ, DATA: str(data)}
    if device == "cpu":
        from dlrecipes.runtime import fork_server
        from tests.forked import program

        process = fork_server.start(
            program(str(Path(__file__).resolve())), args, cwd=ROOT, env=env, out=tmp / "output", new_session=True
        )
    else:
        with open(tmp / "output", "w") as output:
            process = subprocess.Popen(
                [sys.executable, str(Path(__file__)), *args],
                cwd=ROOT,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    try:
        if process.wait(timeout=limit) is None:  # a forked process's way of saying it
            raise subprocess.TimeoutExpired(args, limit)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # with what it started: compile workers, data loaders, ranks
        except OSError:  # not yet a group of its own
            process.kill()
        process.wait()
        last = _last_line(tmp / "output")
        return {"result": "fail", "detail": f"no result after {limit:.0f} s; its last output: {last}"}
    try:
        return json.loads((tmp / "row.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {"result": "fail", "detail": f"the case's process failed: {(tmp / 'output').read_text().strip()[-300:]}"}


def _write_json(path: Path, rows: list[dict]) -> None:
    """The rows so far, replaced whole (a run cut short leaves the last complete file)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(rows, indent=2))
    os.replace(partial, path)


def selected(only: list[str] | None = None) -> list[str]:
    """The cases of the sections named in ``only``, or whose name contains one of its texts (all without it)."""
    return [
        name for name, case in CASES.items() if not only or any(text == case.section or text in name for text in only)
    ]


def run_all(
    device: str,
    only: list[str] | None = None,
    budget: float = BUDGET,
    json_path: Path | None = None,
    data_dir: Path | None = None,
) -> list[dict]:
    """The selected cases, each in its own process, within ``budget`` seconds for each section; each case's line
    printed as it ends (and the JSON rewritten), then the table. Returns the rows."""
    gpus = 0
    if device == "gpu":
        from dlrecipes.core.devices import gpu_count

        gpus = gpu_count()
    rows, began, section_began = [], time.perf_counter(), {}
    with tempfile.TemporaryDirectory() as shared:
        for name in selected(only):
            case, start = CASES[name], time.perf_counter()
            left = budget - (start - section_began.setdefault(case.section, start))
            if device == "gpu" and gpus < case.gpus:
                row = {"result": "skip", "detail": f"needs {case.gpus} GPUs ({gpus} here)"}
            elif left <= 0:
                row = {
                    "result": "fail",
                    "detail": f"not run: the {case.section} section's {budget:.0f} s budget was spent (--budget)",
                }
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    limit = case.limit * (1 if device == "gpu" else CPU_SLOWER)
                    row = _case_in_its_own_process(name, device, Path(tmp), min(limit, left), data_dir or Path(shared))
            row.update(case=name, section=case.section, seconds=time.perf_counter() - start, limit=case.limit)
            rows.append(row)
            print(f"{row['result']:<4}  {name}  ({row['seconds']:.0f} s)  {row['detail']}", flush=True)
            if json_path:
                _write_json(json_path, rows)
    total = time.perf_counter() - began
    cases = f"{len(rows)} case{'s' * (len(rows) != 1)}"
    sections = len({row["section"] for row in rows})
    print(
        "\n" + table(rows, device) + f"\n\n{cases} in {total:.0f} s (budget {budget:.0f} s for each of "
        f"{sections} section{'s' * (sections != 1)})",
        flush=True,
    )
    return rows


def table(rows: list[dict], device: str) -> str:
    from importlib.metadata import version  # not ``import composer``: the runner trains nothing, each case does

    import torch

    name = torch.cuda.get_device_name(0) if device == "gpu" else "CPU"
    lines = [
        f"engine correctness on {name}; torch {torch.__version__}, Composer {version('mosaicml')}",
        "",
        "| case | result | seconds | detail |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['case']} | {r['result']} | {r['seconds']:.0f} | {r['detail']} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    parser.add_argument("--case", help="run one case in this process (what the table's runner does)")
    parser.add_argument(
        "--only",
        action="append",
        help="a section ("
        + "; ".join(f"{name}: {what}" for name, what in SECTIONS.items())
        + ") or text in the cases' names (repeatable)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=BUDGET,
        help=f"seconds for each section (default {BUDGET}); a case gets at most what is left of its section's",
    )
    parser.add_argument("--data-dir", type=Path, help="keep (and reuse) the flagship case's generated data here")
    parser.add_argument("--json", type=Path, help="the rows, rewritten after every case")
    args = parser.parse_args(argv)
    if args.device == "gpu":
        from dlrecipes.core.devices import gpu_available

        if not gpu_available():
            sys.exit("gpu_check: no CUDA device here; --device cpu runs the smoke version")
    if args.case:
        row = run_case(args.case, args.device)
        if args.json:
            args.json.write_text(json.dumps(row))
        return 0
    if not selected(args.only):
        sys.exit(
            f"gpu_check: no section is {' or '.join(map(repr, args.only))} and no case's name contains it "
            f"(the sections: {', '.join(SECTIONS)})"
        )
    rows = run_all(args.device, args.only, args.budget, args.json, args.data_dir)
    return 1 if any(r["result"] == "fail" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
