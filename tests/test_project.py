"""The project's promises about itself: README commands, CI, entry points, import cost."""

from __future__ import annotations

import re
import subprocess
import sys

from .conftest import REPO


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    first_block = re.search(r"```(?:bash|sh)?\n(.*?)```", text, re.S).group(1)
    return [line for line in first_block.splitlines() if line.strip() and not line.startswith("#")]


def test_readme_starts_with_the_main_job_and_the_test_command():
    main_job, tests = _readme_commands()[:2]
    assert "pip install" in main_job and "dlrecipes train recipes/quickstart.yaml" in main_job
    assert "pip install" in tests and "pytest" in tests


def test_ci_runs_exactly_the_readme_test_command():
    tests = _readme_commands()[1]
    assert tests in (REPO / ".ci" / "run").read_text().splitlines()


def test_help_list_and_validate_do_not_import_torch(tmp_path):
    """Also for recipes naming timm and torchvision models (their names are shipped lists)."""
    probe = (
        "import sys; from dlrecipes.cli import main\n"
        "for args in (['--help'], ['list'], ['validate', 'recipes/quickstart.yaml'],\n"
        "             ['validate', 'recipes/finetune_timm.yaml', '--no-data-check'], "
        "['show', 'recipes/imagenet/resnet50_mild.yaml'],\n"
        "             ['validate', 'recipes/imagenet/resnet50_mild.yaml', '--skip-device-check', '--no-data-check']):\n"
        "    try: main(args)\n"
        "    except SystemExit as e: assert not e.code, (args, e.code)\n"
        "heavy = [m for m in ('torch', 'composer', 'timm', 'torchvision') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


def test_python_dash_m_and_the_root_cli_hand_over():
    for cmd in ([sys.executable, "-m", "dlrecipes", "--help"], [sys.executable, "cli.py", "--help"]):
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "train" in out.stdout and "validate" in out.stdout


def test_the_process_s_own_command_skips_the_exit_sweep_and_a_call_from_python_does_not(monkeypatch):
    """``dlrecipes ...`` (main() reading sys.argv) collects once and freezes what is left as it ends, so the exit
    does not sweep torch's and Composer's objects again (1.4 s of a training process on 2 cores); main(args),
    called by a program that goes on (a test, a notebook), leaves its collector as it was."""
    import gc

    import pytest

    from dlrecipes.cli import main
    from dlrecipes.runtime import process_state

    monkeypatch.setattr(process_state, "_OWNS_PROCESS", False)  # main() below says so for this worker
    assert gc.get_freeze_count() == 0
    with pytest.raises(SystemExit):
        main(["--help"])
    assert gc.get_freeze_count() == 0
    monkeypatch.setattr(sys, "argv", ["dlrecipes", "--help"])
    try:
        with pytest.raises(SystemExit) as ended:
            main()
        assert ended.value.code == 0 and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_the_training_stack_is_imported_with_the_collector_paused_and_frozen_in_a_process_of_its_own(monkeypatch):
    """import_training_stack imports Composer with the cycle collector off (the 400,000 objects the import makes
    are not walked again each time they grow by a quarter) and back on after; in a command that owns its process
    they are then frozen, out of later collections; a notebook's are not; with Composer imported it does nothing."""
    import gc
    import importlib.abc
    import importlib.machinery

    from dlrecipes.runtime import process_state

    collector_on = []

    class Composer(importlib.abc.MetaPathFinder, importlib.abc.Loader):  # records the collector as it is imported
        def find_spec(self, name, path, target=None):
            return importlib.machinery.ModuleSpec(name, self) if name == "composer" else None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            collector_on.append(gc.isenabled())

    real = sys.modules.pop("composer", None)  # the real one, imported or not, is put back after
    monkeypatch.setattr(sys, "meta_path", [Composer(), *sys.meta_path])
    monkeypatch.setattr(process_state, "_OWNS_PROCESS", False)
    try:
        assert gc.isenabled() and gc.get_freeze_count() == 0
        process_state.import_training_stack()  # as a notebook's first training
        assert collector_on == [False] and gc.isenabled() and gc.get_freeze_count() == 0
        del sys.modules["composer"]
        process_state.command_owns_process()
        process_state.import_training_stack()  # as the console script's
        assert collector_on == [False, False] and gc.isenabled() and gc.get_freeze_count() > 0
        process_state.import_training_stack()
        assert len(collector_on) == 2  # imported already
    finally:
        gc.unfreeze()
        sys.modules.pop("composer", None)
        if real is not None:
            sys.modules["composer"] = real
