"""Where a job's chains run: the executors (:mod:`.executor`), the asyncio orchestrator
(:mod:`.orchestrator`), and the Ray executor (:mod:`.ray_executor`, its workers :mod:`.ray_worker`,
the bounds' shares :mod:`.shares`, :mod:`.ray_output`, :mod:`.ray_reaper`)."""
