"""What ``--resume`` may change: the recipe is compared with the one the run recorded.

A run continues from its checkpoint: the model's weights and buffers, the optimizer's state,
the algorithms' state, the data order.  Changes to anything that shapes those cannot continue
the run (:data:`CANNOT_CHANGE`, and adding, removing or retuning an algorithm that changes the
model or keeps state in the checkpoint); they are refused before anything is built, each named.
Everything else (how long to train, logging, workers, evaluation, learning rate) is accepted
and listed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlrecipes import registry
from dlrecipes.core.secrets import redact
from dlrecipes.errors import RecipeError
from dlrecipes.records.layout import RunDir
from dlrecipes.records.run_files import read_recipe

# Key paths (and everything under them) that a checkpoint was made for.
CANNOT_CHANGE = (
    "model",
    "task",
    "loss",
    "finetune",
    "optimizer.name",
    "trainer.fsdp",
    "dataset.name",
    "dataset.classes",
    "dataset.class_list",
    "dataset.num_classes",
    "dataset.image_size",
    "dataset.crop_size",
    "dataset.input_shape",
)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves."""
    if not isinstance(data, dict) or (prefix and not data):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _cannot_continue(key: str) -> bool:
    if any(key == p or key.startswith(p + ".") for p in CANNOT_CHANGE):
        return True
    parts = key.split(".")
    return parts[0] == "algorithms" and len(parts) > 1 and fixed_on_resume(parts[1])


def fixed_on_resume(algorithm: str) -> bool:
    """Whether a run cannot add, remove or retune ``algorithm`` on ``--resume``: it changes the network's
    modules or keeps its own state in the checkpoint, as registered with it (``changes_network=True``,
    ``checkpoint_state=True``; ``checkpoint_state=False`` overrides the first, as for ``channels_last``).
    An algorithm not registered in this process (a plugin the resumed run does not load) is not held: what it
    registered cannot be read, and a checkpoint it shaped fails to load by itself, naming the mismatch."""
    if algorithm not in registry.algorithms:
        return False
    metadata = registry.algorithms.get(algorithm).metadata
    return bool(metadata.get("checkpoint_state", metadata.get("changes_network", False)))


def changes(recorded: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """Every key path whose value differs, as (key, before, after); a missing side is None."""
    old, now = flatten(recorded), flatten(new)
    return [(k, old.get(k), now.get(k)) for k in sorted(set(old) | set(now)) if old.get(k) != now.get(k)]


def _default_lr(recorded: dict, change: tuple[str, Any, Any]) -> bool:
    """Whether ``change`` is the optimizer's default lr that validation fills in now, absent from a recipe
    recorded before it did: that run trained with the same default, which is no change."""
    key, before, after = change
    name = flatten(recorded).get("optimizer.name")
    if key != "optimizer.lr" or before is not None or name not in registry.optimizers:
        return False
    lr = registry.optimizers.get(name).parameters.get("lr")
    return lr is not None and lr.default == after


def _show(key: str, before: Any, after: Any) -> str:
    fmt = lambda v: "(none)" if v is None else repr(v)  # noqa: E731
    return f"{key} ({fmt(before)} -> {fmt(after)})"


def check_resume(run_dir: Path, new: dict) -> list[str]:
    """Refuse changes the run cannot continue with; return the accepted ones, described.  The recipe was recorded
    with its secrets redacted, and is compared with the new one redacted alike: another password for the same
    address is no change, another address is."""
    recorded = read_recipe(Path(run_dir))  # a damaged one: one line naming it
    if recorded is None:
        return []
    new = redact(new)
    ignored = {"run_name", "description"}
    found = [c for c in changes(recorded, new) if c[0].split(".")[0] not in ignored and not _default_lr(recorded, c)]
    refused = [_show(*c) for c in found if _cannot_continue(c[0])]
    if refused:
        raise RecipeError(
            f"--resume: {run_dir} was trained with another recipe ({RunDir(run_dir).recipe}); these changes "
            "cannot continue it: "
            f"{'; '.join(refused)}. Undo them, or start a new run (another run_name, without --resume)"
        )
    return [_show(*c) for c in found]
