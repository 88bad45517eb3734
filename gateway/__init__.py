"""What stands in front of the tritonservers: routing, traffic shaping, OpenAI's embeddings API.

``nginx`` renders and runs the nginx gateway (sharding, failover, token buckets, and with
``openai.js`` in its njs module OpenAI's ``/v1/embeddings``), ``shaping`` holds the token buckets
and their limits file, ``metrics`` turns nginx's shaping log into Prometheus counters, and
``router`` is the same routing and shaping in-process, for a Python caller without a proxy.
``python -m gateway serve`` runs a tritonserver with the gateway in front.
"""
