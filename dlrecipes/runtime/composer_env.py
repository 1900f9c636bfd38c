"""What Composer asks of the host at every start and every checkpoint, answered without a process of its own and
once per process.

Each ``Trainer(...)`` and each checkpoint it saves (the state's metadata) call
``composer.utils.collect_env.get_composer_env_dict()``. On the way it asks:

- py-cpuinfo for the processor's name, which py-cpuinfo answers by running a Python process of its own (about 1.2 s
  on 2 cores: every ``dlrecipes train``, ``eval`` and ``export`` paid it, to log nothing). On Linux the name is read
  from ``/proc/cpuinfo`` instead, the same ``brand_raw`` string; elsewhere Composer's own answer stands.
- the commit Composer was installed from (``get_composer_commit_hash``), which it finds by listing every file of
  its installed distribution (``importlib.metadata.files``, each checked to exist: about 2,000 ``stat`` calls, 30 ms
  on 2 cores) at every checkpoint save, to write the same answer each time. Composer's own function is asked once
  per process and its answer kept (the installed package does not change under a running process).
"""

from __future__ import annotations

import functools


def cpu_model_from_proc(path: str = "/proc/cpuinfo") -> str | None:
    """The processor's name as ``/proc/cpuinfo`` gives it (py-cpuinfo's ``brand_raw`` on Linux), or None."""
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return None


def answer_cpu_model_here() -> None:
    """Composer's ``get_cpu_model`` (cached for the process, as Composer's is) reads ``/proc/cpuinfo`` where it names
    the processor; left as it is where it does not."""
    from composer.utils import collect_env

    if getattr(collect_env.get_cpu_model, "dlrecipes", False):
        return
    name = cpu_model_from_proc()
    if name is None:
        return

    @functools.lru_cache(maxsize=1)
    def get_cpu_model() -> str:
        return name

    get_cpu_model.dlrecipes = True  # type: ignore[attr-defined]
    collect_env.get_cpu_model = get_cpu_model


def answer_composer_commit_once() -> None:
    """Composer's ``get_composer_commit_hash``, asked once per process: its answer (the commit of a Composer
    installed from git, else None) kept for every later checkpoint."""
    from composer.utils import collect_env

    if getattr(collect_env.get_composer_commit_hash, "dlrecipes", False):
        return
    asked = functools.lru_cache(maxsize=1)(collect_env.get_composer_commit_hash)
    asked.dlrecipes = True  # type: ignore[attr-defined]
    collect_env.get_composer_commit_hash = asked


def answer_composer_here() -> None:
    """Both answers above, in place before a Trainer is built (the builders, and the server trainings fork from)."""
    answer_cpu_model_here()
    answer_composer_commit_once()
