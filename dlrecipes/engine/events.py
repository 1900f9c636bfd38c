"""Events and their receivers: Composer's Engine, with each event dispatched only to the callbacks that handle it."""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

from composer.core import Callback, Engine, Event
from composer.loggers import LoggerDestination

_ENGINE_DEBUG = bool(os.environ.get("ENGINE_DEBUG"))  # Composer's per-event debug lines


class DirectEngine(Engine):
    """Composer's Engine, dispatching each event only to the callbacks that define a handler for it.

    Composer's ``run_event`` formats a debug line for every callback of every event (printed
    only with ``ENGINE_DEBUG``), compares the event against lists of events several times and
    calls every callback's no-op handlers: about a millisecond per training step.  With the
    profiler on, ``ENGINE_DEBUG`` set, or at INIT, Composer's own ``run_event`` runs.
    """

    _receivers: dict
    _receivers_of: tuple

    def run_event(self, event: Event | str):
        """Composer's ``run_event``: the algorithms, then the callbacks (others first, then loggers), each event only
        to the callbacks that handle it; Composer's own with the profiler, ``ENGINE_DEBUG``, at INIT or once closed.

        Replaces ``composer.core.engine.Engine.run_event`` (Composer 0.32.1);
        guarded by
        ``tests/test_engine_callbacks.py::test_every_kind_of_callback_sees_the_events_composers_trainer_gives``.
        """
        if not isinstance(event, Event):
            event = Event(event)
        if self.state.profiler is not None or event is Event.INIT or self._is_closed or _ENGINE_DEBUG:
            return super().run_event(event)
        # Composer runs its ordering passes even when no algorithm matches the event
        matched = any(algorithm.match(event, self.state) for algorithm in self.state.algorithms)
        traces = self._run_algorithms(event) if matched else OrderedDict()
        for callback in self.receivers(event):
            callback.run_event(event, self.state, self.logger)
        return traces

    def receivers(self, event: Event) -> list[Any]:
        """The callbacks with a handler for ``event``: others first, then loggers (Composer's order).

        Asked of each object as Composer's call ``callback.run_event(event, state, logger)`` finds them
        (:func:`handles`), and kept until ``state.callbacks`` changes: a handler set on a callback's instance after
        that list was last seen is not (Composer's own ``run_event`` with ``ENGINE_DEBUG`` or the profiler sees it).
        """
        callbacks = self.state.callbacks
        key = tuple(map(id, callbacks))
        if getattr(self, "_receivers_of", None) != key:
            self._receivers, self._receivers_of = {}, key
        found = self._receivers.get(event)
        if found is None:
            ordered = [c for c in callbacks if not isinstance(c, LoggerDestination)]
            ordered += [c for c in callbacks if isinstance(c, LoggerDestination)]
            found = self._receivers[event] = [c for c in ordered if handles(c, event)]
        return found


def handles(callback: Any, event: Event) -> bool:
    """Whether Composer's Engine calling ``callback.run_event(event, state, logger)`` would do anything: True unless
    that is Callback's own ``run_event`` and its handler for ``event`` Callback's no-op.  Both are looked up on the
    object, as that call does: a duck-typed object with a ``run_event`` of its own, a mock, a handler set on the
    instance all count; an object without ``run_event`` counts too (the call raises, as Composer's does)."""
    run_event = getattr(callback, "run_event", None)
    if getattr(run_event, "__func__", None) is not Callback.run_event:
        return True
    handler = getattr(callback, event.value, None)
    return getattr(handler, "__func__", None) is not getattr(Callback, event.value)
