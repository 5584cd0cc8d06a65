"""Communicators order their rings by the topology search (MININCL_TOPO_FILE fixtures drive
CPU ranks: rank i stands in for GPU i, or for GPU map[i] with MININCL_TOPO_RANK_MAP)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_ranks

import minincl

core = pytest.importorskip("minincl._core")

FIXTURES = Path(__file__).parent / "fixtures" / "topo"
PCIE = str(FIXTURES / "pcie_2socket_8gpu.xml")
DGX1 = str(FIXTURES / "dgx1_v100.xml")
TWO_NODES = str(FIXTURES / "dgx_h100_2node.xml")
PCIE_NUMA = {g: g // 4 for g in range(8)}  # GPU -> socket in the PCIe fixture
PCIE_SWITCH_MATES = [(0, 1), (2, 3), (4, 5), (6, 7)]


@pytest.fixture
def topo_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A clean slate: no topology file, no rank map, channel count as the test sets it."""
    for name in ("MININCL_TOPO_FILE", "MININCL_TOPO_RANK_MAP", "MININCL_TOPO_DUMP_FILE", "MININCL_ALGO"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def init(n: int) -> list[minincl.Communicator]:
    return minincl.Communicator.init_all(n)


def destroy(comms: list[minincl.Communicator]) -> None:
    for c in comms:
        c.destroy()


def pairs(ring: list[int]) -> list[tuple[int, int]]:
    return [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))]


def adjacent(ring: list[int], a: int, b: int) -> bool:
    return (a, b) in pairs(ring) or (b, a) in pairs(ring)


def search(xml: str, nranks: int) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(core.topo_search_json(xml, nranks))
    return result


def default_channels(nranks: int) -> int:
    return max(1, min(4, len(os.sched_getaffinity(0)) // nranks))


def check_collectives(comm: minincl.Communicator) -> int:
    """allreduce, broadcast, reduce, allgather, reduce_scatter against NumPy; returns checks."""
    n, r = comm.nranks, comm.rank
    checks = 0
    for count in (1, 7, 5000, 70001):  # 70001 float32 crosses 16 KiB slots and channels
        inputs = [((np.arange(count) * (q + 1) + q) % 11).astype(np.float32) for q in range(n)]
        total = np.add.reduce(np.stack(inputs), axis=0, dtype=np.float32)
        x = inputs[r].copy()
        comm.allreduce(x)
        np.testing.assert_array_equal(x, total)
        b = inputs[r].copy()
        comm.broadcast(b, root=n - 1)
        np.testing.assert_array_equal(b, inputs[n - 1])
        red = inputs[r].copy()
        comm.reduce(red, root=1 % n)
        if r == 1 % n:
            np.testing.assert_array_equal(red, total)
        g = comm.allgather(inputs[r])
        np.testing.assert_array_equal(g, np.concatenate(inputs))
        rs = comm.reduce_scatter(np.concatenate([inputs[r] + q for q in range(n)]))
        np.testing.assert_array_equal(rs, total + r * n)
        checks += 5
    return checks


def run_checked(comms: list[minincl.Communicator]) -> None:
    assert run_ranks(comms, check_collectives) == [20] * len(comms)


# --------------------------------------------------------------------------- threads


def test_default_without_file_keeps_working(topo_env: pytest.MonkeyPatch) -> None:
    topo_env.delenv("MININCL_NCHANNELS", raising=False)
    comms = init(3)
    try:
        t = comms[0].topology()
        assert all(c.topology() == t for c in comms)
        assert t.source == "detected" and t.nchannels == default_channels(3)
        assert all(sorted(ring) == [0, 1, 2] for ring in t.rings)
        assert all(d.startswith("NUMA") for d in t.devices)
        numa_nodes = json.loads(core.topo_report(json=True))["cpus"]
        if len(numa_nodes) == 1:  # this machine: every rank on NUMA0, rank order
            assert t.rings == [[0, 1, 2]] * t.nchannels and not t.searched and t.warnings == []
        assert t.bandwidth_scale == 1.0 or t.searched
        run_checked(comms)
    finally:
        destroy(comms)


def test_pcie_server_rings_cross_sockets_twice(topo_env: pytest.MonkeyPatch) -> None:
    # Ranks alternate between the sockets, so the right ring is far from rank order.
    gpu_of = [0, 4, 1, 5, 2, 6, 3, 7]
    topo_env.setenv("MININCL_TOPO_FILE", PCIE)
    topo_env.setenv("MININCL_TOPO_RANK_MAP", ",".join(map(str, gpu_of)))
    topo_env.setenv("MININCL_NCHANNELS", "2")
    comms = init(8)
    try:
        t = comms[0].topology()
        assert all(c.topology() == t for c in comms)
        assert t.searched and t.on_gpus and t.nchannels == 2 and t.search_channels >= 1
        assert t.devices == [f"GPU{g}" for g in gpu_of]
        rank_of = {g: r for r, g in enumerate(gpu_of)}
        for ring, hops in zip(t.rings, t.ring_hops):
            assert sorted(ring) == list(range(8)) and ring != list(range(8))
            crossings = sum(PCIE_NUMA[gpu_of[a]] != PCIE_NUMA[gpu_of[b]] for a, b in pairs(ring))
            assert crossings == 2, ring
            for a, b in PCIE_SWITCH_MATES:
                assert adjacent(ring, rank_of[a], rank_of[b]), (ring, a, b)
            assert hops.count("SYS") == 2 and len(hops) == 8
        run_checked(comms)
    finally:
        destroy(comms)


@pytest.mark.parametrize("nranks", [8, 6])
def test_dgx1_rings_are_the_search_and_nvlink_only(topo_env: pytest.MonkeyPatch, nranks: int) -> None:
    topo_env.setenv("MININCL_TOPO_FILE", DGX1)
    topo_env.setenv("MININCL_NCHANNELS", "2")
    comms = init(nranks)
    try:
        t = comms[0].topology()
        expected = search(DGX1, nranks)
        assert t.search_channels == expected["nchannels"] >= 2
        assert t.rings == expected["rings"][:2]  # channel c runs the search's ring c
        assert t.ring_hops == expected["ring_hops"][:2]
        assert all(h.startswith("NV") for hops in t.ring_hops for h in hops)
        assert t.path_bandwidth_gbs == pytest.approx(expected["channel_bw"], abs=0.05)
        assert any(ring != list(range(nranks)) for ring in t.rings)
        run_checked(comms)
    finally:
        destroy(comms)


@pytest.mark.parametrize("proto", ["simple", "ll", "ll128"])
def test_ring_algorithm_follows_the_order(topo_env: pytest.MonkeyPatch, proto: str) -> None:
    # Five ranks on two hosts of DGX H100s (GPUs 0,8,1,9,2): a ring through both hosts.
    topo_env.setenv("MININCL_TOPO_FILE", TWO_NODES)
    topo_env.setenv("MININCL_TOPO_RANK_MAP", "0,8,1,9,2")
    topo_env.setenv("MININCL_NCHANNELS", "2")
    topo_env.setenv("MININCL_ALGO", "ring")
    topo_env.setenv("MININCL_PROTO", proto)
    comms = init(5)
    try:
        t = comms[0].topology()
        host = [0, 1, 0, 1, 0]
        for ring, hops in zip(t.rings, t.ring_hops):
            assert sum(host[a] != host[b] for a, b in pairs(ring)) == 2, ring
            assert hops.count("NET") == 2
        assert t.rings[0] != list(range(5))
        run_checked(comms)
    finally:
        destroy(comms)


def test_channel_count_follows_search_unless_set(topo_env: pytest.MonkeyPatch) -> None:
    topo_env.setenv("MININCL_TOPO_FILE", PCIE)
    topo_env.delenv("MININCL_NCHANNELS", raising=False)
    comms = init(4)
    try:
        t = comms[0].topology()
        assert t.search_channels == search(PCIE, 4)["nchannels"]
        assert t.nchannels == min(default_channels(4), t.search_channels)
    finally:
        destroy(comms)
    topo_env.setenv("MININCL_NCHANNELS", "3")  # more than the search found: rings repeat
    comms = init(4)
    try:
        t = comms[0].topology()
        assert t.nchannels == 3 and t.search_channels < 3
        assert t.rings[2] == t.rings[2 % t.search_channels]
        run_checked(comms)
    finally:
        destroy(comms)


def test_ranks_sharing_a_gpu_are_neighbours(topo_env: pytest.MonkeyPatch) -> None:
    topo_env.setenv("MININCL_TOPO_FILE", PCIE)
    topo_env.setenv("MININCL_TOPO_RANK_MAP", "0,4,0,4")
    comms = init(4)
    try:
        t = comms[0].topology()
        assert t.devices == ["GPU0", "GPU4", "GPU0", "GPU4"]
        ring = t.rings[0]
        assert adjacent(ring, 0, 2) and adjacent(ring, 1, 3)
        assert sorted(t.ring_hops[0]) == ["SYS", "SYS", "X", "X"]
        run_checked(comms)
    finally:
        destroy(comms)


def write_slow_pcie(path: Path) -> str:
    """Two GPUs behind PCIe Gen1 x1 links (0.25 GB/s each way)."""
    gpus = "".join(
        f'    <pci busid="0000:0{i + 1}:00.0" class="0x030200" vendor="0x10de" device="0x20f1" '
        f'link_speed="2.5 GT/s PCIe" link_width="1">\n      <gpu dev="{i}" sm="80" rank="{i}" gdr="0"/>\n    </pci>\n'
        for i in range(2)
    )
    path.write_text(
        '<system version="1">\n  <cpu numaid="0" affinity="00000003" arch="x86_64" vendor="GenuineIntel" '
        f'familyid="6" modelid="106">\n{gpus}  </cpu>\n</system>\n'
    )
    return str(path)


def test_tuner_bandwidth_comes_from_the_paths(topo_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    slow = write_slow_pcie(tmp_path / "slow.xml")
    scales = {}
    for name, xml in (("slow", slow), ("pcie", PCIE)):
        topo_env.setenv("MININCL_TOPO_FILE", xml)
        comms = init(2)
        try:
            t = comms[0].topology()
            # the JSON report rounds to 0.1 GB/s
            assert t.searched and t.path_bandwidth_gbs == pytest.approx(search(xml, 2)["channel_bw"], abs=0.05)
            scales[name] = t.bandwidth_scale
            run_checked(comms)
        finally:
            destroy(comms)
    assert search(slow, 2)["channel_bw"] == pytest.approx(0.25, abs=0.05)
    assert 0 < scales["slow"] < scales["pcie"] <= 1.0 or 0 < scales["slow"] < 1.0 == scales["pcie"]


@pytest.mark.parametrize(
    ("env", "warning"),
    [
        ({"MININCL_TOPO_FILE": "/nonexistent/topo.xml"}, "cannot open"),
        ({"MININCL_TOPO_FILE": PCIE, "MININCL_TOPO_RANK_MAP": "0,x,2"}, "not a comma list"),
        ({"MININCL_TOPO_FILE": PCIE, "MININCL_TOPO_RANK_MAP": "0,1"}, "names 2 GPUs for 3 ranks"),
        ({"MININCL_TOPO_FILE": PCIE, "MININCL_TOPO_RANK_MAP": "0,1,9"}, "does not have"),
        # (2^32 wrapped onto GPU 0)
        ({"MININCL_TOPO_FILE": PCIE, "MININCL_TOPO_RANK_MAP": "4294967296,1,2"}, "not a comma list"),
    ],
)
def test_unusable_topology_falls_back_to_rank_order(
    topo_env: pytest.MonkeyPatch, env: dict[str, str], warning: str
) -> None:
    for k, v in env.items():
        topo_env.setenv(k, v)
    comms = init(3)
    try:
        t = comms[0].topology()
        assert not t.searched and t.rings == [[0, 1, 2]] * t.nchannels
        assert any(warning in w and w.endswith("; rings use rank order") for w in t.warnings), t.warnings
        assert t.bandwidth_scale == 1.0
        run_checked(comms)
    finally:
        destroy(comms)


def test_a_dump_that_cannot_be_written_warns_without_changing_the_rings(topo_env: pytest.MonkeyPatch) -> None:
    topo_env.setenv("MININCL_TOPO_FILE", PCIE)
    comms = init(3)
    try:
        rings = comms[0].topology().rings
    finally:
        destroy(comms)
    topo_env.setenv("MININCL_TOPO_DUMP_FILE", "/nonexistent/dir/topo.xml")
    comms = init(3)
    try:
        t = comms[0].topology()
        assert t.searched and t.rings == rings
        # (it said "rings use rank order" while the rings were the search's)
        assert t.warnings == ["cannot write MININCL_TOPO_DUMP_FILE /nonexistent/dir/topo.xml"], t.warnings
        run_checked(comms)
    finally:
        destroy(comms)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_short_dump_that_cannot_be_written_warns(topo_env: pytest.MonkeyPatch) -> None:
    # (This machine's detected topology is a few hundred bytes: it failed only at the
    # stream's flush, after the check, and no warning said so.)
    topo_env.setenv("MININCL_TOPO_DUMP_FILE", "/dev/full")
    comms = init(2)
    try:
        warnings = comms[0].topology().warnings
        assert "cannot write MININCL_TOPO_DUMP_FILE /dev/full" in warnings, warnings
        run_checked(comms)
    finally:
        destroy(comms)


def test_info_log_names_the_ring_and_why(tmp_path: Path) -> None:
    code = (
        "import minincl\n"
        "cs = minincl.Communicator.init_all(4)\n"
        "print(cs[0].topology().rings[0])\n"
        "[c.destroy() for c in cs]\n"
    )
    env = {
        **os.environ,
        "MININCL_DEBUG": "INFO",
        "MININCL_DEBUG_SUBSYS": "INIT",
        "MININCL_TOPO_FILE": PCIE,
        "MININCL_TOPO_RANK_MAP": "0,4,1,5",
        "MININCL_NCHANNELS": "1",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    ring = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(ring) == [0, 1, 2, 3] and adjacent(ring, 0, 2) and adjacent(ring, 1, 3)
    assert f"channel 0 ring: {' '.join(map(str, ring))} (hops" in out.stderr
    assert "MININCL_TOPO_RANK_MAP: rank i on GPU map[i]; search over 4 devices" in out.stderr
    assert "ranks on: GPU0 GPU4 GPU1 GPU5" in out.stderr


# --------------------------------------------------------------------------- processes


def process_rank(comm: minincl.Communicator) -> tuple[list[list[int]], list[str], int]:
    t = comm.topology()
    return t.rings, t.devices, check_collectives(comm)


def test_processes_agree_on_the_search_order(topo_env: pytest.MonkeyPatch) -> None:
    topo_env.setenv("MININCL_TOPO_FILE", PCIE)
    topo_env.setenv("MININCL_TOPO_RANK_MAP", "0,4,1,5")
    topo_env.setenv("MININCL_NCHANNELS", "2")
    results = minincl.launch(process_rank, 4, timeout=120)
    rings, devices, checks = results[0]
    assert all(r == (rings, devices, checks) for r in results)
    assert devices == ["GPU0", "GPU4", "GPU1", "GPU5"] and checks == 20
    for ring in rings:
        assert adjacent(ring, 0, 2) and adjacent(ring, 1, 3) and ring != [0, 1, 2, 3]


def pinned_rank(nranks: int, uid: bytes, rank: int, cpu: int, queue: Any) -> None:
    """A rank pinned to one CPU before init, so the NUMA rule places it."""
    try:
        os.sched_setaffinity(0, {cpu})
        with minincl.Communicator(nranks, uid, rank, "cpu") as comm:
            t = comm.topology()
            queue.put((rank, (t.rings, t.devices, t.on_gpus, check_collectives(comm))))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        queue.put((rank, repr(e)))


def test_pinned_cpu_ranks_grouped_by_numa_node(topo_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or max(cpus[:2]) >= 32:
        pytest.skip("needs two CPUs numbered below 32")
    masks = [f"{1 << c:08x}" for c in cpus[:2]]
    xml = tmp_path / "two_numa.xml"
    xml.write_text(
        '<system version="1">\n'
        + "".join(
            f'  <cpu numaid="{i}" affinity="{m}" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="106"/>\n'
            for i, m in enumerate(masks)
        )
        + "</system>\n"
    )
    topo_env.setenv("MININCL_TOPO_FILE", str(xml))
    ctx = mp.get_context("spawn")
    uid, queue = minincl.get_unique_id(), ctx.Queue()
    procs = [ctx.Process(target=pinned_rank, args=(4, uid, r, cpus[r % 2], queue), daemon=True) for r in range(4)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(10)
    assert all(isinstance(v, tuple) for v in results.values()), results
    rings, devices, on_gpus, checks = results[0]
    assert all(results[r] == results[0] for r in range(4))
    assert devices == ["NUMA0", "NUMA1", "NUMA0", "NUMA1"] and not on_gpus and checks == 20
    for ring in rings:
        assert adjacent(ring, 0, 2) and adjacent(ring, 1, 3)


def test_the_topology_subsystem_logs_what_the_search_made(tmp_path: Path) -> None:
    """MININCL_DEBUG_SUBSYS=TOPO ("the topology search") said nothing of it: the plan's lines
    (the search, each channel's ring and tree, the tuner's path bandwidth) were INIT's alone."""
    env = {**os.environ, "MININCL_DEBUG": "INFO", "MININCL_DEBUG_SUBSYS": "TOPO", "MININCL_TOPO_FILE": PCIE}
    env.pop("MININCL_TOPO_RANK_MAP", None)
    run = subprocess.run(
        [sys.executable, "-c", "import minincl; [c.destroy() for c in minincl.Communicator.init_all(4)]"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    for said in ("search over ", "channel 0 ring: ", "channel 0 tree 0", "tuner: path bandwidth"):
        assert said in run.stderr, run.stderr
    assert "rank 0/4:" not in run.stderr, run.stderr  # (INIT's own lines stay INIT's)
