"""What Ray prints on the driver's terminal, routed through logging.

Ray's driver prints two kinds of lines to stdout/stderr, coloured and prefixed: the output of its
worker processes (``(ChainWorker pid=123) ...``: a worker's log records, its errors), and the
messages of its own processes (``(raylet) ...``: a dead worker's multi-line cause, a full disk,
the autoscaler's events), which repeat what the job says itself or concern Ray only. Here the
former become this module's WARNING records (plain text, so a worker's error still reaches the
user), the latter DEBUG records (``-v`` shows them; the session's folder keeps Ray's own logs).

Ray has no setting for this (``log_to_driver=False`` drops a worker's errors too), so the
function Ray prints with is replaced: the handler it registers for worker output and the module
function its error listener calls. Both are Ray's private names; a Ray without them is left as is.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger("presto_client.orchestration.ray")

RAY_OWN = frozenset({"raylet", "autoscaler", "gcs_server"})
"""The ``pid`` Ray gives the lines of its own processes (a worker's is its number)."""

HANDLER = "ray_print_logs"
"""The name ``ray.init`` registers its worker-output printer under."""

_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


def _plain(line: str) -> str:
    """A line without colours or control characters (a worker's line may carry any)."""
    return _CONTROL.sub("", line).rstrip()


def log_ray_output(data: Mapping[str, Any], ignore_prefix: bool = False) -> None:
    """One batch of lines Ray would print (``ray._private.worker.print_to_stdstream``'s)."""
    pid = str(data.get("pid", "?"))
    # (one record a line: a message of several lines is one line on the terminal each)
    parts = [part for line in data.get("lines", ()) for part in str(line).splitlines()]
    lines = [text for text in map(_plain, parts) if text]
    if pid in RAY_OWN:
        for text in lines:
            logger.debug("(%s) %s", pid, text)
        return
    who = data.get("actor_name") or data.get("task_name") or "worker"
    for text in lines:
        logger.warning("ray %s pid=%s: %s", who, pid, text)


class RayOutput:
    """Ray's printing replaced by :func:`log_ray_output` while installed."""

    def __init__(self) -> None:
        self._module: Any = None
        self._original: Callable[..., None] | None = None

    def install(self) -> bool:
        """Replace Ray's printer (after ``ray.init``, which registers it); whether it was."""
        try:
            from ray._private import worker as ray_worker

            dispatcher = ray_worker.global_worker_stdstream_dispatcher
            original = ray_worker.print_to_stdstream
        except (ImportError, AttributeError):
            logger.debug("ray output: this Ray has no printer to replace; left as is")
            return False
        # (the error listener looks the function up at each message; the handler is a copy)
        ray_worker.print_to_stdstream = log_ray_output
        if any(name == HANDLER for name, _ in getattr(dispatcher, "handlers", ())):
            dispatcher.remove_handler(HANDLER)
            dispatcher.add_handler(HANDLER, log_ray_output)
        self._module, self._original = ray_worker, original
        return True

    def uninstall(self) -> None:
        if self._module is not None:
            self._module.print_to_stdstream = self._original
            self._module = self._original = None
