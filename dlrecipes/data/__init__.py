"""Datasets: factories of :class:`~dlrecipes.data.splits.DatasetSplits`, registered in :mod:`.registered`;
the loaders (torch, on-device, tensor cache, FFCV) and dataset implementations sit beside it.

Modules:
- :mod:`.device_decode`: decode: device: the workers read files and draw crops, each batch decoded on the device
- :mod:`.dataset_params`: the CIFARs', the digits' and decode keys several datasets share, declared once
- :mod:`.device_loader`: DeviceTensorLoader: uint8 datasets kept and augmented on the device
- :mod:`.digits`: the embedded 8x8 digits (digits.npz, shipped in the package)
- :mod:`.ffcv`: FFCV's .beton files: written, read back, loaded (the ffcv extra)
- :mod:`.hf_dataset`: Hugging Face datasets (the hf extra)
- :mod:`.image_factories`: the factories of the datasets read from image files, which registered.py adds by name
- :mod:`.image_folder`: image folders, ImageNet, ImageNet-100 (imagenet100_classes.txt)
- :mod:`.jpeg`: images decoded by libjpeg-turbo into tensors, at a reduced size where the crop is small
- :mod:`.order`: the torch loader's global order: the same batches, and a resume at any batch, on any number of
  processes
- :mod:`.preprocess`: preprocess.json: how an image file becomes a model input
- :mod:`.preprocess_params`: the image-preprocessing keys several datasets share, declared once
- :mod:`.shards`: dataset shards (litdata's layout): written, and read by index through a bounded cache
- :mod:`.source_sizes`: source images' sizes, and the warning when a recipe upsamples them
- :mod:`.synthetic`: random tensors with random labels (smoke tests, benchmarks)
- :mod:`.task_data`: multi-input, multi-output datasets (two views of the digits, synthetic)
- :mod:`.tensor_cache`: the tensor cache: images decoded once into a memory-mapped array
- :mod:`.tensor_dataset`: the one dataset over in-memory uint8 images
- :mod:`.torchvision_sets`: MNIST and CIFAR-10/100 (torchvision), or from disk offline
- :mod:`.transforms`: standard train/eval transforms and normalisation constants
"""

from dlrecipes.data import registered  # noqa: F401  (registers the built-ins)
from dlrecipes.data.splits import DatasetSplits

__all__ = ["DatasetSplits"]
