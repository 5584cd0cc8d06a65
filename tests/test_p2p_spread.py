"""Sends and receives spread over channels by peer (MININCL_P2P_SPREAD=1, the GPUs' default).

A send or receive with peer p starts on channel (rank + p) mod channels, the same channel at
both ends, and a big one wraps around past the last channel. On CPUs it is off by default;
here it runs on CPU ranks with 4 channels each, against NumPy, as threads and as processes.
"""

from __future__ import annotations

import pytest
import workers
from conftest import run_ranks
from test_net import launch_as_hosts

import minincl

# (float32) 0, 1, a prime, and big enough to take every channel (16 KiB slots: one channel
# per 64 KiB) starting past the first.
COUNTS = [0, 1, 1009, 300_007]


@pytest.fixture
def spread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MININCL_P2P_SPREAD", "1")
    monkeypatch.setenv("MININCL_NCHANNELS", "4")


@pytest.mark.parametrize("nranks", [3, 5])
def test_alltoall_and_exchanges_between_threads(spread: None, nranks: int) -> None:
    comms = minincl.Communicator.init_all(nranks)
    try:
        assert [c.stats()["channels"] for c in comms] == [4] * nranks
        assert run_ranks(comms, lambda c: workers.p2p_patterns_checked(c, COUNTS)) == [len(COUNTS)] * nranks
    finally:
        for c in comms:
            c.destroy()


def test_alltoall_and_exchanges_between_processes(spread: None) -> None:
    assert minincl.launch(workers.p2p_patterns_checked, 3, COUNTS, timeout=120) == [len(COUNTS)] * 3


def test_sends_waiting_in_a_cycle_are_still_named(spread: None) -> None:
    """The deadlock check counts a group's sends to a peer on the channels they share: with
    their first channel moved, two sends that fit alone but not together still wait."""
    results = workers.run_on_threads(3, lambda c: workers.p2p_ring(c, "grouped sends first"))
    assert any(r.startswith("InvalidUsage: deadlock in sends and receives: ") for r in results), results
    assert all(r.startswith(("InvalidUsage", "RemoteError")) for r in results), results


def test_a_bad_spread_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MININCL_P2P_SPREAD", "2")
    with pytest.raises(minincl.InvalidArgument, match="MININCL_P2P_SPREAD must be 0 or 1"):
        minincl.Communicator.init_all(2)


def test_ranks_must_agree_on_the_spread() -> None:
    got = launch_as_hosts(workers.network_peers, 2, env_of=lambda r: {"MININCL_P2P_SPREAD": str(r)}, timeout=60)
    assert sorted(got) == [0, 1], got
    assert all(not ok and "sets MININCL_P2P_SPREAD differently" in str(why) for ok, why in got.values()), got
