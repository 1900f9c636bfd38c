"""Knowledge distillation (issue 38, item 4): the teacher resolved and recorded at validation, refused in one
line when unusable, frozen and outside the student; the loss against a hand computation; a distilled run's
checkpoints hold no teacher, and evaluation, export and predict work without it."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
import yaml
from composer.core import Event

from dlrecipes.algorithms.distillation import Distillation
from dlrecipes.api import resolve
from dlrecipes.errors import RecipeError, UserError
from dlrecipes.models.architectures.simple_cnn import CNNSimple
from dlrecipes.records.layout import RunDir

KEY = "algorithms.distillation.teacher"


def _network(seed: int = 0, num_classes: int = 10) -> CNNSimple:
    torch.manual_seed(seed)
    return CNNSimple(num_classes, 1, width=4, hidden=16)


def _teacher_run(root: Path, dataset: dict | None = None, algorithms: dict | None = None) -> RunDir:
    """A run directory as training leaves it, as far as a teacher needs: recipe.yaml and a best checkpoint."""
    run = RunDir(root / "teacher")
    run.checkpoints.mkdir(parents=True)
    recipe = {
        "model": {"name": "cnn_simple", "width": 4, "hidden": 16},
        "dataset": dataset or {"name": "digits", "image_size": 8, "augment": False},
        "algorithms": algorithms or {},
    }
    run.recipe.write_text(yaml.safe_dump(recipe))
    weights = {f"module.{k}": v for k, v in _network().state_dict().items()}
    torch.save({"state": {"model": weights}}, run.best)
    return run


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _state(images, student, loss, algorithms=()):
    """What the algorithm reads of Composer's State after the loss."""
    from composer.core.precision import Precision
    from composer.devices import DeviceCPU

    return SimpleNamespace(
        batch=(images, torch.zeros(len(images), dtype=torch.long)),
        outputs=student,
        loss=loss,
        precision=Precision.FP32,
        precision_config=None,
        device=DeviceCPU(),
        algorithms=list(algorithms),
    )


def test_validation_records_the_teachers_checkpoint_and_checksum(tiny_recipe, tmp_path):
    run = _teacher_run(tmp_path)
    expected = {"teacher": str(run.best), "teacher_sha256": _sha(run.best)}
    for given in (run.path, run.best):
        assert (
            resolve(tiny_recipe, [f"algorithms.distillation={{teacher: {given}}}"]).algorithms["distillation"]
            == expected
        )
    # a path in the recipe file is relative to it; written into the run's recipe.yaml as the file and its sha256
    recipe = tmp_path / "student.yaml"
    recipe.write_text(tiny_recipe.read_text() + "algorithms: {distillation: {teacher: teacher, kind: hard}}\n")
    assert resolve(recipe).to_dict()["algorithms"]["distillation"] == {**expected, "kind": "hard"}


def test_a_model_spec_teacher_gets_absolute_paths_and_the_checksum_of_its_weights(tiny_recipe, tmp_path, monkeypatch):
    torch.save(_network().state_dict(), tmp_path / "weights.pt")
    monkeypatch.chdir(tmp_path)
    got = resolve(tiny_recipe, ["algorithms.distillation.teacher={name: cnn_simple, width: 4, checkpoint: weights.pt}"])
    assert got.algorithms["distillation"] == {
        "teacher": {"name": "cnn_simple", "width": 4, "checkpoint": str(tmp_path / "weights.pt")},
        "teacher_sha256": _sha(tmp_path / "weights.pt"),
    }


@pytest.mark.parametrize(
    "teacher, message",
    [
        ("missing", f"{KEY}: .*missing does not exist; give a run directory"),
        ("not_a_run", f"{KEY}: .*not_a_run is not a run directory"),
        ("loose.pt", f"{KEY}: .*loose.pt is not in a run directory's checkpoints/ folder, so its network is unknown"),
        ("{name: cnn_simple, width: 4}", f"{KEY}: the teacher has no trained weights"),
        ("{name: cnn_simpel}", f"{KEY}.name: unknown model 'cnn_simpel'"),
        ("{name: cnn_simple, widht: 4, checkpoint: loose.pt}", f"{KEY}.widht: unknown parameter"),
        ("3", f"{KEY}: expected str or mapping, got 3"),
        ("''", f"{KEY}: expected a run directory, a checkpoint file or a model spec"),
        ("four_classes", f"{KEY}: the teacher \\(run .*\\) predicts 4 classes and this dataset has 10"),
        ("blurpooled", f"{KEY}: run .* was trained with blurpool, which change the network's modules"),
        # issue 63: an address was shown as s3:/... (through Path()), and said not to exist
        (
            "s3://runs/exp/r1",
            f"{KEY}: s3://runs/exp/r1 is an address; a teacher is read from files on this machine: copy",
        ),
        (
            "{name: cnn_simple, checkpoint: 's3://runs/exp/r1/checkpoints/best.pt'}",
            f"{KEY}.checkpoint: s3://runs/exp/r1/checkpoints/best.pt is an address; ",
        ),
        (
            "{name: timm, arch: resnet18, pretrained_path: 'https://host/w.pth'}",
            f"{KEY}.pretrained_path: https://host/w.pth is",
        ),
    ],
)
def test_an_unusable_teacher_is_refused_at_validation_in_one_line(tiny_recipe, tmp_path, monkeypatch, teacher, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "not_a_run").mkdir()
    (tmp_path / "loose.pt").write_bytes(b"x")
    synthetic = {"name": "synthetic", "num_classes": 4, "input_shape": [1, 8, 8]}
    (tmp_path / "four_classes").mkdir()
    _teacher_run(tmp_path / "four_classes", dataset=synthetic)
    (tmp_path / "blurpooled").mkdir()
    _teacher_run(tmp_path / "blurpooled", algorithms={"blurpool": {}})
    if teacher in ("four_classes", "blurpooled"):
        teacher = f"{teacher}/teacher"
    with pytest.raises(RecipeError, match=message) as raised:
        resolve(tiny_recipe, [f"algorithms.distillation.teacher={teacher}"])
    assert "\n" not in str(raised.value)


def test_a_pinned_checksum_is_checked_when_training_starts_not_at_validation(tiny_recipe, tmp_path):
    run = _teacher_run(tmp_path)
    gone = resolve(
        tiny_recipe, [f"algorithms.distillation={{teacher: {tmp_path}/gone.pt, teacher_sha256: {'a' * 64}}}"]
    )
    assert gone.algorithms["distillation"]["teacher_sha256"] == "a" * 64  # what a recorded recipe.yaml re-read does
    with pytest.raises(RecipeError, match=f"{KEY}: s3://runs/exp/r1 is an address"):  # pinned: refused all the same
        resolve(tiny_recipe, [f"algorithms.distillation={{teacher: s3://runs/exp/r1, teacher_sha256: {'a' * 64}}}"])
    with pytest.raises(RecipeError, match=f"{KEY}_sha256: expected 64 lowercase hex digits"):
        resolve(tiny_recipe, [f"algorithms.distillation={{teacher: {run.path}, teacher_sha256: abc}}"])
    with pytest.raises(UserError, match=f"{KEY}: .*best.pt has changed since the recipe recorded it"):
        Distillation(str(run.best), teacher_sha256="a" * 64)
    assert Distillation(str(run.best), teacher_sha256=_sha(run.best)).weights is not None


@pytest.mark.parametrize("hidden", [False, True])
def test_a_teacher_that_holds_objects_is_refused_with_advice_a_teacher_can_follow(tmp_path, monkeypatch, hidden):
    """Issue 63: a teacher is always read tensors-only, so ``--trust-checkpoint``, the advice of every other
    refused checkpoint, cannot help it: the line says to save its weights alone instead (whether the listing saw
    the object, or the tensors-only load behind it stopped at one the listing missed)."""
    run = _teacher_run(tmp_path)
    torch.save({"state": {"model": _network().state_dict()}, "where": Path("x")}, run.best)
    if hidden:
        import dlrecipes.records.checkpoint_safety as safety

        monkeypatch.setattr(safety, "unsafe_globals", lambda path: [])  # a pickle that hides its globals
    with pytest.raises(UserError) as refused:
        Distillation(str(run.best))
    said = str(refused.value)
    assert said.startswith(
        f"{KEY}: {run.best} holds Python objects beyond tensors (pathlib.PosixPath); a teacher is "
        "always read tensors-only, --trust-checkpoint or not: save its weights alone"
    )
    assert "pass --trust-checkpoint" not in said and "\n" not in said


def _hand_kl(student, teacher, t):
    p = torch.softmax(teacher / t, dim=-1)
    return (p * (p.log() - torch.log_softmax(student / t, dim=-1))).sum() / len(student) * t * t


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_the_loss_is_the_blend_computed_by_hand_and_trains_only_the_student(tmp_path, kind):
    run = _teacher_run(tmp_path)
    algorithm = Distillation(str(run.path), temperature=3.0, alpha=0.3, kind=kind)
    torch.manual_seed(1)
    images, labels = torch.randn(6, 1, 8, 8), torch.tensor([0, 1, 2, 3, 4, 5])
    student = torch.randn(6, 10, requires_grad=True)
    label_loss = F.cross_entropy(student, labels)
    state = _state(images, student, label_loss)
    algorithm.apply(Event.BEFORE_BACKWARD, state, None)
    teacher = _network().eval()(images).detach()  # the same weights, by hand
    if kind == "soft":
        distill = _hand_kl(student, teacher, 3.0)
    else:
        distill = -torch.log_softmax(student, dim=-1)[torch.arange(6), teacher.argmax(dim=-1)].mean()
    assert torch.allclose(state.loss["distillation"], distill, atol=1e-6)
    assert torch.allclose(state.loss["total"], 0.7 * label_loss + 0.3 * distill, atol=1e-6)
    assert state.loss["labels"] is label_loss
    net = algorithm.teacher
    assert not net.training and not any(p.requires_grad for p in net.parameters())
    state.loss["total"].backward()
    assert student.grad is not None and all(p.grad is None for p in net.parameters())


def test_the_teacher_follows_the_runs_memory_format(tmp_path):
    from composer.algorithms import ChannelsLast

    algorithm = Distillation(str(_teacher_run(tmp_path).path))
    images = torch.randn(2, 1, 8, 8)
    algorithm.apply(
        Event.BEFORE_BACKWARD, _state(images, torch.randn(2, 10), torch.tensor(1.0), [ChannelsLast()]), None
    )
    weight = algorithm.teacher.features[3].weight  # (8, 4, 3, 3)
    assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    assert algorithm.state_dict() == {}


@pytest.mark.parametrize(
    "shape, classes, said",
    [
        (
            (1, 8, 8),
            4,
            r"predicts 10 classes and this dataset has 4; a teacher must be trained on the student's classes",
        ),
        ((3, 8, 8), 10, r"takes 1-channel images and this dataset's have 3 channels"),
    ],
)
def test_a_teacher_for_other_classes_or_channels_is_refused_before_the_run_naming_both(tmp_path, shape, classes, said):
    """Checked when the data is built (Distillation.check_data, before the start line), and at the first batch
    when the builder did not (a Trainer made by hand)."""
    algorithm = Distillation(str(_teacher_run(tmp_path).path))
    with pytest.raises(UserError, match=f"{KEY}: run .*teacher .*best.pt\\) {said}"):
        algorithm.check_data(SimpleNamespace(num_classes=classes, input_shape=shape))
    state = _state(torch.randn(2, *shape), torch.randn(2, classes), torch.tensor(1.0))
    with pytest.raises(UserError, match=said):
        Distillation(str(_teacher_run(tmp_path / "again").path)).apply(Event.BEFORE_BACKWARD, state, None)


def _tensor_elements(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, dict):
        return sum(_tensor_elements(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_elements(v) for v in value)
    return 0


@pytest.mark.slow
def test_a_distilled_run_holds_no_teacher_and_evaluates_exports_and_predicts_without_it(
    trained_tiny, tiny_recipe, tmp_path
):
    from PIL import Image

    from dlrecipes import api

    teacher = Path(shutil.copytree(trained_tiny, tmp_path / "teacher", symlinks=True))
    result = api.train(
        tiny_recipe,
        [
            "run_name=student",
            "trainer.max_duration=1ep",
            "trainer.train_subset_num_batches=1",
            "trainer.eval_subset_num_batches=1",
            f"algorithms.distillation={{teacher: {teacher}, temperature: 2}}",
        ],
    )
    run = RunDir(result.run_dir)
    recorded = yaml.safe_load(run.recipe.read_text())["algorithms"]["distillation"]
    assert recorded == {
        "teacher": str(RunDir(teacher).best),
        "temperature": 2.0,
        "teacher_sha256": _sha(RunDir(teacher).best),
    }
    ours = torch.load(run.best, map_location="cpu", weights_only=False)
    plain = torch.load(RunDir(trained_tiny).best, map_location="cpu", weights_only=False)  # the same network
    assert set(ours["state"]["model"]) == set(plain["state"]["model"])
    assert _tensor_elements(ours) == _tensor_elements(plain)  # no copy of the teacher anywhere in the file
    shutil.rmtree(teacher)
    assert api.evaluate(run.path).metrics["top1"] == pytest.approx(result.eval_metrics["top1"])
    api.export(run.path)
    Image.new("L", (8, 8), 255).save(tmp_path / "white.png")
    for target in (run.path, run.exports):
        rows = api.predict(target, [tmp_path / "white.png"])
        assert len(rows) == 1 and rows[0]["class"] is not None


@pytest.mark.slow
def test_mixups_interpolated_loss_is_the_label_term_whatever_the_order(tiny_recipe, tmp_path):
    """Mixup's interpolate_loss replaces the loss at BEFORE_BACKWARD and refuses a dict: distillation moves itself
    to the end of the algorithms at INIT and blends there, after it, whichever the recipe lists first."""
    from tests.conftest import fit

    run = _teacher_run(tmp_path)
    for algorithms in (
        f"{{distillation: {{teacher: {run.path}}}, mixup: {{interpolate_loss: true}}}}",
        f"{{cutmix: {{interpolate_loss: true}}, distillation: {{teacher: {run.path}}}}}",
    ):
        result = fit(
            resolve(
                tiny_recipe,
                [
                    "trainer.max_duration=2ba",
                    "checkpoint.save=false",
                    "checkpoint.monitor=null",
                    f"algorithms={algorithms}",
                ],
            )
        )
        assert result.batches == 2


# Mixed precision (the engine issue, item 7): under amp_bf16/amp_fp16 the student's logits are half precision and
# the teacher's are half precision too (on a GPU, where Composer's precision context is autocast) or float32 (on
# the CPU, where it does nothing); the loss is computed at BEFORE_BACKWARD, outside autocast. The project refuses
# amp on the CPU (it needs a GPU), so these run CPU autocast around what would run under it on a GPU.
HALF = (torch.bfloat16, torch.float16)
_MIXED = [(low, torch.float32) for low in HALF] + [(torch.float32, low) for low in HALF] + [(low, low) for low in HALF]


def _hand_loss(student, teacher, t, kind):
    """The distillation term computed by hand on float32 copies of the logits (the reference)."""
    student, teacher = student.detach().float(), teacher.detach().float()
    if kind == "soft":
        return _hand_kl(student, teacher, t)
    return -torch.log_softmax(student, dim=-1)[torch.arange(len(student)), teacher.argmax(dim=-1)].mean()


def _cases():
    """(student dtype, teacher dtype, kind, under autocast) where the cast decides the loss: a hard loss of float32
    student logits, or one under autocast (cross-entropy is an fp32 op there), is float32 without it."""
    for student, teacher in _MIXED:
        for kind in ("soft", "hard"):
            for in_autocast in (False, True):
                if kind == "soft" or (student != torch.float32 and not in_autocast):
                    name = f"{str(student)[6:]}-{str(teacher)[6:]}-{kind}-{'in-autocast' if in_autocast else 'outside'}"
                    yield pytest.param(student, teacher, kind, in_autocast, id=name)


@pytest.mark.parametrize("student_dtype, teacher_dtype, kind, in_autocast", list(_cases()))
def test_the_distillation_loss_of_half_precision_logits_is_computed_in_float32(
    student_dtype, teacher_dtype, kind, in_autocast
):
    """Whatever the two logits' dtypes, and whether or not the loss is computed under autocast: a float32 loss
    equal to the one of both logits cast to float32 (a loss in bf16, or softmaxes of bf16 logits, are off by far
    more than the tolerance), and a backward that gives the student's logits a finite gradient in their dtype."""
    from dlrecipes.algorithms.distillation import distillation_loss

    torch.manual_seed(2)
    student = (torch.randn(8, 10) * 4).to(student_dtype).requires_grad_()
    teacher = (torch.randn(8, 10) * 4).to(teacher_dtype)
    dtype = next(d for d in (student_dtype, teacher_dtype) if d != torch.float32)
    with torch.autocast("cpu", dtype=dtype, enabled=in_autocast):
        loss = distillation_loss(student, teacher, 2.0, kind)
    assert loss.dtype == torch.float32 and loss.dim() == 0 and torch.isfinite(loss)
    assert torch.allclose(loss, _hand_loss(student, teacher, 2.0, kind), rtol=1e-6, atol=1e-6)
    loss.backward()
    assert student.grad.dtype == student_dtype and torch.isfinite(student.grad).all() and student.grad.abs().sum() > 0


@pytest.mark.parametrize("teacher_in_autocast", [True, False], ids=["half-teacher", "float32-teacher"])
@pytest.mark.parametrize(
    "precision, dtype", [("amp_bf16", torch.bfloat16), ("amp_fp16", torch.float16)], ids=["amp_bf16", "amp_fp16"]
)
def test_a_step_under_cpu_autocast_blends_a_float32_loss_and_trains_the_student(
    tmp_path, monkeypatch, precision, dtype, teacher_in_autocast
):
    """The training step as the engine runs it, the student's forward and loss under CPU autocast and the
    algorithm at BEFORE_BACKWARD outside it: with the teacher's precision context made CPU autocast (what it is
    on a GPU: half-precision teacher logits) or Composer's own (nothing on the CPU: float32 ones), the blended
    loss is float32, equal to the one of float32 copies of both logits, and its backward reaches every
    parameter of the student in the parameter's dtype and none of the teacher's."""
    from composer.core.precision import Precision

    import dlrecipes.algorithms.distillation as distillation

    if teacher_in_autocast:
        monkeypatch.setattr(distillation, "get_precision_context", lambda *_: torch.autocast("cpu", dtype=dtype))
    algorithm = Distillation(str(_teacher_run(tmp_path).path), temperature=2.0, alpha=0.4)
    student_net = _network(seed=3)
    torch.manual_seed(4)
    images, labels = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    with torch.autocast("cpu", dtype=dtype):
        student = student_net(images)
        label_loss = F.cross_entropy(student, labels)
    assert student.dtype == dtype and label_loss.dtype == torch.float32  # what autocast makes of them
    state = _state(images, student, label_loss)
    state.precision = Precision(precision)
    algorithm.apply(Event.BEFORE_BACKWARD, state, None)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=teacher_in_autocast):
        teacher = _network().eval()(images)  # the same weights, by hand, in the same context
    assert teacher.dtype == (dtype if teacher_in_autocast else torch.float32)
    distill = _hand_loss(student, teacher, 2.0, "soft")
    for name in ("distillation", "total"):
        assert state.loss[name].dtype == torch.float32 and torch.isfinite(state.loss[name])
    assert torch.allclose(state.loss["distillation"], distill, rtol=1e-6, atol=1e-6)
    assert torch.allclose(state.loss["total"], 0.6 * label_loss + 0.4 * distill, rtol=1e-6, atol=1e-6)
    state.loss["total"].backward()
    assert all(
        p.grad is not None and p.grad.dtype == p.dtype and torch.isfinite(p.grad).all()
        for p in student_net.parameters()
    )
    assert all(p.grad is None for p in algorithm.teacher.parameters())
