"""The stage after training: what a trained run (or its export) is used for, beside load, validate, build and fit.

- :mod:`.target`: what ``eval``, ``export`` and ``predict`` were pointed at: a run directory or a checkpoint file,
  its recorded recipe and the checkpoint (``best``, ``latest`` or a path);
- :mod:`.trained_model`: the recipe's network with the checkpoint's weights, in an evaluation Trainer, and its data;
- :mod:`.evaluate`: ``eval``, the checkpoint evaluated (the report, test-time augmentation);
- :mod:`.export`: ``export``, the checkpoint as TorchScript/ONNX files, checked against the network;
- :mod:`.predict`: ``predict``, the classes of image files (or tensors) by a run's checkpoint or an export directory.

- :mod:`.opened`: :func:`~.opened.open_trained`, the one sequence each of them starts with (the target opened in the
  run store, found, its recorded recipe resolved with the command's overrides), yielding the :class:`~.opened.Trained`
  the others take.

The interface (:mod:`dlrecipes.api`) calls them; what ``eval`` and ``predict`` print is
:mod:`dlrecipes.tools.describe`'s. These modules use the load, validate and build stages and the run's records;
they import neither the fit stage nor the tools nor the interface.
"""
