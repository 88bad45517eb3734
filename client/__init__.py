"""Clients for the served models (tritonclient HTTP/gRPC, sync and asyncio) and the CLI."""
