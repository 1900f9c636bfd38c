"""Models: factories of ``torch.nn.Module`` class-logit networks, registered in :mod:`.registered`; the
architectures live in :mod:`.architectures`, the Composer wrappers in :mod:`.classifier` and
:mod:`.task_model`.
"""

from dlrecipes.models import registered  # noqa: F401  (registers the built-ins)
