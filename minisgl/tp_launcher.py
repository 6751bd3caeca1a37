"""Run a bench ``work(server_args, bench_args, tp_rank, dist_init_method)`` on every tensor-parallel rank.

One process per rank (spawn start method), torch.distributed initialised over a free local TCP port.
Each rank reports once through a queue: its result (rank 0's is returned) or a one-line error. The first
failure takes the group down within seconds: the other ranks are terminated, then killed, and all are
joined, so nothing hangs and nothing is left behind; a rank that dies without reporting counts as failed,
and a rank whose parent disappears exits by itself. A rank's ``InputError`` is re-raised as ``InputError``
(the CLI exits 2), anything else as ``TPRankError`` (exit 1), shown once and prefixed with the rank.

SGLang's ``bench_one_batch.main`` also starts a ``multiprocessing.Process`` per rank (spawn) and ends with
``kill_process_tree``; it also places ranks across nodes (``--nnodes``, ``--dist-init-addr``), joins the
ranks without collecting results, and lets each rank print its own traceback.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import threading
import time
import traceback

import torch
import torch.distributed as dist

from minisgl.utils.common import InputError

_POLL_S = 0.2  # how often the parent looks at the queue and the processes
_REPORT_GRACE_S = 1.0  # a rank found dead may still have its report in flight this long
_PEER_WAIT_S = 3.0  # after a "peer went away" error, how long to wait for the failing rank's own report
_KILL_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long


class TPRankError(RuntimeError):
    """A tensor-parallel rank failed with something other than bad input."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _is_peer_error(e: Exception) -> bool:
    """A collective failing because another rank went away: a symptom, not the cause."""
    return isinstance(e, dist.DistError) or "closed by peer" in str(e) or "reset by peer" in str(e)


def _describe(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    frames = traceback.extract_tb(e.__traceback__)
    return f"{text} ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else text


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)  # the launcher is gone: nobody would stop this rank


def _rank_main(work, server_args, bench_args, tp_rank: int, init_method: str, reports, parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the parent, which stops every rank
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // server_args.tp_size))  # no CPU oversubscription
    try:
        result = work(server_args, bench_args, tp_rank, init_method)
        reports.put((tp_rank, "ok", pickle.dumps(result if tp_rank == 0 else None)))
    except InputError as e:
        reports.put((tp_rank, "input", str(e)))
    except Exception as e:
        reports.put((tp_rank, "peer" if _is_peer_error(e) else "error", _describe(e)))


def _drain(reports, reported: dict, timeout: float) -> None:
    try:
        item = reports.get(timeout=timeout)
        while True:
            reported.setdefault(item[0], item[1:])
            item = reports.get_nowait()
    except queue.Empty:
        pass


def _stop(procs: list, wait_s: float) -> None:
    """Let the ranks exit for ``wait_s``, then SIGTERM, then SIGKILL; join them all."""
    procs = [p for p in procs if p.pid is not None]  # started ones only
    deadline = time.monotonic() + wait_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + _KILL_GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()


def _dead_text(exitcode: int) -> str:
    if exitcode < 0:
        return f"killed by signal {signal.Signals(-exitcode).name} without reporting (out of memory?)"
    return f"exited with code {exitcode} without reporting"


def launch_tp(work, server_args, bench_args):
    """Run ``work`` on ``server_args.tp_size`` ranks; return rank 0's result or raise the first failure."""
    tp_size, ctx = server_args.tp_size, mp.get_context("spawn")
    reports, init_method = ctx.Queue(), f"tcp://127.0.0.1:{_free_port()}"
    procs = [
        ctx.Process(target=_rank_main, name=f"minisgl-tp{rank}", daemon=True,
                    args=(work, server_args, bench_args, rank, init_method, reports, os.getpid()))
        for rank in range(tp_size)
    ]  # fmt: skip
    reported: dict[int, tuple[str, object]] = {}  # rank -> (kind, payload), in arrival order
    dead_since: dict[int, float] = {}
    failure, first_failure_at, all_ok = None, None, False
    try:
        for p in procs:
            p.start()
        while failure is None and not all_ok:
            _drain(reports, reported, _POLL_S)
            now = time.monotonic()
            for rank, p in enumerate(procs):
                if rank not in reported and p.exitcode is not None:
                    if now - dead_since.setdefault(rank, now) > _REPORT_GRACE_S:
                        reported[rank] = ("died", _dead_text(p.exitcode))
            failures = [(rank, kind, msg) for rank, (kind, msg) in reported.items() if kind != "ok"]
            failure = next((f for f in failures if f[1] != "peer"), None)  # the cause, not a peer's symptom
            if failures and failure is None:
                first_failure_at = first_failure_at or now
                if now - first_failure_at > _PEER_WAIT_S or len(reported) == tp_size:
                    failure = failures[0]
            all_ok = not failures and len(reported) == tp_size
    finally:  # also on Ctrl-C in the parent
        _stop(procs, wait_s=_KILL_GRACE_S if all_ok else 0.0)
        reports.close()
    if failure is None:
        return pickle.loads(reported[0][1])
    rank, kind, msg = failure
    raise (InputError if kind == "input" else TPRankError)(f"tp rank {rank} failed: {msg}")
