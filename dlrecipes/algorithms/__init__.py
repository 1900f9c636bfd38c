"""Training-time algorithms (Composer's ``Algorithm`` objects), registered in :mod:`.registered`: Composer's
own by name, and dlrecipes' (layer-wise lr decay, gradient checkpointing, quantization-aware
training, progressive resizing for every loader), whose implementations sit beside it.

Modules:
- :mod:`.augment_keys`: the batch augmentations' recipe keys, checked without numpy or torch
- :mod:`.augment_policy`: RandAugment, TrivialAugment, AugMix, color jitter: each batch's plan
- :mod:`.batch_augment`: BatchAugmentation: strong augmentation of whole batches on the device
- :mod:`.batch_factories`: the batch augmentations' factories, which registered.py adds by name
- :mod:`.batch_ops`: image ops on whole uint8 batches, one parameter per sample
- :mod:`.distillation`: knowledge distillation toward a frozen teacher
- :mod:`.factories`: dlrecipes' own algorithms' factories (label mixing, TTA, distillation, QAT, ...), which
  registered.py adds by name
- :mod:`.finetune`: finetune: the head, its learning rate, a frozen backbone at first
- :mod:`.gradient_checkpointing`: checkpointed blocks: memory for compute
- :mod:`.layer_freezing`: Composer's layer freezing, its checkpoints writable after a freeze
- :mod:`.layerwise_lr_decay`: smaller learning rates nearer the input
- :mod:`.mixup_cutmix`: MixUpCutMix: timm's Mixup in batch mode, MixUp or CutMix per batch
- :mod:`.progressive_resizing`: Composer's progressive resizing, for every loader (FFCV decodes small)
- :mod:`.qat`: quantization-aware training: int8 fake quantization, int8 export
- :mod:`.soft_targets`: label smoothing, MixUp, CutMix without host-device syncs
- :mod:`.support`: the algorithms' checks (requires=, validator=) and augmentation policies
- :mod:`.teacher`: where distillation's teacher comes from, checked at validation
- :mod:`.tta`: test-time augmentation (airbench's levels): evaluation logits over flipped, shifted views
"""

from dlrecipes.algorithms import registered  # noqa: F401  (registers the built-ins)
