"""Surviving a lost rank: data-parallel training that shrinks a dead or hung rank away and goes on.

Four ranks fit a linear model by full-batch gradient descent, each on its share of the
samples, averaging their gradients with allreduce. At step 7 rank 2 dies (SIGKILL), or with
`hang` stops (SIGSTOP: a hung process, whose heartbeat stops). The others' allreduce fails:
`RemoteError` at once for a dead process, `Timeout` (or `RemoteError` from a survivor that
timed out first) after MININCL_TIMEOUT for a hung one. Each survivor asks `lost_ranks()` which
ranks are gone and `shrink`s them away (again, should the survivors' lists differ). The
survivors may have failed in different steps (a call fails as soon as a peer's process is
gone, even where that peer had sent its part, so ranks that had received all of step 6 fail
in step 7 while another fails in step 6): they agree on the earliest (an allreduce with
op="min" on the new communicator), go back to their weights before it, share the samples
among the ranks left and take that step again. The weights they end with equal one process's
full-batch descent: losing a rank changed who computes, not what.

    python examples/survive_a_lost_rank.py          # rank 2 dies
    python examples/survive_a_lost_rank.py hang     # rank 2 hangs

(`launch` runs the ranks as local processes; with torchrun or Slurm the same `train` works on
`minincl.init_from_env()`.)
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time

import numpy as np

import minincl

RANKS, VICTIM, LOST_AT_STEP, STEPS = 4, 2, 7, 20
SAMPLES, FEATURES, LEARNING_RATE = 840, 8, 0.05  # (840 samples share evenly among 4 or 3 ranks)


def dataset() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, FEATURES))
    y = x @ np.arange(1.0, FEATURES + 1) + 0.1 * rng.standard_normal(SAMPLES)
    return x, y


def gradient(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Of the mean squared error over these samples."""
    return 2 * x.T @ (x @ w - y) / len(y)


def reference() -> np.ndarray:
    """One process, every sample at every step."""
    x, y = dataset()
    w = np.zeros(FEATURES)
    for _ in range(STEPS):
        w -= LEARNING_RATE * gradient(w, x, y)
    return w


def lose_this_rank(hang: bool, pid_file: str) -> None:
    if not hang:
        os.kill(os.getpid(), signal.SIGKILL)  # (as a crash: no destroy, no goodbye)
    with open(pid_file, "w") as f:  # (for the survivor that plays the job scheduler below)
        f.write(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGSTOP)


def shrink_away_the_lost(comm: minincl.Communicator) -> tuple[minincl.Communicator, list[int]]:
    """A communicator of the ranks left, and the ranks lost. A loss may reach one survivor a
    moment after another (through a third rank over TCP; a second hung rank once this rank's
    own MININCL_TIMEOUT for it runs out), and shrink refuses, on every rank kept, lists that
    differ or keep a rank gone: look again and retry."""
    deadline = time.monotonic() + 10
    while True:
        lost = comm.lost_ranks()
        if lost:
            try:
                return comm.shrink(lost), lost
            except minincl.InvalidUsage:
                pass
        if time.monotonic() > deadline:  # (an error no rank's loss explains: a bug, not a loss)
            raise RuntimeError(f"rank {comm.rank}: a call failed, and the ranks lost are {lost} after 10 s")
        time.sleep(0.1)


def train(comm: minincl.Communicator, hang: bool, pid_file: str) -> tuple[np.ndarray, list[int]]:
    """Returns the weights and the ranks (of the first communicator) that were lost."""
    x, y = dataset()
    w = np.zeros(FEATURES)
    before = {0: w.copy()}  # the weights before each of the last two steps
    lost_so_far: list[int] = []
    step = 0
    while step < STEPS:
        if step == LOST_AT_STEP and comm.rank == VICTIM and not lost_so_far:
            lose_this_rank(hang, pid_file)
        share = slice(comm.rank * SAMPLES // comm.nranks, (comm.rank + 1) * SAMPLES // comm.nranks)
        g = gradient(w, x[share], y[share])  # (equal shares: their average is the whole mean)
        try:
            comm.allreduce(g, op="avg")
        except minincl.Error as e:
            print(f"rank {comm.rank}: step {step} failed ({type(e).__name__}); shrinking away the ranks lost")
            survivors, lost = shrink_away_the_lost(comm)
            comm.destroy()
            lost_so_far += lost  # (ranks of the first communicator: only one shrink happens here)
            comm = survivors
            # (A step ends on every rank only once every rank has begun it: the survivors
            # failed in this step or the one before.)
            step = int(comm.allreduce(np.array([step]), op="min")[0])
            w = before[step].copy()
            continue  # that step again, on the ranks left
        w -= LEARNING_RATE * g
        step += 1
        before = {step - 1: before[step - 1], step: w.copy()}
    if hang and comm.rank == 0:
        with open(pid_file) as f:
            os.kill(int(f.read()), signal.SIGKILL)  # (a job scheduler would end the hung process)
    comm.destroy()
    return w, lost_so_far


def main(hang: bool = False) -> dict[int, tuple[float, list[int]]]:
    """Runs the ranks; returns each survivor's (largest difference from the reference, lost ranks)."""
    os.environ.setdefault("MININCL_TIMEOUT", "2")  # give up on a silent rank after 2 s (default 5)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            results = dict(enumerate(minincl.launch(train, RANKS, hang, os.path.join(tmp, "victim.pid"), timeout=120)))
        except minincl.LaunchError as e:  # (the victim's process ended by a signal: expected)
            results = e.results
    want = reference()
    return {rank: (float(np.abs(w - want).max()), lost) for rank, (w, lost) in results.items()}


if __name__ == "__main__":
    outcome = main(hang=sys.argv[1:] == ["hang"])
    for rank, (diff, lost) in sorted(outcome.items()):
        print(f"rank {rank}: lost {lost}, weights within {diff:.1e} of one process's")
    ok = sorted(outcome) == [r for r in range(RANKS) if r != VICTIM] and all(
        d < 1e-9 and lost == [VICTIM] for d, lost in outcome.values()
    )
    print("ok" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)
