"""Callbacks of any kind Composer's Engine runs (it calls ``run_event(event, state, logger)`` on each object in
``state.callbacks``) run under dlrecipes' engine as under Composer's Trainer: duck-typed objects, Callback subclasses
with their own ``run_event`` or only event methods, handlers set on the instance, mocks."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from composer.core import Callback, Event
from composer.trainer.trainer import Trainer as ComposerTrainer

from dlrecipes.engine import Trainer


class DuckTyped:
    """Not a Callback: only ``run_event`` (and the close Composer's Engine calls at its end)."""

    def __init__(self, seen: list):
        self.seen = seen

    def run_event(self, event, state, logger):
        self.seen.append(("duck", event.value))

    def close(self, state, logger):
        pass

    def post_close(self):
        pass


class OwnRunEvent(Callback):
    def __init__(self, seen: list):
        self.seen = seen

    def run_event(self, event, state, logger):
        self.seen.append(("own", event.value))
        super().run_event(event, state, logger)  # Callback's: its (no-op) event methods

    def batch_end(self, state, logger):
        self.seen.append(("own.batch_end", int(state.timestamp.batch)))


class EventMethodsOnly(Callback):
    def __init__(self, seen: list):
        self.seen = seen

    def fit_start(self, state, logger):
        self.seen.append(("methods", "fit_start"))

    def after_loss(self, state, logger):
        self.seen.append(("methods", "after_loss"))

    def epoch_end(self, state, logger):
        self.seen.append(("methods", "epoch_end"))


def _on_the_instance(seen: list) -> Callback:
    """A plain Callback whose handlers are set on the instance, not its class."""
    made = Callback()
    made.batch_start = lambda state, logger: seen.append(("instance", "batch_start"))
    made.fit_end = lambda state, logger: seen.append(("instance", "fit_end"))
    return made


def _events(trainer_class: type) -> tuple[list, list]:
    seen: list = []
    mocked = mock.MagicMock()
    callbacks = [DuckTyped(seen), OwnRunEvent(seen), EventMethodsOnly(seen), _on_the_instance(seen), mocked]
    torch.manual_seed(0)
    model_module = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 3))
    from composer.models import ComposerClassifier

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g))
    trainer = trainer_class(
        model=ComposerClassifier(model_module, num_classes=3),
        device="cpu",
        seed=1,
        train_dataloader=torch.utils.data.DataLoader(data, batch_size=4),
        max_duration="2ba",
        callbacks=callbacks,
        progress_bar=False,
        log_to_console=False,
    )
    trainer.fit()
    trainer.close()
    mocked_events = [call.args[0].value for call in mocked.run_event.call_args_list]
    return seen, mocked_events


@pytest.fixture(scope="module")
def composers() -> tuple[list, list]:
    return _events(ComposerTrainer)


def test_every_kind_of_callback_sees_the_events_composers_trainer_gives(composers):
    ours = _events(Trainer)
    assert ours == composers
    seen, mocked = composers
    kinds = {kind for kind, _ in seen}
    assert kinds == {"duck", "own", "own.batch_end", "methods", "instance"}  # each kind ran
    assert [event for kind, event in seen if kind == "duck"] == mocked  # every event, to every callback
    assert mocked.count(Event.BATCH_END.value) == 2 and Event.FIT_END.value in mocked
    assert ("instance", "batch_start") in seen and ("methods", "after_loss") in seen
