"""Which kinds of call torch's gloo backend takes on CUDA tensors itself, with no copy to the host by parasim.

parasim's real ranks never hand gloo a CUDA tensor: with `parasim run --backend gloo --device cuda` each call's
tensors are copied to the host, summed there by gloo, and copied back (comm/torchdist.py, `wire`). This
script asks gloo directly: 2 processes on this machine, one process group, and for each kind of call of
scripts/gpu_programs.py the same call made with torch.distributed on tensors of `--device`, its values checked
against what they must be. A kind gloo refuses says so, with torch's own words; one that does not finish
within `--timeout` seconds ends the probe (the group is unusable after it) and the kinds after it are "not
tried". scripts/gpu_check.py turns the JSON it prints into table rows.

    python scripts/gpu_gloo_direct.py [--device cuda|cpu] [--timeout SECONDS]

Prints {"device", "torch", "kinds": [{"kind", "ok", "result"}]}; exit 0 when it could ask, 2 when it could not
(no torch, no GPU for --device cuda, a rank that died).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

WORLD = 2
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "scatter", "send_recv",
         "barrier")  # scripts/gpu_programs.py's, in its order (tests/e2e/test_gpu_check.py holds them equal)


def _calls(dist: Any, torch: Any, rank: int, device: Any) -> dict[str, Callable[[], bool]]:
    """Each kind as one torch.distributed call on `device`, returning whether its values are right. Rank r
    holds (r + 1) * [1, 2, 3, 4]: integer values, so every order of addition gives the same sums."""
    def mine() -> Any:
        return torch.arange(1, 5, dtype=torch.float32, device=device) * (rank + 1)

    def all_reduce() -> bool:
        x = mine()
        dist.all_reduce(x)
        return x.tolist() == [3.0, 6.0, 9.0, 12.0]

    def reduce_scatter() -> bool:
        out = torch.empty(2, dtype=torch.float32, device=device)
        dist.reduce_scatter_tensor(out, mine())
        return out.tolist() == [[3.0, 6.0], [9.0, 12.0]][rank]

    def all_gather() -> bool:
        out = torch.empty(4 * WORLD, dtype=torch.float32, device=device)
        dist.all_gather_into_tensor(out, mine())
        return out.tolist() == [1.0, 2.0, 3.0, 4.0, 2.0, 4.0, 6.0, 8.0]

    def all_to_all() -> bool:
        out = torch.empty(4, dtype=torch.float32, device=device)
        dist.all_to_all_single(out, mine())
        return out.tolist() == [[1.0, 2.0, 2.0, 4.0], [3.0, 4.0, 6.0, 8.0]][rank]

    def broadcast() -> bool:
        x = mine()
        dist.broadcast(x, src=1)
        return x.tolist() == [2.0, 4.0, 6.0, 8.0]

    def reduce() -> bool:
        x = mine()
        dist.reduce(x, dst=1)
        return rank != 1 or x.tolist() == [3.0, 6.0, 9.0, 12.0]

    def scatter() -> bool:
        out = torch.empty(2, dtype=torch.float32, device=device)
        chunks = list(mine().chunk(WORLD)) if rank == 1 else None
        dist.scatter(out, chunks, src=1)
        return out.tolist() == [[2.0, 4.0], [6.0, 8.0]][rank]

    def send_recv() -> bool:
        got = torch.empty(4, dtype=torch.float32, device=device)
        ops = [dist.P2POp(dist.isend, mine(), 1 - rank), dist.P2POp(dist.irecv, got, 1 - rank)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return got.tolist() == [x * (2 - rank) for x in (1.0, 2.0, 3.0, 4.0)]

    def barrier() -> bool:
        mine()
        dist.barrier()
        return True

    return {k: v for k, v in locals().items() if k in KINDS}


def rank_main(rank: int, device_kind: str, timeout: float, out: Path) -> None:
    """One rank: every kind in order, each result written to `out` as it comes (a rank killed mid-way
    still leaves what it found)."""
    import datetime

    import torch
    import torch.distributed as dist

    device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
    if device_kind == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=timeout))
    found: list[dict] = []
    for kind, call in _calls(dist, torch, rank, device).items():
        try:
            right = call()
            if device_kind == "cuda":
                torch.cuda.synchronize()
            found.append({"kind": kind, "ok": bool(right), "result": "takes them" if right else "wrong values"})
        except Exception as exc:  # torch's refusal, in its own words (first line)
            words = " ".join((str(exc).strip().splitlines() or [type(exc).__name__])[0].split())
            stuck = "timed out" in words.lower() or "timeout" in words.lower()
            found.append({"kind": kind, "ok": False, "result": ("did not finish: " if stuck else "refused: ") + words})
            out.write_text(json.dumps(found))
            if stuck:
                break  # the group cannot be trusted after a call that did not finish
            continue
        out.write_text(json.dumps(found))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_gloo_direct", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where the tensors live (default cuda)")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds one call may take (default 20)")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # set by the launcher below for its children
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not 0 < args.timeout <= 600:
        ap.error(f"--timeout is seconds from above 0 to 600, got {args.timeout}")
    if args.rank is not None:
        rank_main(args.rank, args.device, args.timeout, Path(args.out))
        return 0
    try:
        import torch
    except ImportError:
        print("gpu_gloo_direct: torch cannot be imported here", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_gloo_direct: no CUDA GPU visible: nothing to ask gloo (--device cpu asks on the host)",
              file=sys.stderr)
        return 2
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(WORLD)}
    with tempfile.TemporaryDirectory(prefix="gloo-direct-") as tmp:
        files = [Path(tmp) / f"rank{r}.json" for r in range(WORLD)]
        ranks = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--out", str(files[r]), "--device",
                                   args.device, "--timeout", str(args.timeout)], env={**env, "RANK": str(r)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in range(WORLD)]
        limit = 60 + args.timeout * (len(KINDS) + 1)  # start-up, then every call at its limit at most
        errors = []
        for p in ranks:
            try:
                _, err = p.communicate(timeout=limit)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            if p.returncode:
                errors.append((err.strip().splitlines() or [f"exit {p.returncode}"])[-1])
        found = [json.loads(f.read_text()) if f.exists() else [] for f in files]
    if not found[0] and errors:
        print(f"gpu_gloo_direct: the ranks did not start: {errors[0]}", file=sys.stderr)
        return 2
    kinds = []
    for i, kind in enumerate(KINDS):  # a kind is right only when both ranks say so
        got = [f[i] if i < len(f) else None for f in found]
        if any(g is None for g in got):
            kinds.append({"kind": kind, "ok": False, "result": "not tried: an earlier call ended the probe"})
        else:
            bad = next((g for g in got if not g["ok"]), None)
            kinds.append({"kind": kind, "ok": bad is None, "result": got[0]["result"] if bad is None else bad["result"]})
    print(json.dumps({"device": args.device, "torch": torch.__version__, "kinds": kinds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
