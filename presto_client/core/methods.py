"""The registry of methods: every traversal (an MH chain) and baseline arm, one entry each.

A method is what an arm runs. Its entry says everything the rest of the code asks about it: its
name, its kind (an MH traversal or a baseline without MH), how its runner is made, which size
parameter it takes (``round``: ``N_pf`` proposals a round; ``window``: ``W`` in flight; ``none``)
and whether it replays the sequential chain token for token (same seed, same response: the
summary checks that identity and tests the equivalence of its statistics). Every list of names
(the job config, the arms of a plan, ``presto validate``, the summary's order, ``run_chain``) is
read from here; a new method is one :func:`register_method` (or :func:`register_traversal` for a
tree rule run by the round runner) and its tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

from presto_client.core.baseline_runners import BASELINE_TEMPERATURES, BaselineRunner, Temperature
from presto_client.core.chain_runner import ChainRunner, ChainSetup
from presto_client.core.presto_runner import PrestoRunner
from presto_client.core.sample_baselines import (
    DEFAULT_SAMPLES,
    BestOfNRunner,
    MajorityVoteRunner,
    PowerSMCRunner,
    SampleSetRunner,
)
from presto_client.core.sequential_runner import SequentialRunner
from presto_client.core.settings import ROUND_SIZE, WINDOW
from presto_client.core.stream.walk import StreamRunner
from presto_client.core.tree import TRAVERSAL_RULES, PlanRule

MethodKind = Literal["mh", "baseline"]
SizeParameter = Literal["round", "window", "samples", "none"]

DEFAULT_SIZES: dict[SizeParameter, int | None] = {
    "round": ROUND_SIZE,
    "window": WINDOW,
    "samples": DEFAULT_SAMPLES,
    "none": None,
}


RunnerFactory = Callable[[ChainSetup], ChainRunner]


@dataclass(frozen=True, slots=True)
class Method:
    """One traversal or baseline arm."""

    name: str
    kind: MethodKind
    make_runner: RunnerFactory
    size: SizeParameter = "none"
    replays: bool = False
    """The chain is the sequential chain's, token for token, for the same seed."""
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"a method name must be a non-empty string, got {self.name!r}")
        if any(c in self.name for c in "/\\ \t\n,"):
            raise ValueError(f"method name {self.name!r} must have no '/', ',' or spaces")
        if self.kind not in get_args(MethodKind):
            raise ValueError(f"method {self.name!r}: kind must be one of {get_args(MethodKind)}")
        if self.size not in get_args(SizeParameter):
            raise ValueError(f"method {self.name!r}: size must be one of {get_args(SizeParameter)}")
        if not callable(self.make_runner):
            raise ValueError(
                f"method {self.name!r}: make_runner {self.make_runner!r} is not callable"
            )

    def default_size(self) -> int | None:
        return DEFAULT_SIZES[self.size]


METHODS: dict[str, Method] = {}
"""name -> method, in registration order (the built-ins first)."""


def register_method(method: Method) -> Method:
    """Add ``method``; a name already taken (by a traversal or a baseline) is refused."""
    if not isinstance(method, Method):
        raise ValueError(f"{method!r} is not a presto_client.core.methods.Method")
    taken = METHODS.get(method.name)
    if taken is not None:
        raise ValueError(
            f"method {method.name!r} is registered already (a {taken.kind} method); choose "
            "another name"
        )
    METHODS[method.name] = method
    return method


def unregister_method(name: str) -> None:
    """Remove a registered method (tests, plugins unloading)."""
    METHODS.pop(name, None)


def round_method(
    name: str, rule: PlanRule, *, replays: bool = False, description: str = ""
) -> Method:
    """A method whose rounds are planned by the tree rule ``rule`` and walked by the
    :class:`~presto_client.core.presto_runner.PrestoRunner`."""
    if not callable(rule):
        raise ValueError(f"traversal {name!r}: {rule!r} is not callable")

    def make(setup: ChainSetup) -> ChainRunner:
        return PrestoRunner(setup, traversal=name, rule=rule)

    return Method(name, "mh", make, "round", replays, description)


def register_traversal(
    name: str, rule: PlanRule, *, replays: bool = False, description: str = ""
) -> Method:
    """Make the tree rule ``rule`` available as ``traversals: [name]`` (a round method)."""
    return register_method(round_method(name, rule, replays=replays, description=description))


def baseline_method(name: str, temperature: Temperature, description: str = "") -> Method:
    """A baseline arm: one plain sample of the whole response at ``temperature(sampler)``."""

    def make(setup: ChainSetup) -> ChainRunner:
        return BaselineRunner(setup, temperature=temperature(setup.sampler))

    return Method(name, "baseline", make, "none", False, description)


def get_method(name: str) -> Method:
    """The method called ``name``; an unknown name is a ``ValueError`` listing the valid ones."""
    found = METHODS.get(name)
    if found is None:
        raise ValueError(
            f"unknown traversal {name!r}; valid traversals are: {', '.join(method_names())}"
        )
    return found


def method_names(kind: MethodKind | None = None) -> tuple[str, ...]:
    """The registered methods (of one kind), in registration order."""
    return tuple(n for n, m in METHODS.items() if kind is None or m.kind == kind)


def traversal_names() -> tuple[str, ...]:
    """The MH traversals."""
    return method_names("mh")


def baseline_names() -> tuple[str, ...]:
    """The baseline arms (no MH)."""
    return method_names("baseline")


def arm_traversal_names() -> tuple[str, ...]:
    """Everything an arm may run: the MH traversals, then the baselines."""
    return (*traversal_names(), *baseline_names())


def replaying_names() -> tuple[str, ...]:
    """The methods that replay the sequential chain token for token."""
    return tuple(n for n, m in METHODS.items() if m.replays)


SEQUENTIAL = "sequential"
"""The method every other is measured against (speedups, identity, equivalence)."""

register_method(
    Method(SEQUENTIAL, "mh", SequentialRunner, "none", True, "one engine call per transition")
)
for _name, _rule in TRAVERSAL_RULES.items():
    register_traversal(_name, _rule, replays=_name == "crn")
register_method(
    Method(
        "stream",
        "mh",
        StreamRunner,
        "window",
        True,
        "a window of in-flight proposals, walked as their tokens arrive",
    )
)
for _name, _temperature in BASELINE_TEMPERATURES.items():
    register_method(baseline_method(_name, _temperature))


def sample_set_method(name: str, runner: type[SampleSetRunner], description: str) -> Method:
    """A baseline arm of ``N`` samples (``N``: the job's ``samples``)."""

    return Method(name, "baseline", runner, "samples", False, description)


for _name, _runner, _description in (
    ("best_of_n", BestOfNRunner, "N base-model samples, the most likely one (mean log p0)"),
    ("majority_vote", MajorityVoteRunner, "N base-model samples, graded by their majority"),
    ("power_smc", PowerSMCRunner, "Power-SMC: N particles towards p0^alpha (approximate)"),
):
    register_method(sample_set_method(_name, _runner, _description))
del _name, _rule, _temperature, _runner, _description
