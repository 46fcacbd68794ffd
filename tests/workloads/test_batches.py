"""BatchStream: keyed per-epoch order, ragged tail dropped, resumable."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from agents.sim.keyed import generator
from agents.workloads.batches import BatchStream

SHARD = np.arange(100, 110)  # ten dataset indices


def take(stream: BatchStream, k: int) -> list[list[int]]:
    return [b.tolist() for b in itertools.islice(stream, k)]


def test_an_epoch_is_the_keyed_permutation_cut_into_full_batches():
    stream = BatchStream(SHARD, batch_size=3, seed=7, vworker=2)
    order = SHARD[generator(7, "data", 2, 0).permutation(10)]
    assert take(stream, 3) == [order[0:3].tolist(), order[3:6].tolist(), order[6:9].tolist()]
    assert (stream.epoch, stream.position) == (1, 0)  # the tail order[9] was dropped
    assert next(stream).tolist() == SHARD[generator(7, "data", 2, 1).permutation(10)][:3].tolist()


def test_each_epoch_visits_distinct_samples_in_a_new_order():
    stream = BatchStream(SHARD, batch_size=5, seed=0, vworker=0)
    epochs = [np.concatenate(take(stream, 2)) for _ in range(4)]
    for e in epochs:
        assert sorted(e.tolist()) == SHARD.tolist()
    assert len({tuple(e.tolist()) for e in epochs}) == 4


def test_the_same_seed_and_vworker_give_the_same_stream_and_others_do_not():
    def first(seed: int, vworker: int) -> list[list[int]]:
        return take(BatchStream(SHARD, 4, seed, vworker), 6)

    assert first(1, 3) == first(1, 3)
    assert first(1, 3) != first(1, 4)
    assert first(1, 3) != first(2, 3)


def test_a_stream_resumes_from_its_state():
    stream = BatchStream(SHARD, batch_size=3, seed=5, vworker=1)
    take(stream, 4)
    state = json.loads(json.dumps(stream.state()))  # plain ints survive a checkpoint file
    assert state == {"seed": 5, "vworker": 1, "batch_size": 3, "epoch": 1, "position": 1}
    resumed = BatchStream.from_state(SHARD, state)
    assert take(resumed, 7) == take(stream, 7)
    assert (resumed.epoch, resumed.position) == (stream.epoch, stream.position) == (3, 2)


def test_a_batch_larger_than_the_shard_is_an_error_naming_both():
    with pytest.raises(ValueError, match=r"batch_size=11 is larger than vworker 4's shard of 10 samples"):
        BatchStream(SHARD, batch_size=11, seed=0, vworker=4)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        BatchStream(SHARD, batch_size=0, seed=0, vworker=4)
    with pytest.raises(ValueError, match=r"position in \[0, 3\)"):
        BatchStream(SHARD, batch_size=3, seed=0, vworker=4, position=3)


def test_numpy_integers_are_accepted_for_the_key():
    a = BatchStream(SHARD, np.int64(2), np.int64(9), np.int32(1))
    assert take(a, 3) == take(BatchStream(SHARD, 2, 9, 1), 3)
