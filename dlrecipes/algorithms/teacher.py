"""Where the teacher of knowledge distillation comes from (``algorithms.distillation.teacher``), checked when a
recipe is validated (no torch here; :mod:`.distillation` builds and runs it).

A teacher is one of

- a run directory: its recipe's network (``model:``) with its ``checkpoints/best.pt`` (its newest periodic
  checkpoint when it has no best);
- a checkpoint file in a run's ``checkpoints/`` folder: that run's network with those weights;
- a model spec, ``{name: <model>, <its parameters>, checkpoint: FILE}``: any registered model with the weights of
  a checkpoint or state-dict file (``checkpoint``), or its own (``pretrained_path``, ``pretrained: true``).

Its class count and input channels are the student's (its head is checked against the checkpoint).  At
validation a path becomes the checkpoint file it names and ``teacher_sha256`` that file's SHA-256, so the run's
recipe.yaml records both; a recipe that gives ``teacher_sha256`` pins the file, which is then checked when
training starts, not at validation (a distilled run evaluates, exports and predicts without its teacher).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from dlrecipes import registry
from dlrecipes.errors import RecipeError, shown
from dlrecipes.records.layout import BEST_CHECKPOINT, CHECKPOINT_DIR, RECIPE_FILE, RunDir
from dlrecipes.records.run_files import file_digest

if TYPE_CHECKING:
    from dlrecipes.config.sections import RecipeConfig

KEY = "algorithms.distillation.teacher"
SPEC_WEIGHTS = "checkpoint"  # the key of a model spec that names its weights file
# Algorithms that change a network's modules: a teacher run trained with one cannot be rebuilt from its model alone.
NETWORK_CHANGING = (
    "blurpool",
    "squeeze_excite",
    "stochastic_depth",
    "ghost_batchnorm",
    "weight_standardization",
    "qat",
)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class TeacherSource:
    """A teacher, resolved: the registered model and its parameters, the file its weights come from (None: the
    model's own), the class count it was trained for when known, and how to name it in messages."""

    model: str
    params: dict[str, Any] = field(default_factory=dict)
    weights: Path | None = None
    classes: int | None = None
    origin: str = ""

    @property
    def checksum_file(self) -> Path | None:
        """The file ``teacher_sha256`` is the checksum of: the weights, or a spec's ``pretrained_path``."""
        if self.weights is not None:
            return self.weights
        pretrained = self.params.get("pretrained_path")
        return Path(pretrained) if isinstance(pretrained, str) else None


def check_distillation_params(params: dict[str, Any], path: str) -> None:
    """The registry validator: the teacher's form (a path, or a model spec checked like ``model:``) and the
    pinned checksum's; whether the path exists is asked after paths are resolved (:func:`teacher_fits_the_run`)."""
    teacher = params.get("teacher")
    _refuse_addresses(teacher, f"{path}.teacher")
    if isinstance(teacher, dict):
        _check_spec(teacher, f"{path}.teacher")
    elif not isinstance(teacher, str) or not teacher.strip():
        raise RecipeError(
            f"{path}.teacher: expected a run directory, a checkpoint file or a model spec "
            f"({{name: <model>, <parameters>, checkpoint: FILE}}), got {shown(teacher)}"
        )
    pinned = params.get("teacher_sha256")
    if pinned is not None and not _SHA256.match(pinned):
        raise RecipeError(
            f"{path}.teacher_sha256: expected 64 lowercase hex digits (a SHA-256), got {shown(pinned)}; "
            "leave it out and validation records the teacher file's"
        )


def _refuse_addresses(teacher: Any, path: str) -> None:
    """A teacher is read from files on this machine (checked, and hashed into ``teacher_sha256``, at validation):
    an address (``s3://...``, ``https://...``) is refused as it was given (``Path()`` would show ``s3:/...``),
    saying how to make it a file here."""
    named = (
        {"": teacher}
        if isinstance(teacher, str)
        else {f".{key}": teacher.get(key) for key in (SPEC_WEIGHTS, "pretrained_path")}
        if isinstance(teacher, dict)
        else {}
    )
    for suffix, value in named.items():
        if isinstance(value, str) and "://" in value:
            raise RecipeError(
                f"{path}{suffix}: {value} is an address; a teacher is read from files on this machine: "
                f"copy the run (its {RECIPE_FILE} and {CHECKPOINT_DIR}/) or the file here first, and "
                "give its path"
            )


def _check_spec(spec: dict[str, Any], path: str) -> None:
    from dlrecipes.config.checks import check_component

    weights = spec.get(SPEC_WEIGHTS)
    if weights is not None and (not isinstance(weights, str) or not weights):
        raise RecipeError(
            f"{path}.{SPEC_WEIGHTS}: expected the path of a checkpoint or state-dict file, got {shown(weights)}"
        )
    component = check_component({k: v for k, v in spec.items() if k != SPEC_WEIGHTS}, path, registry.models)
    if registry.models.get(component.name).metadata.get("multi_io"):
        raise RecipeError(f"{path}.name: '{component.name}' takes several inputs; a teacher is a classifier of images")
    params = component.params
    if weights is None and not params.get("pretrained_path") and not params.get("pretrained"):
        raise RecipeError(
            f"{path}: the teacher has no trained weights; add {SPEC_WEIGHTS}: FILE (a checkpoint or "
            "state dict), pretrained_path or pretrained: true, or give a run directory"
        )


def teacher_source(teacher: Any) -> TeacherSource:
    """What ``teacher`` (a path, resolved, or a model spec, checked) names; a path that names nothing usable is
    refused in one line naming the key."""
    if isinstance(teacher, dict):
        params = {k: v for k, v in teacher.items() if k not in ("name", SPEC_WEIGHTS)}
        weights = teacher.get(SPEC_WEIGHTS)
        return TeacherSource(
            teacher["name"],
            params,
            Path(weights) if weights else None,
            params.get("num_classes"),
            f"model {teacher['name']}",
        )
    file = teacher_file(Path(teacher))
    run = RunDir.holding(file)
    if run is None:
        raise RecipeError(
            f"{KEY}: {file} is not in a run directory's {CHECKPOINT_DIR}/ folder, so its network is "
            f"unknown; give the model too: {{name: <model>, <parameters>, {SPEC_WEIGHTS}: {file}}}"
        )
    return _from_run(run, file)


def teacher_file(path: Path) -> Path:
    """The checkpoint a teacher path names: the file itself, or a run's best (else newest periodic) checkpoint."""
    if path.is_file():
        return path
    if not path.is_dir():
        raise RecipeError(
            f"{KEY}: {path} does not exist; give a run directory, a checkpoint file of a run, or a "
            f"model spec {{name: <model>, ..., {SPEC_WEIGHTS}: FILE}}"
        )
    run = RunDir(path)
    if not run.is_run():
        raise RecipeError(
            f"{KEY}: {path} is not a run directory (no {RECIPE_FILE}); give a run directory such as "
            "runs/<name>, or a checkpoint file of one"
        )
    if run.best.is_file():
        return run.best
    if run.latest.exists():
        return run.latest.resolve()
    raise RecipeError(f"{KEY}: run {path} has no checkpoint (no {BEST_CHECKPOINT} and no periodic one); train it first")


def _from_run(run: RunDir, file: Path) -> TeacherSource:
    """The network a teacher run's recipe.yaml names, with the class count its dataset tells."""
    from dlrecipes.config.checks import check_component, dataset_classes
    from dlrecipes.records.run_files import read_recipe

    recipe = read_recipe(run.path) or {}
    if recipe.get("task") is not None:
        raise RecipeError(
            f"{KEY}: run {run.path} trained a task with several inputs/outputs; a teacher is a classifier of images"
        )
    changed = [name for name in (recipe.get("algorithms") or {}) if name in NETWORK_CHANGING]
    if changed:
        raise RecipeError(
            f"{KEY}: run {run.path} was trained with {', '.join(changed)}, which change the network's "
            "modules; a teacher is rebuilt from its model section alone (use a run without them)"
        )
    model = check_component(recipe.get("model"), f"{KEY} (the model of {run.recipe})", registry.models)
    classes = None
    dataset = recipe.get("dataset")
    if isinstance(dataset, dict) and dataset.get("name") in registry.datasets:
        classes = dataset_classes(SimpleNamespace(dataset=check_component(dataset, "dataset", registry.datasets)))
    params = {k: v for k, v in recipe["model"].items() if k != "name"}
    return TeacherSource(model.name, params, file, classes, f"run {run.path}")


def teacher_fits_the_run(config: RecipeConfig) -> str | None:
    """``requires=`` of the algorithm (after paths are resolved): the teacher exists, is a network this run can
    use (the same class count where both are known), and is recorded: its checkpoint file and SHA-256.  A pinned
    ``teacher_sha256`` defers all that to the start of training."""
    from dlrecipes.config.checks import dataset_classes

    params = config.algorithms["distillation"]
    if params.get("teacher_sha256"):
        return None
    teacher = params["teacher"]
    if isinstance(teacher, dict):
        teacher = params["teacher"] = _absolute_spec_paths(teacher)
    source = teacher_source(teacher)
    for file in (source.weights, source.checksum_file):
        if file is not None and not file.is_file():
            raise RecipeError(f"{KEY}: {file} does not exist or is not a file")
    students = dataset_classes(config)
    if source.classes is not None and students is not None and source.classes != students:
        raise RecipeError(
            f"{KEY}: the teacher ({source.origin}) predicts {source.classes} classes and this dataset "
            f"has {students}; a teacher must be trained on the student's classes"
        )
    if isinstance(teacher, str):
        params["teacher"] = str(source.weights)
    if source.checksum_file is not None:
        params["teacher_sha256"] = file_digest(source.checksum_file)
    return None


def _absolute_spec_paths(spec: dict[str, Any]) -> dict[str, Any]:
    """A model spec's file paths (``checkpoint``, ``pretrained_path``), relative to the working directory, made
    absolute (so the run's recipe.yaml names them wherever it is read)."""
    out = dict(spec)
    for key in (SPEC_WEIGHTS, "pretrained_path"):
        if isinstance(out.get(key), str) and "://" not in out[key]:
            out[key] = str(Path(out[key]).expanduser().resolve())
    return out
