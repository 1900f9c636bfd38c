"""The keys two or more built-in datasets share beyond the image preprocessing of :mod:`.preprocess_params`: the
CIFARs' (download, augmentation, size, padding, flips), the embedded digits' two layouts' (augmentation, the
held-out share, the split's seed), and how image files are decoded.  Each meaning is written once, on its type
(:mod:`dlrecipes.core.param_docs`), with its range (:mod:`dlrecipes.core.ranges`).  No torch here: the registry
imports this module to list and validate recipes."""

from __future__ import annotations

from typing import Annotated, Literal

from dlrecipes.core.param_docs import Doc
from dlrecipes.core.ranges import Fraction, Range

CifarDownload = Annotated[
    bool,
    Doc(
        "download and extract the archive into root when files are missing; false: a "
        "missing file is an error naming it."
    ),
]
CifarAugment = Annotated[
    bool,
    Doc(
        "random 32x32 crops of the padded training images (crop_padding, padding_mode) "
        "and left-right flips (flip); false: training images as they are."
    ),
]
CifarSize = Annotated[
    int,
    Range(8, 8192),
    Doc(
        "side in pixels the 32x32 images are bilinearly resized to (after augmentation) for "
        "networks built for larger inputs, at least 8; 32 (the default) leaves them as they "
        "are."
    ),
]
CifarPadding = Annotated[
    int,
    Range(0, 16),
    Doc(
        "pixels each side of a training image is padded by before the random "
        "32x32 crop when augment is on (airbench94: 2, airbench96: 4)."
    ),
]
CifarPaddingMode = Annotated[
    Literal["zeros", "reflect"],
    Doc("what the crop's padding holds: 'zeros' (black) or 'reflect' (the image mirrored at its edge, airbench's)."),
]
CifarFlip = Annotated[
    Literal["random", "alternate"],
    Doc(
        "left-right flips when augment is on: 'random' flips each image with probability 1/2 every epoch; 'alternate' "
        "flips a seeded half of the images on even epochs and the other half on odd ones (airbench's; "
        "trainer.loader torch or device, the same images flipped in the same epochs for the same trainer.seed)."
    ),
]
DigitsAugment = Annotated[
    bool,
    Doc(
        "random affine on training images (up to 10 degrees of rotation, 10% shift, "
        "0.9-1.1 scale; a 2-pixel random shift with trainer.loader=device); false: training "
        "images as they are."
    ),
]
EvalFraction = Annotated[
    Fraction, Doc("share of each class's images held out for evaluation (a stratified split), in (0, 1).")
]
SplitSeed = Annotated[int, Doc("seed of the random train/eval split: the same seed, the same split.")]
Decode = Annotated[
    Literal["turbo", "device", "pil"],
    Doc(
        "how image files are decoded: turbo: by libjpeg-turbo through torchvision.io into tensors, "
        "a JPEG at 1/4 or 1/8 "
        "of its size where the crop box is that many times the crop or more (the same crops as pil within a "
        "small tolerance, faster); device: the loader's workers only read the files and draw the crops, and each batch "
        "is decoded on the training device (nvJPEG on a GPU), cropped, flipped and normalised there (trainer.loader "
        "torch); pil: by PIL, as torchvision's ImageFolder does. A run with Composer's randaugment or augmix (steps on "
        "PIL images) decodes with PIL."
    ),
]
