"""The Ray Data callable that answers LRGinstruction teacher requests: one LLM per actor.

Each actor builds its teacher from an :class:`~longrag.config.LLMConfig` (the bundled GGUF model in
process, or an OpenAI-compatible endpoint with the backend's own retries) and answers a batch of
requests with at most ``in_flight`` calls at once and ``qps`` call starts per second. A failed call
comes back as a reply with ``error`` set, so the driver counts it (see :mod:`longrag.lrg.build`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np


class TeacherActor:
    """Adds a ``reply`` column (a :class:`~longrag.lrg.records.TeacherReply` as JSON) to rows with a
    ``request`` column (a :class:`~longrag.lrg.records.TeacherRequest` as JSON)."""

    def __init__(self, llm_config: dict[str, Any], in_flight: int = 4, qps: float | None = None,
                 temperature: float | None = None) -> None:
        from longrag.config import LLMConfig
        from longrag.llm.factory import build_llm

        self.llm = build_llm(LLMConfig.model_validate(llm_config))
        self.in_flight = in_flight
        self.qps = qps
        self.temperature = temperature

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from longrag.lrg.calls import answer_all
        from longrag.lrg.records import TeacherRequest

        reqs = [TeacherRequest.model_validate_json(str(s)) for s in batch["request"]]
        replies = asyncio.run(answer_all(self.llm, reqs, concurrency=self.in_flight, qps=self.qps,
                                         temperature=self.temperature))  # fmt: skip
        return {"reply": np.array([r.model_dump_json() for r in replies], dtype=object)}
