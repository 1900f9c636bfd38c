"""The foundation every part of dlrecipes may use, and which uses none of them.

- :mod:`.addresses`: what may name a run: an object store's schemes, look-alike addresses and control characters
  refused, S3's key limit;
- :mod:`.durations`: the recipe's time strings (``10ep``, ``200ba``, ``0.5dur``) and their parser;
- :mod:`.distributed`: this process among the launcher's processes (rank, world size, torchrun's environment), the
  one batch-divisibility check, and agreement among the ranks (host-side reductions);
- :mod:`.devices`: the one device vocabulary (``auto``, ``cpu``, ``gpu``), resolving ``auto``, the GPUs this
  machine has, and whether it can run a device (and a recipe's precision, FSDP and microbatching);
- :mod:`.outputs`: what a model's outputs are and how their metrics are named;
- :mod:`.precision`: what each ``trainer.precision`` means (autocast dtype, GradScaler, half data, fused optimizer);
- :mod:`.lr_scaling`: ``optimizer.scale_lr``'s keys, check, rule and report;
- :mod:`.ranges`: the ranges a factory's parameters may take (``Positive``, ``Probability``, ``Range``);
- :mod:`.param_docs`: what a factory's parameters mean, read from its docstring or ``Annotated`` docs;
- :mod:`.run_context`: what a callback or logger factory is told of the run being built;
- :mod:`.secrets`: what counts as a secret, the refusal of one in a recipe key, and the one redaction every
  writer (recipe.yaml, ``show``, summary.json, logs, error lines, trackers) calls.

The machinery of the process a run lives in (signals, state put back, the fork server, the host's answers) is
:mod:`dlrecipes.runtime`'s. Besides :mod:`dlrecipes.errors` these modules import nothing of dlrecipes, and torch
only inside functions that need it, so validation stays fast.
"""
