"""Workers the engine tests share."""
from __future__ import annotations

from agents.sim.worker import Worker


class Sink(Worker):
    """Receives ``expect`` messages; ``got``: when each source's message was delivered."""

    def __init__(self, name, vid, env, expect=1):
        super().__init__(name, vid, env)
        self.expect, self.got = expect, {}

    async def run(self):
        for _ in range(self.expect):
            m = await self.recv()
            self.got[m.src] = m.delivered_at
