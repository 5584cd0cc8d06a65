"""mnclCommMemAlloc and mnclMemFree (the C API's windows, NCCL's ncclMemAlloc with registered
buffers), through ctypes: rank processes whose buffers lie in their windows get the results
NumPy computes, the memory is the window's shared memory (its mapping in /proc/self/maps),
and every wrong use is refused with a reason."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_c_api import CONFIG_MAGIC, MNCL_INVALID_ARGUMENT, MNCL_INVALID_USAGE, UNDEF, Config, UniqueId, open_lib

MNCL_SUCCESS = 0


class ConfigWithWindow(Config):
    """mnclConfig_t with windowBytes (test_c_api's Config is the layout from before it)."""

    _fields_ = [("windowBytes", ctypes.c_longlong)]


# A rank process: inits rank RANK of NRANKS from the id in argv, takes its buffers from
# mnclCommMemAlloc, runs each collective and checks it against NumPy, then frees. What it
# saw goes to stdout as lines "name ok" or "name <why>".
RANK_SCRIPT = textwrap.dedent(
    """
    import ctypes, sys
    import numpy as np
    from test_c_window_memory import ConfigWithWindow, in_shared_window
    from test_c_api import CONFIG_MAGIC, UNDEF, UniqueId, open_lib

    rank, nranks, window = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[4])
    lib = open_lib(ConfigWithWindow)
    uid = UniqueId()
    ctypes.memmove(ctypes.addressof(uid), bytes.fromhex(sys.argv[3]), ctypes.sizeof(uid))
    cfg = ConfigWithWindow(ctypes.sizeof(ConfigWithWindow), CONFIG_MAGIC, 100, UNDEF, UNDEF, UNDEF,
                           window if window >= 0 else UNDEF)
    comm = ctypes.c_void_p()
    rc = lib.mnclCommInitRankConfig(ctypes.byref(comm), nranks, uid, rank, cfg)
    assert rc == 0, lib.mnclGetLastError(None)

    def alloc(nbytes):
        p = ctypes.c_void_p()
        rc = lib.mnclCommMemAlloc(comm, ctypes.byref(p), ctypes.c_size_t(nbytes))
        if rc != 0:
            print("alloc", rc, lib.mnclGetLastError(comm).decode(), flush=True)
            sys.exit(0)
        return p.value

    def array(ptr, count):
        return np.ctypeslib.as_array((ctypes.c_float * max(count, 1)).from_address(ptr))[:count]

    def inputs(count):
        return [np.arange(count, dtype=np.float32) % 251 * (r + 1) - r for r in range(nranks)]

    counts = [0, 1, 1009, 300_007]
    most = max(counts) * nranks
    send, recv = alloc(4 * most), alloc(4 * most)
    print("shared", in_shared_window(send) and in_shared_window(recv), flush=True)
    f32, total = 7, 0
    for count in counts:
        x = inputs(count)
        s, r = array(send, most), array(recv, most)
        s[:count] = x[rank]
        assert lib.mnclAllReduce(ctypes.c_void_p(send), ctypes.c_void_p(recv), ctypes.c_size_t(count), f32, 0,
                                 comm, None) == 0
        ok = np.array_equal(r[:count], np.sum(x, axis=0, dtype=np.float32))
        assert lib.mnclAllGather(ctypes.c_void_p(send), ctypes.c_void_p(recv), ctypes.c_size_t(count), f32,
                                 comm, None) == 0
        ok = ok and np.array_equal(r[: count * nranks], np.concatenate(x))
        s[: count * nranks] = np.concatenate(x) * (rank + 1)
        assert lib.mnclReduceScatter(ctypes.c_void_p(send), ctypes.c_void_p(recv), ctypes.c_size_t(count), f32,
                                     0, comm, None) == 0
        want = np.sum([np.concatenate(x) * (q + 1) for q in range(nranks)], axis=0, dtype=np.float32)
        ok = ok and np.array_equal(r[:count], want[rank * count : (rank + 1) * count])
        s[:count] = x[rank]
        assert lib.mnclBroadcast(ctypes.c_void_p(send), ctypes.c_void_p(send), ctypes.c_size_t(count), f32,
                                 nranks - 1, comm, None) == 0
        ok = ok and np.array_equal(s[:count], x[nranks - 1])
        total += ok
    print("results", total == len(counts), flush=True)
    print("free", lib.mnclMemFree(ctypes.c_void_p(send)), lib.mnclMemFree(ctypes.c_void_p(send)), flush=True)
    # recv outlives the communicator (as NCCL's memory does), then goes.
    assert lib.mnclCommDestroy(comm) == 0
    array(recv, 4)[:] = 7
    print("after destroy", array(recv, 4).tolist(), lib.mnclMemFree(ctypes.c_void_p(recv)), flush=True)
    """
)


def in_shared_window(address: int) -> bool:
    """Whether `address` lies in a mapping of a /dev/shm file (a window) in this process."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        low, high = (int(a, 16) for a in fields[0].split("-"))
        if low <= address < high:
            return len(fields) >= 6 and fields[5].startswith("/dev/shm/")
    return False


def run_ranks(nranks: int, window: int, env: dict[str, str] | None = None) -> list[dict[str, str]]:
    """RANK_SCRIPT in nranks processes; each one's lines as {first word: the rest}."""
    lib = open_lib()
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == MNCL_SUCCESS
    here = str(Path(__file__).parent)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RANK_SCRIPT,
                str(r),
                str(nranks),
                ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid)).hex(),
                str(window),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=here,  # (for the script's imports; not the repository root, whose minincl/ has no compiled core)
        )
        for r in range(nranks)
    ]
    seen = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        seen.append({line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.splitlines() if " " in line})
    return seen


@pytest.mark.parametrize("nranks,window,env", [(2, 8 << 20, None), (3, -1, {"MININCL_WINDOW_BYTES": "16M"})])
def test_collectives_on_window_memory_between_processes_match_numpy(
    nranks: int, window: int, env: dict[str, str] | None
) -> None:
    """The window from config.windowBytes, or (undefined there) from MININCL_WINDOW_BYTES."""
    for seen in run_ranks(nranks, window, env):
        assert seen.get("shared") == "True", seen  # (peers read it: no copy through the FIFO)
        assert seen.get("results") == "True", seen
        assert seen.get("free") == f"{MNCL_SUCCESS} {MNCL_INVALID_ARGUMENT}", seen  # (the second: freed already)
        assert seen.get("after") == f"destroy [7.0, 7.0, 7.0, 7.0] {MNCL_SUCCESS}", seen


def test_processes_without_a_window_are_told_to_make_one() -> None:
    for seen in run_ranks(2, -1, {"MININCL_WINDOW_BYTES": "0"}):
        rc, why = seen["alloc"].split(" ", 1)
        assert int(rc) == MNCL_INVALID_USAGE
        assert "this communicator has no window: set config.windowBytes, or MININCL_WINDOW_BYTES" in why


def test_a_full_window_says_how_much_is_free() -> None:
    for seen in run_ranks(2, 1 << 20, None):  # (the script asks for 2 x 2.4 MB)
        rc, why = seen["alloc"].split(" ", 1)
        assert int(rc) == MNCL_INVALID_USAGE
        assert "the communicator's window cannot hold 2400056 more bytes (1048576 of 1048576 free)" in why


@pytest.fixture
def lib() -> Any:
    lib = open_lib(ConfigWithWindow)
    lib.mnclCommMemAlloc.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.mnclMemFree.argtypes = [ctypes.c_void_p]
    return lib


def init_one_rank(lib: Any, cfg: ConfigWithWindow) -> tuple[int, Any]:
    """mnclCommInitRankConfig of a 1-rank communicator: its result, and the communicator."""
    uid = UniqueId()
    assert lib.mnclGetUniqueId(ctypes.byref(uid)) == MNCL_SUCCESS
    comm = ctypes.c_void_p()
    return lib.mnclCommInitRankConfig(ctypes.byref(comm), 1, uid, 0, cfg), comm


def test_ranks_of_one_process_get_plain_memory_without_a_window(lib: Any) -> None:
    """Threads read each other's buffers already: no window, plain (zeroed, page-aligned) memory."""
    arr = (ctypes.c_void_p * 3)()
    assert lib.mnclCommInitAll(arr, 3, None) == MNCL_SUCCESS
    comms = [ctypes.c_void_p(arr[r]) for r in range(3)]
    count = 100_003
    ptrs = []
    try:
        for c in comms:
            p = ctypes.c_void_p()
            assert lib.mnclCommMemAlloc(c, ctypes.byref(p), count * 4) == MNCL_SUCCESS, lib.mnclGetLastError(c)
            assert p.value % 4096 == 0 and not in_shared_window(p.value)
            ptrs.append(p.value)
        bufs = [np.ctypeslib.as_array((ctypes.c_float * count).from_address(p)) for p in ptrs]
        assert all(not b.any() for b in bufs)
        for r, b in enumerate(bufs):
            b[:] = np.arange(count, dtype=np.float32) * (r + 1)
        assert lib.mnclGroupStart() == MNCL_SUCCESS
        for p, c in zip(ptrs, comms):
            at = ctypes.c_void_p(p)
            assert lib.mnclAllReduce(at, at, ctypes.c_size_t(count), 7, 0, c, None) == MNCL_SUCCESS
        assert lib.mnclGroupEnd() == MNCL_SUCCESS, lib.mnclGetLastError(None)
        for b in bufs:
            np.testing.assert_array_equal(b, np.arange(count, dtype=np.float32) * 6)
    finally:
        for p in ptrs:
            assert lib.mnclMemFree(p) == MNCL_SUCCESS
        for c in comms:
            lib.mnclCommDestroy(c)


def test_wrong_uses_are_refused_with_a_reason(lib: Any) -> None:
    arr = (ctypes.c_void_p * 1)()
    assert lib.mnclCommInitAll(arr, 1, None) == MNCL_SUCCESS
    comm = ctypes.c_void_p(arr[0])
    try:
        assert lib.mnclCommMemAlloc(comm, None, 64) == MNCL_INVALID_ARGUMENT
        assert b"mnclCommMemAlloc: ptr is null" in lib.mnclGetLastError(None)
        p = ctypes.c_void_p()
        assert lib.mnclCommMemAlloc(None, ctypes.byref(p), 64) == MNCL_INVALID_ARGUMENT
        assert b"the communicator is null" in lib.mnclGetLastError(None)
        assert lib.mnclMemFree(None) == MNCL_SUCCESS
        plain = np.zeros(16, np.float32)
        assert lib.mnclMemFree(plain.ctypes.data) == MNCL_INVALID_ARGUMENT
        assert b"is not memory from mnclCommMemAlloc (or it was freed already)" in lib.mnclGetLastError(None)
        for huge in (2**64 - 1, 2**63):  # (rounded up to pages, 2^64 - 1 wrapped to one page)
            assert lib.mnclCommMemAlloc(comm, ctypes.byref(p), huge) == MNCL_INVALID_ARGUMENT
            assert b"bytes is more than any memory holds" in lib.mnclGetLastError(None)
        # (2^63 - 1 reached the allocator: "out of memory", or a sanitizer's abort.)
        machine = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        for huge in (2**63 - 1, machine + 4096):
            assert lib.mnclCommMemAlloc(comm, ctypes.byref(p), huge) == MNCL_INVALID_ARGUMENT
            assert b"bytes is more than this machine's memory" in lib.mnclGetLastError(None)
        assert lib.mnclCommMemAlloc(comm, ctypes.byref(p), 0) == MNCL_SUCCESS  # (a page, as any size)
        assert p.value and lib.mnclMemFree(p) == MNCL_SUCCESS
    finally:
        lib.mnclCommDestroy(comm)


@pytest.mark.parametrize("window,said", [(-5, "config.windowBytes = -5: between 0 (no window) and 2^40")])
def test_a_bad_window_size_in_a_config_is_refused(lib: Any, window: int, said: str) -> None:
    cfg = ConfigWithWindow(ctypes.sizeof(ConfigWithWindow), CONFIG_MAGIC, 100, UNDEF, UNDEF, UNDEF, window)
    rc, _ = init_one_rank(lib, cfg)
    assert rc == MNCL_INVALID_ARGUMENT
    assert said in lib.mnclGetLastError(None).decode()


def test_an_older_callers_config_is_read_without_the_window_field(lib: Any) -> None:
    """A config whose size ends before windowBytes (a caller built against an older header):
    what lies after it is not read."""
    older = ConfigWithWindow.windowBytes.offset
    cfg = ConfigWithWindow(older, CONFIG_MAGIC, 100, UNDEF, UNDEF, UNDEF, -5)  # (-5 would be refused)
    rc, comm = init_one_rank(lib, cfg)
    assert rc == MNCL_SUCCESS, lib.mnclGetLastError(None)
    assert lib.mnclCommDestroy(comm) == MNCL_SUCCESS
