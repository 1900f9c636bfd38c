"""FFCV's .beton files: any dataset written as one, read back, and loaded for training (the ffcv extra).

Modules:
- :mod:`.compile`: FFCV's numba pipelines, compiled once per machine
- :mod:`.files`: FFCV .beton files: any dataset written, one read back
- :mod:`.loader`: FFCV loaders for training and evaluation (Composer DataSpecs)
"""
