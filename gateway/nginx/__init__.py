"""nginx in front of several tritonservers: its config (``config``), run here (``process``).

The config has an HTTP upstream over the servers' HTTP ports and a gRPC upstream (HTTP/2
cleartext, ``grpc_pass grpc://``) over their gRPC ports, both hashed by the ``X-User-Id`` header
with consistent hashing, retried on the next server when one fails. ``python -m gateway.nginx
render`` prints it (the deployments' way); ``process.Nginx`` runs nginx with it from a temp
prefix (the tests' and local use).

Only what a tenant needs is passed on: health, the server's metadata, and the metadata,
readiness and inference of the served models (``gateway.served.SERVED``). The operator APIs (model
control, shared memory, logging, trace) and each model's config and statistics are refused
(HTTP 403, gRPC ``PERMISSION_DENIED``; operators' addresses may read configs and statistics,
which perf_analyzer needs), the other models, steps of the served ones, are unknown (404,
``NOT_FOUND``), streaming inference is ``UNIMPLEMENTED``, and a client's admin key is never
forwarded. gRPC names the model inside the body: ``gateway/grpc.js`` (njs) reads it there.
Slow and greedy clients meet ``limit_conn`` per address, timeouts on headers and bodies, and
bounded buffers (docs/operations.md#security).

With limits, inference requests are shaped by token buckets per tenant and per model
(``gateway/shaping.py`` explains the file), and with ``openai`` OpenAI's embeddings API is
served beside Triton's (``gateway/openai.js``). With a rollout, a share of some models' requests
goes to canary servers that serve their new version (``rollout`` moves it on a running nginx).
"""
