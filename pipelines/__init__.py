"""Plain functions and model contracts shared by export/, model_repository/, client/ and tests/.

Nothing here imports Triton but ``pipelines.backend``, the glue that runs inside tritonserver's
Python stub: the ``model.py`` files are thin adapters over these functions through it, and the
tests and benchmarks call the very same functions in-process.
"""
