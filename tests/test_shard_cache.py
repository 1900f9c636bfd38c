"""The shards reader and its cache (dlrecipes/data/shards/cache.py): both of litdata's chunk layouts read as data, a
small cache under the training order with two processes and DataLoader workers (within its limit plus one shard,
no shard twice in an epoch), a shard being read never evicted, a limit too small for what is read at once refused
before training, a full or read-only cache folder, damaged shards and decompression bombs named."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import image_folders, run_cli

pytest.importorskip("litdata")


def _dataset(folder: Path):
    """The train split of the local shards at ``folder``, as a :class:`ShardsDataset` (samples: the image's size)."""
    from dlrecipes.data.shards.dataset import ShardsPlace, read_meta

    place = ShardsPlace(str(folder), "dataset.remote")
    shards = read_meta(place)["splits"]["train"]["shards"]
    from dlrecipes.data.shards.dataset import ShardsDataset

    return ShardsDataset(place, "train", shards, lambda image: image.size[0], None, None)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """60 training images in about 20 shards of 3 samples."""
    root = tmp_path_factory.mktemp("shard-cache")
    source = image_folders(root / "src", ["a", "b", "c"], per_class=20, size=(24, 24))
    done = run_cli(
        "data", "convert", "image_folder", f"train_path={source / 'train'}", f"val_path={source / 'val'}",
        "--format", "shards", "--out", str(root / "shards"), "--shard-size", "2500",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return root / "shards"


def _cached(dataset, folder: Path, limit: int, log: Path, stall: float = 5.0):
    """``dataset`` read through a :class:`ShardCache` in ``folder`` whose downloads copy from the dataset's own
    folder, each logged (shard, bytes the cache then holds) from whichever process makes it."""
    from dlrecipes.data.shards.cache import ShardCache

    source = Path(dataset.url)

    def fetch(name: str, path: str) -> None:
        shutil.copyfile(source / name, path)
        held = sum(p.stat().st_size for p in folder.glob("chunk-*.bin")) + Path(path).stat().st_size
        with open(log, "a") as out:
            out.write(f"{name} {held}\n")

    dataset.cache = ShardCache(str(folder), limit, fetch, lambda: stall, dataset.cache_identity())
    return dataset


def test_both_chunk_layouts_are_read_as_litdata_wrote_them(tmp_path, monkeypatch):
    """litdata 0.2.76 writes a sample table, or (with pyarrow) Arrow rows at the chunk's end: each read back."""
    import litdata.streaming.item_loader as item_loader

    from dlrecipes.data.shards.cache import ARROW_MAGIC, read_from
    from dlrecipes.data.shards.write import write_split

    class Images:
        count = 5

        def __getitem__(self, index):
            return bytes([index]) * (100 + index), index % 3

    layouts = {}
    for arrow in (True, False):
        monkeypatch.setattr(item_loader, "_PYARROW_AVAILABLE", arrow)
        shards = write_split(Images(), tmp_path / str(arrow), 400)
        first = tmp_path / str(arrow) / shards[0]["file"]
        layouts[arrow] = first.read_bytes()[-8:] == ARROW_MAGIC
        read, tables = [], {}
        for shard in shards:
            fd = os.open(tmp_path / str(arrow) / shard["file"], os.O_RDONLY)
            read += [read_from(tables, fd, shard["file"], shard["bytes"], shard["samples"], i)
                     for i in range(shard["samples"])]  # fmt: skip
            os.close(fd)
        assert read == [Images()[i] for i in range(5)] and len(shards) > 1
    assert layouts == {True: True, False: False}


def _read_in_training_order(dataset, rank: int, epochs: int, step) -> None:
    """Rank ``rank`` of two reads ``epochs`` epochs, each batch ending at ``step`` (a barrier: training's
    all-reduce keeps the ranks within a step of each other)."""
    from torch.utils.data import DataLoader

    from dlrecipes.data.order import ordered

    samples = ordered(dataset, 2, rank, 2, seed=5)
    loader = DataLoader(samples, batch_size=1, sampler=samples.sampler, num_workers=2, persistent_workers=True)
    for epoch in range(epochs):
        samples.sampler.set_epoch(epoch)
        read = 0
        for _, labels in loader:
            read += len(labels)
            step.wait(timeout=60)
        assert read == len(dataset) // 2


def test_a_small_cache_under_the_training_order_holds_its_limit_and_downloads_each_shard_once_per_epoch(
    shards, tmp_path
):
    """Two processes, each with two DataLoader workers, read two epochs in the training order (shards shuffled,
    samples shuffled within windows of four) through one cache whose limit is what check_cache asks for: the cache
    never holds more than its limit plus one shard, and no shard is downloaded more than once per epoch, although
    the limit holds under half of the shards (so shards are evicted and come back)."""
    from dlrecipes.errors import DataError

    dataset = _cached(_dataset(shards), tmp_path / "cache", 1, tmp_path / "downloads.log")
    span = (2 * 2 + 2) * 2  # what the loader builder checks: two workers, a global batch of 2
    with pytest.raises(DataError) as refused:
        dataset.check_cache(span, shuffled=True)
    needed = int(str(refused.value).split("give at least ")[1].split(", or")[0].replace(",", ""))
    total, largest = sum(s["bytes"] for s in dataset.shards), max(s["bytes"] for s in dataset.shards)
    assert "dataset.cache_limit: 1 bytes cannot hold the shards the train split reads at once" in str(refused.value)
    assert needed < total / 2, (needed, total)
    dataset.cache.limit = needed
    dataset.check_cache(span, shuffled=True)  # enough now
    import multiprocessing

    children, step = [], multiprocessing.get_context("fork").Barrier(2)
    for rank in range(2):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's outcome is its exit code
            code = 1
            try:
                _read_in_training_order(dataset, rank, 2, step)
                code = 0
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        children.append(pid)
    assert all(os.waitpid(pid, 0)[1] == 0 for pid in children)
    logged = [line.split() for line in (tmp_path / "downloads.log").read_text().splitlines()]
    counts = {name: sum(1 for n, _ in logged if n == name) for name, _ in logged}
    assert max(int(held) for _, held in logged) <= needed + largest
    assert max(counts.values()) <= 2 and len(logged) > len(dataset.shards), counts  # evicted, never twice an epoch
    assert not list((tmp_path / "cache").glob("*.partial"))


def test_a_shard_being_read_is_never_evicted_and_a_full_cache_waits_a_bounded_time(shards, tmp_path):
    from dlrecipes.errors import DataError

    dataset = _dataset(shards)
    sizes = [s["bytes"] for s in dataset.shards]
    dataset = _cached(dataset, tmp_path / "cache", sizes[0] + sizes[1], tmp_path / "log", stall=0.5)
    cache = dataset.cache
    dataset.raw(dataset.starts[0])
    dataset.raw(dataset.starts[1])
    first = tmp_path / "cache" / dataset.shards[0]["file"]
    os.utime(first, (1, 1))  # the least recently used
    reading = os.open(first, os.O_RDONLY)
    fcntl.flock(reading, fcntl.LOCK_SH)  # as a sample's read holds it
    try:
        dataset.raw(dataset.starts[2])  # room made by evicting the second, not the first being read
        assert first.exists() and not (tmp_path / "cache" / dataset.shards[1]["file"]).exists()
        second = tmp_path / "cache" / dataset.shards[2]["file"]
        held = os.open(second, os.O_RDONLY)
        fcntl.flock(held, fcntl.LOCK_SH)
        cache.limit = 1  # both read at once, the cache over its limit: a new shard waits, then one line
        with pytest.raises(DataError, match=r"dataset.cache_limit: 1 bytes cannot hold the shards being read at once"):
            dataset.raw(dataset.starts[3])
        os.close(held)
    finally:
        os.close(reading)
    dataset.raw(dataset.starts[3])  # released: evicted as usual
    assert not first.exists()


def test_a_full_or_read_only_cache_folder_is_one_line_naming_it(shards, tmp_path):
    """A real small file system (tmpfs, 64 KiB): full, then read-only."""
    from dlrecipes.errors import DataError

    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)]).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        (mount / "filler").write_bytes(b"\0" * (64 * 1024 - 8192))
        dataset = _cached(_dataset(shards), mount / "cache", 10**9, tmp_path / "log")
        with pytest.raises(DataError) as full:
            for shard_start in dataset.starts[:-1]:
                dataset.raw(shard_start)
        assert f"dataset.cache_dir: {mount / 'cache'}: the disk is full (a shard of" in str(full.value)
        assert "--resume" in str(full.value) and not list((mount / "cache").glob("*.partial"))
        (mount / "filler").unlink()
        shutil.rmtree(mount / "cache")
        assert subprocess.run(["mount", "-o", "remount,ro", str(mount)]).returncode == 0
        with pytest.raises(DataError, match=rf"dataset.cache_dir: {mount / 'cache'}: it is on a read-only file"):
            _cached(_dataset(shards), mount / "cache", 10**9, tmp_path / "log").raw(0)
    finally:
        subprocess.run(["umount", str(mount)])


def test_damaged_shards_and_decompression_bombs_name_the_shard_and_sample(shards, tmp_path, monkeypatch):
    from PIL import Image

    from dlrecipes.data.shards.cache import ARROW_MAGIC
    from dlrecipes.errors import DataError

    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    dataset = _dataset(copy)
    shard = copy / "train" / dataset.shards[1]["file"]
    data = bytearray(shard.read_bytes())
    assert data[-8:] == ARROW_MAGIC
    data[-12:-8] = (10**6).to_bytes(4, "little")  # its Arrow rows said to be longer than the shard
    shard.write_bytes(bytes(data))
    at = dataset.starts[1]
    with pytest.raises(DataError, match=rf"shard {copy}/train/{shard.name} \(samples {at}-\d+ of train\) cannot be "):
        dataset[at]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)  # a 24x24 image is then over twice the limit: a bomb
    with pytest.raises(DataError, match=r"cannot be read at sample 0: Image size \(576 pixels\) exceeds .*bomb"):
        dataset[0]
    from torchvision.datasets import ImageFolder

    from dlrecipes.data.shards.write import EncodedImages

    images = EncodedImages(ImageFolder(str(shards.parent / "src" / "train")), None)
    with pytest.raises(
        DataError, match=r"image .*0\.jpg: Image size \(576 pixels\) exceeds .*remove it from the source"
    ):
        images[0]  # data convert's line for the same bomb (it was "unexpected: please report it")


def test_a_cache_folder_holds_one_datasets_shards(shards, tmp_path):
    """Two datasets with shards of the same names and sizes (a dataset converted again at its address, or two given
    one cache_dir): the second's samples are its own, never the first's cached under the same name."""
    from dlrecipes.data.shards.cache import IDENTITY

    other = tmp_path / "other"
    shutil.copytree(shards, other)
    first = _dataset(shards)
    name = first.shards[1]["file"]
    changed = bytearray((other / "train" / name).read_bytes())
    changed[len(changed) // 3] ^= 0xFF  # a byte of an image: the same size, other content
    (other / "train" / name).write_bytes(bytes(changed))
    at = first.starts[1]
    assert _cached(first, tmp_path / "cache", 10**9, tmp_path / "log").raw(at) == _dataset(shards).raw(at)
    second = _cached(_dataset(other), tmp_path / "cache", 10**9, tmp_path / "log")
    assert second.raw(at) == _dataset(other).raw(at) != _dataset(shards).raw(at)
    assert json.loads((tmp_path / "cache" / IDENTITY).read_text())["dataset"] == f"{other}/train"
