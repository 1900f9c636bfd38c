"""The auxiliary commands: tools around the stages (load, validate, build, fit, and after training:
:mod:`dlrecipes.after_training`) rather than stages themselves.

- :mod:`.bench`: trainer overhead against a plain PyTorch loop (``bench``);
- :mod:`.model_cost`: what a model costs (``profile``);
- :mod:`.launch`: the multi-process launcher (``launch``);
- :mod:`.data_convert`: FFCV and tensor-cache conversion (``data convert``, ``data inspect``);
- :mod:`.wheelhouse`: the offline wheelhouse (``wheelhouse``);
- :mod:`.describe`: what ``show``, ``list``, ``validate``, ``train``, ``eval``, ``predict``, ``runs``, ``compare``
  and ``sweep`` print;
- :mod:`.sweep`: grids, random samples and Optuna searches of overrides (``sweep``; on a CPU its trainings are
  forked from a process that imported torch and Composer once: :mod:`dlrecipes.runtime.fork_server`).

They may use every stage; only the interface (:mod:`dlrecipes.api`, :mod:`dlrecipes.cli`, :mod:`dlrecipes.notebook`)
imports them."""
