"""Plain functions and model contracts shared by export/, model_repository/, client/ and tests/.

Nothing here imports Triton: the Python-backend ``model.py`` files are thin adapters over these
functions, and the tests and benchmarks call the very same code in-process.
"""
