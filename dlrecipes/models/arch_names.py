"""timm and torchvision architecture names, shipped as lists so that validation imports neither.

``dlrecipes validate`` of a recipe naming ``arch: resnet50`` looks the name up in
``timm_models.txt`` / ``torchvision_models.txt`` (written from the installed libraries by
``python -m dlrecipes.models.arch_names``; the first line records their version).  A name the
list does not know may come from a newer library, and an older library may lack a listed name,
so only then is the library imported and asked (a few seconds); a name it does not know either
is an error with suggestions.
tests/test_models.py compares the lists with the installed libraries.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from dlrecipes.errors import RecipeError, did_you_mean

FAMILIES = ("timm", "torchvision")
HINTS = {
    "timm": "`python -c \"import timm; print(timm.list_models('resnet*'))\"` lists them.",
    "torchvision": '`python -c "import torchvision; print(torchvision.models.list_models())"` lists them.',
}


@cache
def shipped(family: str) -> tuple[str, frozenset[str]]:
    """(library version the list was written from, the names)."""
    text = resources.files(__package__).joinpath(f"{family}_models.txt").read_text()
    lines = text.splitlines()
    return lines[0].removeprefix(f"# {family} ").strip(), frozenset(n for n in lines[1:] if n and not n.startswith("#"))


def installed(family: str) -> tuple[str, list[str]]:
    """(version, names) of the installed library (imports it)."""
    if family == "timm":
        import timm

        return timm.__version__, timm.list_models()
    import torchvision

    return torchvision.__version__.split("+")[0], torchvision.models.list_models(module=torchvision.models)


def _older_than_list(family: str) -> bool:
    """Whether the installed library predates the list (then a listed name may be missing from it)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import InvalidVersion, Version

    try:
        return Version(version(family).split("+")[0]) < Version(shipped(family)[0])
    except (PackageNotFoundError, InvalidVersion):
        return True


def check_arch(family: str, arch: str, path: str) -> None:
    """``arch`` must be a model of ``family``; imports the library only for a name the list lacks, or
    when the installed library is older than the list (names are added far more often than removed)."""
    if arch in shipped(family)[1] and not _older_than_list(family):
        return
    names = installed(family)[1]
    if arch not in names:
        what = "architecture" if family == "timm" else "classification model"
        raise RecipeError(f"{path}.arch: unknown {family} {what} '{arch}'{did_you_mean(arch, names)}. {HINTS[family]}")


def write_lists() -> None:
    """Rewrite the shipped lists from the installed libraries."""
    folder = resources.files(__package__)
    for family in FAMILIES:
        version, names = installed(family)
        text = f"# {family} {version}\n" + "\n".join(sorted(names)) + "\n"
        with resources.as_file(folder.joinpath(f"{family}_models.txt")) as path:
            path.write_text(text)
            print(f"{path}: {len(names)} names from {family} {version}")


if __name__ == "__main__":
    write_lists()
