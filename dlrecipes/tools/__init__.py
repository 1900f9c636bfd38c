"""The commands that are tools around the four stages rather than stages themselves: benchmarks
(``bench``), model cost (``profile``), the multi-process launcher (``launch``), describing recipes
and registries (``show``, ``list``), FFCV conversion (``data convert``) and the offline
wheelhouse (``wheelhouse``).  They may use every stage; no stage imports them."""
