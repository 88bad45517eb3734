"""What stands in front of several tritonservers: routing and traffic shaping.

``nginx`` renders and runs the nginx gateway (sharding, failover, token buckets), ``shaping``
holds the token buckets and their limits file, ``metrics`` turns nginx's shaping log into
Prometheus counters, and ``router`` is the same routing and shaping in-process, for a Python
caller without a proxy.
"""
