#!/usr/bin/python3
"""Integration: the real weir binary answers --version and runs a short WAL
benchmark against mem:// (with injected latency) and file://, printing one
JSON line with every promised field."""
import json
import subprocess
import sys
import tempfile

weir = sys.argv[1]
FIELDS = ["appends_per_s", "mb_per_s", "p50_ms", "p99_ms", "p999_ms", "puts_per_s", "bytes_per_put"]


def run(args):
    out = subprocess.run([weir] + args, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        sys.exit(f"weir {' '.join(args)} failed ({out.returncode}): {out.stderr}")
    return out.stdout


version = run(["--version"])
assert version.startswith("weir "), version

with tempfile.TemporaryDirectory() as d:
    for extra in (["--store", "mem", "--put-latency-ms", "5"], ["--store", "file", "--dir", d]):
        line = run(["bench", "wal", "--appenders", "4", "--record-bytes", "512", "--duration", "0.5",
                    "--warmup", "0.2"] + extra).strip().splitlines()[-1]
        result = json.loads(line)
        for f in FIELDS:
            assert f in result, f"missing {f} in {line}"
        assert result["appends_per_s"] > 0, line
        assert result["puts_per_s"] > 0, line
        assert result["failures"] == 0, line
        if "--put-latency-ms" in extra:
            assert result["p50_ms"] >= 5, f"ack before the PUT could finish: {line}"

bad = subprocess.run([weir, "bench", "wal", "--store", "s4"], capture_output=True, text=True)
assert bad.returncode != 0 and "store" in bad.stderr, bad.stderr
print("1 passed, 0 failed")
