"""The models clients may call through the gateway; the others are steps of these.

The nginx config routes them (``gateway.nginx.config``), a rollout may carry them
(``gateway.nginx.rollout``), and the exporter and the comparator label their series with them.
"""

from __future__ import annotations

from pipelines import classification, embedding

__all__ = ["SERVED"]

SERVED = (*classification.SERVED, *embedding.SERVED)
