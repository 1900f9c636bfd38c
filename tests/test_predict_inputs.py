"""What `dlrecipes predict` reads (issue 34): every Pillow mode and bit depth as the 8-bit image it shows, EXIF
orientation, an animation's first frame; a file it cannot read (missing, too large to decode safely) named and
skipped, with a count line, and exit code 2 when nothing was predicted; a damaged export directory or an
unwritable --out as one line naming the file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dlrecipes.errors import UserError

from .conftest import run_cli


@pytest.fixture
def run_dir(trained_tiny) -> Path:
    """The tiny digits CNN (8x8 grey inputs) trained for 2 epochs of 3 batches: the shared run directory."""
    return trained_tiny


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """An export directory written by the exporter, of an untrained linear classifier of 8x8 grey images into
    ten classes (no training: these tests are about reading files, not about the classes)."""
    import torch

    from dlrecipes.callbacks.export_for_inference import export_and_verify, write_export_metadata
    from dlrecipes.data.preprocess import preprocess_spec

    folder = tmp_path_factory.mktemp("predict_export") / "export"
    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)).eval()
    assert export_and_verify(network, folder, ["torchscript"], torch.randn(2, 1, 8, 8))["passed"]
    write_export_metadata(folder, preprocess_spec("L", (0.3,), (0.3,), size=(8, 8)), [str(d) for d in range(10)], 10)
    return folder


def _digit() -> np.ndarray:  # noqa: F821
    """A handwritten 4 from the embedded digits, 8-bit grey, 16x16 (predict resizes it to the model's 8x8)."""
    import numpy as np
    from PIL import Image

    from dlrecipes.data.digits import load_digits_arrays

    images, labels = load_digits_arrays()
    small = Image.fromarray((images[np.flatnonzero(labels == 4)[0]] * 15).astype(np.uint8))
    return np.asarray(small.resize((16, 16), Image.BILINEAR))


def _in_every_mode(folder: Path) -> dict[str, tuple[Path, Path]]:
    """{what: (the file, the plain 8-bit grey file holding the same picture)}; each file is checked to open in
    the mode it is named after."""
    import numpy as np
    from PIL import Image

    grey = _digit()
    plain = folder / "plain.png"
    Image.fromarray(grey).save(plain)
    binary = folder / "binary_plain.png"
    Image.fromarray(np.where(grey >= 128, 255, 0).astype(np.uint8)).save(binary)
    rgb = Image.fromarray(grey).convert("RGB")
    opaque = Image.fromarray(np.full_like(grey, 255))
    palette = Image.fromarray(grey, "P")
    palette.putpalette([v for i in range(256) for v in (i, i, i)])
    files = {
        "L": Image.fromarray(grey),
        "RGB": rgb,
        "1": Image.fromarray(grey).convert("1", dither=Image.Dither.NONE),
        "LA": Image.merge("LA", (Image.fromarray(grey), opaque)),
        "P": palette,
        "RGBA": Image.merge("RGBA", (*rgb.split(), opaque)),
        "CMYK": rgb.convert("CMYK"),
        "I;16": Image.fromarray(grey.astype(np.uint16) * 257),  # the full 16-bit range
        "I": Image.fromarray(grey.astype(np.int32) * 257),
        "F": Image.fromarray(grey.astype(np.float32) / 255),  # floats in [0, 1]
    }
    suffix = {"CMYK": ".tif", "I": ".tif", "F": ".tif"}
    made = {}
    for mode, image in files.items():
        path = folder / f"mode_{mode.replace(';', '_')}{suffix.get(mode, '.png')}"
        image.save(path)
        with Image.open(path) as opened:
            assert opened.mode == mode, (path, opened.mode)
        made[mode] = (path, binary if mode == "1" else plain)
    # stored turned a quarter left, with the EXIF orientation (6) that turns it back upright
    exif = Image.Exif()
    exif[0x0112] = 6
    rgb.transpose(Image.Transpose.ROTATE_90).save(folder / "exif_rotated.jpg", exif=exif, quality=100, subsampling=0)
    Image.open(folder / "exif_rotated.jpg").transpose(Image.Transpose.ROTATE_270).convert("L").save(
        folder / "upright_plain.png"
    )  # the JPEG's own pixels (it is lossy), upright
    made["EXIF orientation"] = (folder / "exif_rotated.jpg", folder / "upright_plain.png")
    # an animation: the digit, then its negative
    Image.fromarray(grey).save(folder / "animated.gif", save_all=True, append_images=[Image.fromarray(255 - grey)])
    with Image.open(folder / "animated.gif") as opened:
        assert opened.n_frames == 2
    made["first frame"] = (folder / "animated.gif", plain)
    return made


def _probabilities(row: dict) -> dict[str, float]:
    return dict(row["top"])


@pytest.mark.slow
def test_every_mode_and_bit_depth_is_predicted_as_its_plain_8_bit_picture(run_dir, tmp_path):
    """A 16-bit PNG of a 4 was predicted as a white image would be (Pillow clips when converting); now every
    mode gives the class and probabilities of the same picture saved as plain 8-bit grey."""
    import numpy as np
    from PIL import Image

    from dlrecipes import api

    made = _in_every_mode(tmp_path)
    white = tmp_path / "white.png"
    Image.fromarray(np.full((16, 16), 255, np.uint8)).save(white)
    files = [white, *sorted({plain for _, plain in made.values()}), *(path for path, _ in made.values())]
    rows = {row["path"]: row for row in api.predict(run_dir, [str(f) for f in files], top_k=10)}
    assert len(rows) == len(files)
    plain = _probabilities(rows[str(tmp_path / "plain.png")])
    # the model tells the digit from a white image, so clipping to white could not pass unseen
    assert max(abs(plain[c] - p) for c, p in _probabilities(rows[str(white)]).items()) > 1e-3
    wrong = []
    for what, (path, reference) in made.items():
        row, expected = rows[str(path)], rows[str(reference)]
        got = _probabilities(row)
        if row["class"] != expected["class"] or any(
            abs(got[c] - p) > 1e-5 for c, p in _probabilities(expected).items()
        ):
            wrong.append(
                (what, row["class"], round(row["probability"], 4), expected["class"], round(expected["probability"], 4))
            )
    assert wrong == [], wrong  # (mode, class, probability, the plain picture's class and probability)


def test_an_image_too_large_to_decode_safely_is_named_and_skipped(export, tmp_path, monkeypatch, capsys):
    """Above PIL.Image.MAX_IMAGE_PIXELS Pillow warns, above twice that it raises DecompressionBombError: both
    are a skipped file with its reason, not an aborted batch."""
    from PIL import Image

    from dlrecipes import api

    Image.fromarray(_digit()).save(tmp_path / "small.png")  # 256 pixels
    Image.new("L", (40, 30)).save(tmp_path / "large.png")  # 1,200: above the limit (Pillow's warning)
    Image.new("L", (50, 50)).save(tmp_path / "huge.png")  # 2,500: above twice the limit (Pillow's error)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    rows = api.predict(export, [tmp_path / "huge.png", tmp_path / "small.png", tmp_path / "large.png"])
    assert [row["path"] for row in rows] == [str(tmp_path / "small.png")]
    assert [(path.name, "too large to decode safely" in why) for path, why in rows.skipped] == [
        ("huge.png", True),
        ("large.png", True),
    ]
    err = capsys.readouterr().err
    for name, pixels in (("huge.png", "2500"), ("large.png", "1200")):
        (line,) = [line for line in err.splitlines() if name in line]
        assert line.startswith(f"warning: skipping {tmp_path / name}: too large to decode safely") and pixels in line


def test_some_files_skipped_the_rows_end_with_a_count_line(export, tmp_path, capsys):
    from PIL import Image

    from dlrecipes import api
    from dlrecipes.tools.describe import format_predictions

    Image.fromarray(_digit()).save(tmp_path / "digit.png")
    (tmp_path / "notes.png").write_text("not an image")
    rows = api.predict(export, [tmp_path / "digit.png", tmp_path / "notes.png", tmp_path / "digt.png"])
    assert len(rows) == 1 and [(p.name, why) for p, why in rows.skipped] == [
        ("notes.png", "not an image file Pillow can read"),
        ("digt.png", "no such file (did you mean 'digit.png'?)"),
    ]
    assert format_predictions(rows).splitlines()[-1] == "1 predicted, 2 skipped"
    assert format_predictions(rows, "p.csv").splitlines()[-1] == "1 predicted, 2 skipped; written to p.csv"
    assert capsys.readouterr().err.count("warning: skipping") == 2


def test_nothing_predicted_is_exit_code_2_naming_each_file(export, tmp_path):
    """The CLI contract: `predict EXPORT missing.png` exited 0 having done nothing; now each file is named with
    its reason, the error is the count line, exit code 2, no traceback; --json keeps standard output JSON."""
    import json

    from PIL import Image

    Image.fromarray(_digit()).save(tmp_path / "digit.png")
    result = run_cli("predict", str(export), str(tmp_path / "digti.png"), str(tmp_path / "gone" / "x.png"))
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines() == [
        f"warning: skipping {tmp_path / 'digti.png'}: no such file (did you mean 'digit.png'?)",
        f"warning: skipping {tmp_path / 'gone' / 'x.png'}: no such file (and no folder {tmp_path / 'gone'})",
        "error: 0 predicted, 2 skipped: no file could be read (each is named above)",
    ]
    some = run_cli("predict", str(export), str(tmp_path / "digit.png"), str(tmp_path / "digti.png"), "--json")
    assert some.returncode == 0, some.stderr[-2000:]
    assert [row["path"] for row in json.loads(some.stdout)] == [str(tmp_path / "digit.png")]
    assert some.stderr.splitlines()[-1] == "1 predicted, 1 skipped"


def _damage(export: Path, tmp_path: Path, name: str, content: bytes | str | None) -> Path:
    folder = tmp_path / "damaged"
    shutil.copytree(export, folder)
    if name == "model.onnx":  # an ONNX export: no TorchScript file beside it
        (folder / "model.torchscript.pt").unlink()
    if content is None:
        (folder / name).unlink()
    elif content == "truncated":
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: len(data) // 2])
    else:
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return folder


DAMAGE = [
    ("model.torchscript.pt", b"\x00garbage" * 50, "not a TorchScript model torch can load"),
    ("model.torchscript.pt", "truncated", "not a TorchScript model torch can load"),
    ("model.onnx", b"\x00garbage" * 50, "not an ONNX model onnxruntime can load"),
    ("preprocess.json", '{"channels": "L",', "not valid JSON (Expecting property name"),
    ("preprocess.json", b"\xff\xfe\x00", "cannot be read as JSON text"),
    ("preprocess.json", "[1, 2]", "expected a JSON object (mapping), got a list"),
    (
        "preprocess.json",
        '{"channels": "L", "resize": {"size": [8, 8]}, "scale": 255, "std": [1]}',
        "missing key(s) mean",
    ),
    (
        "preprocess.json",
        '{"channels": "XYZ", "resize": {"size": [8, 8]}, "scale": 255, "mean": [0], "std": [1]}',
        "channels: expected one of L, RGB, got 'XYZ'",
    ),
    (
        "preprocess.json",
        '{"channels": "L", "resize": {"size": [8]}, "scale": 255, "mean": [0], "std": [1]}',
        "resize: expected",
    ),
    (
        "preprocess.json",
        '{"channels": "L", "resize": {"size": [8, 8]}, "scale": 255, "mean": [0, 0], "std": [1]}',
        "mean: expected a list of 1 number(s)",
    ),
    ("preprocess.json", None, "an export directory needs preprocess.json and classes.json; preprocess.json is missing"),
    ("classes.json", "not json", "not valid JSON (Expecting value at line 1, column 1)"),
    ("classes.json", '{"0": "zero"}', "expected a list of class names (strings) in logit order"),
    (
        "classes.json",
        '["a", "b", "c"]',
        "model.torchscript.pt: gives logits of shape [1, 10] for 1 image(s), but classes.json names 3 classes",
    ),
]


@pytest.mark.parametrize("name, content, expected", DAMAGE, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(DAMAGE)])
def test_a_damaged_export_directory_is_one_error_naming_the_file(export, tmp_path, name, content, expected):
    from PIL import Image

    from dlrecipes import api

    if name == "model.onnx":
        pytest.importorskip("onnxruntime")
    folder = _damage(export, tmp_path, name, content)
    Image.fromarray(_digit()).save(tmp_path / "digit.png")
    with pytest.raises(UserError) as caught:
        api.predict(folder, [tmp_path / "digit.png"])
    message = str(caught.value)
    named = "model.torchscript.pt" if "gives logits" in expected else name
    assert f"{folder / named}:" in message or f"{folder}:" in message and named in message, message
    assert expected in message and "\n" not in message and len(message) <= 1000, message


def test_damaged_export_and_unwritable_out_are_one_line_on_the_command_line(export, tmp_path):
    """The CLI contract for both: exit code 2, one line, no traceback."""
    from PIL import Image

    folder = _damage(export, tmp_path, "model.torchscript.pt", "truncated")
    Image.fromarray(_digit()).save(tmp_path / "digit.png")
    result = run_cli("predict", str(folder), str(tmp_path / "digit.png"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith(f"error: {folder / 'model.torchscript.pt'}: not a TorchScript model")
    (tmp_path / "taken").write_text("a file where --out wants a folder")
    for out, expected in (
        (tmp_path / "taken" / "p.csv", f"{tmp_path / 'taken'} is a file, not a folder"),
        (tmp_path, "is a folder; give a file name such as"),
    ):
        result = run_cli("predict", str(export), str(tmp_path / "digit.png"), "--out", str(out))
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert result.stderr.splitlines() == [f"error: --out: {result.stderr.strip().split('--out: ', 1)[1]}"]
        assert expected in result.stderr
