"""FFCV loaders for training (random-resized-crop decode, flip, normalise) and evaluation
(center-crop decode), returned as Composer DataSpecs; a loader decodes at the size progressive
resizing sets (:mod:`dlrecipes.algorithms.progressive_resizing`), so early epochs decode small images.

Pipelines differ by device.  On the GPU, decoded uint8 batches go to the device
(non-blocking), become channels-last torch images, and are normalised there in fp16 or fp32.
On the CPU every FFCV transform, normalisation included, runs before ``ToTensor``: the other
order hangs FFCV's loader on CPU; batches stay in channels-last memory order there (a contiguous
NCHW copy halved throughput).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from composer.core import DataSpec

from dlrecipes.core.devices import torch_device
from dlrecipes.core.precision import precision_of
from dlrecipes.data.ffcv.files import import_ffcv, open_reader

if TYPE_CHECKING:
    from ffcv.loader.epoch_iterator import EpochIterator


@dataclass(frozen=True)
class FFCVSource:
    """One split of an FFCV dataset and how to decode it (what the ``ffcv`` dataset factory returns)."""

    path: str
    train: bool
    crop_size: int
    resize_ratio: float
    min_scale: float
    hflip: bool
    mean: tuple[float, ...]
    std: tuple[float, ...]
    os_cache: bool = True
    batches_ahead: int = 3

    def __len__(self) -> int:
        return int(open_reader(self.path).num_samples)


def _pipelines(source: FFCVSource, device: torch.device, half: bool, channels_last: bool, size: int):
    import_ffcv()
    from ffcv.fields.decoders import CenterCropRGBImageDecoder, IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.transforms import Convert, NormalizeImage, RandomHorizontalFlip, Squeeze, ToDevice, ToTensor, ToTorchImage

    if source.train:
        decoder = RandomResizedCropRGBImageDecoder((size, size), scale=(source.min_scale, 1.0))
    else:
        decoder = CenterCropRGBImageDecoder((size, size), ratio=source.resize_ratio)
    image = [decoder] + ([RandomHorizontalFlip()] if source.train and source.hflip else [])
    mean = np.array(source.mean) * 255
    std = np.array(source.std) * 255
    if device.type == "cuda":
        image += [
            ToTensor(),
            ToDevice(device, non_blocking=True),
            ToTorchImage(channels_last=channels_last),
            NormalizeImage(mean, std, np.float16 if half else np.float32),
        ]
        label = [IntDecoder(), ToTensor(), Squeeze(), Convert(torch.int64), ToDevice(device, non_blocking=True)]
    else:
        # channels_last=True is a free view of FFCV's NHWC batch; False would copy every batch
        image += [NormalizeImage(mean, std, np.float32), ToTensor(), ToTorchImage(channels_last=True)]
        label = [IntDecoder(), ToTensor(), Squeeze(), Convert(torch.int64)]
    return {"image": image, "label": label}, decoder


class FFCVLoader:
    """An FFCV Loader plus the decoder whose output size progressive resizing changes."""

    fixed_batches = True  # batch i holds min(batch_size, num_samples - i * batch_size) samples (the engine)

    def __init__(
        self,
        source: FFCVSource,
        batch_size: int,
        num_workers: int,
        device: torch.device,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        half: bool = False,
        channels_last: bool = False,
    ):
        import_ffcv()
        from ffcv.loader import Loader, OrderOption

        self.source = source
        pipelines, self.decoder = _pipelines(source, device, half, channels_last, source.crop_size)
        n = len(source)
        kwargs = {}
        if source.train:
            kwargs = {"order": OrderOption.RANDOM, "drop_last": True, "distributed": world_size > 1}
        else:
            # each rank evaluates its own slice: every sample exactly once across ranks
            kwargs = {"order": OrderOption.SEQUENTIAL, "drop_last": False, "indices": np.arange(rank, n, world_size)}
        self.loader = Loader(
            source.path,
            batch_size=batch_size,
            num_workers=num_workers if num_workers > 0 else -1,
            os_cache=source.os_cache,
            seed=seed,
            pipelines=pipelines,
            batches_ahead=source.batches_ahead,
            # FFCV's decode writes into buffers allocated at each epoch from the decoder's current
            # output size and never captures the size: progressive resizing needs no recompiling
            recompile=False,
            **kwargs,
        )
        self.batch_size = batch_size
        self.num_samples = len(self.loader) * batch_size if source.train else len(kwargs["indices"])

    @property
    def resolution(self) -> int:
        return int(self.decoder.output_size[0])

    @property
    def full_resolution(self) -> int:
        """The crop size the recipe asks for (progressive resizing grows to it)."""
        return int(self.source.crop_size)

    def set_resolution(self, size: int) -> None:
        """Decode the next epoch at ``size`` (progressive resizing; nothing is recompiled)."""
        self.decoder.output_size = (size, size)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        threads = torch.get_num_threads()
        epoch = iter(self.loader)  # FFCV sets torch's thread count to its worker count here, every epoch
        torch.set_num_threads(threads)  # numba keeps FFCV's; the model keeps its own
        return _closed_when_left(epoch)


def _closed_when_left(epoch: EpochIterator) -> Iterator[Any]:
    """FFCV's epoch, its thread stopped when the epoch is left before its end (a subset of batches, a duration in
    batches): the thread holds its epoch alive and would wait forever to hand over its next batch, with the
    epoch's batch buffers."""
    try:
        yield from epoch
    finally:
        if epoch.is_alive():  # left early (at its end, FFCV's thread has ended and closed the epoch itself)
            _stop(epoch)


def _stop(epoch: EpochIterator) -> None:
    """The thread sees the terminate event only while its queue is full (within half a second); one at its epoch's
    end waits to hand over its last item with no timeout: a batch taken off the queue makes room for it (each
    such room costs at most one more batch's decoding)."""
    from queue import Empty

    epoch.terminate_event.set()
    for _ in range(100):
        epoch.join(timeout=0.6)
        if not epoch.is_alive():
            break
        try:
            epoch.output_queue.get_nowait()
        except Empty:
            pass
    epoch.close()


def ffcv_dataspec(loader: FFCVLoader) -> DataSpec:
    return DataSpec(loader, num_samples=loader.num_samples, get_num_samples_in_batch=lambda batch: batch[0].shape[0])


def build_ffcv_loaders(
    train: FFCVSource,
    evaluation: FFCVSource,
    train_batch: int,
    eval_batch: int,
    num_workers: int,
    device: str,
    precision: str,
    seed: int,
    channels_last: bool,
) -> tuple[FFCVLoader, FFCVLoader]:
    from composer.utils import dist

    on_device = torch_device(device)
    common = {
        "num_workers": num_workers,
        "device": on_device,
        "seed": seed,
        "rank": dist.get_global_rank(),
        "world_size": dist.get_world_size(),
        "half": precision_of(precision).half_data,
        "channels_last": channels_last,
    }
    return (
        FFCVLoader(train, train_batch, **common),
        FFCVLoader(evaluation, eval_batch, **common),
    )
