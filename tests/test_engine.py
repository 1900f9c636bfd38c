"""Our Trainer (dlrecipes/engine/): the same training as Composer's, without host-device
synchronisation per step, train metrics from the step's own outputs, losses read back only
at the log interval."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import composer
import pytest
import torch
from composer.core import Callback

from dlrecipes import api
from dlrecipes.engine import COMPOSER_VERSION, Trainer

from .conftest import REPO, build_trainer

DETERMINISTIC = ["trainer.deterministic=true", "checkpoint.save=false", "checkpoint.monitor=null"]


@pytest.fixture(autouse=True)
def restore_nondeterministic_mode():
    """trainer.deterministic switches torch to deterministic algorithms for the whole process
    (Composer's configure_deterministic_mode); later tests in this process must not inherit it."""
    yield
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, False


def test_overrides_follow_the_pinned_composer():
    assert composer.__version__ == COMPOSER_VERSION  # the private methods overridden are this version's


def _fit(recipe: Path, run_dir: Path, overrides: list[str], callbacks=()):
    trainer = build_trainer(api.resolve(recipe, overrides), run_dir)
    trainer.state.callbacks.extend(callbacks)
    trainer.fit()
    trainer.close()
    return trainer


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.state.model.state_dict().items()}


def _reference_fit(recipe: Path, run_dir: Path, overrides: list[str]):
    """The same recipe through Composer's own Trainer."""
    import dlrecipes.engine

    ours = dlrecipes.engine.Trainer
    try:
        sys.modules.pop("reference_engine", None)
        sys.path.insert(0, str(REPO / "tests"))
        importlib.import_module("reference_engine")
        return _fit(recipe, run_dir, overrides)
    finally:
        sys.path.remove(str(REPO / "tests"))
        dlrecipes.engine.Trainer = ours


@pytest.mark.parametrize(
    "case",
    [
        [],  # one microbatch, SGD without closures
        ["trainer.device_train_microbatch_size=16", "optimizer={name: adamw, lr: 0.01}"],  # gradient accumulation
        ["algorithms={label_smoothing: {smoothing: 0.1}}"],  # an algorithm acting on the loss events
        ["algorithms={sam: {rho: 0.05}}"],  # an optimizer that needs a closure (two passes)
    ],
    ids=["plain", "accumulation", "label_smoothing", "sam"],
)
@pytest.mark.slow
def test_training_is_bit_identical_to_composers_trainer(tiny_recipe, tmp_path, case):
    overrides = DETERMINISTIC + case
    ours = _fit(tiny_recipe, tmp_path / "ours", overrides)
    assert isinstance(ours, Trainer) and int(ours.state.timestamp.batch) == 6
    reference = _reference_fit(tiny_recipe, tmp_path / "reference", overrides)
    assert not isinstance(reference, Trainer)
    a, b = _weights(ours), _weights(reference)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    clock = ("total_wct", "iteration_wct", "epoch_wct", "batch_wct")
    counters = {k: v for k, v in ours.state.timestamp.state_dict().items() if k not in clock}
    assert counters == {k: v for k, v in reference.state.timestamp.state_dict().items() if k not in clock}
    ours_losses = {k: float(v) for k, v in ours.state.total_loss_dict.items()}  # device tensors: read here
    assert ours_losses and ours_losses == reference.state.total_loss_dict  # the last batch's


class CountReadBacks(Callback):
    """Counts Tensor.item/.cpu/.tolist/.numpy and tensor -> bool/float/int conversions (each a
    host-device synchronisation on a GPU) from the end of batch ``start`` to the end of batch ``stop``:
    whole training steps, data loading and the loop's bookkeeping included."""

    NAMES = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__")

    def __init__(self, start: int, stop: int):
        self.start, self.stop, self.counts, self.active = start, stop, {}, False
        self.originals = {name: getattr(torch.Tensor, name) for name in self.NAMES}
        self.module_train_calls = 0

    def _install(self):
        for name, original in self.originals.items():

            def counted(tensor, *args, __name=name, __original=original, **kwargs):
                if self.active:
                    self.counts[__name] = self.counts.get(__name, 0) + 1
                return __original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)
        original_train = torch.nn.Module.train
        self.original_train = original_train

        def train(module, mode=True):
            if self.active:
                self.module_train_calls += 1
            return original_train(module, mode)

        torch.nn.Module.train = train

    def uninstall(self):
        for name, original in self.originals.items():
            setattr(torch.Tensor, name, original)
        torch.nn.Module.train = self.original_train

    def fit_start(self, state, logger):
        self._install()

    def batch_end(self, state, logger):
        batch = int(state.timestamp.batch)
        self.active = self.start <= batch < self.stop

    def fit_end(self, state, logger):
        self.active = False
        self.uninstall()


@pytest.mark.slow
def test_steady_state_steps_never_read_back_from_the_device(tiny_recipe, tmp_path):
    """Nineteen steps between loss read-backs (log_interval 25; the epoch's 22nd batch logs) with a
    train-metric update every step: no read-back and no switch to eval mode and back.  The batches
    come from the on-device loader, so its steps are counted too (a DataLoader's per-sample work
    on host tensors would be counted as well, though it never waits for a device)."""
    counter = CountReadBacks(start=2, stop=21)
    overrides = [
        "trainer.max_duration=24ba",
        "trainer.train_subset_num_batches=-1",
        "trainer.log_interval=25",
        "trainer.loader=device",
        "trainer.train_metrics_interval=1",
        "checkpoint.save=false",
        "checkpoint.monitor=null",
    ]
    try:
        trainer = _fit(tiny_recipe, tmp_path / "run", overrides, callbacks=[counter])
    finally:
        counter.uninstall()
    assert int(trainer.state.timestamp.batch) == 24
    assert counter.counts == {} and counter.module_train_calls == 0


@pytest.mark.slow
def test_composers_own_step_reads_back_every_batch(tiny_recipe, tmp_path):
    """The same count through Composer's Trainer, so the test above would notice a regression."""
    counter = CountReadBacks(start=2, stop=12)
    overrides = [
        "trainer.max_duration=14ba",
        "trainer.train_subset_num_batches=-1",
        "trainer.loader=device",
        "checkpoint.save=false",
        "checkpoint.monitor=null",
    ]
    import dlrecipes.engine

    ours = dlrecipes.engine.Trainer
    try:
        sys.path.insert(0, str(REPO / "tests"))
        importlib.import_module("reference_engine")
        importlib.reload(sys.modules["reference_engine"])
        _fit(tiny_recipe, tmp_path / "run", overrides, callbacks=[counter])
    finally:
        counter.uninstall()
        sys.path.remove(str(REPO / "tests"))
        dlrecipes.engine.Trainer = ours
    assert sum(counter.counts.values()) >= 5 * 10  # five or more per step
    assert counter.module_train_calls >= 10  # eval mode and back for the train metrics


@pytest.mark.slow
def test_every_batch_loss_is_logged_and_read_back_at_the_interval(tiny_recipe, tmp_path, monkeypatch):
    import dlrecipes.loggers.read_back as read_back_module

    reads = []
    original = read_back_module.read_back

    def spy(values):
        reads.append(sum(isinstance(v, torch.Tensor) for v in values))
        return original(values)

    monkeypatch.setattr(read_back_module, "read_back", spy)
    trainer = _fit(
        tiny_recipe,
        tmp_path / "run",
        [
            "trainer.max_duration=2ep",
            "trainer.train_subset_num_batches=5",
            "trainer.log_interval=4",
            "checkpoint.save=false",
        ],
    )
    log = (tmp_path / "run" / "train-rank0.log").read_text().splitlines()
    steps = [int(line.split("batch=")[1].split("]")[0]) for line in log if "loss/train/total" in line]
    assert steps == list(range(10))  # every batch, at the step's start count, as Composer logs it
    # one read per interval (batches 4 and 8), epoch end and evaluation, not one per batch
    assert 0 < len([n for n in reads if n]) <= 8 and sum(reads) >= 10
    assert 0 < float(trainer.state.total_loss_dict["loss/train/total"]) < 10
    assert not any(line.split(": ")[1].startswith("time/batch") for line in log if "[metric]" in line)


class _TrainMetricInputs(Callback):
    """Records what each train metric's update is given: ``updates[name]`` lists (batch, preds, target)."""

    def __init__(self):
        self.updates: dict[str, list] = {}

    def fit_start(self, state, logger):
        for name, metric in state.train_metrics.items():
            seen = self.updates.setdefault(name, [])

            def update(preds, target, __original=metric.update, __seen=seen):
                __seen.append((int(state.timestamp.batch), preds.detach().clone(), target.clone()))
                return __original(preds, target)

            metric.update = update


def _top1_over(inputs, batches) -> float:
    """Top-1 over the samples of the updates at ``batches``, counted here from their logits and labels."""
    picked = [(preds, target) for batch, preds, target in inputs if batch in batches]
    return sum(int((p.argmax(1) == t).sum()) for p, t in picked) / sum(len(t) for _, t in picked)


@pytest.mark.slow
def test_train_metrics_come_from_sampled_steps_and_cover_the_epoch(tiny_recipe, tmp_path):
    inputs = _TrainMetricInputs()
    config = api.resolve(
        tiny_recipe,
        [
            "trainer.max_duration=2ep",
            "trainer.train_subset_num_batches=6",
            "trainer.train_metrics_interval=4",
            "checkpoint.save=false",
        ],
    )
    trainer = build_trainer(config, tmp_path / "run")
    trainer.state.callbacks.append(inputs)
    trainer.fit()
    trainer.close()
    assert set(trainer.state.train_metrics) == {"top1", "top5"}  # Composer's train metrics, kept in the state
    for name in ("top1", "top5"):  # every 4th of each epoch's 6 batches, each epoch's first
        assert [batch for batch, _, _ in inputs.updates[name]] == [0, 4, 6, 10]
    # the value kept is the second epoch's: its two sampled batches (2 x 64 samples) together
    assert float(trainer.state.train_metric_values["top1"]) == pytest.approx(
        _top1_over(inputs.updates["top1"], {6, 10})
    )
    log = (tmp_path / "run" / "train-rank0.log").read_text()
    assert log.count("metrics/train/top1") == 4 + 2  # after each sampled batch, and each epoch's value


@pytest.mark.slow
def test_train_metrics_can_be_switched_off(tiny_recipe, tmp_path):
    trainer = _fit(tiny_recipe, tmp_path / "run", ["trainer.train_metrics_interval=0", "checkpoint.save=false"])
    assert trainer.state.train_metrics == {} and trainer.state.train_metric_values == {}
    assert "metrics/train/" not in (tmp_path / "run" / "train-rank0.log").read_text()


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("trainer.log_interval", 0, "trainer.log_interval: expected int >= 1, got 0"),
        ("trainer.train_metrics_interval", -1, "trainer.train_metrics_interval: expected int >= 0, got -1"),
    ],
)
def test_intervals_are_validated(tiny_recipe, key, value, message):
    from dlrecipes.errors import RecipeError

    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        api.resolve(tiny_recipe, [f"{key}={value}"])


def test_the_quick_timestamp_counts_as_composers():
    import datetime

    from composer.core import Time, Timestamp

    from dlrecipes.engine import QuickTimestamp

    theirs, ours = Timestamp(), QuickTimestamp.of(Timestamp())
    steps = [(3, 0, 0.5), (3, 0, None), (2, 7, 0.25)]
    for _ in range(3):
        for samples, tokens, seconds in steps:
            duration = None if seconds is None else datetime.timedelta(seconds=seconds)
            theirs = theirs.to_next_batch(samples=samples, tokens=tokens, duration=duration)
            ours = ours.to_next_batch(samples=samples, tokens=tokens, duration=duration)
            assert isinstance(ours, QuickTimestamp) and ours.state_dict() == theirs.state_dict()
        theirs, ours = theirs.to_next_epoch(), ours.to_next_epoch()
        assert isinstance(ours, QuickTimestamp) and ours.state_dict() == theirs.state_dict()
    assert type(ours).__qualname__ == "Timestamp"  # the name Composer files it under in checkpoints
    # counts given as Time objects take Composer's own arithmetic
    ours = ours.to_next_batch(samples=Time(4, "sp"))
    theirs = theirs.to_next_batch(samples=Time(4, "sp"))
    assert ours.state_dict() == theirs.state_dict()


@pytest.mark.parametrize(
    "batch",
    [
        (torch.zeros(5, 3), torch.zeros(5, dtype=torch.long)),
        [torch.zeros(4, 3), torch.zeros(4)],
        ((torch.zeros(6, 2), torch.zeros(6, 2)), torch.zeros(6)),  # two inputs
        {"x": torch.zeros(3, 1), "y": torch.zeros(3)},
        {"input_ids": torch.zeros(2, 9, dtype=torch.long)},
    ],
    ids=["tuple", "list", "two_inputs", "dict", "tokens"],
)
def test_quick_batch_counts_agree_with_composers(batch):
    from composer.core import DataSpec

    from dlrecipes.engine import quick_counts

    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    theirs, ours = DataSpec(loader), DataSpec(loader)
    quick_counts(ours)
    assert ours.get_num_samples_in_batch is not theirs.get_num_samples_in_batch
    assert ours.get_num_samples_in_batch(batch) == theirs.get_num_samples_in_batch(batch)
    assert ours.get_num_tokens_in_batch(batch) == theirs.get_num_tokens_in_batch(batch)


# --- the findings of the engine review, each on the CPU ---------------------------------------


def _linear_classifier():
    from composer.models import ComposerClassifier

    torch.manual_seed(0)
    return ComposerClassifier(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 3)), num_classes=3)


def _tensors(samples: int = 24):
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(
        torch.randn(samples, 6, generator=g), torch.randint(0, 3, (samples,), generator=g)
    )


def _direct(loader, callbacks=(), **kwargs):
    from composer.loggers import InMemoryLogger

    memory = InMemoryLogger()
    made = Trainer(
        model=_linear_classifier(),
        train_dataloader=loader,
        device="cpu",
        loggers=[memory],
        callbacks=list(callbacks),
        progress_bar=False,
        log_to_console=False,
        seed=1,
        **{"max_duration": "2ep", **kwargs},
    )
    return made, memory


@pytest.mark.parametrize(
    "stopper, epochs",
    [
        ("threshold_stopper={threshold: -1.0, monitor: top1, split: train}", 1),  # reached at the first epoch's end
        ("early_stopping={monitor: top1, split: train, patience: 1, min_delta: 10.0}", 2),  # never improves by 10
    ],
)
@pytest.mark.slow
def test_stoppers_watch_train_metrics(tiny_recipe, tmp_path, stopper, epochs):
    trainer = _fit(
        tiny_recipe,
        tmp_path / "run",
        [
            "trainer.max_duration=4ep",
            f"callbacks.{stopper}",
            "checkpoint.save=false",
            "trainer.train_metrics_interval=2",
        ],
    )
    assert int(trainer.state.timestamp.epoch) == epochs
    assert set(trainer.state.train_metric_values) == {"top1", "top5"}


def test_a_train_split_monitor_needs_train_metrics(tiny_recipe):
    from dlrecipes.errors import RecipeError

    with pytest.raises(
        RecipeError, match=r"callbacks.early_stopping.monitor: split 'train' .* trainer.train_metrics_interval is 0"
    ):
        api.resolve(tiny_recipe, ["callbacks.early_stopping={split: train}", "trainer.train_metrics_interval=0"])


@pytest.mark.slow
def test_a_run_ending_inside_an_epoch_logs_its_losses_and_train_metrics(tiny_recipe, tmp_path):
    inputs = _TrainMetricInputs()
    trainer = _fit(
        tiny_recipe,
        tmp_path / "run",
        ["trainer.max_duration=5ba", "checkpoint.save=false", "trainer.train_metrics_interval=1"],
        callbacks=[inputs],
    )
    assert int(trainer.state.timestamp.batch) == 5 and int(trainer.state.timestamp.epoch) == 1
    log = (tmp_path / "run" / "train-rank0.log").read_text().splitlines()
    assert [int(line.split("batch=")[1].split("]")[0]) for line in log if "loss/train/total" in line] == [0, 1, 2, 3, 4]
    # the second epoch's two batches: logged after each, then their value at the end of training
    steps = [int(line.split("batch=")[1].split("]")[0]) for line in log if "metrics/train/top1" in line]
    assert steps[-3:] == [3, 4, 5]
    # the value at the end covers the part of the second epoch trained: its batches 4 and 5 (steps 3 and 4)
    assert [batch for batch, _, _ in inputs.updates["top1"]] == [0, 1, 2, 3, 4]
    assert float(trainer.state.train_metric_values["top1"]) == pytest.approx(_top1_over(inputs.updates["top1"], {3, 4}))


def test_a_loader_without_a_length_gets_every_loss_and_the_epoch_metrics():
    class NoLength:
        def __init__(self, loader):
            self.loader = loader

        def __iter__(self):
            return iter(self.loader)

    made, memory = _direct(
        NoLength(torch.utils.data.DataLoader(_tensors(20), batch_size=4)),
        device_train_microbatch_size=4,
        max_duration="12ba",
    )
    made.fit()
    assert int(made.state.timestamp.epoch) == 2 and int(made.state.timestamp.batch) == 12  # epochs of 5, then 2
    assert len(memory.get_timeseries("loss/train/total")["loss/train/total"]) == 12
    steps = [int(stamp.batch) for stamp, _ in memory.data["metrics/train/MulticlassAccuracy"]]
    # after every batch (at its start count), each epoch's value at its end (5, 10), the last two at the end
    assert steps == [0, 1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10, 10, 11, 12]


def test_the_timestamp_pickles_inside_a_callback():
    import pickle

    from composer.core import Timestamp

    pickled = []

    class Keep(Callback):
        def batch_end(self, state, logger):
            pickled.append((pickle.dumps(state.timestamp), state.timestamp.state_dict()))

    made, _ = _direct(torch.utils.data.DataLoader(_tensors(8), batch_size=4), callbacks=[Keep()])
    made.fit()
    loaded = pickle.loads(pickled[-1][0])
    assert type(loaded) is Timestamp and loaded.state_dict() == pickled[-1][1]
    assert int(loaded.batch) == 4


def test_an_out_of_memory_retry_counts_each_batch_once_in_the_train_metrics():
    """Composer's auto-microbatching loop, driven on the CPU: the second batch's first attempt runs
    out of memory after its first microbatch; it is retried with smaller microbatches."""

    class OutOfMemoryOnce(Callback):
        def __init__(self):
            self.raised = False

        def after_forward(self, state, logger):
            if int(state.timestamp.batch) == 1 and not self.raised:
                self.raised = True
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (a test)")

    oom = OutOfMemoryOnce()
    made, _ = _direct(
        torch.utils.data.DataLoader(_tensors(24), batch_size=8),
        callbacks=[oom],
        max_duration="1ep",
        device_train_microbatch_size=4,
    )
    made.state.auto_microbatching = True  # Composer allows 'auto' only on a GPU; its retry loop runs anywhere
    counted = []
    metric = made.state.train_metrics["MulticlassAccuracy"]
    update = metric.update
    metric.update = lambda preds, target: (counted.append(len(target)), update(preds, target))
    made.fit()
    assert oom.raised and made.state.device_train_microbatch_size == 2
    assert sum(counted) == 24  # every sample once: the failed attempt's microbatch was not counted
    assert int(metric.tp + metric.fn) == 24


def test_train_metrics_move_to_the_models_device_before_their_first_update():
    """Composer moves the train metrics to the device before updating them (FSDP and other wrappers
    may leave them elsewhere); so does the engine, before the first sampled update of a metric set."""
    made, _ = _direct(torch.utils.data.DataLoader(_tensors(8), batch_size=4), max_duration="1ep")
    metric = made.state.train_metrics["MulticlassAccuracy"]
    events, place, update = [], made.state.device.module_to_device, metric.update
    made.state.device.module_to_device = lambda module: (events.append(("placed", module)), place(module))[1]
    metric.update = lambda *a, **k: (events.append(("updated", metric)), update(*a, **k))
    made.fit()
    assert events[0] == ("placed", metric) and [e for e, m in events if m is metric].count("updated") == 2


def test_composer_asks_for_the_processor_without_a_process_of_its_own(tmp_path, monkeypatch):
    """Composer's Trainer asks py-cpuinfo for the processor's name at every start (py-cpuinfo runs a Python process
    for it: about 1.2 s); dlrecipes' builders answer it from /proc/cpuinfo, the same name py-cpuinfo gives."""
    import cpuinfo
    from composer.utils import collect_env

    from dlrecipes.builders.trainer import _trainer_class
    from dlrecipes.runtime.composer_env import cpu_model_from_proc

    (tmp_path / "cpuinfo").write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Some CPU @ 2.00GHz\n\n")
    assert cpu_model_from_proc(str(tmp_path / "cpuinfo")) == "Some CPU @ 2.00GHz"
    (tmp_path / "arm").write_text("processor\t: 0\nBogoMIPS\t: 48.00\n")
    assert cpu_model_from_proc(str(tmp_path / "arm")) is None and cpu_model_from_proc(str(tmp_path / "no")) is None
    if cpu_model_from_proc() is None:
        pytest.skip("no processor name in /proc/cpuinfo here: Composer's own answer stands")
    monkeypatch.setattr(collect_env, "get_cpu_model", collect_env.get_cpu_model)  # put back after the test
    _trainer_class()
    expected = cpuinfo.get_cpu_info()["brand_raw"]  # py-cpuinfo's own answer (its process)
    monkeypatch.setattr(cpuinfo, "get_cpu_info", lambda: pytest.fail("py-cpuinfo asked"))
    assert collect_env.get_composer_env_dict()["cpu_model"] == expected
    assert getattr(collect_env.get_cpu_model, "dlrecipes", False)  # ours, not Composer's answer cached earlier


def test_composer_lists_its_own_files_once_per_process_not_at_every_checkpoint(monkeypatch):
    """Each checkpoint's metadata asks Composer's get_composer_commit_hash, which lists every file Composer installed
    (about 30 ms on 2 cores); once the builders have answered, the first answer (Composer's own) is kept."""
    from composer.utils import collect_env

    from dlrecipes.builders.trainer import _trainer_class

    composers = collect_env.get_composer_commit_hash
    composers = getattr(composers, "__wrapped__", composers)
    expected = composers()
    monkeypatch.setattr(collect_env, "get_composer_commit_hash", composers)  # Composer's, put back after the test
    listed = []
    files = collect_env.importlib_metadata.files
    monkeypatch.setattr(collect_env.importlib_metadata, "files", lambda name: listed.append(name) or files(name))
    _trainer_class()
    answers = [collect_env.get_composer_env_dict()["composer_commit_hash"] for _ in range(3)]
    assert answers == [expected] * 3 and len(listed) == 1


def test_sync_free_soft_targets_equal_composers_bit_for_bit():
    """Label smoothing, MixUp's and CutMix's one-hot rows and the soft cross-entropy, made without reading
    anything back, give Composer's values bit for bit, gradients included (a negative label: a zero row, as
    Composer's)."""
    from composer.algorithms.label_smoothing import smooth_labels as composers_smoothing
    from composer.loss import soft_cross_entropy as composers_loss
    from composer.loss.utils import ensure_targets_one_hot as composers_one_hot

    from dlrecipes.algorithms.soft_targets import ensure_targets_one_hot, smooth_labels
    from dlrecipes.losses.functions import soft_cross_entropy

    generator = torch.Generator().manual_seed(0)
    for n, classes, smoothing in [(7, 10, 0.1), (512, 10, 0.2), (33, 100, 0.13)]:
        labels = torch.randint(0, classes, (n,), generator=generator)
        labels[0] = -1 if n == 33 else labels[0]
        logits = torch.randn(n, classes, generator=generator)
        assert torch.equal(ensure_targets_one_hot(logits, labels), composers_one_hot(logits, labels))
        ours, theirs = smooth_labels(logits, labels, smoothing), composers_smoothing(logits, labels, smoothing)
        assert ours.dtype == theirs.dtype == torch.float32 and torch.equal(ours, theirs)
        grads = []
        for loss_fn in (soft_cross_entropy, composers_loss):
            leaf = logits.clone().requires_grad_()
            loss = loss_fn(leaf, theirs)
            loss.backward()
            grads.append((loss.detach(), leaf.grad))
        assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
        assert torch.equal(soft_cross_entropy(logits, labels.clamp(min=0)), composers_loss(logits, labels.clamp(min=0)))


def test_algorithm_traces_are_logged_without_reading_the_loss_back(tiny_recipe, tmp_path, monkeypatch):
    """Composer logs a trace each time an algorithm runs (label smoothing: every batch); the run log keeps them,
    in their place among the losses, and reads the queued losses back only at the interval and the end."""
    from composer.loggers import FileLogger

    import dlrecipes.loggers.read_back as read_back_module

    reads, passed_on = [], []
    original = read_back_module.read_back
    monkeypatch.setattr(read_back_module, "read_back", lambda values: reads.append(len(values)) or original(values))
    monkeypatch.setattr(
        FileLogger,
        "log_traces",
        lambda self, traces: passed_on.extend(
            "trace" for name in traces if name == "algorithm_traces/LabelSmoothing/Event.BEFORE_LOSS"
        ),
    )
    log_metrics = FileLogger.log_metrics
    monkeypatch.setattr(
        FileLogger,
        "log_metrics",
        lambda self, metrics, step=None: (
            passed_on.extend("loss" for name in metrics if name == "loss/train/total"),
            log_metrics(self, metrics, step),
        ),
    )
    _fit(
        tiny_recipe,
        tmp_path / "run",
        [
            "trainer.max_duration=6ba",
            "trainer.train_subset_num_batches=-1",
            "trainer.log_interval=25",
            "checkpoint.save=false",
            "checkpoint.monitor=null",
            "algorithms={label_smoothing: {smoothing: 0.1}}",
        ],
    )
    assert reads and reads[0] >= 6  # the first read-back takes all six losses: at the end, not at each batch's trace
    assert passed_on == ["trace", "loss"] * 6  # each batch's trace, then its loss, in order


@pytest.mark.slow
def test_trainings_in_one_process_leave_no_model_or_optimizer_alive(tiny_recipe, tmp_path):
    """Three trainings through the Python API: after each, no Trainer, model or optimizer is left (Composer's exit
    hook held the state until the process ended, the train metrics' callback held the Trainer, and torch's cache
    of parameter names held every model checkpointed)."""
    import gc

    import dlrecipes
    from dlrecipes.models.architectures.simple_cnn import CNNSimple

    def alive() -> tuple[int, int, int]:
        gc.collect()
        objects = gc.get_objects()
        kinds = [type(o) for o in objects]  # (isinstance asks some objects of torch.distributed for a deprecated class)
        return (
            sum(issubclass(k, Trainer) for k in kinds),
            sum(issubclass(k, CNNSimple) for k in kinds),
            sum(issubclass(k, torch.optim.Optimizer) for k in kinds),
        )

    before = alive()
    for index in range(3):
        result = dlrecipes.train(tiny_recipe, [f"run_name=run{index}", "trainer.max_duration=1ep"])
        assert (result.run_dir / "checkpoints").is_dir()  # a checkpoint was written: torch's cache was filled
        assert alive() == before, f"after training {index + 1}"
