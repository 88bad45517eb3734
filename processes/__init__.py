"""Child processes that never outlive their owner: a manager (``managed``) and its guard.

Every long-running process the repository starts (tritonserver, nginx, redis-server, the
benchmark's peers) is a ``ManagedProcess``: its own process group, a readiness check, a clean
stop, and a guard process (``guard``) that stops the group if the owner dies.
"""
