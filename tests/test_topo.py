"""Topology subsystem: XML fixtures, path classes, ring/tree search, detection."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

core = pytest.importorskip("minincl._core")

FIXTURES = Path(__file__).parent / "fixtures" / "topo"
ALL_FIXTURES = [
    "pcie_2socket_8gpu.xml",
    "dgx1_v100.xml",
    "dgx_h100.xml",
    "dgx_h100_2node.xml",
    "cloud_partial.xml",
]

Report = dict[str, Any]


def load(name: str) -> Report:
    result: Report = json.loads(core.topo_report(xml=str(FIXTURES / name), json=True))
    return result


def cell(rep: Report, a: str, b: str) -> str:
    labels: list[str] = rep["matrix"]["labels"]
    value: str = rep["matrix"]["cells"][labels.index(a)][labels.index(b)]
    return value


def gpu_numa(rep: Report) -> dict[int, int]:
    return {int(d["name"][3:]): d["numa"] for d in rep["devices"] if d["type"] == "GPU"}


def cyclic_pairs(ring: list[int]) -> list[tuple[int, int]]:
    return [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))]


def adjacent(ring: list[int], a: int, b: int) -> bool:
    return (a, b) in cyclic_pairs(ring) or (b, a) in cyclic_pairs(ring)


def check_trees(rep: Report, nranks: int) -> None:
    assert len(rep["trees"]) == rep["nchannels"]
    for tree in rep["trees"]:
        assert [n["rank"] for n in tree] == list(range(nranks))
        roots = [n["rank"] for n in tree if n["parent"] == -1]
        assert len(roots) == 1
        for n in tree:
            for child in n["children"]:
                assert tree[child]["parent"] == n["rank"]
            if n["parent"] != -1:
                assert n["rank"] in tree[n["parent"]]["children"]
        seen, todo = set(), [roots[0]]
        while todo:
            r = todo.pop()
            seen.add(r)
            todo.extend(tree[r]["children"])
        assert seen == set(range(nranks))


# --------------------------------------------------------------------------- PCIe server


def test_pcie_server_matrix() -> None:
    rep = load("pcie_2socket_8gpu.xml")
    assert cell(rep, "GPU0", "GPU0") == "X"
    assert cell(rep, "GPU0", "GPU1") == "PIX"  # same PCIe switch
    assert cell(rep, "GPU0", "GPU2") == "NODE"  # other host bridge, same socket
    assert cell(rep, "GPU0", "GPU4") == "SYS"  # across sockets
    assert cell(rep, "GPU6", "GPU7") == "PIX"
    assert cell(rep, "GPU0", "NIC0") == "PIX"
    assert cell(rep, "GPU5", "NIC0") == "SYS"
    assert gpu_numa(rep) == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}


def test_pcie_server_rings_cross_sockets_twice_and_keep_switch_mates_adjacent() -> None:
    rep = load("pcie_2socket_8gpu.xml")
    numa = gpu_numa(rep)
    assert rep["nchannels"] >= 1
    for ring in rep["rings"]:
        assert sorted(ring) == list(range(8))
        crossings = sum(numa[a] != numa[b] for a, b in cyclic_pairs(ring))
        assert crossings == 2
        for a, b in [(0, 1), (2, 3), (4, 5), (6, 7)]:
            assert adjacent(ring, a, b), f"switch-mates {a},{b} not adjacent in {ring}"
    for hops in rep["ring_hops"]:
        assert hops.count("SYS") == 2
    check_trees(rep, 8)


# --------------------------------------------------------------------------- DGX-1


def test_dgx1_matrix() -> None:
    rep = load("dgx1_v100.xml")
    assert cell(rep, "GPU0", "GPU1") == "NV1"
    assert cell(rep, "GPU0", "GPU3") == "NV2"
    assert cell(rep, "GPU0", "GPU4") == "NV2"
    assert cell(rep, "GPU1", "GPU5") == "NV2"
    assert cell(rep, "GPU2", "GPU6") == "NV1"
    assert cell(rep, "GPU0", "GPU5") == "SYS"
    assert cell(rep, "GPU0", "NIC0") == "PIX"
    assert cell(rep, "GPU0", "NIC1") == "PHB"
    assert cell(rep, "GPU0", "NIC2") == "SYS"


def test_dgx1_rings_use_nvlink_only() -> None:
    rep = load("dgx1_v100.xml")
    assert rep["nchannels"] >= 2
    for ring in rep["rings"]:
        assert sorted(ring) == list(range(8))
        for a, b in cyclic_pairs(ring):
            assert cell(rep, f"GPU{a}", f"GPU{b}").startswith("NV"), (ring, a, b)
    for hops in rep["ring_hops"]:
        assert all(h.startswith("NV") for h in hops)
    check_trees(rep, 8)


# --------------------------------------------------------------------------- DGX H100


def test_dgx_h100_matrix() -> None:
    rep = load("dgx_h100.xml")
    for a in range(8):
        for b in range(8):
            expected = "X" if a == b else "NV18"
            assert cell(rep, f"GPU{a}", f"GPU{b}") == expected
        assert cell(rep, f"GPU{a}", f"NIC{a}") == "PIX"
    assert cell(rep, "GPU0", "NIC1") == "NODE"
    assert cell(rep, "GPU0", "NIC4") == "SYS"
    nics = [d for d in rep["devices"] if d["type"] == "NIC"]
    assert len(nics) == 8 and all(d["speed_mbps"] == 400000 for d in nics)


def test_dgx_h100_rings_full_bandwidth() -> None:
    rep = load("dgx_h100.xml")
    assert rep["nchannels"] >= 16  # 18 NVLinks per GPU carry many channels
    for ring, hops in zip(rep["rings"], rep["ring_hops"]):
        assert sorted(ring) == list(range(8))
        assert hops == ["NV18"] * 8
    check_trees(rep, 8)


def test_nranks_subset() -> None:
    rep = json.loads(core.topo_search_json(str(FIXTURES / "dgx_h100.xml"), 4))
    assert all(sorted(r) == [0, 1, 2, 3] for r in rep["rings"])
    check_trees(rep, 4)


# --------------------------------------------------------------------------- 2 x DGX H100


def test_two_nodes_matrix() -> None:
    rep = load("dgx_h100_2node.xml")
    assert len(rep["hosts"]) == 2
    assert cell(rep, "GPU0", "GPU7") == "NV18"
    assert cell(rep, "GPU8", "GPU15") == "NV18"
    assert cell(rep, "GPU0", "GPU8") == "NET"
    assert cell(rep, "GPU3", "NIC12") == "NET"
    assert cell(rep, "GPU9", "NIC9") == "PIX"


def test_two_nodes_rings_join_chains_through_nearest_nics() -> None:
    rep = load("dgx_h100_2node.xml")
    host = {int(d["name"][3:]): d["host"] for d in rep["devices"] if d["type"] == "GPU"}
    assert rep["nchannels"] >= 8
    nics_used = set()
    for ring, net in zip(rep["rings"], rep["ring_net"]):
        assert sorted(ring) == list(range(16))
        assert sum(host[a] != host[b] for a, b in cyclic_pairs(ring)) == 2  # one chain per host
        assert len(net) == 2
        for hop in net:
            assert host[hop["from"]] != host[hop["to"]]
            # leave and enter through the NIC on the chain end's own PCIe switch
            assert cell(rep, f"GPU{hop['from']}", f"NIC{hop['nic_out']}") == "PIX"
            assert cell(rep, f"GPU{hop['to']}", f"NIC{hop['nic_in']}") == "PIX"
            nics_used.add(hop["nic_out"])
    assert len(nics_used) > 2  # channels spread over the NICs
    check_trees(rep, 16)
    # Trees: a chain inside each host, hosts joined head to head.
    for tree in rep["trees"]:
        cross = [n for n in tree if n["parent"] != -1 and host[n["parent"]] != host[n["rank"]]]
        assert len(cross) == 1


# --------------------------------------------------------------------------- cloud file


def test_cloud_partial_file() -> None:
    rep = load("cloud_partial.xml")
    types = [d["type"] for d in rep["devices"]]
    assert types.count("GPU") == 8 and types.count("NIC") == 8
    assert cell(rep, "GPU0", "NIC0") == "PIX"
    assert cell(rep, "GPU0", "GPU1") == "PHB"
    assert cell(rep, "GPU0", "GPU2") == "SYS"
    assert all(sorted(r) == list(range(8)) for r in rep["rings"])
    numa = gpu_numa(rep)
    for ring in rep["rings"]:
        assert sum(numa[a] != numa[b] for a, b in cyclic_pairs(ring)) == 4  # 4 NUMA nodes
    check_trees(rep, 8)


# --------------------------------------------------------------------------- text, XML, errors


def test_text_report_looks_like_nvidia_smi() -> None:
    text: str = core.topo_report(xml=str(FIXTURES / "dgx1_v100.xml"))
    header = next(line for line in text.splitlines() if line.lstrip().startswith("GPU0"))
    assert "CPU Affinity" in header and "NUMA Affinity" in header
    row = next(line for line in text.splitlines() if line.startswith("GPU0 "))
    assert row.split()[:4] == ["GPU0", "X", "NV1", "NV1"]
    assert "0-19,40-59" in row
    assert "Ring 0:" in text and "Tree 0:" in text


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_xml_round_trip(name: str, tmp_path: Path) -> None:
    first: str = core.topo_dump_xml(str(FIXTURES / name))
    dumped = tmp_path / "dump.xml"
    dumped.write_text(first)
    assert core.topo_dump_xml(str(dumped)) == first
    original, again = load(name), json.loads(core.topo_report(xml=str(dumped), json=True))
    assert again["matrix"] == original["matrix"]
    assert again["rings"] == original["rings"]


def test_dump_option_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.xml"
    core.topo_report(xml=str(FIXTURES / "dgx_h100.xml"), dump=str(out))
    assert out.read_text().startswith('<system version="1">')
    monkeypatch.setenv("MININCL_TOPO_FILE", str(out))
    rep = json.loads(core.topo_report(json=True))
    assert cell(rep, "GPU2", "GPU5") == "NV18"


def test_what_the_loader_skips_is_warned(tmp_path: Path) -> None:
    """A <gpu> outside a <pci>, a second <gpu> in one <pci>, and an affinity that is not a
    hexadecimal mask were dropped without a word (other unknown elements were warned)."""
    pci = '<pci busid="0000:01:00.0" class="0x030200"><gpu dev="0" sm="80"/><gpu dev="1" sm="80"/></pci>'
    xml = tmp_path / "skips.xml"
    xml.write_text(
        '<system version="1">\n<cpu numaid="0" affinity="ff">\n<gpu dev="2" sm="80"/>\n'
        f"{pci}\n</cpu>\n"
        '<cpu numaid="1" affinity="0-3"/>\n</system>\n'
    )
    warnings = json.loads(core.topo_report(xml=str(xml), json=True))["warnings"]
    expected = [
        f"{xml}:3: ignored <gpu> inside <cpu>",
        f"{xml}:4: ignored a second <gpu> inside one <pci>",
        f'{xml}:6: affinity="0-3" is not a hexadecimal CPU mask (its other characters are skipped)',
    ]
    assert all(w in warnings for w in expected), warnings


def test_nonsense_values_are_refused_or_read_as_unknown(tmp_path: Path) -> None:
    """A link speed of "nan" read as unlimited bandwidth (32 channels at 12 GB/s); two hosts
    of one name loaded as two; a character reference with junk after its digits decoded."""
    gpus = "".join(
        f'<pci busid="0000:0{i + 1}:00.0" class="0x030200" link_speed="{{speed}}" link_width="1">'
        f'<gpu dev="{i}" sm="80"/></pci>'
        for i in range(2)
    )
    channels = []
    for speed in ("nan", "inf", ""):  # ("": unknown, read as PCIe Gen3)
        xml = tmp_path / "speed.xml"
        xml.write_text(f'<system version="1"><cpu numaid="0" affinity="ff">{gpus.format(speed=speed)}</cpu></system>')
        rep = json.loads(core.topo_report(xml=str(xml), json=True))
        channels.append((rep["nchannels"], rep["channel_bw"]))
    assert channels[0] == channels[1] == channels[2], channels
    host = '<system hostname="a"><cpu numaid="0" affinity="ff"/></system>'
    (tmp_path / "hosts.xml").write_text(f"<cluster>\n{host}\n{host}\n</cluster>")
    with pytest.raises(
        Exception, match=r'hosts\.xml:3: <system hostname="a">: an earlier <system> names the same host'
    ):
        core.topo_report(xml=str(tmp_path / "hosts.xml"))
    (tmp_path / "ref.xml").write_text(
        '<system version="1"><cpu numaid="0" affinity="ff" vendor="x&#12abc;y"/></system>'
    )
    with pytest.raises(Exception, match="unsupported character reference &#12abc;"):
        core.topo_report(xml=str(tmp_path / "ref.xml"))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_dump_that_cannot_be_written_says_so() -> None:
    # (A dump shorter than the stream's buffer failed only at its flush, after the check.)
    with pytest.raises(Exception, match="cannot write the topology dump to /dev/full"):
        core.topo_report(dump="/dev/full")
    with pytest.raises(Exception, match="cannot write the topology dump to /dev/full"):
        core.topo_report(xml=str(FIXTURES / "cloud_partial.xml"), dump="/dev/full")


def test_malformed_file_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text(
        '<system version="1">\n'
        '  <cpu numaid="0" affinity="ff">\n'
        '    <pci busid="0000:01:00.0" class="0x030200">\n'
        "  </cpu>\n"
        "</system>\n"
    )
    with pytest.raises(Exception, match=r"bad\.xml:4: </cpu> does not match <pci>"):
        core.topo_report(xml=str(bad))
    bad.write_text('<system version="1">\n  <cpu numaid=0>\n</system>\n')
    with pytest.raises(Exception, match=r"bad\.xml:2: .*quoted"):
        core.topo_report(xml=str(bad))
    bad.write_text('<system version="1">\n  <cpu numaid="0">\n    <pci class="0x030200"/>\n  </cpu>\n</system>\n')
    with pytest.raises(Exception, match=r"bad\.xml:3: <pci> has no busid"):
        core.topo_report(xml=str(bad))
    bad.write_text('<cluster version="1">\n  <system version="1">\n')
    with pytest.raises(Exception, match=r"bad\.xml:2: <system> is never closed"):
        core.topo_report(xml=str(bad))
    with pytest.raises(Exception, match="cannot open"):
        core.topo_report(xml=str(tmp_path / "missing.xml"))


def test_hostile_files_are_refused_naming_what_is_wrong(tmp_path: Path) -> None:
    """Files no topology is: elements nested past any machine's depth (the parser recursed
    per level and overflowed its stack), numbers out of range (they wrapped, silently), text
    that is not UTF-8, and paths that are not a regular file (a FIFO blocked, /dev/zero filled
    memory)."""
    deep = tmp_path / "deep.xml"
    deep.write_text('<system version="1">' + "<a>" * 30000 + "</a>" * 30000 + "</system>")
    with pytest.raises(Exception, match=r"deep\.xml:1: elements nest deeper than 64 levels"):
        core.topo_report(xml=str(deep))
    gpu = '<pci busid="0000:01:00.0" class="0x030200" link_width="{w}"><gpu dev="0" sm="{sm}"/></pci>'
    for width, sm, attribute in (
        ("4294967312", "80", "link_width"),  # (read as 16 before)
        ("16", "-80", "sm"),
        ("16", "99999999999999999999", "sm"),  # (strtol saturates: read as -1 before)
    ):
        bad = tmp_path / "range.xml"
        bad.write_text(
            f'<system version="1">\n<cpu numaid="0" affinity="ff">\n{gpu.format(w=width, sm=sm)}\n</cpu></system>'
        )
        with pytest.raises(Exception, match=rf"range\.xml:3: attribute {attribute}=.* is out of range"):
            core.topo_report(xml=str(bad))
    for vendor, error in ((b"\xc3\xa9", None), (b"\xff\xfe", "0xff"), (b"\xed\xa0\x80", "0xed")):  # (é; a surrogate)
        text = b'<system version="1">\n<cpu numaid="0" affinity="ff" vendor="' + vendor + b'"/></system>'
        (tmp_path / "vendor.xml").write_bytes(text)
        if error is None:
            assert "CPU" in core.topo_report(xml=str(tmp_path / "vendor.xml"))
            continue
        # (it loaded; `minincl topo` then died decoding its report, naming neither file nor line)
        with pytest.raises(Exception, match=rf"vendor\.xml:2: byte {error} is not UTF-8 text"):
            core.topo_report(xml=str(tmp_path / "vendor.xml"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (tmp_path, fifo, Path("/dev/zero")):
        with pytest.raises(Exception, match="is not a regular file"):
            core.topo_report(xml=str(path))


# --------------------------------------------------------------------------- detection


def test_detect_this_machine(tmp_path: Path) -> None:
    rep = json.loads(core.topo_report(json=True))
    assert rep["cpus"], "at least one NUMA node"
    gpus = [d for d in rep["devices"] if d["type"] == "GPU"]
    text: str = core.topo_report()
    if not gpus:
        assert "No GPUs found" in text
        assert rep["nchannels"] == 0 and rep["rings"] == []
    xml: str = core.topo_dump_xml()
    path = tmp_path / "detected.xml"
    path.write_text(xml)
    again = json.loads(core.topo_report(xml=str(path), json=True))
    assert again["matrix"]["labels"] == rep["matrix"]["labels"]
    assert again["matrix"]["cells"] == rep["matrix"]["cells"]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _pci_device(root: Path, chain: list[str], attrs: dict[str, str]) -> None:
    """Create /sys/devices/<chain...> with attributes and the /sys/bus/pci/devices link."""
    device = root / "sys" / "devices" / Path(*chain)
    for key, value in attrs.items():
        _write(device / key, value)
    link = root / "sys" / "bus" / "pci" / "devices" / chain[-1]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(device, link.parent))


def _fake_sysfs(root: Path) -> None:
    _write(root / "sys/devices/system/node/node0/cpulist", "0-3")
    _write(root / "sys/devices/system/node/node1/cpulist", "4-7")
    port = {"class": "0x060400", "vendor": "0x8086", "device": "0x347a", "numa_node": "0"}
    switch = {
        "class": "0x060400",
        "vendor": "0x1000",
        "device": "0xc010",
        "numa_node": "0",
        "current_link_speed": "16.0 GT/s PCIe",
        "current_link_width": "16",
    }
    gpu = {
        "class": "0x030200",
        "vendor": "0x10de",
        "device": "0x20b0",
        "numa_node": "0",
        "current_link_speed": "16.0 GT/s PCIe",
        "current_link_width": "16",
    }
    nic = {"class": "0x020000", "vendor": "0x15b3", "device": "0x101b", "numa_node": "0"}
    top = ["pci0000:00", "0000:00:01.0", "0000:01:00.0"]  # root port, switch upstream port
    _pci_device(root, top[:2], port)
    _pci_device(root, top, switch)
    for down, dev, attrs in [
        ("0000:02:00.0", "0000:03:00.0", gpu),
        ("0000:02:01.0", "0000:04:00.0", gpu),
        ("0000:02:02.0", "0000:05:00.0", nic),
    ]:
        _pci_device(root, [*top, down], switch)
        _pci_device(root, [*top, down, dev], attrs)
    _pci_device(root, ["pci0000:80", "0000:80:01.0"], {**port, "numa_node": "1"})
    _pci_device(root, ["pci0000:80", "0000:80:01.0", "0000:81:00.0"], {**gpu, "numa_node": "1"})
    net = root / "sys/class/net/eth0"
    _write(net / "speed", "100000")
    (net / "device").symlink_to(
        os.path.relpath(root / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:05:00.0", net)
    )


def test_detect_fake_sysfs(tmp_path: Path) -> None:
    _fake_sysfs(tmp_path)
    rep = json.loads(core.topo_detect_json(str(tmp_path)))
    names = [d["name"] for d in rep["devices"]]
    assert names == ["GPU0", "GPU1", "GPU2", "NIC0"]
    assert cell(rep, "GPU0", "GPU1") == "PIX"  # switch ports folded into one switch
    assert cell(rep, "GPU0", "NIC0") == "PIX"
    assert cell(rep, "GPU0", "GPU2") == "SYS"
    assert gpu_numa(rep) == {0: 0, 1: 0, 2: 1}
    nic = rep["devices"][3]
    assert nic["ifname"] == "eth0" and nic["speed_mbps"] == 100000
    assert nic["busid"] == "0000:05:00.0"
    assert rep["nchannels"] >= 1 and sorted(rep["rings"][0]) == [0, 1, 2]
    xml: str = core.topo_detect_xml(str(tmp_path))
    assert 'busid="0000:03:00.0"' in xml and 'name="eth0"' in xml


def test_detect_empty_or_flat_sysfs(tmp_path: Path) -> None:
    rep = json.loads(core.topo_detect_json(str(tmp_path)))  # nothing there at all
    assert len(rep["cpus"]) == 1 and rep["devices"] == [] and rep["warnings"]
    # A flattened tree: the device is a plain directory, not a link into /sys/devices.
    flat = tmp_path / "sys/bus/pci/devices/0000:00:04.0"
    for key, value in {"class": "0x030200", "vendor": "0x10de", "numa_node": "-1"}.items():
        _write(flat / key, value)
    rep = json.loads(core.topo_detect_json(str(tmp_path)))
    assert [d["name"] for d in rep["devices"]] == ["GPU0"]
    assert any("flattened" in w for w in rep["warnings"])
