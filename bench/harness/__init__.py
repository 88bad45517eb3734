"""The benchmark run behind ``make perf``: rounds of interleaved, pinned measurements.

Every round measures, on the same machine within minutes of each other: the raw engine
in-process, each serving variant of Triton (perf_analyzer, concurrency and Poisson-rate sweeps,
gRPC and HTTP), and the peer server driven by the same perf_analyzer with the same JSON payload.
Ratios are taken within a round, then summarized over rounds (median and spread), because CPU
speed here drifts by tens of percent from minute to minute.

``plan`` says what a run measures, ``servers`` holds the processes it measures, ``runner`` runs
the rounds; perf_analyzer, pinning (``affinity``), inputs, the raw engine and Triton's traces
and statistics have a module each.
"""
