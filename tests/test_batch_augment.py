"""Strong augmentation of whole batches on the device (issue 38): each op equals torchvision's
``transforms.v2.functional`` on every sample (within 1/255 on uint8), the plans follow the policies'
distributions, the same batch of the same run gets the same augmentation (resumed or not), and it
trains with every loader."""

from __future__ import annotations

import math
import os
import signal
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from dlrecipes import registry
from dlrecipes.algorithms import augment_policy as P
from dlrecipes.algorithms import batch_ops
from dlrecipes.algorithms.augment_keys import parse_timm
from dlrecipes.algorithms.batch_augment import BatchAugmentation, apply_layers, normalization_of
from dlrecipes.errors import RecipeError
from tests.conftest import REPO, TINY_RECIPE, run_cli, write

NEAREST = TF.InterpolationMode.NEAREST


def _images(n=6, c=3, h=23, w=31, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, c, h, w), generator=g, dtype=torch.uint8)
    images[1] = images[1] // 3 + 40  # a low-contrast image: autocontrast and equalize have work to do
    images[2, :, :4] = 7  # a flat band: ties for equalize's histogram
    return images


def _reference(name: str, image: torch.Tensor, v: float, fill):
    """torchvision's op at value ``v``, as its RandAugment/TrivialAugmentWide/AugMix call it."""
    shear = math.degrees(math.atan(v))
    calls = {
        "ShearX": lambda: TF.affine(image, 0.0, [0, 0], 1.0, [shear, 0.0], NEAREST, fill, center=[0, 0]),
        "ShearY": lambda: TF.affine(image, 0.0, [0, 0], 1.0, [0.0, shear], NEAREST, fill, center=[0, 0]),
        "TranslateX": lambda: TF.affine(image, 0.0, [int(v), 0], 1.0, [0.0, 0.0], NEAREST, fill),
        "TranslateY": lambda: TF.affine(image, 0.0, [0, int(v)], 1.0, [0.0, 0.0], NEAREST, fill),
        "Rotate": lambda: TF.rotate(image, v, NEAREST, fill=fill),
        "Brightness": lambda: TF.adjust_brightness(image, v),
        "Color": lambda: TF.adjust_saturation(image, v),
        "Contrast": lambda: TF.adjust_contrast(image, v),
        "Sharpness": lambda: TF.adjust_sharpness(image, v),
        "Posterize": lambda: TF.posterize(image, int(v)),
        "Solarize": lambda: TF.solarize(image, v),
        "Hue": lambda: TF.adjust_hue(image, v),
        "AutoContrast": lambda: TF.autocontrast(image),
        "Equalize": lambda: TF.equalize(image),
        "Invert": lambda: TF.invert(image),
        "Identity": lambda: image,
    }
    return calls[name]()


# values per sample: the extremes of the policies' ranges, signs, and values in between
VALUES = {
    "ShearX": [0.3, -0.25, 0.99, 0.0, -0.99, 0.131],
    "ShearY": [0.3, -0.2, 0.5, 0.1, -0.99, 0.99],
    "TranslateX": [5, -7, 0, 14, -32, 32],
    "TranslateY": [3, -9, 1, 10, -32, 32],
    "Rotate": [30.0, -17.5, 135.0, 90.0, -135.0, 2.7],
    "Brightness": [0.1, 1.9, 1.0, 1.37, 0.01, 1.99],
    "Color": [0.1, 1.9, 0.0, 1.37, 0.01, 1.99],
    "Contrast": [0.1, 1.9, 0.0, 1.37, 0.01, 1.99],
    "Sharpness": [0.1, 1.9, 0.0, 1.37, 0.01, 1.99],
    "Posterize": [4, 8, 2, 6, 0, 1],
    "Solarize": [128.0, 255.0, 0.0, 77.0, 229.5, 12.75],
    "Hue": [0.1, -0.3, 0.5, -0.5, 0.0, 0.05],
    "AutoContrast": [0] * 6,
    "Equalize": [0] * 6,
    "Invert": [0] * 6,
    "Identity": [0] * 6,
}


@pytest.mark.parametrize("channels", [3, 1])
@pytest.mark.parametrize("fill", [None, [124, 116, 104]])
@pytest.mark.parametrize("name", sorted(VALUES))
def test_each_op_equals_torchvision_on_every_sample(name, fill, channels):
    if channels == 1 and name == "Hue":
        pytest.skip("hue of a grayscale image: the image itself (torchvision returns it unchanged)")
    images = _images(c=channels)
    fill = fill[:channels] if fill else None
    out = batch_ops.OPS[name](images, torch.tensor(VALUES[name], dtype=torch.float64), fill)
    assert out.dtype == torch.uint8 and out.shape == images.shape
    for i, v in enumerate(VALUES[name]):
        expected = _reference(name, images[i], v, fill)
        diff = (out[i].int() - expected.int()).abs().max().item()
        # within 1/255: torchvision truncates blends to uint8; the same arithmetic can land one level off
        assert diff <= 1, f"{name}({v}) differs from torchvision by {diff}/255"
        if name in batch_ops.GEOMETRIC or name in ("Posterize", "Solarize", "Invert", "Equalize", "AutoContrast"):
            assert diff == 0, f"{name}({v}) should equal torchvision exactly"


def test_solarize_add_is_timms_definition():
    """timm's SolarizeAdd (no torchvision op): pixels below 128 get ``add`` more, clipped at 255."""
    images = _images()
    adds = [0, 30, 110, 55, 1, 90]
    out = batch_ops.OPS["SolarizeAdd"](images, torch.tensor(adds, dtype=torch.float64))
    for i, add in enumerate(adds):
        lut = torch.tensor([min(255, p + add) if p < 128 else p for p in range(256)], dtype=torch.uint8)
        assert torch.equal(out[i], lut[images[i].long()])


def test_random_erasing_boxes_equal_torchvisions_erase():
    images = _images().float()
    boxes = torch.tensor([[0, 0, 5, 7], [3, 4, 10, 2], [0, 0, 0, 0], [10, 20, 13, 11], [22, 30, 1, 1], [1, 1, 2, 2]])
    noise = torch.randn(images.shape)
    for value in (None, noise):
        out = batch_ops.erase(images, boxes, value)
        for i, (t, x, h, w) in enumerate(boxes.tolist()):
            v = torch.zeros(()) if value is None else value[i, :, t : t + h, x : x + w]
            expected = TF.erase(images[i], t, x, h, w, v) if h else images[i]
            assert torch.equal(out[i], expected)


# --- the policies' values and sampling ------------------------------------------------------------


@pytest.mark.parametrize(
    "table, reference, bins",
    [
        ("randaugment", v2.RandAugment, 31),
        ("trivialaugment", v2.TrivialAugmentWide, 31),
        ("augmix", v2.AugMix, 10),
    ],
)
def test_op_values_are_torchvisions_magnitudes(table, reference, bins):
    """Every op's value at every bin is the magnitude torchvision's policy passes (translations truncated)."""
    space = reference._AUGMENTATION_SPACE
    h, w = 24, 40
    levels = np.arange(bins) / (bins - 1)
    for name, (kind, _, _) in P.TABLES[table].items():
        magnitudes = space[name][0](bins, h, w)
        ours = P.op_values(name, P.TABLES[table], levels, np.zeros(bins, bool), (h, w), bins)
        if magnitudes is None:
            continue
        theirs = magnitudes.double().numpy()
        if name.startswith("Translate") or name == "Posterize":
            theirs = np.trunc(theirs)
        elif name == "Solarize":
            theirs = theirs * 255.0
        elif kind == "factor":
            theirs = 1.0 + theirs
        np.testing.assert_array_equal(ours.astype(np.float32), theirs.astype(np.float32), err_msg=name)


def test_randaugment_draws_each_op_uniformly_with_random_signs():
    policy = P.randaugment_policy(2, 9, 31, 0.0, 1.0, "torchvision", (0,))
    n = 20_000
    ids, values = P.draw_layer(policy, np.random.default_rng(1), n, (32, 32))
    counts = np.bincount(ids, minlength=len(policy.ops))
    assert stats.chisquare(counts).pvalue > 1e-3
    rotate = values[ids == policy.ops.index("Rotate")]
    assert set(np.round(np.abs(rotate), 6)) == {9.0}  # 30 * 9/30 degrees
    assert stats.binomtest(int((rotate < 0).sum()), len(rotate), 0.5).pvalue > 1e-3


def test_timm_string_draws_half_the_ops_and_noisy_magnitudes():
    keys = parse_timm("rand-m9-mstd0.5-inc1")
    assert keys == {
        "kind": "randaugment",
        "num_ops": 2,
        "magnitude": 9.0,
        "num_magnitude_bins": 11,
        "magnitude_std": 0.5,
        "p": 0.5,
        "ops": "timm",
    }
    policy = P.randaugment_policy(2, 9.0, 11, 0.5, 0.5, "timm", P.IMAGENET_FILL)
    rng = np.random.default_rng(2)
    ids, _ = P.draw_layer(policy, rng, 20_000, (32, 32))
    assert stats.binomtest(int((ids >= 0).sum()), 20_000, 0.5).pvalue > 1e-3
    levels = P.draw_levels(policy, rng, 20_000) * 10  # timm's magnitude: N(9, 0.5) clipped to [0, 10]
    top = float(stats.norm.cdf(10, 9, 0.5))
    assert stats.binomtest(int((levels >= 10).sum()), len(levels), 1 - top).pvalue > 1e-3
    below = levels[levels < 10]
    assert stats.kstest(below, lambda x: stats.norm.cdf(x, 9, 0.5) / top).pvalue > 1e-3
    assert set(policy.ops) == {
        "AutoContrast",
        "Equalize",
        "Invert",
        "Rotate",
        "Posterize",
        "Solarize",
        "SolarizeAdd",
        "Color",
        "Contrast",
        "Brightness",
        "Sharpness",
        "ShearX",
        "ShearY",
        "TranslateX",
        "TranslateY",
    }  # timm's _RAND_INCREASING_TRANSFORMS


@pytest.mark.parametrize(
    "bad", ["rand-m9-mstd0.5", "rand-m9-inc1-x3", "auto-m9", "augmix-m5-b1", "rand-m9-mmax20-inc1"]
)
def test_unsupported_timm_strings_are_refused_by_name(bad):
    with pytest.raises(RecipeError, match="policy"):
        parse_timm(bad)


def test_trivialaugment_draws_ops_and_bins_uniformly():
    policy = P.trivialaugment_policy(31, (0,))
    rng = np.random.default_rng(3)
    ids, _ = P.draw_layer(policy, rng, 31_000, (32, 32))
    assert stats.chisquare(np.bincount(ids, minlength=14)).pvalue > 1e-3
    bins = np.round(P.draw_levels(policy, rng, 31_000) * 30).astype(int)
    assert stats.chisquare(np.bincount(bins, minlength=31)).pvalue > 1e-3


def test_augmix_depths_weights_and_mixing_follow_the_policy():
    policy = P.augmix_policy(3, 3, -1, 1.0, True, "torchvision", (0,))
    n = 6000
    chains, weights, mix = P.draw_chains(policy, np.random.default_rng(4), n, (32, 32))
    depths = sum((ids >= 0).astype(int) for ids, _ in chains[0])
    assert stats.chisquare(np.bincount(depths)[1:]).pvalue > 1e-3  # 1, 2 or 3 ops, uniformly
    assert stats.kstest(mix, "uniform").pvalue > 1e-3  # Beta(1, 1)
    np.testing.assert_allclose(weights.sum(1), 1.0)
    assert stats.kstest(weights[:, 0], stats.beta(1, 2).cdf).pvalue > 1e-3  # Dirichlet(1, 1, 1)'s marginal
    levels = P.draw_levels(policy, np.random.default_rng(5), 9000) * 9
    assert stats.chisquare(np.bincount(np.round(levels).astype(int))).pvalue > 1e-3  # bins 0..severity-1


def test_color_jitter_orders_are_uniform_permutations():
    ranges = {"brightness": (0.6, 1.4), "contrast": (0.6, 1.4), "saturation": (0.6, 1.4), "hue": (-0.1, 0.1)}
    layers = P.draw_jitter(np.random.default_rng(6), 24_000, ranges, 1.0)
    orders = Counter(zip(*(tuple(ids) for ids, _ in layers)))
    assert len(orders) == 24 and stats.chisquare(list(orders.values())).pvalue > 1e-3
    hue = np.concatenate([v[ids == 3] for ids, v in layers])
    assert stats.kstest(hue, stats.uniform(-0.1, 0.2).cdf).pvalue > 1e-3


def test_random_erasing_boxes_follow_torchvisions_sampling():
    """The erased areas have the distribution of torchvision's RandomErasing.get_params (two-sample KS test)."""
    h, w, n = 32, 40, 4000
    ours = P.draw_erasing(np.random.default_rng(7), n, (h, w), 1.0, (0.02, 0.33), (0.3, 3.3))
    torch.manual_seed(0)
    image = torch.zeros(3, h, w)
    theirs = [v2.RandomErasing(p=1.0).make_params([image]) for _ in range(n)]
    ours_area = ours[:, 2] * ours[:, 3]
    theirs_area = np.array([p["h"] * p["w"] if p["v"] is not None else 0 for p in theirs])
    assert stats.ks_2samp(ours_area, theirs_area).pvalue > 1e-3
    assert ((ours[:, 0] + ours[:, 2] <= h) & (ours[:, 1] + ours[:, 3] <= w)).all()
    half = P.draw_erasing(np.random.default_rng(8), n, (h, w), 0.25, (0.02, 0.33), (0.3, 3.3))
    assert stats.binomtest(int((half[:, 2] > 0).sum()), n, 0.25).pvalue > 1e-3


# --- the batch path: grouped ops, normalisation, determinism --------------------------------------


def test_each_op_runs_once_per_layer_whatever_the_batch_size(monkeypatch):
    calls = Counter()
    for name, op in list(batch_ops.OPS.items()):

        def counted(images, v, fill=None, op=op, name=name):
            calls[name] += 1
            return op(images, v, fill)

        monkeypatch.setitem(batch_ops.OPS, name, counted)
    policy = P.randaugment_policy(2, 9, 31, 0.0, 1.0, "torchvision", (0,))
    images = _images(n=256, h=16, w=16)
    layers = [P.draw_layer(policy, np.random.default_rng(9), 256, (16, 16)) for _ in range(2)]
    out = apply_layers(images, layers, policy.ops)
    assert max(calls.values()) <= 2 and out.shape == images.shape
    # and each sample got exactly its own ops
    for i in (0, 17, 255):
        expected = images[i : i + 1]
        for ids, values in layers:
            name = policy.ops[ids[i]]
            expected = batch_ops.OPS[name](expected, torch.tensor(values[i : i + 1]), None)
        assert torch.equal(out[i : i + 1], expected)


def _algorithm(name: str, **params):
    return registry.algorithms.get(name).factory(**params)


@pytest.mark.parametrize(
    "name, params",
    [
        ("batch_randaugment", {"policy": "rand-m9-mstd0.5-inc1"}),
        ("batch_trivialaugment", {}),
        ("batch_augmix", {"policy": "augmix-m5-w4-d2"}),
        ("batch_augmix", {}),
        ("batch_color_jitter", {"hue": 0.2}),
        ("batch_random_erasing", {"value": "random"}),
    ],
)
def test_normalised_batches_keep_dtype_layout_and_are_a_function_of_the_draws(name, params):
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    loader = v2.Compose([v2.Normalize(mean, std)])  # what normalization_of reads
    pixels = _images(n=8, h=16, w=16)
    batch = (pixels.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    batch = batch.contiguous(memory_format=torch.channels_last)
    algorithm = _algorithm(name, **params)
    first = algorithm.augment(batch, P.batch_rng(17, 0, 5, name), lambda: loader)
    again = algorithm.augment(batch, P.batch_rng(17, 0, 5, name), lambda: loader)
    other = algorithm.augment(batch, P.batch_rng(17, 0, 6, name), lambda: loader)
    assert first.dtype == batch.dtype and first.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert first.shape == batch.shape


def test_nothing_drawn_gives_the_batch_back_within_half_a_level():
    mean, std = (0.5,), (0.25,)
    pixels = _images(n=4, c=1)
    batch = (pixels.float() / 255 - 0.5) / 0.25
    algorithm = _algorithm("batch_randaugment", p=0.0)
    out = algorithm.augment(batch, P.batch_rng(0, 0, 0, "x"), lambda: v2.Normalize(mean, std))
    assert (out - batch).abs().max() < 0.5 / 255 / 0.25 + 1e-6


def test_normalisation_is_found_on_every_loader(tmp_path):
    from torch.utils.data import DataLoader, Subset, TensorDataset

    from dlrecipes.data.device_loader import BatchAugment, DeviceTensorLoader
    from dlrecipes.data.tensor_dataset import TransformedTensorDataset
    from dlrecipes.data.transforms import imagenet_transforms

    images, labels = torch.zeros(8, 3, 4, 4, dtype=torch.uint8), torch.zeros(8, dtype=torch.long)
    augment = BatchAugment((0.1, 0.2, 0.3), (0.4, 0.5, 0.6))
    expected = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    flat = lambda found: [*found[0], *found[1]]  # noqa: E731
    assert flat(normalization_of(DeviceTensorLoader(images, labels, 4, augment, True))) == pytest.approx(expected)
    raw = DeviceTensorLoader(images, labels, 4, None, True)  # no normalising: pixels as floats 0-255
    assert flat(normalization_of(raw)) == pytest.approx([0.0] * 3 + [1 / 255] * 3)
    dataset = TransformedTensorDataset(images, labels, None, augment)
    assert flat(normalization_of(DataLoader(Subset(dataset, [0, 1])))) == pytest.approx(expected)

    class Folder(torch.utils.data.Dataset):  # an image folder: a PIL transform ending in Normalize
        transform = imagenet_transforms(8, 10, 0.5, True, (0.4, 0.5, 0.6), (0.1, 0.1, 0.1), True)

    assert flat(normalization_of(DataLoader(Folder()))) == pytest.approx([0.4, 0.5, 0.6, 0.1, 0.1, 0.1])
    assert normalization_of(DataLoader(TensorDataset(images, labels))) is None


def test_a_loader_without_a_normalisation_is_one_clear_error():
    algorithm = _algorithm("batch_trivialaugment")
    with pytest.raises(RecipeError, match="batch_trivialaugment: cannot tell how the training loader normalises"):
        algorithm.augment(torch.zeros(2, 3, 8, 8), P.batch_rng(0, 0, 0, "x"), lambda: object())


def test_the_batch_index_and_seed_choose_the_draws():
    """What a batch gets depends on the run's seed, the rank, the batch's index in the run and the algorithm:
    a resumed run (same seed, same batch counter) draws what the uninterrupted one drew."""
    draw = lambda *key: P.batch_rng(*key).random(4).tolist()  # noqa: E731
    assert draw(1, 0, 7, "a") == draw(1, 0, 7, "a")
    assert (
        len({str(draw(*k)) for k in [(1, 0, 7, "a"), (2, 0, 7, "a"), (1, 1, 7, "a"), (1, 0, 8, "a"), (1, 0, 7, "b")]})
        == 5
    )


def test_validation_takes_a_timm_string_or_keys_and_refuses_both(tmp_path):
    recipe = write(tmp_path / "r.yaml", TINY_RECIPE)
    ok = run_cli(
        "validate", str(recipe), "algorithms.batch_randaugment={policy: rand-m9-mstd0.5-inc1}", "algorithms.mixup={}"
    )
    assert ok.returncode == 0, ok.stderr
    both = run_cli("validate", str(recipe), "algorithms.batch_randaugment={policy: rand-m9-inc1, num_ops: 3}")
    assert both.returncode != 0 and "not both" in both.stderr
    two = run_cli("validate", str(recipe), "algorithms.batch_augmix={}", "algorithms.batch_trivialaugment={}")
    assert two.returncode != 0 and "whole augmentation policy" in two.stderr


# --- training with every loader -------------------------------------------------------------------

STRONG = [
    "algorithms.batch_randaugment={policy: rand-m9-mstd0.5-inc1}",
    "algorithms.batch_color_jitter={hue: 0.1}",
    "algorithms.batch_random_erasing={value: random}",
    "algorithms.cutmix={}",
]


@pytest.fixture
def augmented(monkeypatch):
    """How many batches each batch augmentation saw, and changed (the runs train in this process; a
    subprocess run under DLRECIPES_TEST_SUBPROCESS=1 is not counted)."""
    counts = Counter()
    real = BatchAugmentation.augment

    def counting(self, images, rng, loader=lambda: None):
        out = real(self, images, rng, loader)
        counts[self.name] += 1
        counts[self.name, "changed"] += int(not torch.equal(out, images))
        return out

    monkeypatch.setattr(BatchAugmentation, "augment", counting)
    return counts


def _check_augmented(counts: Counter, names: list[str], batches: int) -> None:
    if os.environ.get("DLRECIPES_TEST_SUBPROCESS"):
        return
    assert {name: counts[name] for name in names} == {name: batches for name in names}
    assert all(counts[name, "changed"] for name in names)


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["torch", "device"])
def test_trains_with_the_in_memory_loaders_beside_cutmix(tmp_path, loader, augmented):
    recipe = write(tmp_path / "r.yaml", TINY_RECIPE.replace("2ep", "1ep"))
    result = run_cli("train", str(recipe), f"runs_dir={tmp_path}", f"trainer.loader={loader}", *STRONG)
    assert result.returncode == 0, result.stderr[-2000:]
    _check_augmented(augmented, ["batch_randaugment", "batch_color_jitter", "batch_random_erasing"], 3)


@pytest.mark.slow
def test_trains_with_the_tensor_cache(tmp_path, augmented):
    from tests.conftest import image_folders

    data = image_folders(tmp_path / "data", ["a", "b"], per_class=4)
    recipe = write(
        tmp_path / "r.yaml",
        f"""
        model: {{name: cnn_simple, width: 4, hidden: 16}}
        dataset: {{name: image_folder, train_path: {data / "train"}, val_path: {data / "val"}, crop_size: 16,
                   resize_size: 18}}
        trainer: {{max_duration: 1ep, batch_size: 4, num_workers: 0, progress_bar: false, device: cpu,
                   loader: tensor_cache}}
        optimizer: {{name: sgd, lr: 0.05}}
        """,
    )
    result = run_cli(
        "train", str(recipe), f"runs_dir={tmp_path / 'runs'}", "algorithms.batch_augmix={}", "algorithms.mixup={}"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    _check_augmented(augmented, ["batch_augmix"], 2)


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path):
    """The augmentation of batch N is drawn from (seed, rank, N): after a kill and a resume the run ends
    with the weights of the run that was never stopped."""
    plugin = str(REPO / "tests" / "fault_injection.py")
    recipe = write(tmp_path / "r.yaml", TINY_RECIPE.replace("save_interval: 1ep", "save_interval: 2ba"))
    recipe.write_text(
        recipe.read_text().replace("  device: cpu\n", "  device: cpu\n  deterministic: true\n  loader: device\n")
        + f"runs_dir: {tmp_path / 'runs'}\ncallbacks: {{fault_injection: {{}}}}\n"
    )
    strong = ["algorithms.batch_trivialaugment={}", "algorithms.batch_random_erasing={value: random, p: 0.5}"]

    def train(run: str, *extra: str):
        return run_cli("train", str(recipe), f"run_name={run}", "--plugin", plugin, *strong, *extra)

    assert train("whole").returncode == 0
    killed = train("killed", "callbacks.fault_injection.kill_at_batch=3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = train("killed", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    weights = [
        torch.load(tmp_path / "runs" / run / "checkpoints" / "latest-rank0.pt", map_location="cpu", weights_only=False)[
            "state"
        ]["model"]
        for run in ("whole", "killed")
    ]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


@pytest.mark.slow
def test_trains_with_ffcv(tmp_path, augmented):
    pytest.importorskip("ffcv")
    from tests.conftest import image_folders

    data = image_folders(tmp_path / "data", ["a", "b"], per_class=8)
    out = tmp_path / "ffcv"
    converted = run_cli(
        "data",
        "convert",
        "image_folder",
        f"train_path={data / 'train'}",
        f"val_path={data / 'val'}",
        "--out",
        str(out),
        "--workers",
        "1",
    )
    assert converted.returncode == 0, converted.stderr[-2000:]
    recipe = write(
        tmp_path / "r.yaml",
        f"""
        model: {{name: cnn_simple, width: 4, hidden: 16}}
        dataset: {{name: ffcv, train_path: {out / "train.beton"}, val_path: {out / "val.beton"}, crop_size: 16}}
        trainer: {{max_duration: 1ep, batch_size: 4, num_workers: 1, progress_bar: false, device: cpu}}
        optimizer: {{name: sgd, lr: 0.05}}
        checkpoint: {{save: false}}
        """,
    )
    result = run_cli("train", str(recipe), f"runs_dir={tmp_path / 'runs'}", *STRONG)
    assert result.returncode == 0, result.stderr[-2000:]
    _check_augmented(augmented, ["batch_randaugment", "batch_color_jitter", "batch_random_erasing"], 4)
