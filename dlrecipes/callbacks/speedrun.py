"""The CIFAR-10 speedruns' training techniques (airbench, Jordan 2024) that act on events, as Composer callbacks.

* :class:`PatchWhitening`: at the start of training, the first convolution's filters become the whitening of the
  training images' patches (and their negatives); its bias trains for the first epochs only.
* :class:`Lookahead`: every ``interval`` steps the weights (and batch-norm statistics) are averaged into a slow copy
  with a decay that grows with training, and the model continues from that copy; at the end the model is the copy.
* :class:`BatchNormSettings`: momentum, eps and a frozen scale for every batch norm of a model.

Each has a functional form (:func:`patch_whitening_weights`, :func:`lookahead_update`,
:func:`set_batchnorm`) that does the work; the classes only call it at the right event.
"""

from __future__ import annotations

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from torch import nn

from dlrecipes.errors import RecipeError
from dlrecipes.optim.lr_schedules import run_batches


def patch_whitening_weights(images: torch.Tensor, kernel: int, eps: float) -> torch.Tensor:
    """Filters (2 * C * kernel**2, C, kernel, kernel) that whiten the ``kernel`` x ``kernel`` patches of ``images``.

    The patches' second-moment matrix ``S = X^T X / n`` has eigenvectors ``E`` and eigenvalues ``d``; filter i is
    ``E[:, i] / sqrt(d[i] + eps)``, largest eigenvalue first, followed by the same filters negated (so that a GELU
    after it keeps both signs).  On the patches, the first half of the outputs then has second moment
    ``d / (d + eps)`` on its diagonal and zero elsewhere: the identity when eps is small beside the eigenvalues.
    """
    channels = images.shape[1]
    patches = images.float().unfold(2, kernel, 1).unfold(3, kernel, 1)  # N, C, H', W', k, k
    patches = patches.permute(0, 3, 2, 1, 4, 5).reshape(-1, channels * kernel * kernel)  # columns before rows
    second_moment = patches.T @ patches / len(patches)
    eigenvalues, eigenvectors = torch.linalg.eigh(second_moment, UPLO="U")
    eigenvalues, eigenvectors = eigenvalues.flip(0), eigenvectors.flip(1)
    filters = (eigenvectors.T / torch.sqrt(eigenvalues + eps)[:, None]).reshape(-1, channels, kernel, kernel)
    return torch.cat((filters, -filters))


def first_conv(model: nn.Module) -> nn.Conv2d:
    """The model's first ``Conv2d`` (in module order)."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            return module
    raise RecipeError("callbacks.patch_whitening: the model has no Conv2d to initialise")


def leading_images(loader, count: int) -> torch.Tensor:
    """The first ``count`` training images, normalised and not augmented: from the device loader (its own method) or
    an in-memory dataset's uint8 images and its batch augmentation's mean and std; from any other dataset, its
    first samples as its transform gives them."""
    if hasattr(loader, "leading_images"):
        return loader.leading_images(count)
    dataset = loader.dataset
    dataset = getattr(dataset, "samples_of", dataset)  # the torch loader's dataset read in the run's order
    augment = getattr(dataset, "batch_augment", None)
    if augment is not None:
        shape = (1, -1, 1, 1)
        mean, std = torch.tensor(augment.mean).view(shape), torch.tensor(augment.std).view(shape)
        return (dataset.images[:count].float() / 255.0 - mean) / std
    return torch.stack([dataset[i][0] for i in range(min(count, len(dataset)))])


class PatchWhitening(Callback):
    """Set the first convolution from the patch whitening of the first ``images`` training images at the start of
    training (not when resuming: the weights come from the checkpoint); train its bias for ``bias_epochs`` epochs,
    then freeze it (None: never frozen).  Its weight is not trained (the model decides: airbench's is frozen)."""

    def __init__(self, images: int = 5000, eps: float = 5e-4, bias_epochs: int | None = 3):
        self.images = images
        self.eps = eps
        self.bias_epochs = bias_epochs

    def fit_start(self, state: State, logger: Logger) -> None:
        if int(state.timestamp.batch) > 0:  # resumed: the weights are the checkpoint's; a run resumed inside an
            self.epoch_start(state, logger)  # epoch has no epoch start before its next batch to freeze the bias
            return
        conv = first_conv(state.model)
        images = leading_images(state.train_dataloader, self.images).to(conv.weight.device)
        filters = patch_whitening_weights(images, conv.kernel_size[0], self.eps)
        if filters.shape != conv.weight.shape:
            raise RecipeError(
                f"callbacks.patch_whitening: the model's first convolution's weight is "
                f"{tuple(conv.weight.shape)}; whitening its {conv.kernel_size[0]}x{conv.kernel_size[0]} "
                f"patches needs {tuple(filters.shape)} (2 * channels * kernel**2 filters), as the "
                "airbench model's has"
            )
        with torch.no_grad():
            conv.weight.copy_(filters.to(conv.weight.dtype))

    def epoch_start(self, state: State, logger: Logger) -> None:
        """The bias trained in the first ``bias_epochs`` epochs, frozen after."""
        conv = first_conv(state.model)
        if conv.bias is not None and self.bias_epochs is not None:
            conv.bias.requires_grad = int(state.timestamp.epoch) < self.bias_epochs


@torch.no_grad()
def lookahead_update(slow: dict[str, torch.Tensor], model: nn.Module, decay: float) -> None:
    """Move the slow copy toward the model's floating-point state by ``1 - decay`` and load it into the model."""
    for name, value in model.state_dict().items():
        if value.is_floating_point():
            average = slow[name]
            if average.device != value.device or average.dtype != value.dtype:  # once: the model moved after init
                slow[name] = average = average.to(value.device, value.dtype)
            average.lerp_(value, 1 - decay)
            value.copy_(average)


class Lookahead(Callback):
    """Every ``interval`` batches, average the weights into a slow copy with decay ``decay * (t / T) ** power``
    (t the batches done, T the run's) and continue from it; at the last batch the model becomes the slow copy.

    The copy starts from the weights as built (at Trainer init, before patch whitening), as airbench's does; it
    is saved in checkpoints and restored on resume.
    """

    def __init__(self, interval: int = 5, decay: float = 0.95**5, power: float = 3.0, final: bool = True):
        self.interval = interval
        self.decay = decay
        self.power = power
        self.final = final
        self.slow: dict[str, torch.Tensor] = {}

    def init(self, state: State, logger: Logger) -> None:
        self.slow = {k: v.detach().clone() for k, v in state.model.state_dict().items() if v.is_floating_point()}

    def batch_end(self, state: State, logger: Logger) -> None:
        done, total = int(state.timestamp.batch), run_batches(state)
        if done % self.interval == 0:
            lookahead_update(self.slow, state.model, self.decay * (done / total) ** self.power)
        if self.final and done >= total:
            lookahead_update(self.slow, state.model, 1.0)

    def state_dict(self) -> dict:
        return {"slow": self.slow}

    def load_state_dict(self, state: dict) -> None:
        self.slow = {k: v.clone() for k, v in state["slow"].items()}


def set_batchnorm(model: nn.Module, momentum: float | None, eps: float | None, train_weight: bool | None) -> int:
    """Give every batch norm of ``model`` these settings (None: leave that one); returns how many were set."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        if momentum is not None:
            norm.momentum = momentum
        if eps is not None:
            norm.eps = eps
        if train_weight is not None and norm.weight is not None:
            norm.weight.requires_grad = train_weight
    return len(norms)


class BatchNormSettings(Callback):
    """:func:`set_batchnorm` on the model at Trainer init."""

    def __init__(self, momentum: float | None = None, eps: float | None = None, train_weight: bool | None = None):
        self.settings = (momentum, eps, train_weight)

    def init(self, state: State, logger: Logger) -> None:
        set_batchnorm(state.model, *self.settings)
