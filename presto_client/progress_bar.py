"""The progress of a job on the terminal: a tqdm bar, or plain lines where there is none.

A face (``presto run``): a :class:`~presto_client.orchestration.executors.orchestrator.ChainSink`
that counts Metropolis–Hastings transitions as the rounds come in.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from presto_client.core.methods import baseline_names
from presto_client.core.stats import RoundRecord
from presto_client.orchestration.executors.orchestrator import ChainOutcome, ChainSpec


def duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class ProgressBar:
    """Progress of a job in Metropolis–Hastings transitions (a
    :class:`~presto_client.orchestration.executors.orchestrator.ChainSink`): on a terminal a tqdm
    bar with the current arm, the rate and the ETA, kept at the end; elsewhere (a log file, CI)
    one plain line every ``every_s`` seconds and at the end.

    A baseline arm makes no transition: where a job has some (``baseline_share`` of its chains),
    the unit is the *step*, an MH transition or a baseline's block (one engine call), so that
    the baselines' work counts and the ETA holds."""

    def __init__(
        self,
        mode: str | None,
        stream: TextIO | None = None,
        *,
        per_chain: int = 1,
        baseline_blocks: int = 1,
        baseline_share: float = 0.0,
        every_s: float = 10.0,
    ) -> None:
        self.mode = mode  # "bar" | "lines" | None
        self.enabled = mode == "bar"  # (the tqdm bar needs log lines redirected around it)
        self.stream = stream or sys.stderr
        self.per_chain = max(1, per_chain)
        self.baseline_blocks = max(1, baseline_blocks)
        self.baseline_share = baseline_share
        self.unit = "step" if baseline_share > 0 else "transition"
        self._baselines = frozenset(baseline_names())
        self.every_s = every_s
        self.bar: Any = None
        self.failed = 0
        self.total = 0
        self.done = 0
        self.chains_total = 0
        self.chains_done = 0
        self.arm = ""
        self._by_chain: dict[str, int] = {}
        self._t0 = time.monotonic()
        self._start_done = 0
        self._last_line = 0.0
        self._active = False
        self._shown = False

    def start(self, total: int, finished: int) -> None:
        if self.mode is None or finished >= total:
            return
        self.chains_total, self.chains_done = total, finished
        share = self.baseline_share
        mean = (1 - share) * self.per_chain + share * self.baseline_blocks
        self.total, self.done = round(total * mean), round(finished * mean)
        self._t0 = self._last_line = time.monotonic()
        self._start_done = self.done
        self._active = True

    def _show(self) -> None:
        """The bar or the ``[started]`` line, at the first chain: a job whose probe fails
        never starts, and shows no progress at all."""
        if self._shown or not self._active:
            return
        self._shown = True
        self._t0 = self._last_line = time.monotonic()
        if self.mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.total,
                initial=self.done,
                unit=self.unit,
                desc=f"{self.unit}s",
                file=self.stream,
                dynamic_ncols=True,
                leave=True,
                smoothing=0.1,
            )
        else:
            self._line("started")

    def chain_started(self, spec: ChainSpec, replica: int) -> None:
        self._show()

    def round_done(self, spec: ChainSpec, record: RoundRecord, queue_s: float) -> None:
        if not self._active:
            return
        self._show()
        baseline = spec.traversal in self._baselines
        n = int(record.kind == "propose") if baseline else int(record.transitions)
        self.done += n
        self._by_chain[spec.chain_id] = self._by_chain.get(spec.chain_id, 0) + n
        self.arm = spec.arm
        if self.bar is not None:
            self.bar.set_postfix_str(self._postfix(), refresh=False)
            self.bar.update(n)
        elif time.monotonic() - self._last_line >= self.every_s:
            self._line()

    def chain_done(self, outcome: ChainOutcome) -> None:
        if not self._active:
            return
        self._show()
        self.chains_done += 1
        # A chain that stopped early (failed) will not bring its remaining transitions.
        expected = (
            self.baseline_blocks if outcome.spec.traversal in self._baselines else self.per_chain
        )
        missing = expected - self._by_chain.pop(outcome.spec.chain_id, 0)
        if missing > 0:
            self.total -= missing
        if not outcome.ok:
            self.failed += 1
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.set_postfix_str(self._postfix(), refresh=False)
            self.bar.refresh()
        elif not outcome.ok or time.monotonic() - self._last_line >= self.every_s:
            self._line()

    def _postfix(self) -> str:
        failed = f", {self.failed} failed" if self.failed else ""
        return f"{self.arm}, chains {self.chains_done}/{self.chains_total}{failed}"

    def _line(self, what: str = "") -> None:
        self._last_line = now = time.monotonic()
        rate = (self.done - self._start_done) / max(now - self._t0, 1e-9)
        left = max(self.total - self.done, 0)
        eta = duration(left / rate) if rate > 0 and what != "started" else "-"
        pct = 100.0 * self.done / self.total if self.total else 100.0
        arm = f", arm {self.arm}" if self.arm else ""
        failed = f" ({self.failed} failed)" if self.failed else ""
        print(
            f"progress: {self.done}/{self.total} {self.unit}s ({pct:.0f}%), chains "
            f"{self.chains_done}/{self.chains_total}{failed}{arm}, {rate:.1f} {self.unit}s/s, "
            f"ETA {eta}" + (f" [{what}]" if what else ""),
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self._active and self._shown:
            self._line("done")
        self._active = False

    @contextlib.contextmanager
    def logging_redirected(self) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        from tqdm.contrib.logging import logging_redirect_tqdm

        with logging_redirect_tqdm():
            yield
