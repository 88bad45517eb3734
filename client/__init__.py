"""Clients for the served models (tritonclient HTTP/gRPC, sync and asyncio) and the CLI.

    from client import EmbedClient, ClassifyClient, Router
    with EmbedClient("localhost:8000") as c:
        vectors = c.embed(["a text"])

``Router`` spreads requests over several servers by a consistent hash of a key, with failover.
"""

from client.classify import AsyncClassifyClient, ClassifyClient, Prediction
from client.connection import ClientError
from client.embed import AsyncEmbedClient, EmbedClient
from client.router import AllShardsFailed, Router

__all__ = [
    "AllShardsFailed",
    "AsyncClassifyClient",
    "AsyncEmbedClient",
    "ClassifyClient",
    "ClientError",
    "EmbedClient",
    "Prediction",
    "Router",
]
