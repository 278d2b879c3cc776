"""Where a benchmark figure comes from: date, torchlog checkout and commit, machine load, command."""
from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path


def _git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "?"


def _uptime() -> str:
    done = subprocess.run(["uptime"], capture_output=True, text=True)
    if done.returncode == 0:
        return done.stdout.strip()
    load = os.getloadavg() if hasattr(os, "getloadavg") else ()
    return "load average " + ", ".join(f"{x:.2f}" for x in load)


def provenance() -> dict[str, str]:
    """Facts that make a result file comparable with another: which torchlog, when, how busy.

    The commit is the one of the checkout that `import torchlog` found (the 'before'
    figures run against a worktree of an older commit); '+dirty' marks uncommitted changes
    in that checkout's torchlog/, storage/ or vis/. Nothing here raises: a fact that
    cannot be found reads '?'.
    """
    import torchlog

    checkout = Path(torchlog.__file__).resolve().parent.parent
    dirty = _git(checkout, "status", "--porcelain", "--", "torchlog", "storage", "vis")
    commit = _git(checkout, "rev-parse", "--short", "HEAD")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "torchlog": str(Path(torchlog.__file__).resolve()),
        "commit": commit + ("+dirty" if dirty and dirty != "?" else ""),
        "uptime": _uptime(),
        "command": " ".join([Path(sys.executable).name] + sys.argv),
    }


def provenance_line() -> str:
    """The provenance on one line, to head a result file."""
    p = provenance()
    return (f"# {p['date']}; torchlog {p['commit']} ({p['torchlog']}); {p['uptime']}; "
            f"command: {p['command']}")


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it ('AMD EPYC ...'), or '?'."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"
