"""Secrets stay secret (dlrecipes.core.secrets): what counts as one, the redaction every writer calls, a
credential in a recipe key refused, and the resume check that compares redacted recipes.  The runs that send
a secret address to MLflow, TensorBoard and W&B are in tests/test_trackers.py (beside its MLflow server)."""

from __future__ import annotations

import pytest
import yaml

from dlrecipes.core.secrets import MASK, is_secret_key, redact, redact_text, redact_uri, refusal, secret_keys
from dlrecipes.recipe import run_recipe_text

from .conftest import TINY_RECIPE, run_cli, write

PASSWORD = "hunter2-Zq9"


@pytest.mark.parametrize(
    "name",
    [
        "password",
        "db_password",
        "DB_PASSWORD",
        "api_key",
        "apiKey",
        "APIKey",
        "apikey",
        "some_token",
        "token",
        "access_key",
        "aws_secret_access_key",
        "secret",
        "client-secret",
        "credentials",
        "X-Amz-Signature",
        "X-Amz-Credential",
        "X-Amz-Security-Token",
        "sig",
        "loggers.wandb.api_key",
        "private_key",
        "passwd",
    ],
)
def test_a_key_named_like_a_secret_is_one(name):
    assert is_secret_key(name)


@pytest.mark.parametrize(
    "name",
    [
        "tokenizer",
        "max_tokens",
        "reg_tokens",
        "num_tokens",
        "key",
        "keys",
        "monitor",
        "keep",
        "secretary",
        "passing",
        "signal",
        "sigma",
        "design",
        "tracking_uri",
        "runs_dir",
        "name",
        "accessed",
        "api",
        "keyboard",
        "X-Amz-Expires",
        "author",
    ],
)
def test_no_false_positives_on_words_that_only_contain_one(name):
    assert not is_secret_key(name)


def test_no_parameter_of_a_registered_component_or_section_is_named_like_a_secret():
    """Refusing a secret-named key must never refuse a real setting: every factory parameter of every registry
    (the schema of ``model.*``, ``loggers.*``, ...) and every section field passes."""
    import dataclasses

    from dlrecipes.config import sections
    from dlrecipes.plugins import load_all
    from dlrecipes.registry import REGISTRIES

    load_all()
    names = {p for reg in REGISTRIES.values() for name in reg.names() for p in reg.get(name).parameters}
    names |= {
        f.name for cls in vars(sections).values() if dataclasses.is_dataclass(cls) for f in dataclasses.fields(cls)
    }
    assert len(names) > 100
    assert [n for n in names if is_secret_key(n)] == []


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("http://bob:hunter2@host:5000", "http://***@host:5000"),
        ("http://bob:hunter2@host:5000/api?x=1", "http://***@host:5000/api?x=1"),
        ("https://TOKEN123@github.com/org/repo.git", "https://***@github.com/org/repo.git"),
        ("s3://key:sec@ret@bucket/x", "s3://***@bucket/x"),  # an unescaped @ in the password
        ("http://host:5000/x", "http://host:5000/x"),  # nothing to hide
        ("http://[::1]:5000/x", "http://[::1]:5000/x"),
        ("/data/user@host/images", "/data/user@host/images"),  # a path, not an address
        ("mailto:bob@example.org", "mailto:bob@example.org"),
        ("https://h/f?token=abc&page=2", "https://h/f?token=***&page=2"),
        (
            "https://b.s3.amazonaws.com/f?X-Amz-Credential=AK%2F1&X-Amz-Expires=60&X-Amz-Signature=ff",
            "https://b.s3.amazonaws.com/f?X-Amz-Credential=***&X-Amz-Expires=60&X-Amz-Signature=***",
        ),
        (
            "https://acct.blob.core.windows.net/c?sv=2022&sig=abc%3D",
            "https://acct.blob.core.windows.net/c?sv=2022&sig=***",
        ),
    ],
)
def test_an_address_loses_its_user_info_and_secret_query_values(uri, expected):
    assert redact_uri(uri) == expected
    assert redact_text(f"nothing answers at {uri} (refused)") == f"nothing answers at {expected} (refused)"


def test_a_line_loses_secret_assignments_but_keeps_error_prose_and_switches():
    assert redact_text(f"bad override loggers.wandb.api_key={PASSWORD}") == "bad override loggers.wandb.api_key=***"
    assert (
        redact_text(f"{{'api_key': '{PASSWORD} x', 'class_token': True, 'n': 3}}")
        == "{'api_key': '***', 'class_token': True, 'n': 3}"
    )
    assert redact_text(f'{{"token": "{PASSWORD}"}}') == '{"token": "***"}'
    prose = "loggers.mlflow.tags.api_token: a credential is not taken from a recipe"  # an error line's key: prose
    assert redact_text(prose) == prose
    assert redact_text("class_token=true max_tokens=5 tokenizer=bpe") == "class_token=true max_tokens=5 tokenizer=bpe"
    assert redact_text(redact_text(f"x http://a:{PASSWORD}@h token={PASSWORD}")) == "x http://***@h token=***"


def test_redacting_data_masks_secret_keys_and_addresses_and_keeps_the_shape():
    data = {
        "loggers": {"mlflow": {"tracking_uri": f"http://bob:{PASSWORD}@h:5000", "tags": {"team": "vision"}}},
        "model": {"name": "vit", "class_token": False, "reg_tokens": 4},
        "plugin": {
            "db_password": PASSWORD,
            "credentials": {"user": "bob", "pw": PASSWORD, "port": 5432},
            "tokens": [f"https://{PASSWORD}@h/x", 7],
            "token": "",
        },
        "epochs": 3,
    }
    got = redact(data)
    assert got == {
        "loggers": {"mlflow": {"tracking_uri": "http://***@h:5000", "tags": {"team": "vision"}}},
        "model": {"name": "vit", "class_token": False, "reg_tokens": 4},
        "plugin": {
            "db_password": MASK,
            "credentials": {"user": MASK, "pw": MASK, "port": 5432},
            "tokens": ["https://***@h/x", 7],
            "token": "",
        },
        "epochs": 3,
    }
    assert redact(got) == got and PASSWORD in str(data)  # idempotent; the original is left as it was
    assert secret_keys(data) == ["plugin.db_password", "plugin.credentials"]  # a switch, a count, "" hold none


def test_a_credential_in_a_recipe_key_is_refused_naming_the_key_and_the_environment_variable(tmp_path):
    recipe = write(tmp_path / "r.yaml", TINY_RECIPE)
    wandb = run_cli("validate", str(recipe), f"loggers.wandb.api_key={PASSWORD}")
    assert wandb.returncode == 2 and "Traceback" not in wandb.stderr
    line = wandb.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("error: loggers.wandb.api_key: a credential is not taken")
    assert "WANDB_API_KEY" in line
    mlflow = run_cli("show", str(recipe), f'loggers={{mlflow: {{tags: {{db_password: "{PASSWORD}"}}}}}}')
    assert mlflow.returncode == 2 and "loggers.mlflow.tags.db_password:" in mlflow.stderr
    assert "MLFLOW_TRACKING_USERNAME" in mlflow.stderr
    anywhere = run_cli("train", str(recipe), f"model.access_key={PASSWORD}", f"runs_dir={tmp_path / 'runs'}")
    assert anywhere.returncode == 2 and "model.access_key:" in anywhere.stderr
    assert "environment variable or configuration file" in anywhere.stderr and not (tmp_path / "runs").exists()
    for result in (wandb, mlflow, anywhere):
        assert PASSWORD not in result.stdout + result.stderr
    assert refusal("runs_dir").count("AWS_ACCESS_KEY_ID") == 1
    switch = run_cli("validate", str(recipe), "model.class_token=true")  # not a credential: the schema's to judge
    assert "credential" not in switch.stderr and "class_token" in switch.stderr


def test_an_s3_runs_dir_with_credentials_in_it_is_refused_without_showing_them(tmp_path):
    recipe = write(tmp_path / "r.yaml", TINY_RECIPE)
    result = run_cli("train", str(recipe), f"runs_dir=s3://AKIA1:{PASSWORD}@bucket/runs")
    assert result.returncode == 2 and PASSWORD not in result.stdout + result.stderr
    assert "runs_dir: s3://***@bucket/runs: S3 credentials are not taken from the address" in result.stderr
    assert "AWS_ACCESS_KEY_ID" in result.stderr


def test_show_and_an_error_line_redact_an_address(tmp_path):
    recipe = write(tmp_path / "r.yaml", TINY_RECIPE)
    uri = f"http://bob:{PASSWORD}@127.0.0.1:9/?token={PASSWORD}"
    shown = run_cli("show", str(recipe), f'loggers={{mlflow: {{tracking_uri: "{uri}"}}}}')
    assert shown.returncode == 0, shown.stderr
    assert "tracking_uri: http://***@127.0.0.1:9/?token=***" in shown.stdout
    assert PASSWORD not in shown.stdout + shown.stderr
    unreachable = run_cli(
        "train", str(recipe), f'loggers={{mlflow: {{tracking_uri: "{uri}"}}}}', f"runs_dir={tmp_path / 'runs'}"
    )
    assert unreachable.returncode == 2 and "nothing answers at http://***@127.0.0.1:9/" in unreachable.stderr
    assert PASSWORD not in unreachable.stdout + unreachable.stderr
    wrong = run_cli("validate", str(recipe), f'trainer.max_duration="http://bob:{PASSWORD}@h"')
    assert wrong.returncode == 2 and PASSWORD not in wrong.stderr and "http://***@h" in wrong.stderr
    from dlrecipes import api  # a notebook shows the resolved recipe's repr, and keeps it in the .ipynb

    config = api.resolve(recipe, [f'loggers={{mlflow: {{tracking_uri: "{uri}"}}}}'], check_data=False)
    assert config.loggers["mlflow"]["tracking_uri"] == uri  # the tracker still gets the address it was given
    assert PASSWORD not in repr(config) and "http://***@127.0.0.1:9/" in repr(config)


def test_a_resume_compares_the_recorded_recipe_redacted_alike(tmp_path):
    """recipe.yaml holds the address without its password: the same recipe resumes as unchanged (no false
    'changed settings', no recipe.before-*.yaml), another password is no change, another address is one."""
    from dlrecipes.records.layout import RunDir
    from dlrecipes.records.resume_check import check_resume
    from dlrecipes.records.run_dir import make_run_dir, record_recipe

    recipe = {
        "model": {"name": "cnn_simple"},
        "runs_dir": str(tmp_path),
        "loggers": {"mlflow": {"tracking_uri": f"http://bob:{PASSWORD}@h:5000"}},
    }
    run = make_run_dir(tmp_path / "run")
    record_recipe(run, recipe, resume=False)
    assert PASSWORD not in run.recipe.read_text()
    assert yaml.safe_load(run.recipe.read_text())["loggers"]["mlflow"]["tracking_uri"] == "http://***@h:5000"
    assert check_resume(run.path, recipe) == []
    assert check_resume(run.path, redact(recipe) | {}) == []
    other_password = {**recipe, "loggers": {"mlflow": {"tracking_uri": "http://bob:other@h:5000"}}}
    assert check_resume(run.path, other_password) == []
    moved = {**recipe, "loggers": {"mlflow": {"tracking_uri": f"http://bob:{PASSWORD}@elsewhere:5000"}}}
    assert check_resume(run.path, moved) == [
        "loggers.mlflow.tracking_uri ('http://***@h:5000' -> 'http://***@elsewhere:5000')"
    ]
    (run.path / "checkpoints").mkdir()
    record_recipe(run, recipe, resume=True)  # the same recipe: recipe.yaml is kept as it is
    assert sorted(p.name for p in run.path.iterdir()) == ["checkpoints", "recipe.yaml"]
    assert RunDir(run.path).recipe.read_text() == run_recipe_text(redact(recipe))


def test_a_model_setting_with_a_secret_address_is_not_refused_on_resume_by_redaction(tmp_path):
    """model.* cannot change on resume; an address under it that only hides its password compares equal."""
    from dlrecipes.records.resume_check import check_resume
    from dlrecipes.records.run_dir import make_run_dir, record_recipe

    recipe = {"model": {"name": "m", "weights": f"https://u:{PASSWORD}@h/w.pt", "class_token": True}}
    run = make_run_dir(tmp_path / "run")
    record_recipe(run, recipe, resume=False)
    assert check_resume(run.path, recipe) == []
    from dlrecipes.errors import RecipeError

    with pytest.raises(RecipeError, match=r"model.weights \('https://\*\*\*@h/w.pt' -> 'https://\*\*\*@h/v.pt'\)"):
        check_resume(run.path, {"model": {**recipe["model"], "weights": f"https://u:{PASSWORD}@h/v.pt"}})


def test_a_sweep_records_its_overrides_redacted_and_compares_them_alike(tmp_path):
    from dlrecipes.records.store import store_for
    from dlrecipes.tools.sweep.plan import SweepPlan, prepare_folder

    uri = f'loggers={{mlflow: {{tracking_uri: "http://bob:{PASSWORD}@h:5000"}}}}'
    plan = SweepPlan(recipe=tmp_path / "r.yaml", name="s", fixed=[uri], swept={}, seeds=1, points=[])
    folder = prepare_folder(plan, store_for(tmp_path).sweep(plan.name))
    text = (folder / "sweep.yaml").read_text()
    assert PASSWORD not in text and "http://***@h:5000" in text
    assert (
        prepare_folder(plan, store_for(tmp_path).sweep(plan.name)) == folder
    )  # the same sweep again: the same fixed settings
