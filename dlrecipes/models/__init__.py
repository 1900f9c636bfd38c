"""Models: factories of ``torch.nn.Module`` class-logit networks, registered in :mod:`.registered`; the
architectures live in :mod:`.architectures`, the Composer wrappers in :mod:`.classifier` and
:mod:`.task_model`.

Modules:
- :mod:`.arch_names`: timm and torchvision architecture names, shipped as lists (*_models.txt)
- :mod:`.fetch`: pretrained weights: one line at once where a download cannot succeed
- :mod:`.init`: weight initialisations by name (model.init)
"""

from dlrecipes.models import registered  # noqa: F401  (registers the built-ins)
