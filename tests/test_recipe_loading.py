"""load: YAML, base: composition, overrides, deletions, provenance."""

from __future__ import annotations

import pytest

from dlrecipes.errors import RecipeError
from dlrecipes.recipe import load_recipe

from .conftest import RECIPES, run_cli, write


@pytest.fixture
def family(tmp_path):
    write(
        tmp_path / "base" / "a.yaml",
        """
        trainer: {max_duration: 5ep, batch_size: 32, seed: 1}
        algorithms: {ema: {half_life: 10ba}}
        tags: [a, b, c]
    """,
    )
    write(
        tmp_path / "base" / "b.yaml",
        """
        base: a.yaml
        trainer: {batch_size: 64}
        tags: [x]
    """,
    )
    write(
        tmp_path / "other.yaml",
        """
        trainer: {seed: 2}
    """,
    )
    return write(
        tmp_path / "child.yaml",
        """
        base: [base/b.yaml, other.yaml]
        trainer: {max_duration: 7ep}
        model: {name: cnn_simple}
    """,
    )


def test_bases_merge_in_order_with_the_recipe_last(family):
    data = load_recipe(family).data
    assert data["trainer"] == {"max_duration": "7ep", "batch_size": 64, "seed": 2}
    assert data["algorithms"] == {"ema": {"half_life": "10ba"}}  # mappings merge
    assert data["tags"] == ["x"]  # lists replace
    assert "base" not in data


def test_sources_name_the_file_each_value_came_from(family, tmp_path):
    sources = load_recipe(family, ["trainer.seed=3"]).sources
    assert sources["trainer.max_duration"].endswith("child.yaml")
    assert sources["trainer.batch_size"].endswith("b.yaml")
    assert sources["algorithms.ema.half_life"].endswith("a.yaml")
    assert sources["trainer.seed"] == "override trainer.seed=3"


def test_overrides_parse_yaml_values_set_null_and_create_keys(family):
    data = load_recipe(
        family,
        [
            "trainer.batch_size=128",
            "trainer.lr=1e-3",
            "tags=[1, 2]",
            "trainer.seed=null",
            "new.section.key={a: 1}",
            "model.name=mnist_cnn",
            "trainer.max_duration='10'",
        ],
    ).data
    assert data["trainer"]["batch_size"] == 128
    assert data["trainer"]["lr"] == 1e-3
    assert data["tags"] == [1, 2]
    assert data["trainer"]["seed"] is None and "seed" in data["trainer"]
    assert data["new"] == {"section": {"key": {"a": 1}}}
    assert data["model"]["name"] == "mnist_cnn"
    assert data["trainer"]["max_duration"] == "10"


def test_tilde_deletes_a_key_and_its_sources(family):
    recipe = load_recipe(family, ["~algorithms.ema", "~trainer.seed"])
    assert recipe.data["algorithms"] == {}
    assert "seed" not in recipe.data["trainer"]
    assert not any(k.startswith("algorithms.ema") for k in recipe.sources)


@pytest.mark.parametrize(
    "override, message",
    [
        ("~trainer.nope", "nothing to delete at 'trainer.nope'"),
        ("trainer.batch_size.x=1", "'trainer.batch_size' is a int, not a section"),
        ("justaword", "expected key.path=value"),
        ("a..b=1", "not a valid key path"),
        ("base=x.yaml", "base: can only be set in a recipe file"),
        ("trainer.seed=[1, 2", "invalid YAML"),
    ],
)
def test_bad_overrides_are_named(family, override, message):
    with pytest.raises(RecipeError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_recipe(family, [override])


def test_duplicate_keys_are_an_error_with_the_line(tmp_path):
    path = write(
        tmp_path / "dup.yaml",
        """
        trainer:
          seed: 1
          seed: 2
    """,
    )
    with pytest.raises(RecipeError, match=r"dup.yaml, line 3: invalid YAML: duplicate key 'seed'"):
        load_recipe(path)


def test_anchors_and_merge_keys_still_work(tmp_path):
    path = write(
        tmp_path / "anchors.yaml",
        """
        common: &c {batch_size: 8, seed: 3}
        trainer:
          <<: *c
          seed: 4
    """,
    )
    assert load_recipe(path).data["trainer"] == {"batch_size": 8, "seed": 4}


def test_unsafe_yaml_tags_are_refused(tmp_path):
    path = write(tmp_path / "evil.yaml", "x: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(RecipeError, match="invalid YAML"):
        load_recipe(path)


def test_base_cycles_missing_bases_and_bad_files_are_named(tmp_path):
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(RecipeError, match="cycle"):
        load_recipe(tmp_path / "a.yaml")
    write(tmp_path / "c.yaml", "base: missing.yaml\n")
    with pytest.raises(RecipeError, match="base: file not found: missing.yaml"):
        load_recipe(tmp_path / "c.yaml")
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_recipe(tmp_path / "nope.yaml")
    (tmp_path / "bin.yaml").write_bytes(b"a: \xff\xfe\n")
    with pytest.raises(RecipeError, match="not UTF-8"):
        load_recipe(tmp_path / "bin.yaml")
    write(tmp_path / "list.yaml", "- 1\n- 2\n")
    with pytest.raises(RecipeError, match="must be a mapping"):
        load_recipe(tmp_path / "list.yaml")


def test_input_paths_are_relative_to_the_file_that_sets_them(tmp_path, monkeypatch):
    from dlrecipes.api import resolve

    write(
        tmp_path / "recipes" / "base" / "data.yaml",
        """
        dataset: {name: image_folder, train_path: ../../data/train, val_path: /abs/val}
        checkpoint: {load_path: ../../weights/start.pt}
    """,
    )
    recipe = write(
        tmp_path / "recipes" / "exp.yaml",
        """
        base: base/data.yaml
        model: {name: cnn_simple}
        dataset: {train_path: ../images/train}
    """,
    )
    monkeypatch.chdir(tmp_path / "recipes")  # somewhere else than the data
    config = resolve(recipe, check_device=False, check_data=False)
    assert config.dataset.params["train_path"] == str(tmp_path / "images" / "train")  # exp.yaml's folder
    assert config.dataset.params["val_path"] == "/abs/val"
    assert config.checkpoint.load_path == str(tmp_path / "weights" / "start.pt")  # base/data.yaml's folder
    overridden = resolve(recipe, ["dataset.val_path=mine/val"], check_device=False, check_data=False)
    assert overridden.dataset.params["val_path"] == str(tmp_path / "recipes" / "mine" / "val")  # the working dir
    assert overridden.runs_dir == "runs"  # outputs stay relative to where you run


def test_a_billion_laughs_recipe_is_refused_at_once_in_one_short_line(tmp_path):
    import time

    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 12)]
    path = tmp_path / "laughs.yaml"
    path.write_text("\n".join([*lines, "imports: *a11", "model: {name: cnn_simple}"]) + "\n")
    start = time.perf_counter()
    result = run_cli("validate", str(path))
    assert time.perf_counter() - start < 20 and result.returncode == 2  # the process; the check itself: ms
    line = result.stderr.strip()
    assert line.startswith(f"error: {path}: its aliases expand to more than 100,000 values") and len(line) < 300
    small = tmp_path / "small.yaml"  # within the bound, but a value too big to print
    small.write_text(
        "a: &a [" + ", ".join(["xxxxxxxxxx"] * 50) + "]\nb: &b [" + ", ".join(["*a"] * 50) + "]\n"
        "imports: {weird: *b}\nmodel: {name: cnn_simple}\n"
    )
    result = run_cli("validate", str(small))
    assert result.returncode == 2 and len(result.stderr) < 400, result.stderr[:500]


def test_overrides_are_key_value_strings_or_a_dict_and_a_bare_string_is_refused():
    from dlrecipes import api
    from dlrecipes.errors import RecipeError

    recipe = RECIPES / "quickstart.yaml"
    as_dict = api.resolve(recipe, {"optimizer.lr": 0.125, "trainer.max_duration": "3ep", "dataset.augment": False})
    as_list = api.resolve(recipe, ["optimizer.lr=0.125", "trainer.max_duration=3ep", "dataset.augment=false"])
    assert as_dict.to_dict() == as_list.to_dict()
    assert as_dict.optimizer.params["lr"] == 0.125 and as_dict.trainer.max_duration == "3ep"
    with pytest.raises(
        RecipeError,
        match=r"overrides: expected a list of key=value strings or a dict, got the string "
        r"'optimizer.lr=0.1' \(write \['optimizer.lr=0.1'\]\)",
    ):
        api.resolve(recipe, "optimizer.lr=0.1")
    with pytest.raises(RecipeError, match="overrides: each one is a key=value string, got float 0.1"):
        api.resolve(recipe, ["optimizer.lr=0.1", 0.1])


def test_libyamls_parser_reads_every_recipe_as_pyyamls_own_does():
    """Recipes are read with libyaml's parser where PyYAML has it (yaml.CSafeLoader: 5-10x faster) and PyYAML's own
    otherwise: every shipped recipe, a run's recorded recipe and the strict loader's own rules (a duplicate key named
    at its line, `1e-3` a float, merge keys, an unhashable key) read the same with both."""
    import yaml

    from dlrecipes.api import resolve
    from dlrecipes.recipe import SAFE_LOADER, run_recipe_text, strict_loader

    if not getattr(yaml, "__with_libyaml__", False):
        pytest.skip("this PyYAML has no libyaml: there is one parser")
    fast, own = strict_loader(yaml.CSafeLoader), strict_loader(yaml.SafeLoader)
    texts = [path.read_text() for path in sorted(RECIPES.rglob("*.yaml"))]
    texts += ["lr: 1e-3\nwd: -5E+2\nname: 1e\n", "common: &c {a: 1, b: 2}\nx:\n  <<: *c\n  b: 3\n"]
    assert len(texts) > 15
    for text in texts:
        assert yaml.load(text, Loader=fast) == yaml.load(text, Loader=own)  # noqa: S506 - safe loaders
    recorded = run_recipe_text(resolve(RECIPES / "quickstart.yaml").to_dict())  # what records/run_files reads
    assert yaml.load(recorded, Loader=SAFE_LOADER) == yaml.safe_load(recorded)  # noqa: S506
    assert yaml.load("lr: 1e-3\n", Loader=fast) == {"lr": 0.001}  # noqa: S506
    for bad, problem in (("a: 1\nb:\n  c: 2\n  c: 3\n", "duplicate key 'c'"), ("? [1, 2]\n: x\n", "unhashable key")):
        errors = []
        for loader in (fast, own):
            with pytest.raises(yaml.constructor.ConstructorError) as raised:
                yaml.load(bad, Loader=loader)  # noqa: S506
            errors.append((raised.value.problem, raised.value.problem_mark.line))
        assert errors[0] == errors[1] and errors[0][0].startswith(problem), errors
