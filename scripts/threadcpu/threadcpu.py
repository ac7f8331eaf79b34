"""Per-thread CPU of a bench's servers, from /proc (docs/benchmarks.md, "Receive fan-out,
wave 10"): bench-only instrument.

Runs a bench command, samples utime + stime of every thread of its `popmq serve` and floor
processes every 0.2 s until the command ends, and prints a JSON line per process: the main
thread, the threads gRPC names itself, and the other Python threads together. With
TNAMES_DIR set and this directory on PYTHONPATH (its sitecustomize writes each process's
``threading.enumerate()`` names by native id), a second line gives CPU by Python thread name:

    TNAMES_DIR=/tmp/tn PYTHONPATH=scripts/threadcpu \
        python scripts/threadcpu/threadcpu.py popmq bench e2e --messages 40000 --mode proxy floor

Unlike py-spy's samples, these are CPU seconds: a thread waiting in fsync costs nothing here.
"""

import json
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def descendants(pid):
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children(p):
            seen.append(c)
            todo.append(c)
    return seen


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def threads(pid):
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1 : s.rindex(")")]
        fields = s[s.rindex(")") + 2 :].split()
        out[int(tid)] = (comm, (int(fields[11]) + int(fields[12])) / TICK)
    return out


proc = subprocess.Popen(sys.argv[1:])
watched = {}  # pid -> {"argv":..., "threads": {tid: (comm, cpu)}}
while proc.poll() is None:
    for pid in descendants(proc.pid):
        cl = cmdline(pid)
        if "popmq serve" in cl or "popmq.bench.floor" in cl:
            w = watched.setdefault(pid, {"argv": cl[:80], "threads": {}})
            for tid, (comm, cpu) in threads(pid).items():
                old = w["threads"].get(tid)
                if old is None or cpu >= old[1]:
                    w["threads"][tid] = (comm, cpu)
    time.sleep(0.2)
for pid, w in watched.items():
    procname = None
    groups = {}
    for tid, (comm, cpu) in w["threads"].items():
        if tid == pid:
            key = "main"
            procname = comm
        else:
            key = comm
        groups.setdefault(key, [0.0, 0])
        groups[key][0] += cpu
        groups[key][1] += 1
    pn = w["threads"].get(pid, ("?",))[0]
    workers = groups.pop(pn, [0.0, 0])
    total = sum(cpu for _, cpu in w["threads"].values())
    print(
        json.dumps(
            {
                "pid": pid,
                "argv": w["argv"],
                "total_s": round(total, 2),
                "main_s": round(groups.pop("main", [0])[0], 2),
                "python_workers_s": round(workers[0], 2),
                "python_worker_threads": workers[1],
                "other": {k: [round(v[0], 2), v[1]] for k, v in sorted(groups.items())},
            }
        )
    )
tn = os.environ.get("TNAMES_DIR")
if tn:
    for pid, w in watched.items():
        try:
            names = json.load(open(os.path.join(tn, f"{pid}.json")))["names"]
        except OSError:
            continue
        by = {}
        for tid, (comm, cpu) in w["threads"].items():
            n = names.get(str(tid), comm)
            n = n.rstrip("0123456789_") or n
            by.setdefault(n, [0.0, 0])
            by[n][0] += cpu
            by[n][1] += 1
        print(
            json.dumps(
                {
                    "pid": pid,
                    "argv": w["argv"],
                    "by_name": {k: [round(v[0], 2), v[1]] for k, v in by.items()},
                }
            )
        )
sys.exit(proc.returncode)
