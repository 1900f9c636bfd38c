"""What objects handed in from Python yield, made into what training takes, or refused in one line before it.

- Samples: ``(input, label)`` pairs as they are; dicts (the layout of Hugging Face datasets and many notebooks) by
  two keys, named with ``input_key=``/``target_key=`` or found among the usual names when exactly one of each is
  there (:data:`INPUT_KEYS`, :data:`LABEL_KEYS`).  A dict's image may be a tensor, a NumPy array or a PIL image
  (converted as ``torchvision.transforms.ToTensor`` does: channels first, values in [0, 1]).
- The model's output: checked at the first batch to be the ``(batch, classes)`` logits the loss and metrics read;
  a tuple, a dict or another shape is refused naming what came back and how to return the logits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dlrecipes.errors import DataError, RecipeError, shown

INPUT_KEYS = ("image", "img", "pixel_values", "input", "inputs", "x")
LABEL_KEYS = ("label", "labels", "target", "targets", "y")
PAIRS = "(image tensor, int label) pairs, or dicts with an image and a label key"


def first_sample(dataset: Any, keyword: str) -> Any:
    """``dataset[0]``; an empty dataset or one whose first read raises is refused naming ``keyword``."""
    try:
        size = len(dataset)
    except Exception as exc:
        raise DataError(f"{keyword}: len() raised {type(exc).__name__}: {exc}"[:300]) from None
    if size == 0:
        raise DataError(f"{keyword}: the dataset is empty (len() is 0); give it at least one sample")
    try:
        return dataset[0]
    except Exception as exc:
        raise DataError(f"{keyword}: reading its first sample raised {type(exc).__name__}: {exc}"[:300]) from None


def _is_input(value: Any) -> bool:
    import numpy as np
    import torch

    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.ndim >= 1 and (
            value.dtype.is_floating_point if isinstance(value, torch.Tensor) else np.issubdtype(value.dtype, np.number)
        )
    return type(value).__module__.startswith("PIL.")


def _is_label(value: Any) -> bool:
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.dtype.is_floating_point
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _what(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return f"{type(value).__name__}{tuple(shape) if shape is not None else ''}"


def sample_keys(sample: Mapping, input_key: str | None, target_key: str | None, keyword: str) -> tuple[str, str]:
    """The (input, label) keys of dict samples: the ones named, else the one usual name of each present."""
    keys = ", ".join(repr(k) for k in sample)

    def pick(given: str | None, usual: tuple[str, ...], what: str, name: str) -> str:
        if given is not None:
            if given not in sample:
                raise RecipeError(f"{name}={given!r}: {keyword}'s samples have no such key; they have {keys}")
            return given
        found = [k for k in usual if k in sample]
        if len(found) != 1:
            which = "several" if found else "no"
            raise RecipeError(
                f"{keyword}: its samples are dicts with keys {keys} and {which} usual {what} key; name "
                f"it with {name}=... (e.g. dlrecipes.train(..., input_key='image', target_key='label'))"
            )
        return found[0]

    return pick(input_key, INPUT_KEYS, "image", "input_key"), pick(target_key, LABEL_KEYS, "label", "target_key")


def as_input(value: Any) -> Any:
    """A dict sample's image as a tensor: tensors as they are, NumPy arrays shared, PIL images as ToTensor does."""
    import numpy as np
    import torch

    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if type(value).__module__.startswith("PIL."):
        from torchvision.transforms.functional import to_tensor

        return to_tensor(value)
    return value


class KeyedSamples:
    """A Dataset of dict samples read as ``(input, label)`` pairs by two keys."""

    def __init__(self, dataset: Any, input_key: str, target_key: str):
        self.dataset, self.input_key, self.target_key = dataset, input_key, target_key
        names = getattr(dataset, "classes", None)
        if names is not None:
            self.classes = names

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        sample = self.dataset[index]
        return as_input(sample[self.input_key]), sample[self.target_key]

    @property
    def targets(self) -> list:
        """Every label, by the column when the dataset has one (a Hugging Face dataset), else sample by sample."""
        try:
            column = self.dataset[self.target_key]
            if len(column) == len(self.dataset):
                return list(column)
        except Exception:
            pass
        return [self.dataset[i][self.target_key] for i in range(len(self.dataset))]


def readable(dataset: Any, keyword: str, input_key: str | None, target_key: str | None) -> Any:
    """``dataset`` as training reads it: pairs as they are, dict samples through :class:`KeyedSamples`; a sample
    training could not use is refused in one line naming ``keyword``."""
    sample = first_sample(dataset, keyword)
    if isinstance(sample, Mapping):
        keys = sample_keys(sample, input_key, target_key, keyword)
        dataset = KeyedSamples(dataset, *keys)
        sample = dataset[0]
    elif input_key is not None or target_key is not None:
        raise RecipeError(
            f"{keyword}: input_key=/target_key= name the keys of dict samples; its samples are {type(sample).__name__}s"
        )
    if not (isinstance(sample, (tuple, list)) and len(sample) == 2):
        raise RecipeError(f"{keyword}: its samples are {_what(sample)}; expected {PAIRS}")
    image, label = sample
    if not _is_input(image):
        hint = (
            " (convert images to tensors, e.g. with torchvision.transforms.ToTensor())"
            if type(image).__module__.startswith("PIL.")
            else ""
        )
        raise RecipeError(
            f"{keyword}: the first sample's input is {_what(image)} {shown(image, 40)}; expected a numeric tensor{hint}"
        )
    if not _is_label(label):
        raise RecipeError(
            f"{keyword}: the first sample's label is {_what(label)} {shown(label, 40)}; expected an "
            "int class index (0 .. classes-1)"
        )
    return dataset


def loader_batches(loader: Any, samples: Any) -> Any:
    """A DataLoader used as it is, or, over dict samples (``samples``: its dataset as :func:`readable` made it), a
    Composer DataSpec that reads its dict batches as ``(inputs, labels)`` on the device."""
    if not isinstance(samples, KeyedSamples):
        return loader
    from composer.core import DataSpec

    keys = (samples.input_key, samples.target_key)
    return DataSpec(loader, batch_transforms=lambda batch: (batch[keys[0]], batch[keys[1]]))


class OutputCheck:
    """A forward hook refusing, once, an output other than ``(batch, classes)`` logits; it removes itself after
    the first forward it accepts.  ``classes``: filled with ``{"count": n}`` when the data is built."""

    def __init__(self, keyword: str, classes: dict[str, int]):
        self.keyword, self.classes, self.handle = keyword, classes, None

    def attach(self, module: Any) -> None:
        self.handle = module.register_forward_hook(self)
        ATTACHED.append(self)

    def detach(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        if self in ATTACHED:
            ATTACHED.remove(self)

    def __call__(self, module: Any, inputs: tuple, output: Any) -> None:
        self.detach()  # once, whatever it finds: the model is the user's again after this call
        self._check(inputs, output)

    def _check(self, inputs: tuple, output: Any) -> None:
        import torch

        batch = inputs[0].shape[0] if inputs and hasattr(inputs[0], "shape") else None
        count = self.classes.get("count")
        if isinstance(output, (tuple, list)):
            parts = ", ".join(_what(o) for o in output[:4])
            raise RecipeError(
                f"{self.keyword}: forward returned a {type(output).__name__} of {len(output)} ({parts}); "
                "training needs the class logits alone, a (batch, classes) tensor: return only them "
                "(or pass a wrapper whose forward returns out[0])"
            )
        if not isinstance(output, torch.Tensor):
            keys = f" (keys: {', '.join(map(str, list(output)[:6]))})" if isinstance(output, Mapping) else ""
            raise RecipeError(
                f"{self.keyword}: forward returned a {type(output).__name__}{keys}; training needs the "
                "class logits, a (batch, classes) tensor: return them (e.g. out['logits'] or out.logits)"
            )
        if (
            output.dim() != 2
            or (batch is not None and output.shape[0] != batch)
            or (count is not None and output.shape[1] < count)
        ):
            want = f"({batch if batch is not None else 'batch'}, {count if count is not None else 'classes'})"
            raise RecipeError(
                f"{self.keyword}: forward returned a tensor of shape {tuple(output.shape)} for a batch "
                f"of {batch}; training needs the class logits, shape {want}"
            )


ATTACHED: list[OutputCheck] = []  # checks not yet run (the call ended before a forward): removed at its end


def detach_all() -> None:
    """Remove every output check still attached (a user's model carries none after a dlrecipes call)."""
    for check in list(ATTACHED):
        check.detach()
