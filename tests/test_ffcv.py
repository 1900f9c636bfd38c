"""FFCV end to end on CPU: convert, inspect, load, progressive resizing in the decoder, train."""

from __future__ import annotations

import builtins
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dlrecipes.errors import DataError, UserError

from . import forked
from .conftest import run_cli, write

if importlib.util.find_spec("ffcv") is None:
    if os.environ.get("CI"):
        raise RuntimeError("CI installs the ffcv extra; FFCV tests must run there")
    pytest.skip("FFCV is not installed (pip install -e '.[ffcv]')", allow_module_level=True)

from dlrecipes.data.ffcv.files import ConvertOptions, RawImages, import_ffcv, inspect_beton, open_reader, write_beton  # noqa: E402
from dlrecipes.data.ffcv.loader import FFCVLoader, FFCVSource  # noqa: E402

CLASSES = ("ant", "bee", "cow")


def _folder(root: Path, per_class: int = 6, bad: dict[str, bytes] | None = None) -> Path:
    """Images whose every pixel is the sample's id, so a decoded crop still says which sample it is."""
    sample_id = 0
    for c in CLASSES:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(np.full((24 + i, 30, 3), sample_id, dtype=np.uint8)).save(root / c / f"{i}.png")
            sample_id += 1
    for name, data in (bad or {}).items():
        (root / name).write_bytes(data)
    return root


def _image_folder(root: Path):
    from torchvision.datasets import ImageFolder

    return ImageFolder(str(root))


@pytest.fixture(scope="module")
def beton(tmp_path_factory) -> Path:
    root = _folder(tmp_path_factory.mktemp("src") / "train")
    path = tmp_path_factory.mktemp("beton") / "train.beton"
    report = write_beton(
        RawImages(_image_folder(root)), path, ConvertOptions(write_mode="raw", num_workers=1), list(CLASSES)
    )
    assert report.samples == 18 and path.exists() and Path(f"{path}.json").exists()
    return path


def _source(path, train, size=16, hflip=False):
    # mean 0 and std 1/255 leave pixel values as they were stored: each pixel is the sample id
    return FFCVSource(str(path), train, size, 1.0, 0.5, hflip, (0.0, 0.0, 0.0), (1 / 255,) * 3, os_cache=False)


def test_import_restores_the_thread_count_and_missing_ffcv_names_the_install(monkeypatch):
    torch.set_num_threads(2)
    import_ffcv()
    assert torch.get_num_threads() == 2
    real_import = builtins.__import__

    def no_ffcv(name, *args, **kwargs):
        if name.startswith("ffcv"):
            raise ImportError("No module named 'ffcv'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ffcv)
    with pytest.raises(UserError, match=r"pkg-config libturbojpeg0-dev libopencv-dev.*pip install -e '.\[ffcv\]'"):
        import_ffcv()


def test_inspect_reports_samples_fields_resolutions_and_classes(beton):
    info = inspect_beton(beton)
    assert info["samples"] == 18
    assert info["fields"] == {"image": "RGBImageField", "label": "IntField"}
    assert info["resolution"]["height"] == {"min": 24, "median": 26.5, "max": 29}
    assert info["stored_as"] == {"jpg": 0, "raw": 18}
    assert info["classes"] == {0: 6, 1: 6, 2: 6} and info["class_names"] == list(CLASSES)
    from dlrecipes import registry

    data = registry.datasets.build("ffcv", train_path=str(beton), val_path=str(beton), crop_size=16)
    assert data.num_classes == 3 and data.class_names == list(CLASSES)  # for the end-of-run report


def test_eval_loader_returns_every_sample_once_with_its_label(beton):
    loader = FFCVLoader(_source(beton, train=False), batch_size=4, num_workers=1, device=torch.device("cpu"), seed=0)
    images, labels = zip(*loader)
    images, labels = torch.cat(images), torch.cat(labels)
    assert images.shape == (18, 3, 16, 16) and images.dtype == torch.float32 and labels.dtype == torch.int64
    ids = images[:, 0, 8, 8].round().long()
    assert ids.tolist() == list(range(18))  # in order, each once
    assert labels.tolist() == [i // 6 for i in range(18)]  # the label travelled with its image


def test_an_epoch_left_before_its_end_stops_ffcvs_thread(beton):
    """A subset of batches (eval_subset_num_batches, a duration in batches) leaves an epoch early: FFCV's thread,
    which holds its epoch and batch buffers, is stopped then, not left waiting to hand over its next batch."""
    import threading
    import time

    from ffcv.loader.epoch_iterator import EpochIterator

    loader = FFCVLoader(_source(beton, train=False), batch_size=4, num_workers=1, device=torch.device("cpu"), seed=0)
    ahead = loader.loader.batches_ahead  # FFCV's queue holds this many batches
    for taken in (1, len(loader) - ahead):  # mid-epoch; and with only the last batches left, all queued
        epoch = iter(loader)
        for _ in range(taken):
            next(epoch)
        thread = next(t for t in threading.enumerate() if isinstance(t, EpochIterator))
        while not thread.output_queue.full():  # the second time, the thread then waits to queue its end mark
            time.sleep(0.01)
        del epoch  # as Composer's loop drops an epoch it leaves
        assert not thread.is_alive(), taken


def test_train_loader_epoch_sees_each_sample_once_and_resolution_follows_the_decoder(beton, tmp_path, monkeypatch):
    """Each epoch decodes at the size set before it; numba compiles the pipeline in the first
    epoch only, whatever the size (progressive resizing used to recompile at every epoch)."""
    import numba.core.config
    import numba.core.event

    monkeypatch.setattr(numba.core.config, "CACHE_DIR", str(tmp_path / "numba"))  # nothing cached yet

    loader = FFCVLoader(_source(beton, train=True), batch_size=6, num_workers=1, device=torch.device("cpu"), seed=1)
    before, threads = torch.get_num_threads(), 3  # any count other than the loader's one worker
    torch.set_num_threads(threads)
    compilations = []
    for size in (16, 8, 24, 8):
        loader.set_resolution(size)
        with numba.core.event.install_recorder("numba:compile") as recorder:
            batches = list(loader)
        compilations.append(len(recorder.buffer))
        images, labels = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        assert images.shape == (18, 3, size, size)
        ids = images[:, 0, size // 2, size // 2].round().long()
        assert sorted(ids.tolist()) == list(range(18))
        assert torch.equal(labels, ids // 6)
    assert compilations[0] > 0 and compilations[1:] == [0, 0, 0]
    assert torch.get_num_threads() == threads  # FFCV's per-epoch set_num_threads(workers) is undone
    torch.set_num_threads(before)


def test_an_os_cache_loader_leaves_numbas_shared_types_writable(beton):
    """FFCV's OS-cache reader set ``mutable = False`` on numba's one ``uint8[::1]`` instance, so
    writable buffers were typed read-only and numba printed KeyError tracebacks at exit."""
    import numba

    source = FFCVSource(str(beton), False, 16, 1.0, 0.5, False, (0.0,) * 3, (1 / 255,) * 3, os_cache=True)
    loader = FFCVLoader(source, batch_size=6, num_workers=1, device=torch.device("cpu"), seed=0)
    assert sum(len(labels) for _, labels in loader) == 18
    assert numba.uint8[::1].mutable and numba.uint64[::1].mutable


_DECODE_TWICE = """
import json, sys
import numba.core.event, torch
from dlrecipes.data.ffcv.loader import FFCVLoader, FFCVSource
out = {}
for path in sys.argv[1:]:
    out[path] = {"compilations": 0, "batches": []}
    for train in (True, False):
        source = FFCVSource(path, train, 12, 1.0, 0.3, True, (0.0, 0.0, 0.0), (1 / 255,) * 3, os_cache=True)
        loader = FFCVLoader(source, batch_size=6, num_workers=2, device=torch.device("cpu"), seed=3)
        with numba.core.event.install_recorder("numba:compile") as recorder:
            for epoch in range(2):
                out[path]["batches"] += [[images.sum().item(), labels.tolist()] for images, labels in loader]
        out[path]["compilations"] += len(recorder.buffer)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_compiled_pipelines_are_cached_on_disk_and_decode_as_ffcv_does(tmp_path):
    """For files written as JPEG and as raw pixels, each decoded in the same three processes: with FFCV's own
    compilation, then a machine's first process with the cache (compiles the train and eval pipelines: random
    crops, flips, two numba threads), then the next (loads every function from numba's cache, compiles nothing):
    the same batches, and no numba warnings or tracebacks on stderr. (The two write modes were two
    parametrized cases of three processes each; one process now decodes both files. The first two are forked
    from the preload server, which has not imported numba or FFCV; the last is a new Python, whose exit is
    a real interpreter's.)"""
    import subprocess
    import sys

    from dlrecipes.data.ffcv.compile import CACHE_SWITCH

    root = _folder(tmp_path / "src" / "train")
    paths = []
    for write_mode in ("jpg", "raw"):
        paths.append(str(tmp_path / f"{write_mode}.beton"))
        write_beton(
            RawImages(_image_folder(root)),
            Path(paths[-1]),
            ConvertOptions(write_mode=write_mode, num_workers=1),
            list(CLASSES),
        )
    cache = tmp_path / "numba"
    script = tmp_path / "decode_twice.py"
    script.write_text(_DECODE_TWICE)
    runs = []
    for switch, new_python in (("0", False), ("1", False), ("1", True)):
        env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), CACHE_SWITCH: switch}
        if new_python:  # what a process prints as it exits (numba's messages were) reaches stderr only here
            runs.append(
                subprocess.run(
                    [sys.executable, str(script), *paths], capture_output=True, text=True, timeout=600, env=env
                )
            )
        else:  # forked from the server that imported torch and Composer (not numba, not FFCV: imported here)
            runs.append(forked.run(paths, cwd=tmp_path, timeout=600, env=env, module=str(script)))
    ffcvs, first, second = (json.loads(run.stdout.splitlines()[-1]) for run in runs)
    # FFCV compiles each loader's pipeline; with the cache, the first process compiles (what the JPEG file's loaders
    # compile serves the raw file's too: one decoder reads both) and the next compiles nothing for either
    assert all(ffcvs[path]["compilations"] > 0 for path in paths) and first[paths[0]]["compilations"] > 0
    for path in paths:
        assert second[path]["compilations"] == 0, path
        assert ffcvs[path]["batches"] == first[path]["batches"] == second[path]["batches"], path
        assert len(first[path]["batches"]) == 2 * (3 + 3), path
    for run in runs:
        assert not any(word in run.stderr for word in ("Numba", "Traceback", "Exception ignored")), run.stderr[-2000:]
    assert any(cache.rglob("*.nbi"))


def _closure(scale, inner):
    def pipeline(x):
        return inner(x) * scale[0]

    return pipeline


def _plus_one(x):
    return x + 1


def _plus_two(x):
    return x + 2


def test_cache_keys_follow_the_code_and_every_closure_value(monkeypatch):
    """Equal content gives equal keys across separately built dispatchers (as in a new process);
    a different captured array, inner function, inner compile option or C signature gives a
    different key."""
    from numba import njit, types

    from dlrecipes.data.ffcv import compile as ffcv_compile
    from dlrecipes.data.ffcv.compile import _fingerprint

    key = _fingerprint(_closure(np.array([2.0]), njit(_plus_one)))
    assert key == _fingerprint(_closure(np.array([2.0]), njit(_plus_one)))
    assert key != _fingerprint(_closure(np.array([3.0]), njit(_plus_one)))
    assert key != _fingerprint(_closure(np.array([2.0]), njit(_plus_two)))
    assert key != _fingerprint(_closure(np.array([2.0]), njit(fastmath=True)(_plus_one)))
    decode_key = _fingerprint(ffcv_compile.imdecode)
    monkeypatch.setattr(ffcv_compile, "_c_imdecode", types.ExternalFunction("other", types.int32(types.int64)))
    assert _fingerprint(ffcv_compile.imdecode) != decode_key


def test_without_a_writable_cache_location_pipelines_compile_uncached(beton, monkeypatch):
    from ffcv.pipeline.compiler import Compiler
    from numba.core.caching import NullCache

    from dlrecipes.data.ffcv import compile as ffcv_compile

    def no_location(self, py_func):
        raise RuntimeError("cannot cache function: no locator available")

    monkeypatch.setattr(ffcv_compile._ContentKeyedCache, "__init__", no_location)
    import_ffcv()
    assert Compiler.compile.__func__ is ffcv_compile._compile
    compiled = Compiler.compile(_closure(np.array([2.0]), Compiler.compile(_plus_one)))
    assert compiled(1.0) == 4.0 and isinstance(compiled._cache, NullCache)
    loader = FFCVLoader(_source(beton, train=False), batch_size=9, num_workers=1, device=torch.device("cpu"), seed=0)
    images = torch.cat([batch[0] for batch in loader])
    assert images[:, 0, 8, 8].round().long().tolist() == list(range(18))


def test_progressive_resizing_schedule_matches_composers_rule(beton):
    loader = FFCVLoader(
        _source(beton, train=True, size=224), batch_size=6, num_workers=1, device=torch.device("cpu"), seed=0
    )
    from dlrecipes.algorithms.progressive_resizing import ProgressiveResizing, decodes_at_a_size

    assert decodes_at_a_size(loader) and loader.full_resolution == 224
    pr = ProgressiveResizing(initial_scale=0.5, delay_fraction=0.2, finetune_fraction=0.2, size_increment=32)
    # 10 epochs: epochs 0-1 at half size, a linear ramp, full size for the last 2 (multiples of 32)
    assert [pr.resolution_at(e / 10, 224) for e in range(10)] == [128, 128, 128, 128, 160, 160, 192, 192, 224, 224]


def test_truncated_or_missing_beton_is_a_named_error(beton, tmp_path):
    cut = tmp_path / "cut.beton"
    cut.write_bytes(beton.read_bytes()[: beton.stat().st_size - 100])
    with pytest.raises(DataError, match=rf"{cut}: truncated or damaged FFCV file"):
        open_reader(cut)
    half = tmp_path / "half.beton"
    half.write_bytes(beton.read_bytes()[: beton.stat().st_size // 2])
    with pytest.raises(DataError, match=rf"{half}"):
        open_reader(half)
    with pytest.raises(DataError, match="FFCV file not found"):
        open_reader(tmp_path / "nope.beton")


def test_a_betons_fields_and_sidecar_are_data(beton, tmp_path):
    """Fields other than an image and its label (an NDArrayField names any dtype) are refused before any sample is
    read; a sidecar's class count is checked (1e12 was a MemoryError at the model) and holds the file's labels."""
    import json
    import shutil

    from ffcv.fields import IntField, NDArrayField
    from ffcv.writer import DatasetWriter

    from dlrecipes.data.ffcv.files import beton_num_classes

    other = tmp_path / "other.beton"
    rows = [(np.zeros(2, dtype=np.float32), i) for i in range(3)]
    DatasetWriter(
        str(other), {"x": NDArrayField(np.dtype("float32"), (2,)), "y": IntField()}, num_workers=1
    ).from_indexed_dataset(rows)
    with pytest.raises(DataError, match=r"its fields are \['NDArrayField', 'IntField'\], not those data convert"):
        open_reader(other)
    copy = tmp_path / "copy.beton"
    shutil.copy(beton, copy)
    sidecar = json.loads(Path(f"{beton}.json").read_text())
    for forged, said in [
        ({**sidecar, "num_classes": 10**12, "class_names": None}, "not the class names and count data convert writes"),
        ({**sidecar, "num_classes": 2, "class_names": sidecar["class_names"][:2]}, "holds labels up to 2, outside"),
    ]:
        Path(f"{copy}.json").write_text(json.dumps(forged))
        with pytest.raises(DataError, match=said):
            beton_num_classes(copy)
    Path(f"{copy}.json").write_text(json.dumps(sidecar))
    assert beton_num_classes(copy) == len(CLASSES)


def test_corrupt_images_stop_the_conversion_or_are_skipped_and_counted(tmp_path):
    root = _folder(tmp_path / "src", per_class=2, bad={"ant/empty.jpg": b"", "bee/broken.jpg": b"\xff\xd8\xff garbage"})
    target = tmp_path / "out" / "train.beton"
    with pytest.raises(DataError, match=r"unreadable image .*ant/empty.jpg"):
        write_beton(RawImages(_image_folder(root)), target, ConvertOptions(num_workers=1))
    assert not target.exists() and not list(target.parent.glob("*.tmp-*"))  # nothing half-written
    report = write_beton(RawImages(_image_folder(root)), target, ConvertOptions(num_workers=1, skip_bad=True))
    assert report.samples == 6 and sorted(Path(p).name for p, _ in report.skipped) == ["broken.jpg", "empty.jpg"]
    assert inspect_beton(target)["samples"] == 6


@pytest.mark.slow
def test_cli_convert_inspect_and_train_through_ffcv_with_decoder_resizing(tmp_path):
    _folder(tmp_path / "imgs" / "train", per_class=8)
    _folder(tmp_path / "imgs" / "val", per_class=2)
    out = tmp_path / "ffcv"
    args = [
        "data",
        "convert",
        "image_folder",
        f"train_path={tmp_path}/imgs/train",
        f"val_path={tmp_path}/imgs/val",
        "--out",
        str(out),
        "--workers",
        "1",
    ]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "24 samples written" in first.stderr and "6 samples written" in first.stderr
    again = run_cli(*args)
    assert again.returncode == 2 and "already exist" in again.stderr and "--overwrite" in again.stderr
    assert run_cli(*args, "--overwrite").returncode == 0
    shown = run_cli("data", "inspect", str(out / "train.beton"))
    assert "24 samples" in shown.stdout and "ant: 8" in shown.stdout
    recipe = write(
        tmp_path / "ffcv.yaml",
        f"""
        model: {{name: cifar_resnet18}}
        dataset: {{name: ffcv, train_path: {out}/train.beton, val_path: {out}/val.beton, crop_size: 32}}
        trainer: {{max_duration: 3ep, batch_size: 8, num_workers: 1, progress_bar: false, device: cpu}}
        optimizer: {{name: sgd, lr: 0.01}}
        checkpoint: {{save: false}}
        runs_dir: {tmp_path}/runs
        run_name: ffcv
        algorithms:
          progressive_resizing: {{initial_scale: 0.5, delay_fraction: 0.0, finetune_fraction: 0.34, size_increment: 8}}
    """,
    )
    result = run_cli("train", str(recipe))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done: 3 epochs, 9 batches" in result.stderr
    assert "Exception ignored" not in result.stderr  # numba's finalizer tracebacks came with recompiling
    log = (tmp_path / "runs" / "ffcv" / "train-rank0.log").read_text()
    resolutions = [
        int(float(line.rsplit(":", 1)[1])) for line in log.splitlines() if "progressive_resizing/resolution" in line
    ]
    assert list(dict.fromkeys(resolutions)) == [16, 24, 32]  # one value per epoch (the file log repeats lines)
