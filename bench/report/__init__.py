"""The report of a run, from its points.csv and raw.csv: ratios, markdown, plots, attribution.

Pure functions over recorded rows, so that a report can be rebuilt (and tested) without a
server: ``points`` reads the rows, ``metrics`` computes the targets, ``markdown`` and ``plots``
write them, ``attribution`` says where a traced request's time went.
"""
