"""The commands that are tools around the four stages rather than stages themselves.

- :mod:`.bench`: trainer overhead against a plain PyTorch loop (``bench``);
- :mod:`.model_cost`: what a model costs (``profile``);
- :mod:`.launch`: the multi-process launcher (``launch``);
- :mod:`.evaluate`, :mod:`.export_run`, :mod:`.predict`: after training (``eval``, ``export``, ``predict``);
- :mod:`.data_convert`: FFCV and tensor-cache conversion (``data convert``, ``data inspect``);
- :mod:`.wheelhouse`: the offline wheelhouse (``wheelhouse``);
- :mod:`.describe`: what ``show``, ``list``, ``validate``, ``train``, ``runs``, ``compare`` and ``sweep`` print;
- :mod:`.preloaded` and :mod:`.preload_server`: trainings forked from a process that imported torch and Composer
  once (sweeps on a CPU, and the tests);
- :mod:`.sweep`: grids, random samples and Optuna searches of overrides (``sweep``).

They may use every stage; only the interface (:mod:`dlrecipes.api`, :mod:`dlrecipes.cli`, :mod:`dlrecipes.notebook`)
imports them."""
