"""Monitoring as code: the service-level objectives and the Prometheus rules made from them."""
