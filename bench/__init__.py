"""Benchmarks: perf_analyzer sweeps, raw engine, peers, SLO tuner, overload, contention, GPU check.

On top of the rest of the repository: it imports export, server and client; nothing imports it.
"""
