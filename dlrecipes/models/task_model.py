"""Multi-input / multi-output models as a Composer model: a loss and metrics per output.

The batch is ``(*inputs, *targets)`` in the order the dataset declares them
(:class:`~dlrecipes.data.splits.DataIO`).  The network's ``forward`` receives the task's
inputs as separate tensors, in the task's order, and returns its outputs as a dict keyed by
output name, or as a tuple in the task's output order.  Each output has its own loss and
weight; the training loss is ``{<output>: loss, ..., "total": weighted sum}``, which Composer
logs as ``loss/train/<output>`` and ``loss/train/total`` and trains on ``total``.  Metrics
are named ``<output>/<metric>`` (Composer logs ``metrics/eval/digit/top1``), plus ``loss``,
the weighted total over the evaluation set.  :mod:`dlrecipes.core.outputs` decides the names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from composer.models import ComposerModel
from torch import Tensor, nn
from torchmetrics import MeanAbsoluteError, MeanMetric, MeanSquaredError, Metric
from torchmetrics.classification import MulticlassAccuracy

from dlrecipes import registry
from dlrecipes.core.outputs import EVAL_LOSS, DataIO, OutputSpec, output_metrics
from dlrecipes.errors import RecipeError
from dlrecipes.losses import build_loss
from dlrecipes.losses.functions import regression_pair
from dlrecipes.registry import build_component

if TYPE_CHECKING:
    from dlrecipes.config.sections import Component, TaskConfig
    from dlrecipes.data.splits import DatasetSplits

# Model parameters filled from the task and the data when the factory takes them and the recipe leaves them out.
MULTI_IO_SUPPLIED_PARAMS = ("output_sizes", "input_channels", "input_shapes")


class OutputLoss(MeanMetric):
    """The mean of one output's loss over the evaluation set (``output=None``: the weighted total)."""

    def __init__(self, output: str | None):
        super().__init__()
        self.output = output


def _scores(spec: OutputSpec, names: list[str]) -> dict[str, Metric]:
    if spec.kind == "class":
        kinds = {"top1": 1, "top5": 5}
        return {
            n: MulticlassAccuracy(num_classes=spec.size, top_k=kinds[n], average="micro", validate_args=False)
            for n in names
        }  # validate_args: torch.unique on every update waits for the GPU
    return {n: {"mse": MeanSquaredError, "mae": MeanAbsoluteError}[n]() for n in names}


class MultiIOModel(ComposerModel):
    """A network with several inputs and outputs, trained on a weighted sum of per-output losses."""

    def __init__(self, module: nn.Module, io: DataIO, inputs: list[str], outputs: dict[str, tuple[str, float]]):
        """``outputs``: output name -> (loss: a name or {name, params}, weight), in the task's order."""
        super().__init__()
        self.module = module
        layout = [*io.inputs, *io.outputs]  # the batch's order
        self.input_positions = [layout.index(name) for name in inputs]
        self.target_positions = {name: layout.index(name) for name in outputs}
        self.specs = {name: io.outputs[name] for name in outputs}
        self.weights = {name: weight for name, (_, weight) in outputs.items()}
        self.loss_fns = {name: build_loss(loss) for name, (loss, _) in outputs.items()}
        self.train_metrics = self._metrics(train=True)
        self.val_metrics = self._metrics(train=False)

    def _metrics(self, train: bool) -> nn.ModuleDict:
        # keyed by output (ModuleDict keys cannot hold the '/' of the logged names); get_metrics flattens them
        per_output = {}
        for name, spec in self.specs.items():
            names = output_metrics(spec, train)
            metrics = _scores(spec, [n for n in names if n != "loss"])
            if "loss" in names:
                metrics["loss"] = OutputLoss(name)
            for metric in metrics.values():
                metric.output_name = name  # survives the deep copies Composer makes of each metric
            per_output[name] = nn.ModuleDict(metrics)
        if not train:
            total = OutputLoss(None)
            total.output_name = None
            per_output[EVAL_LOSS] = nn.ModuleDict({EVAL_LOSS: total})
        return nn.ModuleDict(per_output)

    def forward(self, batch: Sequence[Tensor]) -> dict[str, Tensor]:
        out = self.module(*(batch[i] for i in self.input_positions))
        return self._by_name(out)

    def _by_name(self, out: Tensor | Sequence[Tensor] | dict[str, Tensor]) -> dict[str, Tensor]:
        names = list(self.specs)
        if isinstance(out, Tensor) and len(names) == 1:
            return {names[0]: out}
        if isinstance(out, (tuple, list)):
            if len(out) != len(names):
                raise ValueError(
                    f"the model returned {len(out)} outputs; the task has {len(names)} ({', '.join(names)})"
                )
            return dict(zip(names, out))
        if isinstance(out, dict):
            missing = [n for n in names if n not in out]
            if missing:
                raise ValueError(
                    f"the model's outputs lack {', '.join(missing)} (it returned {', '.join(map(str, out))})"
                )
            return {n: out[n] for n in names}
        raise TypeError(
            f"the model returned {type(out).__name__}; expected a dict or tuple of outputs ({', '.join(names)})"
        )

    def output_losses(self, outputs: dict[str, Tensor], batch: Sequence[Tensor]) -> dict[str, Tensor]:
        """Each output's (unweighted) loss on this batch."""
        return {name: fn(outputs[name], batch[self.target_positions[name]]) for name, fn in self.loss_fns.items()}

    def weighted_total(self, losses: dict[str, Tensor]) -> Tensor:
        return sum(self.weights[name] * loss for name, loss in losses.items())

    def loss(self, outputs: dict[str, Tensor], batch: Sequence[Tensor], *args, **kwargs) -> dict[str, Tensor]:
        losses = self.output_losses(outputs, batch)
        return {**losses, "total": self.weighted_total(losses)}

    def get_metrics(self, is_train: bool = False) -> dict[str, Metric]:
        groups = self.train_metrics if is_train else self.val_metrics
        return {
            (metric_name if output == EVAL_LOSS else f"{output}/{metric_name}"): metric
            for output, metrics in groups.items()
            for metric_name, metric in metrics.items()
        }

    def update_metric(self, batch: Sequence[Tensor], outputs: dict[str, Tensor], metric: Metric) -> None:
        name = metric.output_name
        n = batch[self.input_positions[0]].shape[0]
        if isinstance(metric, OutputLoss):
            losses = self.output_losses(outputs, batch)
            value = losses[name] if name is not None else self.weighted_total(losses)
            metric.update(value.detach(), n)
            return
        pred, target = outputs[name], batch[self.target_positions[name]]
        if self.specs[name].kind == "regression":
            pred, target = regression_pair(pred, target)
            pred, target = pred.reshape(-1), target.reshape(-1)
        metric.update(pred.detach(), target)


def multi_io_model_params(
    name: str, params: dict[str, Any], io: DataIO, inputs: list[str], outputs: list[str]
) -> dict[str, Any]:
    """The model's parameters, with its inputs' channels and shapes and its heads' sizes filled from the data."""
    params = dict(params)
    accepted = registry.models.get(name).parameters
    supplied = {
        "output_sizes": {o: io.outputs[o].size for o in outputs},
        "input_channels": [io.inputs[i][0] for i in inputs],
        "input_shapes": [tuple(io.inputs[i]) for i in inputs],
    }
    for key in MULTI_IO_SUPPLIED_PARAMS:
        if key not in accepted:
            continue
        if key not in params:
            params[key] = supplied[key]
        elif _plain(params[key]) != _plain(supplied[key]):
            raise RecipeError(
                f"model.{key}: {params[key]!r} does not match the task and the dataset ({supplied[key]!r}); "
                f"leave model.{key} out to take it from them"
            )
    return params


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def build_multi_io_model(cfg: Component, data: DatasetSplits, task: TaskConfig) -> MultiIOModel:
    """The recipe's network (``model:``) for its ``task:``, wrapped with per-output losses and metrics."""

    if data.io is None:
        raise TypeError("the dataset returned DatasetSplits without io; a task needs it (DatasetSplits.io)")
    params = multi_io_model_params(cfg.name, cfg.params, data.io, list(task.inputs), list(task.outputs))
    module = build_component(registry.models, cfg.name, params, "model.name")
    outputs = {name: (out.loss, out.weight) for name, out in task.outputs.items()}
    return MultiIOModel(module, data.io, list(task.inputs), outputs)
