#!/usr/bin/python3
"""weir serve on s3:// (the radosgw of the CTest fixture "s3"): the start-up
probe passes, records appended over HTTP survive a SIGTERM restart and a
SIGKILL restart, /metrics shows S3 requests, and a wrong secret key makes the
server refuse to start with an authentication error.

With WEIR_TEST_POSTGRES_ENV set (the CTest fixture "pg"), the metastore is on
PostgreSQL too (a schema of its own), and the node keeps no state on its disk:
its data directory is wiped before the SIGKILL restart.

Usage: serve_s3_test.py WEIR_BINARY (WEIR_TEST_S3_ENV names the fixture's env file)
"""
import os
import shutil
import subprocess
import sys
import uuid

import requests

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.join(here, "http")]
from crash_test import read_s3_env  # noqa: E402
from weir_server import WeirServer  # noqa: E402


def store_uri(env, prefix):
    return (f"s3://{env['S3_BUCKET']}/{prefix}?endpoint={env['S3_ENDPOINT']}&region={env['AWS_DEFAULT_REGION']}"
            f"&path_style=true")


def main():
    binary = sys.argv[1]
    env = read_s3_env(os.environ["WEIR_TEST_S3_ENV"])
    prefix = "serve-" + uuid.uuid4().hex[:8]
    proc_env = dict(os.environ, AWS_ACCESS_KEY_ID=env["AWS_ACCESS_KEY_ID"],
                    AWS_SECRET_ACCESS_KEY=env["AWS_SECRET_ACCESS_KEY"])
    args = ["--object-store", store_uri(env, prefix)]
    pg_env = os.environ.get("WEIR_TEST_POSTGRES_ENV")
    if pg_env:
        base_uri = read_s3_env(pg_env)["POSTGRES_URI"]
        schema = prefix.replace("-", "_")
        subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", base_uri, "-c", f"CREATE SCHEMA {schema}"],
                       check=True, timeout=60)
        # A password the server (trust authentication) never asks for: it must not show in the log.
        with_password = base_uri.replace("postgres://weir@", "postgres://weir:not-to-be-logged@")
        assert with_password != base_uri, base_uri
        args += ["--metastore", f"{with_password}?options=-csearch_path%3D{schema}"]
        proc_env["WEIR_LOG_LEVEL"] = "info"  # the line naming the metastore (scripts/test.sh sets warn)
    server = WeirServer(binary, args=args, env=proc_env)
    server.start()
    try:
        base = server.base_url
        assert requests.post(f"{base}/v1/streams", json={"stream": "s"}, timeout=60).status_code == 201
        sent = []
        for i in range(20):
            body = [{"body": f"r{i}-{j}"} for j in range(5)]
            r = requests.post(f"{base}/v1/streams/s/records", json={"records": body}, timeout=60)
            assert r.status_code == 200, r.text
            assert r.json()["start"]["seq_num"] == len(sent)
            sent += [b["body"] for b in body]
        metrics = requests.get(f"{base}/metrics", timeout=60).text
        assert 'weir_s3_requests_total{op="put",outcome="2xx"}' in metrics, metrics[:2000]

        def read_all():
            got = []
            while True:
                r = requests.get(f"{base}/v1/streams/s/records", params={"seq_num": len(got)}, timeout=60)
                if r.status_code == 416:  # at the tail
                    return got
                assert r.status_code == 200, r.text
                recs = r.json()["records"]
                if not recs:
                    return got
                got += [x["body"] for x in recs]

        server.restart()  # SIGTERM: drain and settle into segments on S3
        base = server.base_url
        assert read_all() == sent
        r = requests.post(f"{base}/v1/streams/s/records", json={"records": [{"body": "after"}]}, timeout=60)
        assert r.status_code == 200, r.text
        sent.append("after")
        server.kill()  # SIGKILL: the next start replays the WAL from S3
        if pg_env:  # everything is on S3 and PostgreSQL: the data dir is neither made nor locked
            assert not os.path.exists(server.data_dir), os.listdir(server.data_dir)
        server.start()
        base = server.base_url
        assert read_all() == sent
        server.stop()
        if pg_env:
            with open(server.log_path) as f:  # the server's lines, not the harness's command lines
                log = "".join(line for line in f if not line.startswith("====="))
            assert "postgres://weir@127.0.0.1" in log, log[-2000:]
            assert "not-to-be-logged" not in log, log[-2000:]

        # A wrong secret: the probe fails, the server refuses to start, naming the cause.
        bad_env = dict(proc_env, AWS_SECRET_ACCESS_KEY="wrong" + env["AWS_SECRET_ACCESS_KEY"])
        bad_dir = server.data_dir + "-bad"
        try:
            out = subprocess.run([binary, "serve", "--data-dir", bad_dir, "--http-addr", "127.0.0.1:0",
                                  "--kafka-addr", "", "--object-store", store_uri(env, prefix)], env=bad_env,
                                 capture_output=True, text=True, timeout=120)
        finally:
            shutil.rmtree(bad_dir, ignore_errors=True)
        assert out.returncode != 0, out
        assert "SignatureDoesNotMatch" in out.stderr or "auth" in out.stderr.lower(), out.stderr
    finally:
        server.cleanup()
    print("serve on s3:// ok" + (" with a postgres:// metastore" if pg_env else ""))


if __name__ == "__main__":
    main()
