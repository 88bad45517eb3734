"""Benchmarks: ``make perf`` and the operations benchmarks the tests drive.

``harness`` runs a plan (perf_analyzer, pinning, inputs, the raw engine, Triton under test),
``report`` turns its rows into ratios, markdown and plots, ``peers`` holds the servers it is
compared with. ``overload``, ``contention``, ``load``, ``gateway`` and ``text_cache`` measure
one behaviour each. Above the rest of the repository; only the tuner (``tune``) and the tests
import it.
"""
