"""presto-client: fast, exact LLM power sampling (PowerMH, EntropyCut, MultiTryMH) with PreSTO.

The public Python API::

    from presto_client import SamplerConfig, run_chain
    result = await run_chain(engine, prompt_ids, SamplerConfig(sampler="power_mh"),
                             traversal="stream", size=8, seed=0)

``engine`` is any :class:`~presto_client.core.engine_protocol.Engine`:
``presto_client.backends.create_engine(spec)`` for a vLLM/SGLang/OpenAI-compatible server, or
:class:`ReferenceEngine` for the exact in-process model. Batch jobs, run directories and engine
comparisons are in :mod:`presto_client.orchestration` and the ``presto`` command.
"""

import importlib.metadata

from presto_client.core.engine_protocol import (
    Engine,
    ProposalRequest,
    ScoredTokens,
    ScoreRequest,
    ScoreSpec,
)
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import ChainResult, run_chain
from presto_client.core.sampler_config import SAMPLERS, TRAVERSALS, SamplerConfig
from presto_client.core.stats import ChainStats, RoundRecord, TransitionRecord
from presto_client.errors import (
    ConfigError,
    EngineError,
    EngineRequestError,
    EngineUnavailableError,
    InvalidResponseError,
    PrestoError,
    ProbeError,
)

try:  # the version is pyproject's, as installed (one place)
    __version__ = importlib.metadata.version("presto-client")
except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "SAMPLERS",
    "TRAVERSALS",
    "ChainResult",
    "ChainStats",
    "ConfigError",
    "Engine",
    "EngineError",
    "EngineRequestError",
    "EngineUnavailableError",
    "InvalidResponseError",
    "PrestoError",
    "ProbeError",
    "ProposalRequest",
    "ReferenceEngine",
    "ReferenceModel",
    "RoundRecord",
    "SamplerConfig",
    "ScoreRequest",
    "ScoreSpec",
    "ScoredTokens",
    "TransitionRecord",
    "__version__",
    "run_chain",
]
