"""What stands in front of the tritonservers: routing, traffic shaping, OpenAI's embeddings API.

``nginx`` renders and runs the nginx gateway (sharding, failover, token buckets, and with
``openai.js`` in its njs module OpenAI's ``/v1/embeddings``), ``shaping`` reads the buckets'
limits file, and ``access_log`` turns nginx's access log into Prometheus counters. nginx is the
one shaping engine. ``router`` is only the sharding and failover, client-side: a consistent-hash
ring for a Python caller that talks to several servers without a proxy in between.
``python -m gateway serve`` runs a tritonserver with the gateway in front.
"""
