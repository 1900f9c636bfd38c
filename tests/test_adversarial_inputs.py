"""The damage matrix beyond the commands' own files (issue 53, item 1): every input a component reads.

- a distillation teacher (a run or checkpoint: missing, empty, truncated, another model, another class count,
  another input shape), refused from the CLI before the run's start line;
- Hugging Face sources (an empty split, used or not, a missing split, an unreadable image, a wrong column type,
  an offline hub id);
- objects handed in from Python (a model returning a tuple, a dict or the wrong shape; a Dataset yielding dicts,
  wrong types or raising; a DataLoader with workers).

Each refusal: one line naming the input and what would be valid (exit 2 from the CLI, a ``UserError`` from
Python), no run directory left behind to block a retry, and a finished run beside it unchanged (checksums).
Common shapes are accepted, not refused (item 2): dict samples by their keys, a DataLoader over them with
workers, a recipe given as a dict.
"""

from __future__ import annotations

import importlib.util
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from dlrecipes.errors import DataError, RecipeError, UserError

from .conftest import TINY_RECIPE, write
from .test_adversarial_cli import assert_refused, checksums, invoke, other_models_checkpoint

TEACHER_KEY = "algorithms.distillation.teacher"


def _recipe(path: Path, extra: str = "") -> Path:
    """The tiny recipe with ``extra`` lines."""
    return write(path, textwrap.dedent(TINY_RECIPE).lstrip() + extra)


def _first(model: dict, dims: int) -> str:
    return next(k for k, v in model.items() if v.dim() == dims)


def _reshaped(path: Path, dims: int, pick: str, change) -> None:
    """Rewrite one weight of a Composer checkpoint: the first (``pick='first'``) or last matrix/kernel."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    model = state["state"]["model"]
    keys = [k for k, v in model.items() if v.dim() == dims]
    key = keys[0] if pick == "first" else keys[-1]
    model[key] = torch.zeros(change(tuple(model[key].shape)))
    if pick == "last":  # the head's bias too
        bias = key.replace("weight", "bias")
        model[bias] = torch.zeros(model[key].shape[0])
    torch.save(state, path)


TEACHER_DAMAGE = {
    "missing": (lambda best: shutil.rmtree(best.parent.parent), "does not exist"),
    "empty": (lambda best: best.write_bytes(b""), "best.pt"),
    "truncated": (lambda best: best.write_bytes(best.read_bytes()[: best.stat().st_size // 2]), "best.pt"),
    "other-model": (other_models_checkpoint, "do not fit"),
    "other-classes": (
        lambda best: _reshaped(best, 2, "last", lambda s: (5, *s[1:])),
        "predicts 5 classes and this dataset has 10",
    ),
    "other-input": (
        lambda best: _reshaped(best, 4, "first", lambda s: (s[0], 3, *s[2:])),
        "takes 3-channel images and this dataset's have 1 channels",
    ),
}


@pytest.mark.parametrize("how", list(TEACHER_DAMAGE))
def test_a_damaged_or_unfitting_teacher_is_one_line_before_the_run_starts(trained_tiny, tmp_path, how):
    damage, said = TEACHER_DAMAGE[how]
    teacher = tmp_path / "teachers" / "tiny"
    shutil.copytree(trained_tiny, teacher, symlinks=True)
    runs = tmp_path / "runs"
    shutil.copytree(trained_tiny, runs / "finished", symlinks=True)
    damage(teacher / "checkpoints" / "best.pt")
    before, teacher_before = checksums(runs), checksums(teacher) if teacher.exists() else {}
    recipe = _recipe(tmp_path / "tiny.yaml", f"runs_dir: {runs}\nrun_name: student\n")
    result = invoke(["train", str(recipe), f"{TEACHER_KEY}={teacher}"])
    line = assert_refused(result, TEACHER_KEY)
    assert said in line and (str(teacher) in line)
    assert result.exit_code == 2 and not result.stdout.startswith("run ")  # before the start line
    assert checksums(runs) == before and not (runs / "student").exists()  # nothing left to block a retry
    assert (checksums(teacher) if teacher.exists() else {}) == teacher_before


# --- Hugging Face sources -------------------------------------------------------------------------------------

needs_hf = pytest.mark.skipif(
    importlib.util.find_spec("datasets") is None,
    reason="Hugging Face datasets is not installed (pip install -e '.[hf]')",
)


@pytest.fixture
def hf_folder(tmp_path, monkeypatch):
    """A saved DatasetDict of 8x8 RGB images: train (8), validation (4), an empty test split, and a split whose
    second image is not an image file (broken)."""
    import datasets
    import numpy as np
    from PIL import Image

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    datasets.disable_progress_bars()
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"]), "caption": datasets.Value("string")}
    )

    def split(n: int, broken: bool = False):
        images = [Image.fromarray(np.full((8, 8, 3), 30 * i, np.uint8)) for i in range(n)]
        rows = {"image": images, "label": [i % 2 for i in range(n)], "caption": [f"c{i}" for i in range(n)]}
        table = datasets.Dataset.from_dict(rows, features=features)
        if broken:
            table = table.cast_column("image", datasets.Image(decode=False))
            table = table.map(
                lambda row, i: {"image": {"bytes": b"not an image" if i == 1 else row["image"]["bytes"], "path": None}},
                with_indices=True,
            )
            table = table.cast_column("image", datasets.Image())
        return table

    folder = tmp_path / "hf"
    datasets.DatasetDict(
        {"train": split(8), "validation": split(4), "test": split(0), "broken": split(4, broken=True)}
    ).save_to_disk(str(folder))
    return folder


HF_CASES = {
    "empty-split": (
        {"eval_split": "test"},
        "dataset.eval_split: the 'test' split of {path} is empty (0 rows); name a "
        "split with samples: train, validation, broken",
    ),
    "missing-split": ({"split": "trian"}, "dataset.split: {path} has no split 'trian' (did you mean 'train'?)"),
    "wrong-column": ({"label_column": "caption"}, "dataset.label_column: column 'caption' of {path} holds"),
    "unreadable-image": ({"split": "broken"}, "cannot decode the image of row 1 of {path}:broken"),
    "offline-hub-id": (
        {"path": "nobody-here/no-such-dataset"},
        "dataset.path: cannot download the Hugging Face dataset 'nobody-here/no-such-dataset' (offline",
    ),
}


@needs_hf
@pytest.mark.parametrize("case", list(HF_CASES))
def test_a_bad_hugging_face_source_is_one_line_and_leaves_nothing(trained_tiny, tmp_path, hf_folder, monkeypatch, case):
    params, said = HF_CASES[case]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    runs = tmp_path / "runs"
    shutil.copytree(trained_tiny, runs / "finished", symlinks=True)
    before = checksums(runs)
    dataset = {"name": "hf", "path": str(hf_folder), "crop_size": 8, "resize_size": 8, "hflip": False, **params}
    recipe = _recipe(tmp_path / "tiny.yaml", f"runs_dir: {runs}\nrun_name: hf\n")
    flow = "{" + ", ".join(f"{k}: {v}" for k, v in dataset.items()) + "}"
    result = invoke(["train", str(recipe), f"dataset={flow}", "trainer.batch_size=2", "trainer.max_duration=2ba"])
    line = assert_refused(result, said.format(path=hf_folder))
    assert result.exit_code == 2, line
    assert checksums(runs) == before and not (runs / "hf").exists()


@needs_hf
def test_an_empty_split_the_recipe_does_not_use_is_no_obstacle(tmp_path, hf_folder):
    """The library opens every split of a saved DatasetDict and fails on an empty one: dlrecipes opens only the
    splits the recipe names."""
    from dlrecipes import registry

    data = registry.datasets.build("hf", path=str(hf_folder), crop_size=8, resize_size=8, hflip=False)
    assert (len(data.train), len(data.eval), data.num_classes) == (8, 4, 2)  # validation, the test split unopened


@needs_hf
def test_validation_warns_when_the_crop_upsamples_the_source_images(tmp_path, hf_folder):
    recipe = _recipe(tmp_path / "tiny.yaml")
    result = invoke(["validate", str(recipe), f"dataset={{name: hf, path: {hf_folder}}}"])
    assert result.exit_code == 0, result.output
    assert (
        f"warning: dataset.crop_size=224 is 28x the source images' side (8 px, {hf_folder} (train[0])): each "
        "image is upsampled, which costs time and adds no detail; set dataset.crop_size (and resize_size) near 8"
    ) in result.output
    quiet = invoke(
        ["validate", str(recipe), f"dataset={{name: hf, path: {hf_folder}, crop_size: 16, resize_size: 16}}"]
    )
    assert quiet.exit_code == 0 and "warning" not in quiet.output


# --- objects from Python ----------------------------------------------------------------------------------------


class Net(nn.Module):
    """A tiny classifier of 1x8x8 images whose forward returns what ``out`` says."""

    def __init__(self, out: str = "logits"):
        super().__init__()
        self.layer = nn.Linear(64, 3)
        self.out = out

    def forward(self, x):
        y = self.layer(x.flatten(1))
        return {"tuple": (y, y.detach()), "dict": {"logits": y}, "shape": y[:, :, None], "logits": y}[self.out]


class Samples(torch.utils.data.Dataset):
    """``n`` samples as ``kind`` says: pairs, dicts with the usual keys, dicts with other keys, strings, raising."""

    def __init__(self, n: int, kind: str = "pairs"):
        generator = torch.Generator().manual_seed(n)
        self.x, self.y, self.kind = torch.randn(n, 1, 8, 8, generator=generator), torch.arange(n) % 3, kind

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        if self.kind == "raising":
            raise ValueError("disk on fire")
        return {
            "pairs": lambda: (self.x[i], int(self.y[i])),
            "dicts": lambda: {"image": self.x[i], "label": int(self.y[i])},
            "odd-keys": lambda: {"pixels": self.x[i], "cls": int(self.y[i])},
            "strings": lambda: f"sample {i}",
        }[self.kind]()


SETTINGS = {
    "trainer.max_duration": "1ba",
    "trainer.batch_size": 4,
    "trainer.num_workers": 0,
    "trainer.progress_bar": False,
    "plots": False,
}

OBJECT_CASES = {
    "tuple": (
        dict(model=Net("tuple")),
        RecipeError,
        "model=: forward returned a tuple of 2 (Tensor(4, 3), Tensor(4, 3)); training needs the class logits alone",
    ),
    "dict": (
        dict(model=Net("dict")),
        RecipeError,
        "model=: forward returned a dict (keys: logits); training needs "
        "the class logits, a (batch, classes) tensor: return them (e.g. out['logits'] or out.logits)",
    ),
    "shape": (
        dict(model=Net("shape")),
        RecipeError,
        "model=: forward returned a tensor of shape (4, 3, 1) for a "
        "batch of 4; training needs the class logits, shape (4, 3)",
    ),
    "odd-keys": (
        dict(train_data=Samples(8, "odd-keys")),
        RecipeError,
        "train_data=: its samples are dicts with keys "
        "'pixels', 'cls' and no usual image key; name it with input_key=...",
    ),
    "wrong-key": (
        dict(train_data=Samples(8, "dicts"), input_key="img"),
        RecipeError,
        "input_key='img': train_data='s samples have no such key; they have 'image', 'label'",
    ),
    "strings": (
        dict(train_data=Samples(8, "strings")),
        RecipeError,
        "train_data=: its samples are str; expected "
        "(image tensor, int label) pairs, or dicts with an image and a label key",
    ),
    "raising": (
        dict(train_data=Samples(8, "raising")),
        DataError,
        "train_data=: reading its first sample raised ValueError: disk on fire",
    ),
    "empty": (dict(train_data=Samples(0)), DataError, "train_data=: the dataset is empty (len() is 0)"),
}


@pytest.mark.parametrize("case", list(OBJECT_CASES))
def test_an_object_training_cannot_use_is_one_line_from_python_and_leaves_nothing(trained_tiny, tmp_path, case):
    import dlrecipes

    given, error, said = OBJECT_CASES[case]
    runs = tmp_path / "runs"
    shutil.copytree(trained_tiny, runs / "finished", symlinks=True)
    before = checksums(runs)
    objects = {"model": Net(), "train_data": Samples(8), "eval_data": Samples(4), **given}
    model = objects["model"]
    with pytest.raises(error) as caught:
        dlrecipes.train(None, {**SETTINGS, "runs_dir": str(runs)}, quiet=True, **objects)
    assert isinstance(caught.value, UserError) and said in str(caught.value) and "\n" not in str(caught.value)
    assert "--" not in str(caught.value)  # Python's words (verbose=True), not the command line's
    assert checksums(runs) == before
    assert not model._forward_hooks  # the model is the user's again: no check left attached


@pytest.mark.slow  # two tiny trainings
def test_dict_samples_and_a_loader_with_workers_over_them_train(tmp_path):
    import dlrecipes

    loader = torch.utils.data.DataLoader(Samples(16, "dicts"), batch_size=4, num_workers=2)
    result = dlrecipes.train(
        None,
        {**SETTINGS, "runs_dir": str(tmp_path / "runs"), "trainer.max_duration": "2ba"},
        model=Net(),
        train_data=loader,
        eval_data=Samples(4, "dicts"),
        quiet=True,
    )
    assert result.status == "finished" and result.batches == 2 and "top1" in result.eval_metrics
    named = dlrecipes.train(
        None,
        {**SETTINGS, "runs_dir": str(tmp_path / "runs")},
        model=Net(),
        quiet=True,
        train_data=Samples(8, "odd-keys"),
        eval_data=Samples(4, "odd-keys"),
        input_key="pixels",
        target_key="cls",
    )
    assert named.status == "finished"


@pytest.mark.slow  # a tiny training
def test_a_recipe_given_as_a_dict_trains_with_its_base_found_from_root(tmp_path):
    import dlrecipes

    write(tmp_path / "recipes" / "tiny.yaml", TINY_RECIPE)
    recipe = {
        "base": "tiny.yaml",
        "name": "mine",
        "trainer": {"max_duration": "2ba"},
        "runs_dir": str(tmp_path / "runs"),
    }
    result = dlrecipes.train(recipe, root=tmp_path / "recipes", quiet=True)
    assert result.status == "finished" and result.run_dir.name.startswith("mine-") and result.batches == 2
    with pytest.raises(RecipeError, match=r"^the recipe dict: base: file not found: tiny.yaml \(looked for "):
        dlrecipes.train(recipe, quiet=True)  # the working directory holds no tiny.yaml
    with pytest.raises(RecipeError, match=r"^trainer.seed: a recipe holds what a YAML file can"):
        dlrecipes.train({**recipe, "trainer": {"seed": object()}}, root=tmp_path / "recipes", quiet=True)


def test_errors_from_python_name_keyword_arguments_not_flags():
    from dlrecipes.notebook import in_python

    assert (
        in_python("training failed: X (no run directory; rerun with --verbose to see its traceback)")
        == "training failed: X (no run directory; rerun with verbose=True to see its traceback)"
    )
    assert (
        in_python("use --checkpoint latest, or --resume; --trust-checkpoint to load it")
        == "use checkpoint='latest', or resume=True; trust_checkpoint=True to load it"
    )
