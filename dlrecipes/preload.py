"""Imported by the server that sweeps on a CPU (and the tests) fork their ``dlrecipes`` processes from
(:data:`dlrecipes.api.FORKED`, dlrecipes/runtime/fork_server.py), and by nothing else: it imports what a training
imports and fills the caches every training fills the same way, so that each forked training starts at its first
line of work.

A new Python's first training in a process (quickstart, 2 batches, on 2 cores) spends about 8 s importing
torch and Composer, then about 4 s more the first time: Composer's algorithms, timm's optimizers, torchvision's
transforms v2 and dlrecipes' own modules imported on the way, the processor's name Composer's Trainer asks for at
every start (py-cpuinfo's probe, a Python process of its own, 1.2 s, where /proc/cpuinfo does not name it: see
dlrecipes/runtime/composer_env.py) and matplotlib's first font. What it has then is frozen out of the cycle collector's
sight (process_state.freeze_survivors), so that no fork's full collection walks it again.
"""

from __future__ import annotations

import io

from dlrecipes.runtime.fork_server import mark_preloaded
from dlrecipes.runtime.process_state import collector_paused, freeze_survivors


def warm() -> None:
    """What a training imports (each import visible here), and the caches it fills at its start."""
    import composer  # noqa: F401
    import composer.algorithms  # noqa: F401
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.pyplot  # noqa: F401
    import PIL.Image  # noqa: F401
    import PIL.JpegImagePlugin  # noqa: F401
    import PIL.PngImagePlugin  # noqa: F401
    import timm  # noqa: F401
    import timm.optim  # noqa: F401
    import torch  # noqa: F401
    import torchvision  # noqa: F401
    import torchvision.transforms.v2  # noqa: F401
    from composer.utils import collect_env

    import dlrecipes.api  # noqa: F401
    import dlrecipes.callbacks.best_checkpoint  # noqa: F401
    import dlrecipes.callbacks.export_for_inference  # noqa: F401
    import dlrecipes.callbacks.monitors  # noqa: F401
    import dlrecipes.callbacks.stop_on_signal  # noqa: F401
    import dlrecipes.cli  # noqa: F401
    import dlrecipes.data.device_loader  # noqa: F401
    import dlrecipes.data.digits  # noqa: F401
    import dlrecipes.data.preprocess  # noqa: F401
    import dlrecipes.data.tensor_dataset  # noqa: F401
    import dlrecipes.engine  # noqa: F401
    import dlrecipes.fit  # noqa: F401
    import dlrecipes.loggers.read_back  # noqa: F401
    import dlrecipes.loggers.run_log  # noqa: F401
    import dlrecipes.loggers.run_record  # noqa: F401
    import dlrecipes.loggers.terminal  # noqa: F401
    import dlrecipes.losses.functions  # noqa: F401
    import dlrecipes.metrics.eval_loss  # noqa: F401
    import dlrecipes.metrics.report  # noqa: F401
    import dlrecipes.models.classifier  # noqa: F401
    import dlrecipes.optim.lr_schedules  # noqa: F401
    import dlrecipes.records.plots  # noqa: F401
    from dlrecipes.plugins import load_builtins

    load_builtins()

    from dlrecipes.runtime.composer_env import answer_composer_here

    answer_composer_here()  # as the builders do (/proc/cpuinfo, where it names the processor; the commit asked once)
    collect_env.get_cpu_model()  # cached for the process (functools.lru_cache): the forked trainings inherit the answer
    collect_env.get_composer_commit_hash()  # the same
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = plt.figure(figsize=(1, 1))
    figure.text(0.5, 0.5, "0.1")  # loads the font the plots use
    figure.savefig(io.BytesIO(), format="png")
    plt.close(figure)


with collector_paused():  # nothing the imports make is garbage (freeze_survivors collects once, then freezes)
    warm()
# everything alive now (about 500,000 objects, alive as long as the server and every fork) out of the collector's
# sight, in the server and each fork: otherwise a fork's first full collection walks all of them, 0.35 s of a forked
# quickstart training with its plots (1.31 s -> 0.97 s), on memory the walk then copies out of the server's pages
freeze_survivors()
mark_preloaded()  # this server, and every process forked from it, has the imports
