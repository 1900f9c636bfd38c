"""A wheelhouse for machines with no internet and their own torch (``dlrecipes wheelhouse``).

On a connected machine with dlrecipes installed (from a source checkout), this collects a
wheel of every package dlrecipes needs, at the versions installed here, except the torch
stack (torch, torchvision and what they need, CUDA libraries included): the target machine
keeps the torch it has (a cluster module, an NGC container).  The target Python may differ
from this one (``--python-version``): binary wheels are then downloaded for it, and packages
that exist only as source are built here when they are pure Python (FFCV, compiled, is built
only for this machine's Python).  On the target::

    pip install --no-index --find-links WHEELHOUSE --no-deps -r WHEELHOUSE/requirements.txt

``--no-deps`` because Composer 0.32.1 declares ``torch<2.7.1``; with a newer torch that
declaration is the only thing ``pip check`` reports.  tests/test_wheelhouse.py builds one and
installs it into a fresh venv whose torch comes from elsewhere, with ``--no-index``.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from dlrecipes.errors import UserError

TORCH_STACK = ("torch", "torchvision")
INSTALL_COMMAND = "pip install --no-index --find-links {out} --no-deps -r {out}/requirements.txt"


def _key(name: str) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def _name(pin: str) -> str:
    """The normalised project name of a pin such as ``numpy==2.2.6`` or ``tomli>=1.1``."""
    return _key(re.split(r"[=<>!~;\[ ]", pin, maxsplit=1)[0])


def closure(roots: Iterable[tuple[str, tuple[str, ...]]], python_version: str | None = None) -> dict[str, str]:
    """Distributions reachable from ``roots`` ((name, extras)), as {normalised name: pin}.

    Requirement markers are evaluated for ``python_version`` (the target's; default: this
    Python).  An installed distribution is pinned to the version installed (and tested) here; one
    only the target needs (a backport for an older Python) is not installed here, so it keeps the
    requiring package's specifier (``"tomli>=1.1"``) and pip picks the newest fitting release.
    """
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    environment = default_environment()
    if python_version is not None:
        environment.update(python_version=python_version, python_full_version=f"{python_version}.0")
    found: dict[str, str] = {}
    stack = [(name, set(extras), name) for name, extras in roots]
    while stack:
        name, extras, spec = stack.pop()
        if _key(name) in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if python_version is None or spec == name:
                raise UserError(
                    f"wheelhouse: {name} is needed but not installed here; install dlrecipes (with the "
                    "extras you want) in this environment first"
                ) from None
            found[_key(name)] = spec
            continue
        found[_key(name)] = f"{name}=={dist.version}"
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({**environment, "extra": e}) for e in (extras or {""})):
                stack.append((req.name, tuple(req.extras), f"{req.name}{req.specifier}"))
    return found


def requirements(extras: Iterable[str] = (), python_version: str | None = None) -> dict[str, str]:
    """What the wheelhouse holds, {name: pin}: dlrecipes' closure (with ``extras``) minus the torch stack's."""
    needed = closure([("dlrecipes", tuple(extras))], python_version)
    torch_stack = closure([(name, ()) for name in TORCH_STACK])
    return {name: pin for name, pin in needed.items() if name not in torch_stack and name != "dlrecipes"}


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def _pip_error(result: subprocess.CompletedProcess) -> str:
    """pip's own error line (the last line is often only a hint)."""
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith("error")]
    return (errors or lines or ["(no output)"])[-1]


def _source_root() -> Path:
    import dlrecipes

    root = Path(dlrecipes.__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file():
        raise UserError("wheelhouse: run it from dlrecipes installed from a source checkout (pip install -e .)")
    return root


def _build_dlrecipes(out: Path) -> subprocess.CompletedProcess:
    """dlrecipes' own wheel, from a clean copy of the package (a checkout's build/ may hold stale modules)."""
    import shutil
    import tempfile

    root = _source_root()
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(root / name, Path(tmp) / name)
        shutil.copytree(root / "dlrecipes", Path(tmp) / "dlrecipes", ignore=shutil.ignore_patterns("__pycache__"))
        return _pip("wheel", "--no-deps", "--wheel-dir", str(out), tmp)


def _target_args(python_version: str | None) -> list[str]:
    """pip's flags for another Python (binary wheels only), for this machine's platforms."""
    if python_version is None:
        return []
    from packaging import tags

    platforms = list(dict.fromkeys(t.platform for t in tags.sys_tags()))
    digits = python_version.replace(".", "")
    args = [
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "--abi",
        f"cp{digits}",
        "--abi",
        "abi3",
        "--abi",
        "none",
    ]
    for platform in platforms:
        args += ["--platform", platform]
    return args


def _same_python(python_version: str | None) -> bool:
    return python_version is None or python_version == f"{sys.version_info.major}.{sys.version_info.minor}"


def _download(pins: list[str], out: Path, python_version: str) -> list[str]:
    """Download binary wheels of ``pins`` for another Python; returns the pins that have none."""
    pending, without = list(pins), []
    while pending:
        result = _pip("download", "--no-deps", "--dest", str(out), *_target_args(python_version), *pending)
        if result.returncode == 0:
            return without
        missing = re.search(r"No matching distribution found for (\S+)", result.stderr)
        if missing is None:
            raise UserError(f"wheelhouse: pip download failed: {_pip_error(result)}")
        name = _name(missing.group(1))
        without += [p for p in pending if _name(p) == name]
        pending = [p for p in pending if _name(p) != name]
    return without


def _build(pins: list[str], out: Path, any_python_only: bool) -> None:
    """Build wheels of ``pins`` from source (with ``any_python_only``: refuse compiled ones)."""
    for pin in pins:
        before = set(out.glob("*.whl"))
        result = _pip("wheel", "--no-deps", "--wheel-dir", str(out), pin)
        if result.returncode != 0:
            raise UserError(f"wheelhouse: could not build {pin}: {_pip_error(result)}")
        built = set(out.glob("*.whl")) - before
        if any_python_only and any(not w.name.endswith("-none-any.whl") for w in built):
            for wheel in built:
                wheel.unlink()
            raise UserError(
                f"wheelhouse: {pin} has no wheel for the target Python and compiles; build the "
                "wheelhouse on a machine with the target's Python version (or leave out its extra)"
            )


def build_wheelhouse(out: Path, python_version: str | None = None, extras: Iterable[str] = ()) -> Path:
    """Fill ``out`` with wheels and write ``out/requirements.txt``; returns that file."""
    extras = tuple(extras)
    out.mkdir(parents=True, exist_ok=True)
    pins = [pin for _, pin in sorted(requirements(extras, python_version).items())]
    if _same_python(python_version):
        result = _pip("wheel", "--no-deps", "--wheel-dir", str(out), *pins)  # cached wheels, or built here
        if result.returncode != 0:
            raise UserError(f"wheelhouse: pip wheel failed: {_pip_error(result)}")
    else:
        _build(_download(pins, out, python_version), out, any_python_only=True)
    result = _build_dlrecipes(out)
    if result.returncode != 0:
        raise UserError(f"wheelhouse: building the dlrecipes wheel failed: {_pip_error(result)}")
    torch_version = metadata.version("torch")
    python = python_version or "{}.{}".format(*sys.version_info[:2])
    lines = [
        f"# dlrecipes wheelhouse for Python {python}; built beside torch "
        f"{torch_version}; the target brings its own torch (>= 2.6) and torchvision.",
        "# Install with: " + INSTALL_COMMAND.format(out=out),
        *pins,
        f"dlrecipes=={metadata.version('dlrecipes')}",
    ]
    requirements_file = out / "requirements.txt"
    requirements_file.write_text("\n".join(lines) + "\n")
    return requirements_file


def format_wheelhouse(requirements_file: Path) -> str:
    """What ``wheelhouse`` made and how to install it on the target machine."""
    out = requirements_file.parent
    wheels = len(list(out.glob("*.whl")))
    return (
        f"{wheels} wheels in {out} ({requirements_file.name} lists them). On the target machine, beside its torch:\n"
        f"  {INSTALL_COMMAND.format(out=out)}"
    )
