"""validate: unknown keys, types, required keys, registry names, device checks."""

from __future__ import annotations

import pytest

from dlrecipes.config import RecipeConfig, validate
from dlrecipes.errors import RecipeError
from dlrecipes.recipe import load_recipe

from .conftest import TINY_RECIPE, run_cli, write


@pytest.fixture
def recipe(tmp_path):
    return write(tmp_path / "r.yaml", TINY_RECIPE)


def check(recipe, *overrides) -> RecipeConfig:
    return validate(load_recipe(recipe, overrides))


def test_a_valid_recipe_gets_defaults_filled(recipe):
    config = check(recipe)
    assert config.name == "r"
    assert config.trainer.max_duration == "2ep"
    assert config.trainer.eval_interval == "1ep"  # default
    assert config.model.name == "cnn_simple" and config.model.params == {"width": 4, "hidden": 16}
    assert config.optimizer.params == {"lr": 0.05}
    assert config.scheduler.name == "constant"


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.max_duraton=3ep", r"trainer.max_duraton: unknown key \(did you mean 'max_duration'\?\)"),
        ("modle={name: x}", r"modle: unknown key \(did you mean 'model'\?\)"),
        ("checkpoint.monitr=top5", r"checkpoint.monitr: unknown key \(did you mean 'monitor'\?\)"),
        ("model.widht=8", r"model.widht: unknown parameter of model 'cnn_simple' \(did you mean 'width'\?\)"),
        (
            "optimizer.momentun=0.8",
            r"optimizer.momentun: unknown parameter of optimizer 'sgd' \(did you mean 'momentum'\?\)",
        ),
        (
            "algorithms.ema.half_lif=10ba",
            r"algorithms.ema.half_lif: unknown parameter of algorithm 'ema' \(did you mean 'half_life'\?\)",
        ),
    ],
)
def test_unknown_keys_name_the_path_and_the_closest_key(recipe, override, message):
    with pytest.raises(RecipeError, match=message):
        check(recipe, override)


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.batch_size=lots", r"trainer.batch_size: expected int, got 'lots' \(str\)"),
        ("trainer.batch_size=2.5", r"trainer.batch_size: expected int, got 2.5 \(float\)"),
        ("trainer.deterministic=1", r"trainer.deterministic: expected bool, got 1 \(int\)"),
        ("trainer.max_duration=10", r"trainer.max_duration: expected duration such as '10ep'"),
        ("trainer.precision=fp16", r"trainer.precision: expected one of 'fp32', 'amp_fp16', 'amp_bf16', got 'fp16'"),
        ("model.width=[4]", r"model.width: expected int, got \[4\] \(list\)"),
        (
            "trainer.device_train_microbatch_size=big",
            r"trainer.device_train_microbatch_size: expected int >= 1 or one of 'auto' or null",
        ),
        ("checkpoint.load_ignore_keys=[1]", r"checkpoint.load_ignore_keys\[0\]: expected str, got 1"),
        (
            "checkpoint={load_weights_only: false, load_ignore_keys: ['module.fc.*']}",
            r"checkpoint.load_ignore_keys: applies to weights-only loads",
        ),
        ("trainer=5", r"trainer: expected mapping, got 5"),
    ],
)
def test_wrong_types_name_path_expected_type_and_value(recipe, override, message):
    with pytest.raises(RecipeError, match=message):
        check(recipe, override)


def test_numbers_widen_to_float_but_not_to_int(recipe):
    assert check(recipe, "optimizer.lr=1").optimizer.params["lr"] == 1.0
    assert isinstance(check(recipe, "optimizer.lr=1").optimizer.params["lr"], float)


def test_missing_required_keys_are_named(recipe):
    with pytest.raises(RecipeError, match="model: missing required key"):
        check(recipe, "~model")
    with pytest.raises(RecipeError, match=r"model.name: missing required key \(one of .*cnn_simple"):
        check(recipe, "~model.name")
    with pytest.raises(RecipeError, match=r"model.arch: missing required parameter of model 'timm' \(str\)"):
        check(recipe, "model={name: timm}")
    with pytest.raises(RecipeError, match="callbacks.threshold_stopper.threshold: missing required parameter"):
        check(recipe, "callbacks.threshold_stopper={}")


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "model.name=resnet9000",
            r"model.name: unknown model 'resnet9000'\. Valid models: .*cifar_resnet18.*mnist_cnn",
        ),
        ("dataset.name=mnits", r"dataset.name: unknown dataset 'mnits' \(did you mean 'mnist'\?\)\. Valid datasets: "),
        ("optimizer.name=adamww", r"optimizer.name: unknown optimizer 'adamww' \(did you mean 'adamw'\?\)"),
        ("scheduler.name=cosin", r"scheduler.name: unknown scheduler 'cosin' \(did you mean 'cosine'\?\)"),
        (
            "algorithms.blur_pool={}",
            r"algorithms.blur_pool: unknown algorithm 'blur_pool' \(did you mean 'blurpool'\?\)",
        ),
        ("callbacks.lr_monitr={}", r"callbacks.lr_monitr: unknown callback 'lr_monitr'"),
        ("loggers.tensorbord={}", r"loggers.tensorbord: unknown logger 'tensorbord' \(did you mean 'tensorboard'\?\)"),
        ("model={name: timm, arch: resnet5000}", r"model.arch: unknown timm architecture 'resnet5000'"),
    ],
)
def test_unknown_registry_names_list_the_valid_ones(recipe, override, message):
    with pytest.raises(RecipeError, match=message):
        check(recipe, override)


def test_components_may_be_given_by_name_only_and_switched_off(recipe):
    config = check(recipe, "optimizer=adamw", "algorithms.ema=true", "algorithms.blurpool=null")
    assert config.optimizer.name == "adamw"
    assert config.algorithms == {"ema": {}}


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.precision=amp_bf16", r"trainer.precision: amp_bf16 needs a GPU"),
        ("trainer.precision=amp_fp16", r"trainer.precision: amp_fp16 needs a GPU"),
        ("trainer.device_train_microbatch_size=auto", r"'auto' needs a GPU"),
    ],
)
def test_gpu_only_settings_are_refused_on_cpu(recipe, override, message):
    with pytest.raises(RecipeError, match=message):
        check(recipe, override)  # the tiny recipe pins device: cpu


def test_the_schema_and_the_devices_module_name_the_same_devices(recipe):
    """One device vocabulary: ``trainer.device`` takes the words dlrecipes.core.devices knows (auto, cpu, gpu),
    and nothing else (torch's ``cuda`` included)."""
    import typing

    from dlrecipes.config import TrainerConfig
    from dlrecipes.core.devices import DEVICES

    assert (
        set(typing.get_args(typing.get_type_hints(TrainerConfig)["device"])) == set(DEVICES) == {"auto", "cpu", "gpu"}
    )
    with pytest.raises(RecipeError, match="trainer.device"):
        check(recipe, "trainer.device=cuda")


@pytest.mark.parametrize(
    "override, message",
    [
        ("run_name=../escape", "run_name: '../escape' must be a plain name"),
        ("trainer.batch_size=0", "trainer.batch_size: expected int >= 1, got 0"),
        ("checkpoint.best_only=true", "checkpoint.best_only: needs checkpoint.monitor"),
    ],
)
def test_values_out_of_range_are_refused(recipe, override, message):
    with pytest.raises(RecipeError, match=message.replace("(", r"\(")):
        check(recipe, override, "checkpoint.monitor=null")


def _assert_user_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 or _is_meaning(lines), result.stderr  # one message (and what its key means)
    for fragment in fragments:
        assert fragment in lines[0]


def _is_meaning(lines: list[str]) -> bool:
    """An error about a key's value: its line, then what the key means (``  key: meaning``)."""
    key = lines[0].removeprefix("error: ").split(":", 1)[0]
    return len(lines) == 2 and lines[1].startswith(f"  {key}: ") and len(lines[1]) > len(key) + 10


def test_cli_misspelled_key_is_one_line_exit_2(recipe):
    result = run_cli("train", str(recipe), "trainer.bacth_size=8")
    _assert_user_error(result, "trainer.bacth_size: unknown key", "did you mean 'batch_size'")


def test_cli_errors_in_the_recipe_file_itself(tmp_path):
    bad = write(tmp_path / "bad.yaml", TINY_RECIPE.replace("optimizer: {name: sgd", "optimizer: {name: sgdd"))
    _assert_user_error(run_cli("validate", str(bad)), "optimizer.name: unknown optimizer 'sgdd'", "Valid optimizers:")
    _assert_user_error(run_cli("show", str(bad)), "optimizer.name")
    _assert_user_error(run_cli("validate", str(tmp_path / "missing.yaml")), "recipe file not found")
    good = write(tmp_path / "good.yaml", TINY_RECIPE)
    _assert_user_error(run_cli("validate", str(good), "trainer.seed=x"), "trainer.seed: expected int")
    _assert_user_error(run_cli("list", "modles"), "unknown group 'modles'", "did you mean 'models'")
    _assert_user_error(run_cli("validate", str(good), "~model"), "model: missing required key")


def test_an_error_about_a_value_says_what_the_key_means_after_its_line(recipe):
    result = run_cli("validate", str(recipe), "optimizer.lr=-0.1")
    assert result.stderr.splitlines() == [
        "error: optimizer.lr: expected float > 0, got -0.1 (float)",
        "  optimizer.lr: base learning rate: the schedule multiplies it at every step (it is the rate at multiplier "
        "1.0).",
    ]
    from dlrecipes.api import resolve
    from dlrecipes.errors import RecipeError

    with pytest.raises(RecipeError) as caught:  # from Python: the hint travels with the error, as a notebook shows it
        resolve(recipe, ["trainer.max_duration=x"])
    assert caught.value.hint == "trainer.max_duration: how long to train: '10ep', '500ba', ..."
    assert caught.value._render_traceback_()[1] == caught.value.hint


def test_show_explain_precedes_each_key_with_its_meaning_and_stays_a_recipe(recipe, tmp_path):
    import yaml

    shown = run_cli("show", str(recipe), "--explain").stdout
    lines = shown.splitlines()
    lr = next(i for i, line in enumerate(lines) if line.strip().startswith("lr: "))
    assert lines[lr - 1].strip().startswith("# base learning rate")
    seed = next(i for i, line in enumerate(lines) if line.strip().startswith("seed: "))
    assert lines[seed - 1].strip() == "# random seed for weights, data order and augmentation"
    assert yaml.safe_load(shown) == yaml.safe_load(run_cli("show", str(recipe)).stdout)  # comments only


def test_cli_validate_show_and_list_succeed(recipe):
    result = run_cli("validate", str(recipe), "trainer.seed=5")
    assert result.returncode == 0 and "ok:" in result.stdout
    shown = run_cli("show", str(recipe), "trainer.seed=5").stdout
    assert "seed: 5" in shown and "# override trainer.seed=5" in shown
    assert "max_duration: 2ep" in shown and "r.yaml" in shown
    assert "eval_interval: 1ep" in shown and "# default" in shown
    listing = run_cli("list", "optimizers").stdout
    for name in ("sgd", "adamw", "decoupled_sgdw", "decoupled_adamw", "no_decay_norm_and_bias"):
        assert name in listing


@pytest.mark.parametrize(
    "key, bad, suggestion",
    [
        ("trainer.fsdp", "{sharding_strategi: FULL_SHARD}", "sharding_strategy"),
        ("trainer.compile", "{mode: max-autotune, fulgraph: true}", "fullgraph"),
    ],
)
def test_fsdp_and_compile_options_are_checked_by_name(tiny_recipe, key, bad, suggestion):
    from dlrecipes.api import resolve

    with pytest.raises(RecipeError, match=rf"{key}\.\w+: unknown option \(did you mean '{suggestion}'\?\)"):
        resolve(tiny_recipe, [f"{key}={bad}"], check_device=False)


def test_fsdp_and_compile_option_lists_match_composer_and_torch():
    """FSDP options: a list kept here (checked against the installed Composer); compile options are
    asked of the installed torch, whose torch.compile grows keys from release to release."""
    import dataclasses

    from composer.utils.parallelism import FSDPConfig

    from dlrecipes.config.sections import FSDP_KEYS, compile_keys

    assert set(FSDP_KEYS) == {f.name for f in dataclasses.fields(FSDPConfig) if not f.name.startswith("_")}
    assert {"fullgraph", "dynamic", "backend", "mode", "options", "disable"} <= set(compile_keys())
    assert "model" not in compile_keys()


def test_an_imagenet_network_on_small_images_is_refused_by_validate(tiny_recipe):
    result = run_cli("validate", str(tiny_recipe), "model={name: timm, arch: resnet18}", "--skip-device-check")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "model.arch: timm 'resnet18' is built for ImageNet-sized inputs and the data is 8x8" in result.stderr
    lowered = run_cli(
        "validate", str(tiny_recipe), "model={name: timm, arch: resnet18, min_input_size: 8}", "--skip-device-check"
    )
    assert lowered.returncode == 0, lowered.stderr


def test_show_of_a_gpu_recipe_needs_no_gpu():
    from .conftest import RECIPES

    shown = run_cli("show", str(RECIPES / "imagenet100_fast.yaml"))
    assert shown.returncode == 0, shown.stderr
    assert "precision: amp_bf16" in shown.stdout and "device: gpu" in shown.stdout


def test_show_names_the_override_of_a_list_written_section(tiny_recipe):
    result = run_cli("show", str(tiny_recipe), "metrics=[top1,macro_f1]")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(
        line.strip().startswith("macro_f1: {}") and "# override metrics=[top1,macro_f1]" in line for line in lines
    )
    assert any(line.strip().startswith("deterministic: false") and "# default" in line for line in lines)


# --- ranges and relations a recipe's types do not say (issue 25): each at `validate`, one line, exit 2 ---


@pytest.mark.parametrize(
    "override, line",
    [
        ("optimizer.lr=-0.1", "optimizer.lr: expected float > 0, got -0.1 (float)"),
        ("model={name: mnist_cnn, dropout: 1.5}", "model.dropout: expected float in [0, 1), got 1.5 (float)"),
        ("model={name: cnn_simple, width: 0}", "model.width: expected int in [1, 8192], got 0 (int)"),
        (
            "trainer.max_duration=0ep",
            "trainer.max_duration: expected duration above zero such as '10ep', '200ba' or '0.5dur', got '0ep' (str)",
        ),
        ("trainer.eval_interval=0ep", "trainer.eval_interval: expected duration above zero"),
        (
            "trainer.train_subset_num_batches=0",
            "trainer.train_subset_num_batches: -1 (all batches) or at least 1, got 0",
        ),
        ("dataset.image_size=100000", "dataset.image_size: expected int in [1, 8192], got 100000 (int)"),
        ("dataset.eval_fraction=0", "dataset.eval_fraction: expected float in (0, 1), got 0 (int)"),
        (
            "scheduler={name: cosine, warmup: 5ep}",
            "scheduler.warmup: 5ep is not shorter than the run (trainer.max_duration 2ep)",
        ),
        ("run_name=" + "r" * 300, "run_name: 300 characters; at most 120"),
        ("dataset={name: synthetic, num_classes: 3}", None),  # top5 dropped from the defaults: not an error
        ("metrics=[top1, top5]", None),
        # issue 63: values validate said ok to and training then refused (in its factory, or in torch, Composer or
        # NumPy)
        ("callbacks.early_stopping.patience=0", "callbacks.early_stopping.patience: expected int >= 1, got 0 (int)"),
        (
            "callbacks.speed_monitor.window_size=0",
            "callbacks.speed_monitor.window_size: expected int >= 1, got 0 (int)",
        ),
        ("callbacks.torch_profiler.active=0", "callbacks.torch_profiler.active: expected int >= 1, got 0 (int)"),
        ("callbacks.torch_profiler.wait=-1", "callbacks.torch_profiler.wait: expected int >= 0, got -1 (int)"),
        ("callbacks.nan_monitor.max_skips=-1", "callbacks.nan_monitor.max_skips: expected int >= 0, got -1 (int)"),
        (
            "algorithms.progressive_resizing.size_increment=0",
            "algorithms.progressive_resizing.size_increment: expected int >= 1, got 0 (int)",
        ),
        ("algorithms.swa.anneal_steps=0", "algorithms.swa.anneal_steps: expected int >= 1, got 0 (int)"),
        ("loggers.tensorboard.flush_interval=0", "loggers.tensorboard.flush_interval: expected int >= 1, got 0 (int)"),
        ("trainer.seed=-1", "trainer.seed: expected int in [0, 4294967295], got -1 (int)"),
        ("trainer.seed=4294967296", "trainer.seed: expected int in [0, 4294967295], got 4294967296 (int)"),
        ("dataset={name: cifar10, image_size: 4}", "dataset.image_size: expected int in [8, 8192], got 4 (int)"),
        ("dataset={name: synthetic, train_samples: 0}", "dataset.train_samples: expected int >= 1, got 0 (int)"),
        ("checkpoint.save_interval=0ba", "checkpoint.save_interval: expected duration above zero"),
        ("trainer.eval_interval=0", "trainer.eval_interval: expected duration such as '10ep'"),
    ],
)
def test_ranges_and_relations_are_checked_at_validate(recipe, override, line):
    result = run_cli("validate", str(recipe), override)
    if line is None:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 2 and result.stderr.startswith(f"error: {line}"), result.stderr
    lines = result.stderr.strip().splitlines()
    assert (len(lines) == 1 or _is_meaning(lines)) and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            ["trainer.batch_size=1000000000000"],
            "trainer.batch_size: one batch of 1,000,000,000,000 images of 1x8x8 float32 "
            "is 238,418.6 GiB, and this machine has ",
        ),
        (
            ["trainer.eval_batch_size=1000000000000"],
            "trainer.eval_batch_size: one batch of 1,000,000,000,000 images of ",
        ),
        (
            ["dataset={name: synthetic, input_shape: [3, 8192, 8192], train_samples: 100000}", "trainer.batch_size=1"],
            "dataset: synthetic holds 100,064 images of 3x8192x8192 float32 in memory, 75,048.0 GiB, "
            "and this machine has ",
        ),
    ],
)
def test_a_batch_or_dataset_larger_than_this_machines_memory_is_refused_by_validate(recipe, overrides, line):
    """Issue 63: validate said ok, and training failed later allocating them; --skip-device-check (a recipe meant
    for another machine) leaves this machine's memory out, as it does its devices."""
    result = run_cli("validate", str(recipe), *overrides)
    assert result.returncode == 2 and result.stderr.startswith(f"error: {line}"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and " of this size fit" in result.stderr
    assert run_cli("validate", str(recipe), *overrides, "--skip-device-check").returncode == 0


def test_the_memory_estimate_is_the_recipes_numbers_multiplied(recipe):
    from dlrecipes.config.checks import check_memory

    config = check(recipe, "trainer.batch_size=1000", "dataset={name: cifar10, image_size: 64}")
    image = 3 * 64 * 64 * 4
    check_memory(config, memory=1000 * image)  # exactly fits
    with pytest.raises(
        RecipeError,
        match=r"^trainer.batch_size: one batch of 1,000 images of 3x64x64 float32 is "
        r"0.0 GiB, and this machine has 0.0 GiB of memory; at most 999 images",
    ):
        check_memory(config, memory=1000 * image - 1)
    check_memory(config, processes=2, memory=500 * image)  # each of two processes loads half the batch


def test_top_k_metrics_fit_the_data(recipe):
    config = check(recipe, "dataset={name: synthetic, num_classes: 3}")
    assert list(config.metrics) == ["top1", "per_class_accuracy", "confusion_matrix"] and list(
        config.train_metrics
    ) == ["top1"]
    with pytest.raises(RecipeError, match=r"metrics.top5: top-5 of 3 classes is always 1"):
        check(recipe, "dataset={name: synthetic, num_classes: 3}", "metrics=[top1, top5]")


def test_a_dataset_needs_two_classes(recipe, tmp_path):
    from .conftest import image_folders

    root = image_folders(tmp_path / "one", ["only"])
    with pytest.raises(RecipeError, match=r"dataset: image_folder has 1 class; a classifier needs at least 2"):
        check(recipe, f"dataset={{name: image_folder, train_path: {root}/train, val_path: {root}/val}}")


def test_input_paths_must_exist_unless_the_data_check_is_off(recipe, tmp_path):
    missing = f"dataset={{name: image_folder, train_path: {tmp_path}/nope/train, val_path: {tmp_path}/nope/val}}"
    result = run_cli("validate", str(recipe), missing)
    assert result.returncode == 2 and result.stderr.strip() == (
        f"error: dataset.train_path: {tmp_path}/nope/train does not exist (and dataset.val_path); give an existing "
        "path, or check it later (validate --no-data-check)"
    ), result.stderr
    assert run_cli("validate", str(recipe), missing, "--no-data-check").returncode == 0
    loaded = run_cli("validate", str(recipe), f"checkpoint.load_path={tmp_path}/nope.pt")
    assert loaded.returncode == 2 and f"checkpoint.load_path: {tmp_path}/nope.pt does not exist" in loaded.stderr


def test_a_missing_ffcv_file_names_the_command_that_makes_it():
    """The flagship's FFCV files are made by ``dlrecipes data convert``: the error names it, not only the path."""
    from .conftest import RECIPES

    done = run_cli("validate", str(RECIPES / "imagenet100_fast.yaml"), "--skip-device-check")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "dataset.train_path:" in done.stderr and "train.beton does not exist" in done.stderr
    assert "make it with: dlrecipes data convert" in done.stderr and "docs/fast-data-loading.md" in done.stderr
