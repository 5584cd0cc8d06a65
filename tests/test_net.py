"""The network transport: TCP sockets moved by a proxy thread. Ranks on other hosts use it
(here: processes posing as other hosts with MININCL_HOSTID), and MININCL_TRANSPORT=net puts
every connection on it (thread ranks too), so every algorithm x protocol runs over it."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue as queue_mod
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import workers
from conftest import ALGOS, PROTOS, TYPES_OPS, counts_for, env_as, needs, run_ranks
from test_algorithms import check_collective, check_small_allreduces
from test_errors import CALLS_RUN_AS_OTHERS, calls_run_as_others_stories, mismatched_allreduce_stories

import minincl


@contextlib.contextmanager
def net_comms(nranks: int, algo: str | None = None, proto: str | None = None) -> Any:
    with env_as({"MININCL_TRANSPORT": "net", "MININCL_ALGO": algo, "MININCL_PROTO": proto}):
        comms = minincl.Communicator.init_all(nranks)
    try:
        yield comms
    finally:
        for c in comms:
            c.destroy()


def launch_as_hosts(
    fn: Callable[..., Any],
    nranks: int,
    *args: Any,
    env: dict[str, str] | None = None,
    env_of: Callable[[int], dict[str, str]] | None = None,
    timeout: float = 120,
    reporting: int | None = None,
) -> dict[int, tuple[bool, Any]]:
    """fn(comm, *args) in `nranks` processes, each with MININCL_HOSTID of its own (so each is
    another host to the others) plus `env` (or env_of(rank)); returns {rank: (ok, result)} of
    those that reported (a rank that died reports nothing; with `reporting`, stops waiting
    once that many have reported, and kills the rest)."""
    ctx = mp.get_context("spawn")
    uid = minincl.get_unique_id()
    results: Any = ctx.Queue()
    procs = [
        ctx.Process(
            target=workers.rank_with_env,
            args=(
                fn,
                nranks,
                r,
                uid,
                {"MININCL_HOSTID": f"host{r}", **(env_of(r) if env_of else env or {})},
                args,
                results,
            ),
            daemon=True,
        )
        for r in range(nranks)
    ]
    for p in procs:
        p.start()
    got: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(got) < (reporting or nranks) and time.monotonic() < deadline:
        with contextlib.suppress(queue_mod.Empty):
            rank, ok, value = results.get(timeout=0.1)
            got[rank] = (ok, value)
            continue
        if all(not p.is_alive() for p in procs) and results.empty():
            break
    for p in procs:
        p.join(timeout=0 if reporting else 5)
        if p.is_alive():
            p.kill()
            p.join()
    return got


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("nranks", [2, 3, 5])
def test_every_algorithm_and_protocol_over_the_network(nranks: int, algo: str, proto: str) -> None:
    with net_comms(nranks, algo, proto) as comms:
        assert all(c.stats()["network_peers"] == nranks - 1 for c in comms)
        for coll in ALGOS[algo]:
            for dtype, op in TYPES_OPS:
                needs(dtype)
                for count in counts_for(dtype):
                    check_collective(comms, coll, dtype, op, count)


def ring_exchange(c: Any) -> int:
    """Each rank sends 200,003 doubles to the next and receives the previous one's, in one group."""
    n = c.nranks
    out = np.zeros(200_003, np.float64)
    with minincl.group():
        c.send(np.arange(200_003, dtype=np.float64) * c.rank, (c.rank + 1) % n)
        c.recv(out, (c.rank - 1) % n)
    np.testing.assert_array_equal(out, np.arange(200_003, dtype=np.float64) * ((c.rank - 1) % n))
    return 0


@pytest.mark.parametrize("proto", ["simple", None])
def test_pointer_steps_to_the_proxy(monkeypatch: pytest.MonkeyPatch, proto: str | None) -> None:
    """MININCL_NET_POINTER_BYTES=0: every big Simple step goes to the proxy as a pointer to
    the caller's buffers (sent from there), send / recv and premulsum included."""
    monkeypatch.setenv("MININCL_NET_POINTER_BYTES", "0")
    monkeypatch.setenv("MININCL_POINTER_STEP_BYTES", "1K")
    with net_comms(3, None, proto) as comms:
        before = sum(c.stats()["pointer_steps"] for c in comms)
        for count in (5003, 300_007):
            for coll in ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce"):
                check_collective(comms, coll, "float32", "sum", count)
            check_collective(comms, "allreduce", "int32", "max", count)

        def premul(c: Any) -> int:
            x = np.arange(40009, dtype=np.float32) % 7 + c.rank
            got = c.allreduce(x, np.empty_like(x), op=minincl.PreMulSum(float(c.rank + 1)))
            want = sum((np.arange(40009, dtype=np.float32) % 7 + r) * (r + 1) for r in range(3))
            np.testing.assert_allclose(got, want, rtol=1e-6)
            return 0

        run_ranks(comms, premul)

        run_ranks(comms, ring_exchange)
        assert sum(c.stats()["pointer_steps"] for c in comms) > before


@pytest.mark.parametrize("algo", ["ring", "tree", "direct"])
def test_steps_land_in_the_receivers_output(algo: str) -> None:
    """Simple steps of final output values (allreduce, allgather, broadcast) and of send /
    recv go from the socket straight into the receiver's output, which its channel finds in
    place; steps of partial values (reduce_scatter, reduce) still go through the slots."""
    with net_comms(3, algo, "simple") as comms:

        def landed() -> int:
            return sum(c.stats()["network_steps_landed"] for c in comms)

        for coll in {"reduce_scatter", "reduce"} & set(ALGOS[algo]):
            before = landed()
            check_collective(comms, coll, "float32", "sum", 300_007)
            assert landed() == before, coll
        for coll, dtype, op in [
            ("allreduce", "float32", "avg"),
            ("allreduce", "int64", "max"),
            ("allgather", "int8", "sum"),
            ("broadcast", "float64", "sum"),
        ]:
            if coll not in ALGOS[algo]:
                continue
            before = landed()
            check_collective(comms, coll, dtype, op, 300_007)
            assert landed() > before, coll

        def in_place(c: Any) -> int:  # the output is the input too (allgather: the rank's block)
            x = np.arange(3 * 100_003, dtype=np.float32) * (c.rank + 1)
            c.allreduce(x)
            np.testing.assert_array_equal(x, np.arange(3 * 100_003, dtype=np.float32) * 6)
            if "allgather" in ALGOS[algo]:
                y = np.zeros(3 * 100_003, np.int32)
                y[c.rank * 100_003 : (c.rank + 1) * 100_003] = c.rank + 7
                c.allgather(y[c.rank * 100_003 : (c.rank + 1) * 100_003], y)
                np.testing.assert_array_equal(y, np.repeat(np.arange(3, dtype=np.int32) + 7, 100_003))
            return 0

        before = landed()
        run_ranks(comms, in_place)
        assert landed() > before

        before = landed()
        run_ranks(comms, ring_exchange)
        assert landed() > before


def test_an_aborted_receivers_output_stays_as_it_was() -> None:
    """A broadcast aborted while its steps land in the output: once the error is raised,
    nothing more lands there (the caller may free the buffer)."""
    import threading

    with net_comms(2, "ring", "simple") as comms:
        out = np.zeros(64 << 20, np.float32)
        results: list[tuple[int, str]] = []

        def rank(r: int) -> None:
            try:
                comms[r].broadcast(np.ones(out.size, np.float32) if r == 0 else out, root=0)
                results.append((r, "ok"))
            except minincl.Error as e:
                results.append((r, type(e).__name__))

        threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in (0, 1)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while not out[0] and time.monotonic() < deadline:  # the first step has landed
            time.sleep(0.0002)
        comms[1].abort()
        threads[1].join(10)
        snapshot = out.copy()
        time.sleep(0.3)
        comms[0].abort()
        threads[0].join(10)
        assert (1, "Aborted") in results, results
        assert 0 < np.count_nonzero(snapshot) < out.size
        np.testing.assert_array_equal(out, snapshot)


@pytest.mark.parametrize("socket_buffer", [None, "0", "64K"])
def test_large_messages_and_the_tuners_choices_over_the_network(socket_buffer: str | None) -> None:
    """Counts across many FIFO laps (each slot reused again and again), whatever the tuner
    picks; socket buffers as set by default, left to the kernel, and small (many partial
    sends and reads)."""
    with env_as({"MININCL_NET_SOCKET_BUFFER": socket_buffer}), net_comms(3) as comms:
        for count in (1, 1000, 65536, 1_000_003):
            for coll in ("allreduce", "allgather", "reduce_scatter", "broadcast"):
                check_collective(comms, coll, "float32", "sum", count)


def test_send_recv_and_alltoall_over_the_network() -> None:
    with net_comms(4) as comms:
        n = len(comms)

        def body(c: Any) -> int:
            r = c.rank
            for count in (0, 1, 4099, 300_007):
                out = np.zeros(count, np.float64)
                with minincl.group():
                    c.send(np.arange(count, dtype=np.float64) + r, (r + 1) % n)
                    c.recv(out, (r - 1) % n)
                np.testing.assert_array_equal(out, np.arange(count, dtype=np.float64) + (r - 1) % n)
                got = c.sendrecv(np.full(count, r, np.int32), np.zeros(count, np.int32), r ^ 1)
                np.testing.assert_array_equal(got, np.full(count, r ^ 1, np.int32))
                send = np.concatenate([np.full(count, 10 * r + q, np.int64) for q in range(n)])
                a2a = c.alltoall(send)
                np.testing.assert_array_equal(
                    a2a, np.concatenate([np.full(count, 10 * q + r, np.int64) for q in range(n)])
                )
            return 0

        run_ranks(comms, body, timeout=120)


def test_thousands_of_small_allreduces_per_protocol_over_the_network() -> None:
    """Every step's header and flags cross the wire: values change every call."""
    for proto in PROTOS:
        with net_comms(3, "ring", proto) as comms:
            check_small_allreduces(comms, 2000, proto)


def test_mismatched_collectives_are_named_over_the_network() -> None:
    with net_comms(2) as comms:
        results = mismatched_allreduce_stories(comms)
    assert any("mismatched calls" in r and "count=10" in r and "count=20" in r for r in results), results


@pytest.mark.parametrize("case", [c for c in CALLS_RUN_AS_OTHERS if c != "alltoall vs send"])
def test_mismatches_over_the_network_name_calls_as_the_user_made_them(case: str) -> None:
    """Over TCP a rank that saw the mismatch in a step named the calls as they run (rank 1's
    barrier as an int32 allreduce, an alltoall as a send), while the other, a moment later,
    named them as made: a peer's call log travels with its heartbeats, after the steps. Now
    both wait for it (a few ticks at most) and name the calls alike."""
    names = CALLS_RUN_AS_OTHERS[case][2]
    with net_comms(2) as comms:
        results = calls_run_as_others_stories(comms, case)
    assert all(r != "ok" for r in results), results
    for story in results:
        if story != "ok":
            assert "int32" not in story and all(name in story for name in names), results


def test_receives_waiting_in_a_cycle_over_the_network_are_a_deadlock_error() -> None:
    """Every rank receives first: the ranks' counts of sends and receives come with their
    heartbeats, and the cycle of waits is named as on one host."""
    with net_comms(3) as comms:
        results = run_ranks(comms, lambda c: workers.p2p_ring(c, "recv first"))
    assert all(r.startswith(("InvalidUsage", "RemoteError")) for r in results), results
    assert any(
        "deadlock in sends and receives: " in r and "rank 0 waits for rank 2 to send (its receive 1 from rank 2" in r
        for r in results
    ), results


@pytest.mark.parametrize("socket_buffer", [None, "1G"])
def test_sends_that_do_not_fit_over_the_network_are_a_deadlock_error(socket_buffer: str | None) -> None:
    """Each rank sends 32 MiB to the next on one channel, then receives: more than the
    sockets and FIFOs between them hold (17-20 MiB a channel over loopback). The monitor
    counted twice an estimate of it, ~36 MiB (with 1G socket buffers, which the kernel caps,
    ~4 GiB), so no send was long and the ranks waited for ever; now it counts the buffers
    the kernel granted, and names the cycle."""
    if socket_buffer == "1G" and min(_sysctl("net/core/wmem_max"), _sysctl("net/core/rmem_max")) > 4 << 20:
        pytest.skip("this host grants socket buffers that hold the 32 MiB sent")
    settings = {"MININCL_NCHANNELS": "1", "MININCL_NET_SOCKET_BUFFER": socket_buffer}
    with env_as(settings), net_comms(2) as comms:
        results = run_ranks(comms, lambda c: workers.p2p_ring(c, "long send first"), timeout=120)
    assert all(r.startswith(("InvalidUsage", "RemoteError")) for r in results), results
    assert any("deadlock in sends and receives: " in r and "does not fit in their connections" in r for r in results)


def _sysctl(name: str) -> int:
    with open(f"/proc/sys/{name}") as f:
        return int(f.read().split()[0])


def _listening_ports() -> set[int]:
    """The TCP ports this process listens on (from /proc)."""
    sockets = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                sockets.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in sockets:  # (0A: listening)
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_stray_connections_to_a_ranks_listeners_are_dropped() -> None:
    """A connection to a rank's bootstrap listener from outside the communicator (a port
    scan, a health check, a leftover of an earlier job) is closed and the rank goes on
    accepting: one that sent a few bytes and closed failed the next split at once
    (RemoteError), one that stayed silent held it until the bootstrap timeout (Timeout).
    (The network transport's listener, open during init only, takes the same path:
    Socket::recvOpening; bench/RESULTS.md, forty-ninth session, for its repro.)"""
    before = _listening_ports()
    with env_as({"MININCL_BOOTSTRAP_TIMEOUT": "30"}), net_comms(2) as comms:
        ports = _listening_ports() - before
        assert ports, "no listeners found"
        silent = []
        for port in ports:
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"GET")
            silent.append(socket.create_connection(("127.0.0.1", port)))
        try:
            t0 = time.monotonic()
            subs = run_ranks(comms, lambda c: c.split(0, c.rank), timeout=60)
            took = time.monotonic() - t0
        finally:
            for s in silent:
                s.close()
        x = [np.full(5, c.rank + 1, np.float32) for c in subs]
        run_ranks(subs, lambda c: c.allreduce(x[c.rank]))
        for c in subs:
            c.destroy()
    np.testing.assert_array_equal(x[1], np.full(5, 3, np.float32))
    assert took < 25, took  # (a silent stray costs Socket::kOpeningSeconds, 5 s; the timeout is 30)


def test_abort_unblocks_a_collective_waiting_on_the_network() -> None:
    with net_comms(2) as comms:
        out: list[str] = []

        def lonely() -> None:
            try:
                comms[0].allreduce(np.ones(1000, np.float32))  # rank 1 never joins
            except minincl.Error as e:
                out.append(type(e).__name__)

        import threading

        t = threading.Thread(target=lonely, daemon=True)
        t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        comms[0].abort()
        t.join(5)
        assert out == ["Aborted"] and time.monotonic() - t0 < 1.0


def test_processes_on_different_hosts_use_the_network() -> None:
    got = launch_as_hosts(workers.all_collectives, 3, [0, 1, 7, 50021])
    assert sorted(got) == [0, 1, 2]
    assert all(ok for ok, _ in got.values()), got
    assert len({v for _, v in got.values()}) == 1
    peers = launch_as_hosts(workers.network_peers, 3)
    assert peers == {r: (True, 2) for r in range(3)}, peers


def test_two_hosts_of_two_processes_mix_shared_memory_and_the_network() -> None:
    """As on two nodes: shared memory within each host, TCP between them, in one communicator."""

    def two_hosts(r: int) -> dict[str, str]:
        return {"MININCL_HOSTID": f"node{r // 2}"}

    got = launch_as_hosts(workers.all_collectives, 4, [0, 1, 7, 50021], env_of=two_hosts)
    assert sorted(got) == [0, 1, 2, 3] and all(ok for ok, _ in got.values()), got
    assert len({v for _, v in got.values()}) == 1
    peers = launch_as_hosts(workers.network_peers, 4, env_of=two_hosts)
    assert peers == {r: (True, 2) for r in range(4)}, peers


def test_rings_leave_each_host_once_whatever_the_rank_order() -> None:
    """Hosts interleaved by rank (0, 2 on one; 1, 3 on the other): each channel's ring runs
    through one host's ranks, then the other's, so it crosses the network twice, not four
    times as rank order would; channels enter the hosts at different ranks."""

    def interleaved(r: int) -> dict[str, str]:
        return {"MININCL_HOSTID": f"node{r % 2}", "MININCL_NCHANNELS": "2"}

    got = launch_as_hosts(workers.topology_and_collectives, 4, [0, 1, 7, 50021], env_of=interleaved)
    assert sorted(got) == [0, 1, 2, 3] and all(ok for ok, _ in got.values()), got
    plans = [value[0] for _, value in got.values()]
    assert all(p == plans[0] for p in plans)
    plan = plans[0]
    assert plan["hosts"] == [0, 1, 0, 1]
    assert plan["rings"] == [[0, 2, 1, 3], [2, 0, 3, 1]]
    for ring, hops in zip(plan["rings"], plan["ring_hops"]):
        crossings = [plan["hosts"][ring[i]] != plan["hosts"][ring[(i + 1) % 4]] for i in range(4)]
        assert crossings.count(True) == 2
        assert [h == "NET" for h in hops] == crossings
    assert "2 hosts" in plan["reason"]


def test_trees_cross_between_hosts_once() -> None:
    """Ranks 0, 1 on one host and 2, 3 on another: each channel's tree is a chain in each
    host, from where its ring enters it, and one edge between the hosts. The heaps over
    rank numbers (parents -1 0 0 1 and -1 3 0 0) have two and three."""

    def two_hosts(r: int) -> dict[str, str]:
        return {"MININCL_HOSTID": f"node{r // 2}", "MININCL_NCHANNELS": "2"}

    got = launch_as_hosts(workers.topology_and_collectives, 4, [1, 7], env_of=two_hosts)
    assert sorted(got) == [0, 1, 2, 3] and all(ok for ok, _ in got.values()), got
    plan = got[0][1][0]
    assert plan["rings"] == [[0, 1, 2, 3], [1, 0, 3, 2]]
    assert plan["trees"] == [[-1, 0, 0, 2], [-1, 0, 3, 0]]
    for parents in plan["trees"]:
        edges = [(r, p) for r, p in enumerate(parents) if p >= 0]
        assert sum(plan["hosts"][r] != plan["hosts"][p] for r, p in edges) == 1


def test_each_host_orders_its_own_ranks_by_the_topology() -> None:
    """With a topology file, each host's ranks are placed on it as if alone (here by
    MININCL_TOPO_RANK_MAP: a host's entries of the list) and ordered by the search."""
    fixture = Path(__file__).parent / "fixtures" / "topo" / "pcie_2socket_8gpu.xml"

    def hosts_with_file(r: int) -> dict[str, str]:
        return {
            "MININCL_HOSTID": f"node{r // 3}",
            "MININCL_TOPO_FILE": str(fixture),
            "MININCL_TOPO_RANK_MAP": "0,4,1,2,6,3",  # node0: GPUs 0 4 1, node1: GPUs 2 6 3
            "MININCL_NCHANNELS": "1",
        }

    got = launch_as_hosts(workers.topology_and_collectives, 6, [1, 50021], env_of=hosts_with_file)
    assert sorted(got) == list(range(6)) and all(ok for ok, _ in got.values()), got
    plan = next(iter(got.values()))[1][0]
    assert plan["hosts"] == [0, 0, 0, 1, 1, 1] and plan["searched"]
    assert plan["devices"] == ["GPU0", "GPU4", "GPU1", "GPU2", "GPU6", "GPU3"]
    ring = plan["rings"][0]
    # Within each host the switch mates (GPUs 0 and 1: ranks 0, 2; GPUs 2 and 3: ranks 3, 5)
    # are neighbours, and the ring leaves each host once.
    pairs = {frozenset((ring[i], ring[(i + 1) % 6])) for i in range(6)}
    assert frozenset((0, 2)) in pairs and frozenset((3, 5)) in pairs
    assert [plan["hosts"][r] for r in ring] in ([0, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0])
    assert plan["ring_hops"][0].count("NET") == 2


@pytest.mark.parametrize(
    ("hosts", "per_host", "proto"),
    [(2, 2, "simple"), (2, 3, "ll"), (3, 2, "ll128"), (2, 2, "ll128"), (3, 1, "simple")],
)
def test_trees_across_hosts(hosts: int, per_host: int, proto: str) -> None:
    """Ranks on several hosts run chains within hosts and trees across them (cuda/tree.h):
    tree allreduce, broadcast and reduce from every root, against NumPy. Hosts are
    interleaved by rank, so the trees' shapes differ from rank-number heaps."""
    n = hosts * per_host

    def on_hosts(r: int) -> dict[str, str]:
        return {"MININCL_HOSTID": f"node{r % hosts}", "MININCL_ALGO": "tree", "MININCL_PROTO": proto}

    got = launch_as_hosts(workers.tree_collectives, n, [1, 7, 9000], env_of=on_hosts, timeout=240)
    assert got == {r: (True, 2 * 3 * (2 * n + 2)) for r in range(n)}, got


def test_tree_shapes_across_hosts(tmp_path: Path) -> None:
    """tests/tree_shape_check.cc: every host count and size, root and tree index gives one
    tree as deep as treeDepth says, crossing between hosts only hosts - 1 times."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    root = Path(__file__).resolve().parent.parent
    exe = tmp_path / "tree_shape_check"
    built = subprocess.run(
        [cxx, "-std=c++20", f"-I{root / 'cuda'}", str(root / "tests" / "tree_shape_check.cc"), "-o", str(exe)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:]
    summary = re.search(r"(\d+) checks, (\d+) failed", run.stdout)
    assert summary is not None and int(summary.group(1)) > 0 and int(summary.group(2)) == 0, run.stdout


def test_same_host_processes_keep_shared_memory_unless_told() -> None:
    peers = minincl.launch(workers.network_peers, 2)
    assert peers == [0, 0]


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_lost_host_is_an_error_on_the_others(tmp_path: Path, how: str) -> None:
    """A killed rank's connections close: the others raise RemoteError at once. A hung one's
    heartbeats stop: Timeout after MININCL_TIMEOUT (no pid to look at across hosts)."""
    sig = signal.SIGKILL if how == "killed" else signal.SIGSTOP
    t0 = time.monotonic()
    got = launch_as_hosts(
        workers.stop_mid_run, 3, 1, str(tmp_path), int(sig), env={"MININCL_TIMEOUT": "2"}, timeout=60, reporting=2
    )
    assert sorted(got) == [0, 2], got
    for ok, story in got.values():
        assert ok, story
        if how == "killed":
            assert story.startswith("RemoteError after") and "rank 1" in story, story
            assert "network connection" in story, story
        else:
            assert story.startswith(("Timeout after", "RemoteError after")) and "rank 1" in story, story
    if how == "hung":  # one survivor times out; the other may learn it from that one
        assert any(v.startswith("Timeout after") and "no sign of life" in v for _, v in got.values()), got
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_the_other_hosts_shrink_a_lost_one_away(tmp_path: Path, how: str) -> None:
    """As above, then the survivors make a communicator of their own (Communicator.shrink)
    and run calls on it over the network."""
    sig = signal.SIGKILL if how == "killed" else signal.SIGSTOP
    got = launch_as_hosts(
        workers.shrink_after_a_death,
        3,
        1,
        str(tmp_path),
        int(sig),
        env={"MININCL_TIMEOUT": "2"},
        timeout=60,
        reporting=2,
    )
    assert sorted(got) == [0, 2], got
    for old, (ok, result) in got.items():
        assert ok, result
        ended, lost, rank, nranks, summed, ranks = result
        assert ended in ("RemoteError", "Timeout") and (rank, nranks) == (old // 2, 2), result
        assert lost == [1], result  # (the hung one: its heartbeat stopped for MININCL_TIMEOUT)
        assert summed == [4.0] * 3 and ranks == [0, 2], result


def test_the_other_hosts_shrink_away_a_rank_that_aborted(tmp_path: Path) -> None:
    """Rank 1 of 3 hosts aborts its communicator and lives on: its closed connection makes
    the others list it in lost_ranks(), and they shrink it away."""
    got = launch_as_hosts(workers.shrink_after_an_abort, 3, 1, timeout=60)
    assert got[1] == (True, "aborted"), got
    for old in (0, 2):
        ok, result = got[old]
        assert ok, result
        ended, lost, rank, nranks, summed = result
        assert ended == "RemoteError" and lost == [1], result
        assert (rank, nranks, summed) == (old // 2, 2, [4.0] * 3), result


@pytest.mark.parametrize("short", [0, 2])
@pytest.mark.parametrize("transport", ["shm", "net"])
def test_the_rank_with_the_shortest_timeout_frees_the_others(tmp_path: Path, transport: str, short: int) -> None:
    """Ranks may set different MININCL_TIMEOUTs: rank `short` waits 1 s for a hung rank 1
    (SIGSTOP), the other survivor 60 s. The first to give up tells the others, so that one
    hears why (RemoteError naming both) within seconds, not after its own 60. Over shared
    memory (one MININCL_HOSTID for all: a host's processes) and over the network."""
    other = 2 - short

    def env_of(rank: int) -> dict[str, str]:
        same_host = {"MININCL_HOSTID": "one-host"} if transport == "shm" else {}
        return {"MININCL_TIMEOUT": "1" if rank == short else "60", **same_host}

    got = launch_as_hosts(
        workers.stop_mid_run, 3, 1, str(tmp_path), int(signal.SIGSTOP), env_of=env_of, timeout=60, reporting=2
    )
    assert sorted(got) == [0, 2], got
    ok, story = got[short]
    assert ok and story.startswith("Timeout after"), story
    assert re.search(r"rank 1 \(pid \d+\) has shown no sign of life for 1 s", story), story
    ok, story = got[other]
    assert ok, story
    heard = re.fullmatch(
        r"RemoteError after (\d+\.\d+)s: rank (\d) \(pid \d+\) failed: rank 1 .*no sign of life.*", story
    )
    assert heard and int(heard.group(2)) == short, story
    assert float(heard.group(1)) < 20, story  # (its own timeout: 60 s)


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_rank_stopped_past_the_timeout_learns_why_its_peers_gave_up(tmp_path: Path, nranks: int) -> None:
    """Rank 1 stops (SIGSTOP) between calls; rank 0 times out, destroys its communicator, and
    resumes it. Rank 1 then reads rank 0's reported failure, though its socket had filled
    with rank 0's heartbeats meanwhile, not a lost connection; and it says that it stopped."""
    got = launch_as_hosts(
        workers.freeze_then_resume, nranks, 1, str(tmp_path), env={"MININCL_TIMEOUT": "2"}, timeout=60
    )
    assert sorted(got) == list(range(nranks)), got
    assert got[0][1].startswith("Timeout after") and "rank 1 (pid" in got[0][1], got
    ok, story = got[1]
    assert ok and story.startswith("RemoteError after"), story
    assert re.search(r"rank \d \(pid \d+\) failed: rank 1 \(pid \d+\) has shown no sign of life", story), story
    assert re.search(r"this process did not run for \d+\.\d s just before: stopped", story), story
    assert "network connection" not in story, story


@pytest.mark.parametrize("congestion", [None, "reno", "system"])
def test_data_sockets_use_the_congestion_control_asked_for(congestion: str | None, tmp_path: Path) -> None:
    """cubic by default (BBR, some hosts' default, slowed transfers down for good once a
    connection had carried a few MiB one way); reno is one every process may choose."""
    code = (
        "import numpy as np, minincl\n"
        "comms = minincl.Communicator.init_all(2)\n"
        "x = [np.full(100_003, c.rank + 1.0) for c in comms]\n"
        "import threading\n"
        "ts = [threading.Thread(target=c.allreduce, args=(v,)) for c, v in zip(comms, x)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "assert all((v == 3).all() for v in x)\n"
        "[c.destroy() for c in comms]\n"
    )
    env = {**os.environ, "MININCL_TRANSPORT": "net", "MININCL_DEBUG": "INFO"}
    if congestion:
        env["MININCL_NET_CONGESTION"] = congestion
    # (From an empty folder: run from the repository root, "import minincl" finds its sources.)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    used = set(re.findall(r"TCP congestion control (\w+)", out.stderr))
    proc = Path("/proc/sys/net/ipv4")
    system = (proc / "tcp_congestion_control").read_text().strip()
    cubic_settable = "cubic" in (proc / "tcp_available_congestion_control").read_text().split() and (
        os.geteuid() == 0 or "cubic" in (proc / "tcp_allowed_congestion_control").read_text().split()
    )
    want = congestion or ("cubic" if cubic_settable else system)
    assert used == {system if want == "system" else want}, out.stderr[-2000:]


def test_transport_settings_are_checked() -> None:
    with (
        env_as({"MININCL_TRANSPORT": "carrier-pigeon"}),
        pytest.raises(minincl.InvalidArgument, match="MININCL_TRANSPORT"),
    ):
        minincl.Communicator.init_all(2)
    for size in ("2G", "8K"):  # (8K made a 128 KiB allreduce take 2 s)
        with (
            env_as({"MININCL_TRANSPORT": "net", "MININCL_NET_SOCKET_BUFFER": size}),
            pytest.raises(minincl.InvalidArgument, match="MININCL_NET_SOCKET_BUFFER must be 0 .* or a size from 64K"),
        ):
            minincl.Communicator.init_all(2)
    for congestion, nranks in (("cubic;", 2), ("no-such-congestion", 2), ("no-such-congestion", 4)):
        t0 = time.monotonic()
        with (
            env_as({"MININCL_TRANSPORT": "net", "MININCL_NET_CONGESTION": congestion}),
            pytest.raises(minincl.InvalidArgument, match="MININCL_NET_CONGESTION"),
        ):
            minincl.Communicator.init_all(nranks)
        # (4 ranks as threads waited MININCL_BOOTSTRAP_TIMEOUT for the one that failed first,
        # mid-connection, and often raised its Timeout instead)
        assert time.monotonic() - t0 < 10
    # Two processes of one host, only one of them told to use the network.
    got = launch_as_hosts(
        workers.network_peers,
        2,
        env_of=lambda r: {"MININCL_HOSTID": "one-host", "MININCL_TRANSPORT": "net" if r == 0 else "auto"},
        timeout=60,
    )
    assert sorted(got) == [0, 1]
    for ok, story in got.values():
        assert not ok and "InvalidUsage" in story and "MININCL_TRANSPORT" in story, story


def test_a_destroy_beside_a_hung_peer_gives_up_on_its_last_sends_after_the_timeout() -> None:
    """A destroy sends what the rank's sends left to its proxy: to a hung peer (stopped) that
    took until the bootstrap timeout (60 s here), where MININCL_TIMEOUT without progress is
    enough to call a peer hung."""
    env = {"MININCL_TIMEOUT": "2", "MININCL_BOOTSTRAP_TIMEOUT": "60", "MININCL_NET_SOCKET_BUFFER": "64K"}
    got = launch_as_hosts(workers.destroy_beside_a_stopped_peer, 2, env=env, timeout=90, reporting=1)
    assert list(got) == [0] and got[0][0], got
    assert got[0][1] < 20, got  # (MININCL_TIMEOUT, 2 s, with no progress; not 60)
