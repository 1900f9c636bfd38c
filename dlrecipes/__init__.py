"""dlrecipes: composable YAML recipes for training image classifiers on MosaicML Composer.

The path through the package is load -> validate -> build -> fit:
:mod:`dlrecipes.recipe` (YAML, ``base:``, overrides), :mod:`dlrecipes.config` (schema),
:mod:`dlrecipes.builders` (registry name -> object), :mod:`dlrecipes.fit` (Composer).
"""

__version__ = "0.1.0"
