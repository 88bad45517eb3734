"""Start, wait for and stop a real tritonserver over this repository (see launcher.py)."""

from server.launcher import Server, ServerConfig, ServerStartError

__all__ = ["Server", "ServerConfig", "ServerStartError"]
