"""Fine-tuning: which parameters are the head, a learning rate of its own, a frozen backbone at first.

The recipe's ``finetune:`` section::

    finetune:
      freeze_backbone: 2ep   # train only the head for 2 epochs, then everything
      head_lr: 1.0e-2        # the head's learning rate (the backbone keeps optimizer.lr)
      head: [fc]             # module names (globs) of the head; default: found from the model
      layer_decay: 0.7       # optional: smaller lrs nearer the input (layerwise_lr_decay)

Starting weights come from the model (``pretrained: true`` / ``pretrained_path`` for timm,
torchvision) or from ``checkpoint.load_path`` with ``load_ignore_keys`` for a new head.
"""

from __future__ import annotations

import fnmatch

from composer.core import Algorithm, Event, State, Time, TimeUnit
from composer.loggers import Logger
from torch import nn

from dlrecipes.errors import RecipeError


def default_head(net: nn.Module) -> str:
    """The classifier's module name: timm's ``get_classifier()``, else the last ``nn.Linear``."""
    modules = dict(net.named_modules())
    if hasattr(net, "get_classifier"):
        classifier = net.get_classifier()
        for name, module in modules.items():
            if module is classifier and name:
                return name
    linear = [name for name, module in modules.items() if isinstance(module, nn.Linear) and name]
    if not linear:
        raise RecipeError("finetune.head: the model has no nn.Linear classifier to find; name the head's modules")
    return linear[-1]


def head_parameter_names(net: nn.Module, patterns: list[str]) -> set[str]:
    """Names of the parameters inside the modules matching ``patterns`` (or the default head)."""
    patterns = patterns or [default_head(net)]
    modules = [name for name, _ in net.named_modules() if name and any(fnmatch.fnmatchcase(name, p) for p in patterns)]
    if not modules:
        top = ", ".join(name for name, _ in net.named_children())
        raise RecipeError(f"finetune.head: no module of the model matches {patterns}; its top-level modules are: {top}")
    names = {n for n, _ in net.named_parameters() if any(n == m or n.startswith(m + ".") for m in modules)}
    if len(names) == len(list(net.parameters())):
        raise RecipeError(f"finetune.head: {patterns} covers every parameter of the model; nothing is left to freeze")
    return names


def split_head_group(net: nn.Module, optimizer, head: set[str], head_lr: float | None) -> None:
    """Move the head's parameters into groups of their own with ``head_lr`` (options otherwise kept)."""
    if head_lr is None:
        return
    names = {id(p): n for n, p in net.named_parameters()}
    groups = []
    for group in optimizer.param_groups:
        options = {k: v for k, v in group.items() if k != "params"}
        body = [p for p in group["params"] if names.get(id(p)) not in head]
        top = [p for p in group["params"] if names.get(id(p)) in head]
        if body:
            groups.append({**options, "params": body})
        if top:
            scaled = {"lr": head_lr} | ({"initial_lr": head_lr} if "initial_lr" in options else {})
            groups.append({**options, **scaled, "params": top, "finetune_head": True})
    state = optimizer.state
    optimizer.param_groups.clear()
    for g in groups:
        optimizer.add_param_group(g)
    optimizer.state = state


class FreezeBackbone(Algorithm):
    """Until ``until``, only the head trains: backbone weights get no gradient and its norm layers keep their
    statistics.

    An Algorithm rather than a Callback so that Composer sets DDP up for parameters
    without gradients (``find_unused_parameters``), as for its own layer freezing.
    """

    @property
    def find_unused_parameters(self) -> bool:
        return True

    def __init__(self, head: set[str], until: str):
        self.head = head
        self.until = Time.from_timestring(until)
        self.frozen: bool | None = None

    def _net(self, state: State) -> nn.Module:
        model = state.model
        model = getattr(model, "module", model)  # DDP
        return getattr(model, "module", model)  # ComposerClassifier

    def _set(self, state: State, frozen: bool) -> None:
        net = self._net(state)
        for name, param in net.named_parameters():
            if name not in self.head:
                param.requires_grad_(not frozen)
        self.frozen = frozen

    def _keep_norm_stats(self, state: State) -> None:
        # only those the loop put back in training mode (after an evaluation): a mode switch per batch is not free
        for name, module in self._net(state).named_modules():
            if (
                isinstance(module, nn.modules.batchnorm._NormBase)
                and module.training
                and not any(p.startswith(name + ".") for p in self.head)
            ):
                module.eval()

    def _still_frozen(self, state: State) -> bool:
        if self.until is None:
            return False
        if self.until.unit == TimeUnit.DURATION:
            return state.get_elapsed_duration() < self.until
        return state.timestamp.get(self.until.unit) < self.until

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.FIT_START, Event.BATCH_START)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        frozen = self._still_frozen(state)
        if frozen != self.frozen:
            self._set(state, frozen)
            if event != Event.FIT_START or frozen:
                logger.log_metrics({"finetune/backbone_frozen": float(frozen)})
        if frozen:
            self._keep_norm_stats(state)  # Composer puts the model in train mode every epoch
