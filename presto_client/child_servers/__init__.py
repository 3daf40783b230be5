"""The servers that presto starts as child processes: their one home.

A job's engine with no URL of its own is served by a child of presto: the embedded engine
(:mod:`.embedded`: ``python -m presto_client.embedded``) or llama.cpp's llama-server
(:mod:`.llamacpp`: built once and run by ``scripts/llamacpp.sh``). Both live the one lifecycle of
:class:`~presto_client.child_servers.lifecycle.ChildServer`: started in a process group of their
own, waited for, checked to be the process answering, watched (a death is said at once, with its
cause and its log, and the server restarted), and stopped with everything they spawned.
:mod:`.process` is the operating system's side of a child, :mod:`.ports` the loopback ports.
"""

from __future__ import annotations

from presto_client.child_servers.lifecycle import ChildServer, ChildServerError

__all__ = ["ChildServer", "ChildServerError"]
