"""A vworker's endless stream of mini-batches over its shard — DESIGN §7."""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from agents.sim.keyed import generator

__all__ = ["BatchStream"]


class BatchStream(Iterator[np.ndarray]):
    """Endless mini-batches of sample indices drawn from ``indices``, epoch after epoch.

    Epoch ``e`` visits the shard in the keyed order ``(seed, "data", vworker, e)``
    and yields ``len(indices) // batch_size`` full batches; the ragged tail of
    that order is dropped, so every batch has the same shape (and cost), and
    the samples left out change from epoch to epoch.
    """

    def __init__(self, indices: np.ndarray, batch_size: int, seed: int, vworker: int,
                 epoch: int = 0, position: int = 0) -> None:
        self.indices = np.asarray(indices, dtype=np.int64)
        if self.indices.ndim != 1:
            raise ValueError(f"BatchStream: indices must be 1-D, got shape {self.indices.shape}.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        if batch_size > len(self.indices):
            raise ValueError(f"batch_size={batch_size} is larger than vworker {vworker}'s shard of "
                             f"{len(self.indices)} samples; lower batch_size or give the vworker more data.")
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.vworker = int(vworker)
        self.batches_per_epoch = len(self.indices) // self.batch_size
        if epoch < 0 or not 0 <= position < self.batches_per_epoch:
            raise ValueError(f"BatchStream: epoch must be >= 0 and position in [0, {self.batches_per_epoch}), "
                             f"got epoch={epoch}, position={position}.")
        self.epoch = int(epoch)
        """The epoch the next batch comes from."""
        self.position = int(position)
        """How many batches of the current epoch were already drawn."""
        self._order = self._epoch_order()

    def _epoch_order(self) -> np.ndarray:
        return generator(self.seed, "data", self.vworker, self.epoch).permutation(len(self.indices))

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> np.ndarray:
        start = self.position * self.batch_size
        batch = self.indices[self._order[start:start + self.batch_size]]
        self.position += 1
        if self.position == self.batches_per_epoch:
            self.epoch += 1
            self.position = 0
            self._order = self._epoch_order()
        return batch

    def state(self) -> dict[str, int]:
        """Everything but the shard itself, as plain ints, for a checkpoint."""
        return {"seed": self.seed, "vworker": self.vworker, "batch_size": self.batch_size,
                "epoch": self.epoch, "position": self.position}

    @classmethod
    def from_state(cls, indices: np.ndarray, state: dict[str, int]) -> BatchStream:
        """Resume a stream over the same shard; the next batch is the one the saved stream would give."""
        return cls(indices, state["batch_size"], state["seed"], state["vworker"],
                   epoch=state["epoch"], position=state["position"])
