"""The SLO tuner (``make tune``): the config with the most throughput within a p99 target.

``search`` models the candidates from the raw engine's curves and verifies the best,
``session`` runs a search against a real tritonserver and writes the winner as an overlay,
``model_analyzer`` hands single models to Triton Model Analyzer's own search. On top of bench's
harness (perf_analyzer, variants); nothing imports it.
"""
