"""What the ``export`` callback accepts, checked at validation (light: imports no torch, no onnx)."""

from __future__ import annotations

from dlrecipes.errors import RecipeError

EXPORT_FORMATS = ("torchscript", "onnx")
ONNX_PACKAGES = ("onnx", "onnxruntime")  # the `onnx` extra: writing/checking the file, running it


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (validation stays fast)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: sys.modules holds None for it
        return False


def check_export(params: dict, path: str) -> None:
    formats = params.get("formats", EXPORT_FORMATS)
    if not formats or len(set(formats)) != len(formats):
        raise RecipeError(
            f"{path}.formats: give each of {', '.join(EXPORT_FORMATS)} at most once, at least one, got {list(formats)}"
        )
    for key in ("batch_size", "verify_batch_size"):
        if params.get(key, 1) < 1:
            raise RecipeError(f"{path}.{key}: must be at least 1, got {params[key]}")
    for key in ("atol", "rtol"):
        if params.get(key, 0.0) < 0:
            raise RecipeError(f"{path}.{key}: must be 0 or more, got {params[key]}")
    missing = [m for m in ONNX_PACKAGES if "onnx" in formats and not _installed(m)]
    if missing:
        raise RecipeError(missing_onnx_message(missing, path))


def missing_onnx_message(missing: list[str], path: str = "callbacks.export") -> str:
    return (
        f"{path}.formats: 'onnx' needs the {' and '.join(missing)} package{'s' * (len(missing) > 1)}: "
        f"pip install 'dlrecipes[onnx]' (or export TorchScript only: {path}.formats=[torchscript])"
    )
