"""Baselines that spend a power sampler's compute on several plain samples: the comparators
reviewers ask for, in the same job and table as the MH arms, on the same prompts and seeds.

* ``best_of_n``: ``N`` samples from the base model (temperature 1); the one with the highest
  mean ``log p0`` per token (its own likelihood, EOS-truncated) is the answer.
* ``majority_vote``: ``N`` samples from the base model; the chain's answer is the first, and the
  others are its :attr:`~presto_client.core.chain_runner.ChainResult.alternatives`: a graded job
  grades them all and scores the chain by the majority of the extracted answers (maj@N).
* ``power_smc`` (Power-SMC, arXiv 2602.10273): ``N`` particles extended block by block at the
  proposal temperature ``τ``, weighted by ``p0^α / q_τ`` of every block, resampled (systematic)
  when the effective sample size falls below ``smc_ess_threshold × N``; the answer is one particle
  drawn by its final weight. **Approximate**: its law is ``π_α`` only as the particles grow (the
  MH arms are exact at any size); with top-K logprobs ``log q_τ`` is the middle of its
  certified interval.

``N`` is the arm's size (the job's ``samples``). Every sample is generated block by block, so
under the stop rule (``stop_at_eos``) a sample whose response holds an EOS after a block stops
there, as an MH chain does, and the arm stops when every sample has. Every draw (seeds,
resampling, the final pick) is keyed by the chain's seed: a rerun gives the same answers.

``best_of_n`` and ``majority_vote`` draw the same ``N`` samples for the same seed, so a job that
runs both reads one draw twice (:class:`SharedDraws`): one pays for the samples, the other reads
them (``stats.shared_draw``), and each answers from them by its own rule.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from presto_client.core.chain_runner import ChainResult, ChainRunner, ChainSetup
from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens, ScoreSpec
from presto_client.core.state import ChainState
from presto_client.core.stats import ChainStats

DEFAULT_SAMPLES = 8
"""``N`` of a sampling baseline when the job names none: a common maj@N / best-of-N size."""


@dataclass(slots=True)
class _Sample:
    state: ChainState
    log_weight: float = 0.0
    done: bool = False


@dataclass(frozen=True, slots=True)
class _Draw:
    states: tuple[ChainState, ...]
    stats: ChainStats
    """The drawing runner's statistics when its samples were complete (calls, tokens, blocks)."""


class SampleSetRunner(ChainRunner):
    """``N`` samples of a prompt generated together, block by block (one engine call a block
    for the samples still running). Subclasses choose the temperature, weigh and resample
    (:meth:`_after_block`) and pick the answer (:meth:`_answer`)."""

    temperature_is_tau = False
    """Sample at the proposal temperature ``τ`` (Power-SMC) rather than at 1 (the base model)."""
    keeps_alternatives = False
    """Whether the other samples travel with the answer (:attr:`ChainResult.alternatives`)."""
    reads_shared_draw = False
    """Whether the samples are plain base-model samples that another arm of the job may have
    drawn already (:class:`SharedDraws`): not for an arm that weighs or resamples as it goes."""

    def __init__(self, setup: ChainSetup) -> None:
        super().__init__(setup)
        self.draws = setup.draws if self.reads_shared_draw else None
        self.samples = DEFAULT_SAMPLES if setup.size is None else setup.size
        if self.samples < 1:
            raise ValueError(f"a sampling baseline needs at least one sample, got {self.samples}")
        self.temperature = self.config.proposal_temperature if self.temperature_is_tau else 1.0
        self.spec = ScoreSpec((self.temperature,))

    def _seed(self, sample: int, block: int) -> int:
        return int(self._rng("seed", sample, block).integers(0, 2**31 - 1))

    def _rng(self, what: str, *key: int) -> np.random.Generator:
        tag = {"seed": 11, "resample": 12, "pick": 13}[what]
        return np.random.default_rng(
            np.random.SeedSequence(self.randomness.seed, spawn_key=(tag, *key))
        )

    async def run(self, prompt_ids: Sequence[int]) -> ChainResult:
        started = time.perf_counter()
        prompt = tuple(int(t) for t in prompt_ids)
        if self.draws is None:
            particles = await self._draw(prompt)
        else:
            key = (prompt, self.randomness.seed, self.samples, self.temperature, self.config)
            drawn, shared = await self.draws.draw(key, lambda: self._recorded_draw(prompt))
            particles = [_Sample(state, 0.0, True) for state in drawn.states]
            if shared:
                self.stats = replace(drawn.stats, call_wall_s=list(drawn.stats.call_wall_s))
                self.stats.shared_draw = True
        self.stats.stopped_at_eos = self.stats.blocks_run < self.config.num_blocks
        self.stats.chain_wall_s = time.perf_counter() - started
        chosen = self._answer(particles)
        result = self._result(particles[chosen].state)
        result.alternatives = (
            tuple(self._truncated(p.state) for i, p in enumerate(particles) if i != chosen)
            if self.keeps_alternatives
            else ()
        )
        return result

    async def _recorded_draw(self, prompt: tuple[int, ...]) -> _Draw:
        particles = await self._draw(prompt)
        stats = replace(self.stats, call_wall_s=list(self.stats.call_wall_s))
        return _Draw(tuple(p.state for p in particles), stats)

    async def _draw(self, prompt: tuple[int, ...]) -> list[_Sample]:
        """The ``N`` samples, block by block, as this arm weighs and resamples them."""
        empty = ScoredTokens.empty(1, False)
        particles = [_Sample(ChainState(prompt, empty)) for _ in range(self.samples)]
        for block in range(self.config.num_blocks):
            running = [i for i, p in enumerate(particles) if not p.done]
            if not running:
                break
            requests = [
                ProposalRequest(
                    particles[i].state.prefix(particles[i].state.length),
                    self.config.block_size,
                    self.temperature,
                    self._seed(i, block),
                    self.spec,
                )
                for i in running
            ]
            results, wall = await self._generate(requests)
            tokens = sum(len(r) for r in results)
            self.stats.rounds += 1
            self.stats.call_wall_s.append(wall)
            self.stats.requests_issued += len(requests)
            self.stats.requests_used += len(requests)
            self.stats.sequences_issued += len(requests)
            self.stats.tokens_generated += tokens
            self.stats.blocks_run += 1
            self._emit(
                block=block,
                kind="propose",
                requests=len(requests),
                sequences=len(requests),
                used=len(requests),
                transitions=0,
                accepts=0,
                wall_s=wall,
                tokens=tokens,
            )
            for i, extension in zip(running, results, strict=True):
                p = particles[i]
                p.state = p.state.extend(extension)
                p.log_weight += self._log_increment(extension)
                p.done = self._stops(p.state)
            particles = self._after_block(particles, block)
        return particles

    def _log_increment(self, extension: ScoredTokens) -> float:
        return 0.0

    def _after_block(self, particles: list[_Sample], block: int) -> list[_Sample]:
        return particles

    def _answer(self, particles: list[_Sample]) -> int:
        return 0


class BestOfNRunner(SampleSetRunner):
    """``N`` base-model samples; the answer is the one the model itself finds most likely (the
    highest mean ``log p0`` per token of its EOS-truncated response)."""

    reads_shared_draw = True

    def _answer(self, particles: list[_Sample]) -> int:
        def mean_logp0(p: _Sample) -> float:
            n = len(self._truncated(p.state))
            return float(p.state.response.logp0[:n].mean()) if n else -math.inf

        scores = [mean_logp0(p) for p in particles]
        return int(np.argmax(scores))  # the first of equals: reproducible


class MajorityVoteRunner(SampleSetRunner):
    """``N`` base-model samples, all kept: the grader scores the chain by their majority."""

    keeps_alternatives = True
    reads_shared_draw = True


class PowerSMCRunner(SampleSetRunner):
    """Power-SMC: particles at ``τ`` weighted towards ``p0^α``, resampled when their effective
    sample size drops (see the module doc; approximate)."""

    temperature_is_tau = True

    def _log_increment(self, extension: ScoredTokens) -> float:
        logq = 0.5 * (extension.logq_lo[:, 0] + extension.logq_hi[:, 0])
        return float(self.config.alpha * extension.logp0.sum() - logq.sum())

    def _normalised(self, particles: list[_Sample]) -> np.ndarray:
        logw = np.array([p.log_weight for p in particles])
        w = np.exp(logw - logw.max())
        out: np.ndarray = w / w.sum()
        return out

    def _after_block(self, particles: list[_Sample], block: int) -> list[_Sample]:
        if block + 1 >= self.config.num_blocks:
            return particles
        w = self._normalised(particles)
        ess = 1.0 / float((w**2).sum())
        if ess >= self.config.smc_ess_threshold * len(particles):
            return particles
        # Systematic resampling: one uniform, N evenly spaced points through the weights' CDF.
        n = len(particles)
        u = (self._rng("resample", block).random() + np.arange(n)) / n
        picks = np.minimum(np.searchsorted(np.cumsum(w), u), n - 1)
        return [_Sample(particles[j].state, 0.0, particles[j].done) for j in picks]

    def _answer(self, particles: list[_Sample]) -> int:
        w = self._normalised(particles)
        return int(self._rng("pick").choice(len(particles), p=w))
