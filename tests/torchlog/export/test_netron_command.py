"""`python -m torchlog netron run.h5` (torchlog/export/netron_command.py): writes the ONNX and
metrics files and serves them on 127.0.0.1 until stopped; bad files are one-line errors."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import onnx

from tests.torchlog.export.histories import nested

ROOT = Path(__file__).resolve().parents[3]


def _torchlog(*args: str, **options) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torchlog", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **options)


def test_writes_the_files_and_serves_them(tmp_path):
    log = nested().save(str(tmp_path / "run.h5"))
    process = _torchlog("netron", log, "--port", "0")
    try:
        wrote = process.stdout.readline()
        serving = process.stdout.readline()
        assert wrote.strip() == f"wrote {tmp_path / 'run.onnx'} and {tmp_path / 'run.metrics.json'}"
        url = serving.split(" at ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:") and "run.metrics.json" in serving
        with urllib.request.urlopen(url, timeout=30) as page:
            assert b"netron" in page.read().lower()
        with urllib.request.urlopen(f"{url}/data/run.onnx", timeout=30) as served:
            assert onnx.load_from_string(served.read()).graph.node[0].name == "block1:1"
    finally:
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=60)
    assert process.returncode == 0 and "stopped serving" in out


def test_no_serve_writes_where_asked(tmp_path):
    log = nested().save(str(tmp_path / "run.h5"))
    out = tmp_path / "model.onnx.json"
    done = subprocess.run([sys.executable, "-m", "torchlog", "netron", log, "-o", str(out),
                           "--no-serve"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert out.exists() and (tmp_path / "model.metrics.json").exists()


def test_a_missing_log_is_a_one_line_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "torchlog", "netron", str(tmp_path / "no.h5")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("torchlog: error:") and "no.h5" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
