#!/usr/bin/python3
"""Integration: starts the real `weir serve` on a free loopback port in a temp
dir and drives the weir CLI end to end: basins, streams, append (batched,
--producer, --match-seq-num, --fencing-token), read with every start option
and --follow, tail, --json, error lines and exit codes (missing stream, bad
names, auth, server down), and a short `weir bench http`.

Usage: cli_test.py WEIR_BINARY"""
import base64
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "http"))
from weir_server import WeirServer, run_expecting_exit  # noqa: E402

WEIR = sys.argv[1]
failures = []
passed = 0


def start_server(data_dir, extra=()):
    # At info level the server prints its "listening on" line.
    return WeirServer(WEIR, data_dir=data_dir, args=extra, env={"WEIR_LOG_LEVEL": "info"}).start()


def weir(*args, input=None, server=None, ok=True, binary=False, timeout=120, env_vars=None):
    env = dict(os.environ)
    env.pop("WEIR_BASIN", None)
    env.pop("WEIR_AUTH_TOKEN", None)
    env["WEIR_SERVER"] = server or SERVER.base_url
    env.update(env_vars or {})
    out = subprocess.run([WEIR, *args], input=input, capture_output=True, env=env, timeout=timeout,
                         text=not binary)
    if ok and out.returncode != 0:
        raise AssertionError(f"weir {' '.join(args)} exited {out.returncode}: {out.stderr}")
    if not ok and out.returncode == 0:
        raise AssertionError(f"weir {' '.join(args)} succeeded, expected a failure: {out.stdout}")
    return out


def error_line(out):
    """The one stderr line of a failed command."""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("weir: "), f"not one error line: {out.stderr!r}"
    return lines[0]


def case(fn):
    global passed
    try:
        fn()
        passed += 1
        print(f"ok   {fn.__name__}", flush=True)
    except Exception as e:  # report every case, fail at the end
        failures.append(fn.__name__)
        print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}", flush=True)
    return fn


def jsonl(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


tmp = tempfile.TemporaryDirectory(prefix="weir-cli-test-")
SERVER = start_server(os.path.join(tmp.name, "data"))


@case
def done_when_of_the_issue():
    assert weir("stream", "create", "s1").stdout == 'stream "s1" created\n'
    assert weir("append", "s1", input="hi\n").stdout == "s1 0..1\n"
    assert weir("read", "s1").stdout == "hi\n"


@case
def basins():
    assert weir("basin", "create", "cli-test-basin").stdout == 'basin "cli-test-basin" created\n'
    names = weir("basin", "list").stdout.split()
    # --basin (or WEIR_BASIN) names a basin for stream commands; basin
    # commands ignore it rather than send it (a bad one was a 400).
    assert weir("basin", "list", "--basin", "nob").stdout.split() == names
    assert "cli-test-basin" in names and "weir-default" in names, names
    listed = jsonl(weir("basin", "list", "--json", "--prefix", "cli-test").stdout)
    assert [b["name"] for b in listed] == ["cli-test-basin"], listed
    assert listed[0]["created_at"], listed
    dup = weir("basin", "create", "cli-test-basin", ok=False)
    assert error_line(dup) == 'weir: basin "cli-test-basin" already exists (409 resource_already_exists)', dup.stderr
    for bad in ("ab", "Upper-Case-Name", "-leading-hyphen", "x" * 49):
        out = weir("basin", "create", "--", bad, ok=False)
        assert error_line(out).endswith("(422 invalid)"), out.stderr
    # Streams live in a basin named by --basin (s2-basin).
    weir("stream", "create", "in-basin", "--basin", "cli-test-basin")
    assert weir("stream", "list", "--basin", "cli-test-basin").stdout == "in-basin\n"
    assert "in-basin" not in weir("stream", "list").stdout.split()
    weir("append", "in-basin", "--basin", "cli-test-basin", input="x\n")
    assert weir("read", "in-basin", "--basin", "cli-test-basin").stdout == "x\n"
    missing = weir("stream", "list", "--basin", "no-such-basin", ok=False)
    assert error_line(missing) == 'weir: basin "no-such-basin" not found (404 basin_not_found)', missing.stderr
    assert weir("basin", "delete", "cli-test-basin").stdout == 'basin "cli-test-basin" deleted\n'
    # A basin that creates streams on append, with its defaults for them.
    weir("basin", "create", "cli-auto-basin", "--create-stream-on-append", "--retention", "infinite",
         "--storage-class", "express")
    weir("append", "made-by-append", "--basin", "cli-auto-basin", input="first\n")
    assert weir("read", "made-by-append", "--basin", "cli-auto-basin").stdout == "first\n"
    info = json.loads(weir("stream", "info", "made-by-append", "--basin", "cli-auto-basin", "--json").stdout)
    assert "infinite" in json.dumps(info) and "express" in json.dumps(info), info
    bad = weir("basin", "create", "cli-bad-basin", "--retention", "0", ok=False)
    assert "--retention must be a positive number" in bad.stderr, bad.stderr
    assert "cli-bad-basin" not in weir("basin", "list").stdout.split()
    assert jsonl(weir("basin", "delete", "never-was-a-basin", "--json", ok=False).stdout) == []


@case
def streams():
    weir("stream", "create", "st-a")
    weir("stream", "create", "st-b")
    names = weir("stream", "list", "--prefix", "st-").stdout.split()
    assert names == ["st-a", "st-b"], names
    listed = jsonl(weir("stream", "list", "--json", "--prefix", "st-").stdout)
    assert [s["name"] for s in listed] == ["st-a", "st-b"] and all(s["created_at"] for s in listed), listed
    info = weir("stream", "info", "st-a").stdout
    assert re.search(r"^storage class\s+standard$", info, re.M), info
    assert re.search(r"^tail\s+0$", info, re.M), info
    assert re.search(r"^delete empty\s+never$", info, re.M), info
    j = jsonl(weir("stream", "info", "st-a", "--json").stdout)[0]
    assert j["stream"] == "st-a" and j["tail"]["seq_num"] == 0 and "storage_class" in j["config"], j
    dup = weir("stream", "create", "st-a", ok=False)
    assert error_line(dup) == 'weir: stream "st-a" already exists (409 resource_already_exists)', dup.stderr
    assert weir("stream", "delete", "st-b", "--json").stdout.strip() == '{"stream":"st-b","deleted":true}'
    gone = weir("tail", "st-b", ok=False)
    assert error_line(gone) == 'weir: stream "st-b" not found (404 stream_not_found)', gone.stderr
    bad = weir("stream", "create", "n" * 600, ok=False)
    assert error_line(bad).endswith("(422 invalid)"), bad.stderr
    # Configuration on create.
    weir("stream", "create", "st-cfg", "--storage-class", "express", "--retention", "3600",
         "--timestamping-mode", "arrival", "--delete-on-empty-min-age", "60")
    info = weir("stream", "info", "st-cfg").stdout
    for line in (r"^storage class\s+express$", r"^retention\s+3600 s$", r"^timestamping\s+arrival$",
                 r"^delete empty\s+after 60 s$"):
        assert re.search(line, info, re.M), (line, info)
    weir("stream", "create", "st-forever", "--retention", "infinite")
    assert re.search(r"^retention\s+infinite$", weir("stream", "info", "st-forever").stdout, re.M)
    badcfg = weir("stream", "create", "st-badcfg", "--retention", "soon", ok=False)
    assert error_line(badcfg) == 'weir: --retention must be a positive number of seconds or "infinite", got "soon"', \
        badcfg.stderr
    assert weir("stream", "info", "st-badcfg", ok=False).returncode != 0  # nothing was created
    odd = "a stream/with spaces?&é"
    weir("stream", "create", odd)
    weir("append", odd, input="odd\n")
    assert weir("read", odd).stdout == "odd\n"
    assert odd in weir("stream", "list").stdout.splitlines()


@case
def append_batches_and_reads():
    weir("stream", "create", "many")
    lines = [f"line-{i}" for i in range(2500)]
    acks = jsonl(weir("append", "many", "--json", input="\n".join(lines) + "\n").stdout)
    assert acks[0]["start"] == 0 and acks[-1]["end"] == 2500, acks
    assert all(a["end"] - a["start"] <= 1000 for a in acks), acks
    assert all(acks[i]["end"] == acks[i + 1]["start"] for i in range(len(acks) - 1)), acks
    assert all(a["stream"] == "many" and a["duplicated"] is False for a in acks), acks
    assert weir("read", "many").stdout.splitlines() == lines
    assert weir("read", "many", "--count", "1500").stdout.splitlines() == lines[:1500]
    assert weir("read", "many", "--from", "2490").stdout.splitlines() == lines[2490:]
    assert weir("read", "many", "--from", "10", "--count", "3").stdout.splitlines() == lines[10:13]
    assert weir("read", "many", "--tail-offset", "3").stdout.splitlines() == lines[-3:]
    assert weir("tail", "many").stdout == "2500\n"
    tail = jsonl(weir("tail", "many", "--json").stdout)[0]
    assert tail["seq_num"] == 2500 and tail["timestamp"] > 0, tail
    recs = jsonl(weir("read", "many", "--json", "--from", "2498").stdout)
    assert [(r["seq_num"], r["body"]) for r in recs] == [(2498, "line-2498"), (2499, "line-2499")], recs
    # --timestamp: the first record at or after the time.
    time.sleep(0.05)
    t = int(time.time() * 1000) + 1
    time.sleep(0.05)
    weir("append", "many", input="late\n")
    got = weir("read", "many", "--timestamp", str(t)).stdout
    assert got == "late\n", got
    # A time after every record's: nothing yet, as --from the tail.
    later = weir("read", "many", "--timestamp", str(int(time.time() * 1000) + 60000))
    assert later.returncode == 0 and later.stdout == "", later
    past = weir("read", "many", "--from", "999999", ok=False)
    assert "(416 range_not_satisfiable)" in error_line(past), past.stderr
    # An incomplete last line and empty lines are records too.
    weir("stream", "create", "partial")
    weir("append", "partial", input="a\n\nb")
    assert weir("read", "partial", "--json").stdout.count('"body"') == 3
    assert weir("read", "partial").stdout == "a\n\nb\n"


@case
def bytes_round_trip():
    weir("stream", "create", "bin")
    rng = random.Random(4)
    body = bytes(rng.choice([b for b in range(256) if b != 10]) for _ in range(5000))
    weir("append", "bin", input=body + b"\n", binary=True)
    assert weir("read", "bin", binary=True).stdout == body + b"\n"
    rec = jsonl(weir("read", "bin", "--json").stdout)[0]
    assert rec["encoding"] == "base64", rec
    # A CRLF line ends as an LF one does; a `\r` elsewhere is the record's.
    weir("stream", "create", "crlf")
    weir("append", "crlf", input=b"one\r\ntwo\r\r\n\rthree\nlast\r", binary=True)
    assert weir("read", "crlf", binary=True).stdout == b"one\ntwo\r\n\rthree\nlast\r\n"


@case
def json_input():
    # `--input json` takes what `read --json` prints: a copy keeps bodies,
    # headers (text or base64) and timestamps.
    weir("stream", "create", "jsrc")
    weir("stream", "create", "jdst", "--timestamping-mode", "client-require")
    now = int(time.time() * 1000)
    lines = [json.dumps({"body": "with headers", "headers": [["k", "v"], ["k2", ""]], "timestamp": now - 3000}),
             json.dumps({"timestamp": now - 2000}),  # an empty body
             json.dumps({"body": "", "headers": [], "seq_num": 99, "timestamp": now - 1000})]
    weir("append", "jsrc", "--input", "json", input="\n".join(lines) + "\n")
    weir("append", "jsrc", input=b"plain\n\xff\n", binary=True)  # not UTF-8: base64 in --json
    # A command record (a fence, here) is printed by read --json, and not
    # appended by --input json: it would act on the copy.
    r = requests.post(f"{SERVER.base_url}/v1/streams/jsrc/records", timeout=30,
                      json={"records": [{"headers": [["", "fence"]], "body": "tok"}]})
    assert r.status_code == 200, r.text
    src = weir("read", "jsrc", "--json").stdout
    assert len(jsonl(src)) == 6 and jsonl(src)[5]["headers"] == [["", "fence"]], src
    copied = weir("append", "jdst", "--input", "json", input=src)
    assert copied.stdout == "jdst 0..5\n", copied.stdout
    assert copied.stderr == "weir: skipped 1 command record(s) (fence, trim): appended they would act on this " \
                            "stream\n", copied.stderr
    dst = jsonl(weir("read", "jdst", "--json").stdout)
    assert dst == jsonl(src)[:5], (dst, src)
    assert [r["body"] for r in dst[:4]] == ["with headers", "", "", "plain"], dst
    assert [r["timestamp"] for r in dst[:3]] == [now - 3000, now - 2000, now - 1000], dst
    assert dst[0]["headers"] == [["k", "v"], ["k2", ""]], dst
    assert dst[4]["encoding"] == "base64" and dst[4]["body"] == "/w==", dst
    # A client-require stream takes no record without a timestamp.
    nots = weir("append", "jdst", "--input", "json", input='{"body": "x"}\n', ok=False)
    assert "timestamp" in error_line(nots), nots.stderr
    # Bad lines are named; the batch holding one is not sent.
    for bad, why in (('not json', "not a JSON value"), ('[1]', "not a JSON object"),
                     ('{"body": 1}', '"body" must be a string'), ('{"bdy": "x"}', 'unknown field "bdy"'),
                     ('{"timestamp": -1}', '"timestamp" must be a whole number'),
                     ('{"headers": [["k"]]}', '"headers" must be an array'),
                     ('{"body": "*", "encoding": "base64"}', '"body" is not base64'),
                     ('{"encoding": "hex"}', '"encoding" can only be "base64"')):
        out = weir("append", "jsrc", "--input", "json", "--linger-ms", "60000",
                   input='{"body": "ok", "timestamp": 1}\n' + bad + "\n", ok=False)
        line = error_line(out)
        assert "line 2 is not a record" in line and why in line, (bad, line)
    big = json.dumps({"body": "x" * ((1 << 20) - 8), "headers": [["h", ""]]})
    out = weir("append", "jsrc", "--input", "json", input=big + "\n", ok=False)
    assert "line 1 is a record of 1048579 metered bytes" in error_line(out), out.stderr
    assert weir("tail", "jsrc").stdout == "6\n"
    assert weir("tail", "jdst").stdout == "5\n"
    assert "--input" in error_line(weir("append", "jsrc", "--input", "yaml", input="", ok=False))


@case
def conditions():
    weir("stream", "create", "cond")
    weir("append", "cond", input="a\nb\n")
    ack = jsonl(weir("append", "cond", "--match-seq-num", "2", "--json", input="c\n").stdout)[0]
    assert (ack["start"], ack["end"]) == (2, 3), ack
    miss = weir("append", "cond", "--match-seq-num", "1", input="d\n", ok=False)
    assert error_line(miss) == 'weir: seq_num mismatch: stream "cond" has its tail at 3 (412 seq_num_mismatch)', \
        miss.stderr
    fenced = weir("append", "cond", "--fencing-token", "not-the-token", input="e\n", ok=False)
    assert "fencing token mismatch" in error_line(fenced) and "(412 fencing_token_mismatch)" in fenced.stderr, \
        fenced.stderr
    assert weir("read", "cond").stdout == "a\nb\nc\n"


@case
def producer():
    weir("stream", "create", "prod")
    acks = jsonl(weir("append", "prod", "--producer", "--json", "--max-batch-records", "2",
                      input="1\n2\n3\n4\n5\n").stdout)
    assert [(a["start"], a["end"]) for a in acks] == [(0, 2), (2, 4), (4, 5)], acks
    assert all(a["duplicated"] is False for a in acks), acks
    # A second producer appends after the first.
    assert weir("append", "prod", "--producer", input="6\n").stdout == "prod 5..6\n"
    assert weir("read", "prod").stdout.split() == ["1", "2", "3", "4", "5", "6"]


def follow_until_an_append(env, args, line, not_before_ms=None):
    """Runs `weir read live -f ARGS`, checks that it waits, appends LINE and
    returns the follower's (exit code, stdout, stderr)."""
    proc = subprocess.Popen([WEIR, "read", "live", "-f"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    out, err = "", ""
    try:
        time.sleep(1)
        assert proc.poll() is None, f"the follower ended: {proc.communicate()}"
        # Not before `not_before_ms`: a record the follower must get whenever
        # its start was resolved.
        while not_before_ms and time.time() * 1000 < not_before_ms + 50:
            time.sleep(0.05)
        weir("append", "live", input=line + "\n")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def start_follower(stream):
    """Starts `weir read STREAM --follow`: the process and a queue of the lines it prints."""
    env = dict(os.environ, WEIR_SERVER=SERVER.base_url)
    proc = subprocess.Popen([WEIR, "read", stream, "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    got = queue.Queue()
    proc.reader = threading.Thread(target=lambda: [got.put(l) for l in proc.stdout], daemon=True)
    proc.reader.start()
    return proc, got


@case
def follow():
    weir("stream", "create", "live")
    weir("append", "live", input="before\n")
    env = dict(os.environ, WEIR_SERVER=SERVER.base_url)
    proc, got = start_follower("live")
    try:
        assert got.get(timeout=30) == "before\n"
        weir("append", "live", input="one\n")
        weir("append", "live", input="two\n")
        assert got.get(timeout=30) == "one\n"
        assert got.get(timeout=30) == "two\n"
        assert proc.poll() is None, "the follower exited on its own"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    # With --count the session ends by itself.
    out = weir("read", "live", "-f", "--count", "2", timeout=60).stdout
    assert out == "before\none\n", out
    out = weir("read", "live", "-f", "--tail-offset", "1", "--count", "1", timeout=60).stdout
    assert out == "two\n", out
    # --count past what the stream holds: the follower waits for the rest.
    rc, out, err = follow_until_an_append(env, ["--from", "2", "--count", "2"], "three")
    assert rc == 0 and out == "two\nthree\n", (rc, out, err)
    # From a time later than the last record's: the follower waits for a
    # record of that time (appended once it is past, wherever the follower's
    # start was resolved meanwhile).
    later_ms = int(time.time() * 1000) + 2000
    rc, out, err = follow_until_an_append(env, ["--timestamp", str(later_ms), "--count", "1"], "later",
                                          not_before_ms=later_ms)
    assert rc == 0 and out == "later\n", (rc, out, err)


@case
def follow_ends_when_its_stream_is_deleted():
    # The session's stream is gone: an error, not a reconnect that could pick
    # up a new stream of the same name (here made at once) past its records.
    weir("stream", "create", "phoenix")
    weir("append", "phoenix", input="a\nb\nc\n")
    proc, got = start_follower("phoenix")
    try:
        assert [got.get(timeout=30) for _ in range(3)] == ["a\n", "b\n", "c\n"]
        weir("stream", "delete", "phoenix")
        weir("stream", "create", "phoenix")
        weir("append", "phoenix", input="new\n")
        rc = proc.wait(timeout=60)
        err = proc.stderr.read()
        assert rc == 1, (rc, err)
        assert "not found" in err, err
        proc.reader.join(timeout=30)  # every line it printed is queued
        assert got.empty(), "the follower printed records of the new stream"
    finally:
        if proc.poll() is None:
            proc.kill()


@case
def a_follower_whose_reader_is_gone_ends_while_its_stream_is_idle():
    # `weir read --follow | head -1`: once head has its line the follower
    # ends as a write would end it (SIGPIPE), at the server's next ping
    # (every 5 s), not at the next record, which may never come.
    weir("stream", "create", "headed")
    weir("append", "headed", input="only\n")
    r, w = os.pipe()
    proc = subprocess.Popen([WEIR, "read", "headed", "--follow"], stdout=w, stderr=subprocess.PIPE,
                            env=dict(os.environ, WEIR_SERVER=SERVER.base_url))
    os.close(w)
    try:
        with os.fdopen(r) as reader:
            assert reader.readline() == "only\n"
        rc = proc.wait(timeout=60)
        assert rc == -signal.SIGPIPE, (rc, proc.stderr.read())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def start_server_to_bring_back(data_name):
    """A server of its own on a data dir of that name, and a command that
    starts it again on the port it has now (set srv.command to it)."""
    srv = start_server(os.path.join(tmp.name, data_name))
    port, base_command = srv.port, srv.command

    def same_port():
        cmd = base_command()
        cmd[cmd.index("--http-addr") + 1] = f"127.0.0.1:{port}"
        return cmd

    return srv, same_port


@case
def follow_across_a_restart():
    # --tail-offset and --timestamp are resolved once: a follower that
    # reconnects before its first batch must not skip what was appended
    # while it was away (a time past every record's read again would start
    # at the tail as it is then).
    srv, same_port = start_server_to_bring_back("data-follow")
    procs = []
    try:
        weir("stream", "create", "quiet", server=srv.base_url)
        hour_later = str(int(time.time() * 1000) + 3_600_000)
        for start in (["--tail-offset", "0"], ["--timestamp", hour_later]):
            proc = subprocess.Popen([WEIR, "read", "quiet", "-f"] + start, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=dict(os.environ, WEIR_SERVER=srv.base_url))
            proc.got = queue.Queue()
            threading.Thread(target=lambda p=proc: [p.got.put(l) for l in p.stdout], daemon=True).start()
            procs.append(proc)
        # Wait until the sessions are open on the idle stream (their starts are resolved by then).
        deadline = time.monotonic() + 60
        while not re.search(r"^weir_read_sessions [2-9]", requests.get(srv.base_url + "/metrics", timeout=30).text,
                            re.M):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                "the followers did not open their sessions"
            time.sleep(0.1)
        # While the follower is away (the server up on another port, where it
        # cannot reconnect), a record lands; only then is it let back in. A
        # follower that resolved --tail-offset again would skip it.
        srv.stop()
        srv.start()
        weir("append", "quiet", input="during\n", server=srv.base_url)
        srv.stop()
        # Longer than the 30 s a follower used to give up after.
        time.sleep(35)
        for proc in procs:
            assert proc.poll() is None, f"the follower gave up: {proc.stderr.read()}"
        srv.command = same_port
        srv.start()
        weir("append", "quiet", input="after\n", server=srv.base_url)
        for proc in procs:
            assert [proc.got.get(timeout=60) for _ in range(2)] == ["during\n", "after\n"], proc.args
            assert proc.poll() is None, "the follower exited on its own"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        srv.stop()


@case
def a_follower_stops_at_a_stream_made_again_while_it_was_away():
    # A follower resumes by sequence number: one that comes back to a stream
    # deleted and made again meanwhile must stop, not go on from its old
    # position in the new stream (skipping "x" and "y", printing "z" as if
    # it followed "b").
    srv, same_port = start_server_to_bring_back("data-reborn")
    proc = None
    try:
        weir("stream", "create", "reborn", server=srv.base_url)
        weir("append", "reborn", input="a\nb\n", server=srv.base_url)
        proc = subprocess.Popen([WEIR, "read", "reborn", "-f"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=dict(os.environ, WEIR_SERVER=srv.base_url))
        got = queue.Queue()
        reader = threading.Thread(target=lambda: [got.put(l) for l in proc.stdout], daemon=True)
        reader.start()
        assert [got.get(timeout=30) for _ in range(2)] == ["a\n", "b\n"]
        # Away (the server up on another port), the stream is made again.
        srv.stop()
        srv.start()
        weir("stream", "delete", "reborn", server=srv.base_url)
        weir("stream", "create", "reborn", server=srv.base_url)
        weir("append", "reborn", input="x\ny\nz\n", server=srv.base_url)
        srv.stop()
        assert proc.poll() is None, f"the follower gave up: {proc.stderr.read()}"
        srv.command = same_port
        srv.start()
        rc = proc.wait(timeout=60)
        err = proc.stderr.read()
        assert rc == 1, (rc, err)
        assert "made again" in err, err
        reader.join(timeout=30)  # every line it printed is queued
        assert got.empty(), "the follower printed records of the new stream"
    finally:
        if proc and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        srv.stop()


def append_waits_for_a_server_that_is_starting_with(flags):
    name = "late" + "".join(f.strip("-") for f in flags)
    srv = start_server(os.path.join(tmp.name, "data-starting-" + name))
    port, base_command = srv.port, srv.command
    proc = None
    try:
        weir("stream", "create", name, server=srv.base_url)
        srv.stop()
        proc = subprocess.Popen([WEIR, "append", name] + flags, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=dict(os.environ, WEIR_SERVER=srv.base_url))
        proc.stdin.write("waited\n")
        proc.stdin.close()
        proc.stdin = None  # communicate() below must not touch it
        time.sleep(0.5)
        assert proc.poll() is None, f"append {flags} gave up at once: {proc.stderr.read()}"

        def same_port():
            cmd = base_command()
            cmd[cmd.index("--http-addr") + 1] = f"127.0.0.1:{port}"
            return cmd

        srv.command = same_port
        srv.start()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"append {flags} exited {proc.returncode}: {err}"
        got = weir("read", name, server=srv.base_url).stdout
        assert got == "waited\n", got
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        srv.stop()


@case
def append_waits_for_a_server_that_is_starting():
    # No connection, then (while it recovers) 503 server_starting: neither
    # appended anything, so even without --producer the line is sent again;
    # with --producer, allocating the producer waits the same way.
    for flags in ([], ["--producer"]):
        append_waits_for_a_server_that_is_starting_with(flags)


def hanging_up_listener(read_first, hold_s=0):
    """A loopback listener that hangs up on each connection, at once or
    (`read_first`) once it has read the request and waited `hold_s`
    seconds without answering; closed by the caller."""
    import socket
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def hang_up():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                if read_first:
                    conn.settimeout(10)
                    try:
                        conn.recv(65536)
                    except OSError:
                        pass
                    time.sleep(hold_s)
    threading.Thread(target=hang_up, daemon=True).start()
    return listener


@case
def a_follower_that_never_got_a_session_gives_up():
    # A listener that hangs up at once (another protocol's port, say): a
    # follower reconnected for ever; until a session was accepted, only a
    # weir server's 503 server_starting is waited out.
    listener = hanging_up_listener(read_first=False)
    try:
        out = weir("read", "s1", "--follow", server=f"http://127.0.0.1:{listener.getsockname()[1]}", ok=False,
                   timeout=60)
        assert out.returncode == 1, out
        assert "reconnecting" not in out.stderr, out.stderr
        error_line(out)
    finally:
        listener.close()


@case
def an_append_whose_answer_was_lost_says_it_may_have_landed():
    # A server that reads the request and hangs up: the append may have
    # been applied, so without --producer it is not sent again, and the
    # error says why.
    listener = hanging_up_listener(read_first=True)
    try:
        out = weir("append", "anywhere", input="x\n", ok=False,
                   server=f"http://127.0.0.1:{listener.getsockname()[1]}")
        line = error_line(out)
        assert "may have been appended" in line and "--producer" in line, line
    finally:
        listener.close()


@case
def a_server_that_never_answers_fails_the_command_after_one_timeout():
    # A listener that takes requests and answers none: one --timeout (or
    # WEIR_TIMEOUT), not ten of them (each was 90 s).
    listener = hanging_up_listener(read_first=True, hold_s=60)
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        for args, env_vars in ((["stream", "list", "--timeout", "2"], None),
                               (["append", "s1", "--producer"], {"WEIR_TIMEOUT": "2"})):
            started = time.monotonic()
            out = weir(*args, input="x\n", server=url, ok=False, timeout=60, env_vars=env_vars)
            assert "timed out" in error_line(out), out.stderr
            assert time.monotonic() - started < 15, (args, time.monotonic() - started)
        assert "--timeout" in weir("stream", "list", "--help").stdout
        out = weir("stream", "list", "--timeout", "0", server=url, ok=False)
        assert "--timeout" in error_line(out), out.stderr
    finally:
        listener.close()


@case
def errors():
    out = weir("read", "s-missing", ok=False)
    assert out.returncode == 1 and error_line(out) == 'weir: stream "s-missing" not found (404 stream_not_found)'
    out = weir("append", "s-missing", input="x\n", ok=False)
    assert error_line(out) == 'weir: stream "s-missing" not found (404 stream_not_found)', out.stderr
    out = weir("stream", "info", "s-missing", ok=False)
    assert error_line(out) == 'weir: stream "s-missing" not found (404 stream_not_found)', out.stderr
    out = weir("tail", "s1", "--server", "ftp://nowhere", ok=False)
    assert "bad server URL" in error_line(out), out.stderr
    out = weir("read", "s1", "--from", "1", "--tail-offset", "1", ok=False)
    assert out.returncode == 1 and "excludes" in error_line(out), out.stderr
    # Bytes that are not UTF-8 would reach the server as U+FFFD, naming
    # another stream: refused before anything is sent.
    for args in (("stream", "create", "bad\udcff"), ("stream", "list", "--prefix", "\udcff"),
                 ("append", "s1", "--fencing-token", "t\udcff")):
        out = weir(*args, input="x\n", ok=False)
        assert out.returncode == 1 and "is not valid UTF-8" in error_line(out), (args, out.stderr)
    assert "bad" not in weir("stream", "list").stdout, "created"
    # Usage errors are one line and exit 1 too.
    for args in (("read",), ("read", "s1", "--count", "x"), ("bogus",)):
        out = weir(*args, ok=False)
        assert out.returncode == 1, (args, out.returncode)
        error_line(out)
    assert error_line(weir("bogus", ok=False)) == 'weir: unknown command "bogus" (see weir --help)'
    assert "--server URL" in weir("--help").stdout  # the client commands' shared flags


@case
def output_that_cannot_be_written_is_an_error():
    # A full disk under the output: exit 1 with one error line, never 0 with
    # the output cut.
    env = dict(os.environ, WEIR_SERVER=SERVER.base_url)
    for args, stdin in ((("read", "s1"), None), (("stream", "list"), None), (("tail", "s1"), None),
                        (("append", "s1"), b"full\n"), (("read", "s1", "--follow", "--count", "1"), None)):
        with open("/dev/full", "wb") as full:
            out = subprocess.run([WEIR, *args], input=stdin, stdout=full, stderr=subprocess.PIPE, env=env,
                                 timeout=60)
        assert out.returncode == 1, (args, out.returncode)
        assert out.stderr.decode().startswith("weir: ") and "writing standard output" in out.stderr.decode(), \
            (args, out.stderr)


@case
def flags_beat_environment_variables():
    # Every client command: its flag wins over its WEIR_ variable, which
    # applies only where the flag is left out; another command's variables
    # (serve's) change nothing.
    weir("basin", "create", "flag-basin")
    wrong = {"WEIR_BASIN": "env-basin-missing", "WEIR_SERVER": "http://127.0.0.1:1", "WEIR_PIPELINE_WINDOW": "0"}
    flags = ("--basin", "flag-basin", "--server", SERVER.base_url)
    weir("basin", "list", *flags, env_vars=wrong)
    weir("stream", "create", "fs1", *flags, env_vars=wrong)
    assert weir("stream", "list", *flags, env_vars=wrong).stdout == "fs1\n"
    assert weir("append", "fs1", *flags, input="a\nb\n", env_vars=wrong).stdout == "fs1 0..2\n"
    assert weir("read", "fs1", *flags, env_vars=wrong).stdout == "a\nb\n"
    assert weir("tail", "fs1", *flags, env_vars=wrong).stdout.strip() == "2"
    assert json.loads(weir("stream", "info", "fs1", "--json", *flags, env_vars=wrong).stdout)["tail"]["seq_num"] == 2
    assert weir("stream", "list", env_vars={"WEIR_BASIN": "flag-basin"}).stdout == "fs1\n"
    # Before the command too, in either form; given before and after, an error.
    assert weir(*flags, "read", "fs1", env_vars=wrong).stdout == "a\nb\n"
    assert weir("--basin=flag-basin", f"--server={SERVER.base_url}", "--json", "tail", "fs1",
                env_vars=wrong).stdout.startswith('{"seq_num":2,')
    assert "--basin" in error_line(weir("--basin", "flag-basin", "stream", "list", "--basin", "flag-basin", ok=False))
    assert weir(*flags, "read", "--", "fs1", env_vars=wrong).stdout == "a\nb\n"  # they go ahead of a `--`
    assert "not expected" in error_line(weir("--server", SERVER.base_url, "serve", ok=False))
    assert "not expected" in error_line(weir("--prefix", "f", "stream", "list", ok=False))
    # Between a command group and its command too.
    assert weir("stream", "--json", "--basin", "flag-basin", "--server", SERVER.base_url, "list",
                env_vars=wrong).stdout.startswith('{"name":"fs1",')
    assert weir("basin", f"--server={SERVER.base_url}", "list", env_vars=wrong).returncode == 0
    assert "not expected" in error_line(weir("stream", "--prefix", "f", "list", ok=False))
    weir("stream", "delete", "fs1", *flags, env_vars=wrong)
    weir("basin", "delete", "flag-basin", "--server", SERVER.base_url, env_vars=wrong)
    assert "flag-basin" not in weir("basin", "list").stdout


@case
def numbers_are_decimal():
    weir("stream", "create", "nums")
    weir("append", "nums", input="".join(f"{i}\n" for i in range(12)))
    # CLI11 alone reads "010" as octal, "0x10" as hex and "-1" as 2^64 - 1.
    assert weir("read", "nums", "--from", "010", "--count", "1").stdout == "10\n"
    # Past 64 bits: refused, not saturated to the largest value.
    for args in (("--count", "-1"), ("--tail-offset", "-1"), ("--from", "0x1"), ("--count", "1e3"),
                 ("--count", "0"), ("--from", ""), ("--from", "18446744073709551616"),
                 ("--timestamp", "99999999999999999999")):
        out = weir("read", "nums", *args, ok=False)
        assert out.returncode == 1 and args[0] in error_line(out), (args, out.stderr)
    # NaN got past CLI11's range checks into a duration cast.
    for args in (("append", "nums", "--linger-ms", "nan"), ("append", "nums", "--linger-ms", "inf"),
                 ("bench", "http", "--duration", "nan"), ("bench", "http", "--warmup", "0x1p3")):
        out = weir(*args, input="", ok=False)
        assert out.returncode == 1 and args[2] in error_line(out), (args, out.stderr)
    assert weir("tail", "nums").stdout == "12\n"


@case
def lines_too_long_for_a_record():
    weir("stream", "create", "long")
    limit = (1 << 20) - 8  # S2: 1 MiB metered per record, 8 of them overhead
    weir("append", "long", input="a\n" + "x" * limit + "\r\n")  # the CR is not the record's
    assert weir("tail", "long").stdout == "2\n"
    # One byte more: the line is named, its batch is not sent (a linger would
    # send "b" while the long line is still arriving), nothing after it is read.
    out = weir("append", "long", "--linger-ms", "60000", input="b\n" + "y" * (limit + 1) + "\nc\n", ok=False)
    line = error_line(out)
    # "is at least N bytes" if a read of stdin happened to end inside that line
    assert re.search(rf"line 2 is (at least )?\d+ bytes; a record holds at most {limit}\b", line), line
    assert weir("tail", "long").stdout == "2\n"
    # A line still growing past the limit fails before it ends (memory stays bounded).
    proc = subprocess.Popen([WEIR, "append", "long"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ, WEIR_SERVER=SERVER.base_url))
    try:
        chunk = b"z" * (1 << 16)
        for _ in range(64):  # 4 MiB, no newline
            proc.stdin.write(chunk)
    except BrokenPipeError:
        pass
    finally:
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass
    proc.stdin = None  # closed above; communicate() must not touch it
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 1 and b"line 1 is at least" in err, (proc.returncode, err)
    assert weir("tail", "long").stdout == "2\n"


@case
def bench_http_smoke():
    out = weir("bench", "http", "--clients", "4", "--streams", "2", "--duration", "1", "--warmup", "0.2",
               "--record-bytes", "100", "--batch", "3", timeout=120).stdout
    r = json.loads(out.strip().splitlines()[-1])
    for f in ("appends_per_s", "records_per_s", "mb_per_s", "p50_ms", "p99_ms", "p999_ms", "errors"):
        assert f in r, f"missing {f}: {r}"
    assert r["appends_per_s"] > 0 and r["errors"] == 0, r
    assert abs(r["records_per_s"] - 3 * r["appends_per_s"]) < 1e-6 * r["records_per_s"] + 1, r
    assert weir("tail", "bench-1").stdout.strip() != "0"
    # More streams than clients: every stream gets appends.
    # (3 s: client 0 must get three appends through, one after another.)
    # (--json, as the other client commands take it, before or after the command.)
    out = weir("--json", "bench", "http", "--clients", "2", "--streams", "5", "--duration", "3", "--warmup", "0",
               "--stream-prefix", "spread-", "--json", timeout=120).stdout
    assert json.loads(out.strip().splitlines()[-1])["errors"] == 0, out
    for i in range(5):
        assert weir("tail", f"spread-{i}").stdout.strip() != "0", i
    # A request over S2's 1 MiB metered limit is refused before the run, not 422'd for its whole length.
    out = weir("bench", "http", "--record-bytes", "1048", "--batch", "1000", "--duration", "1", ok=False)
    assert "1048576" in out.stderr and "appends_per_s" not in out.stdout, out


SERVER.stop()


@case
def server_down():
    out = weir("tail", "s1", ok=False)
    line = error_line(out)
    assert f"cannot reach the weir server at {SERVER.base_url}" in line and "weir serve" in line, line
    out = weir("bench", "http", "--duration", "1", ok=False)
    assert "cannot connect" in out.stderr, out.stderr
    # Through a proxy (libcurl honours http_proxy): the error names it.
    out = weir("tail", "s1", ok=False, env_vars={"http_proxy": "http://127.0.0.1:1"})
    assert "proxy http_proxy=http://127.0.0.1:1" in error_line(out), out.stderr


@case
def a_server_that_is_not_weir():
    # Another HTTP server on the port: one line that says so, not its HTML.
    import http.server
    import threading
    httpd = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        out = weir("stream", "create", "s1", server=f"http://127.0.0.1:{httpd.server_port}", ok=False)
        line = error_line(out)
        assert "not JSON" in line and "weir server" in line and "<" not in line, line
    finally:
        httpd.shutdown()
        httpd.server_close()

    # One whose answer has no end: the client stops keeping it at 256 MiB.
    class Endless(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            chunk = b" " * (1 << 20)
            try:
                for _ in range(300):
                    self.wfile.write(chunk)
            except OSError:
                pass  # the client hung up

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        out = weir("stream", "list", server=f"http://127.0.0.1:{httpd.server_port}", ok=False)
        line = error_line(out)
        assert "larger than 256 MiB" in line, line
        # A read session's event too (its body is streamed, not kept whole).
        out = weir("read", "s1", "--follow", server=f"http://127.0.0.1:{httpd.server_port}", ok=False)
        line = error_line(out)
        assert "an event of more than 64 MiB: not a weir server?" in line, line
    finally:
        httpd.shutdown()
        httpd.server_close()


class ScriptedServer:
    """A fake server on loopback answering each request with the next of
    `script` (status, JSON body); the last entry repeats."""

    def __init__(self, script):
        import http.server
        self.script = list(script)
        self.seen = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                outer.seen.append((self.command, self.path))
                status, body = outer.script.pop(0) if len(outer.script) > 1 else outer.script[0]
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = answer

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@case
def a_follower_waits_out_a_server_that_is_starting():
    # Before its first session, a follower waits out a weir server's refusal
    # that did nothing (503 server_starting), then takes its answer.
    # A weir server that is starting is waited out, then its answer taken.
    # (Each try looks the stream up first, then opens its session.)
    server = ScriptedServer([(503, {"code": "server_starting", "message": "recovering"})] * 4 +
                            [(404, {"code": "stream_not_found", "message": "no such stream"})])
    try:
        out = weir("read", "s1", "--follow", server=server.url, ok=False, timeout=60)
        assert "not found" in out.stderr.splitlines()[-1], out.stderr
        assert len(server.seen) == 6, server.seen
        assert [p for _, p in server.seen[1::2]] == ["/v1/streams/s1/records?seq_num=0"] * 3, server.seen
    finally:
        server.close()


@case
def changes_wait_out_a_server_that_is_starting():
    # A create or a delete refused by a weir server that is starting (503
    # server_starting: nothing done) is tried again; a failure after which
    # it may have been done is not (a delete tried again would say "not found").
    starting = (503, {"code": "server_starting", "message": "recovering"})
    created = {"name": "s1", "created_at": "2026-12-07T00:00:00.000Z", "deleted_at": None}
    for args, script, said in ((("stream", "create", "s1"), [starting, starting, (201, created)], "created"),
                               (("stream", "delete", "s1"), [starting, (202, {})], "deleted"),
                               (("basin", "create", "basin-one"), [starting, (201, dict(created, name="basin-one"))],
                                "created"),
                               (("basin", "delete", "basin-one"), [starting, (202, {})], "deleted")):
        server = ScriptedServer(script)
        try:
            out = weir(*args, server=server.url, timeout=60)
            assert said in out.stdout, (args, out.stdout, out.stderr)
            assert len(server.seen) == len(script), (args, server.seen)
        finally:
            server.close()
    server = ScriptedServer([(500, {"code": "other", "message": "boom"}), (202, {})])
    try:
        out = weir("stream", "delete", "s1", server=server.url, ok=False, timeout=60)
        assert "boom" in error_line(out), out.stderr
        assert len(server.seen) == 1, server.seen
    finally:
        server.close()


@case
def a_read_stops_at_the_tail_it_began_with():
    # Without --follow a read goes up to the tail as it was when it began:
    # records appended meanwhile (here in the page the read gets) are left
    # to a follower, and no further page is asked for.
    def rec(n):
        return {"seq_num": n, "timestamp": 0, "headers": [], "body": base64.b64encode(f"r{n}".encode()).decode()}

    server = ScriptedServer([(200, {"tail": {"seq_num": 3, "timestamp": 0}}),
                             (200, {"records": [rec(n) for n in range(5)]}),
                             (200, {"records": [rec(n) for n in range(5, 8)]})])
    try:
        out = weir("read", "s1", server=server.url, timeout=60)
        assert out.stdout == "r0\nr1\nr2\n", (out.stdout, out.stderr)
        assert [p.split("?")[0] for _, p in server.seen] == ["/v1/streams/s1/records/tail", "/v1/streams/s1/records"], \
            server.seen
    finally:
        server.close()
    # --tail-offset counts back from that tail, not from one that has moved
    # since (which would start past it and print nothing).
    server = ScriptedServer([(200, {"tail": {"seq_num": 10, "timestamp": 0}}),
                             (200, {"records": [rec(n) for n in range(8, 12)]})])
    try:
        out = weir("read", "s1", "--tail-offset", "2", server=server.url, timeout=60)
        assert out.stdout == "r8\nr9\n", (out.stdout, out.stderr)
        assert server.seen[1][1] == "/v1/streams/s1/records?seq_num=8", server.seen
    finally:
        server.close()


@case
def lists_print_each_page_as_it_comes():
    # A page at a time, asking for the next after the last name printed; a
    # failure on a later page comes after the pages before it.
    def info(name):
        return {"name": name, "created_at": "2026-12-07T00:00:00.000Z", "deleted_at": None}

    server = ScriptedServer([(200, {"streams": [info("a"), info("b")], "has_more": True}),
                             (200, {"streams": [info("c")], "has_more": False})])
    try:
        out = weir("stream", "list", server=server.url, timeout=60)
        assert out.stdout == "a\nb\nc\n", out.stdout
        assert [p for _, p in server.seen] == ["/v1/streams?limit=1000", "/v1/streams?limit=1000&start_after=b"], \
            server.seen
    finally:
        server.close()
    server = ScriptedServer([(200, {"basins": [info("basin-one")], "has_more": True}),
                             (403, {"code": "permission_denied", "message": "no more for you"})])
    try:
        out = weir("basin", "list", server=server.url, ok=False, timeout=60)
        assert out.stdout == "basin-one\n", out.stdout
        assert "no more for you" in error_line(out), out.stderr
    finally:
        server.close()
    # A server that ignores start_after would be listed for ever.
    server = ScriptedServer([(200, {"streams": [info("a")], "has_more": True})])
    try:
        out = weir("stream", "list", server=server.url, ok=False, timeout=60)
        assert out.stdout == "a\n", out.stdout
        assert "listed \"a\" again" in error_line(out), out.stderr
        assert len(server.seen) == 2, server.seen
    finally:
        server.close()


@case
def a_producer_append_whose_tries_ran_out_says_it_may_have_landed():
    # With --producer, failures that may have appended are retried (a resend
    # is a duplicate to the server); once the 10 tries are used up, the
    # error says the batch may have landed, as it does without --producer.
    server = ScriptedServer([(200, {"id": 7, "epoch": 0})] +
                            [(503, {"code": "unavailable", "message": "store down"})])
    try:
        out = weir("append", "s", "--producer", input="x\n", server=server.url, ok=False, timeout=90)
        assert out.returncode == 1, out
        last = out.stderr.splitlines()[-1]
        assert last.startswith("weir: ") and "the batch may have been appended (its retries ran out)" in last, \
            out.stderr
        assert len([1 for m, _ in server.seen if m == "POST"]) == 11, server.seen  # the producer, then 10 tries
    finally:
        server.close()


@case
def refusals_waited_out_do_not_use_up_the_tries():
    # An append with --producer behind a stretch of 429s (more than the 10
    # tries other failures get), then a 503 that may have done something:
    # that failure still gets its tries. And a read waits out a server that
    # is starting for longer than those 10 tries. Both run at once (about
    # 13 and 15 s: the backoff doubles from 0.1 s up to 2 s).
    ack = {"start": {"seq_num": 0}, "end": {"seq_num": 1}, "tail": {"seq_num": 1}}
    appender = ScriptedServer([(200, {"id": 7, "epoch": 0})] +
                              [(429, {"code": "rate_limited", "message": "behind"})] * 9 +
                              [(503, {"code": "unavailable", "message": "store down"}), (200, ack)])
    reader = ScriptedServer([(503, {"code": "server_starting", "message": "recovering"})] * 11 +
                            [(200, {"tail": {"seq_num": 7, "timestamp": 1}})])
    try:
        results = {}

        def run(key, *args, server):
            try:
                results[key] = weir(*args, server=server, input="x\n" if key == "append" else None)
            except AssertionError as e:  # it gave up
                results[key] = e

        threads = [threading.Thread(target=run, args=("append", "append", "s", "--producer"),
                                    kwargs={"server": appender.url}),
                   threading.Thread(target=run, args=("tail", "tail", "s"), kwargs={"server": reader.url})]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out = results["append"]
        assert not isinstance(out, Exception), out
        assert len([1 for m, _ in appender.seen if m == "POST"]) == 12, appender.seen
        out = results["tail"]
        assert not isinstance(out, Exception), out
        assert out.stdout == "7\n", out.stdout
        assert len(reader.seen) == 12, reader.seen
    finally:
        appender.close()
        reader.close()


@case
def auth_token():
    token_file = os.path.join(tmp.name, "token")
    with open(token_file, "w") as f:
        f.write("s3cret\n")
    srv = start_server(os.path.join(tmp.name, "data-auth"), ["--auth-token-file", token_file])
    try:
        out = weir("stream", "list", server=srv.base_url, ok=False)
        line = error_line(out)
        assert "(401 authn)" in line and "--auth-token" in line, line
        weir("stream", "create", "authed", "--auth-token", "s3cret", server=srv.base_url)
        env_out = subprocess.run([WEIR, "stream", "list"], capture_output=True, text=True, timeout=60,
                                 env=dict(os.environ, WEIR_SERVER=srv.base_url, WEIR_AUTH_TOKEN="s3cret"))
        assert env_out.returncode == 0 and env_out.stdout == "authed\n", env_out
    finally:
        srv.stop()


@case
def a_wal_store_of_another_deployment_is_refused():
    # Two deployments (each its own metastore and object store) on one WAL
    # store would write the same slot keys for a node id, and one's sweep
    # delete the other's unsettled slots: the WAL store carries the
    # deployment marker of each node id too (each store of a quorum), and a
    # start of another deployment with that node id on it is refused.
    base = os.path.join(tmp.name, "shared-wal")
    os.mkdir(base)
    one = ["--wal-store", "file://" + os.path.join(base, "one")]
    three = [a for i in range(3) for a in ("--wal-store", "file://" + os.path.join(base, f"q-{i}"))]
    for flags in (one, three):
        first = start_server(os.path.join(base, f"a-{len(flags)}"), flags)
        weir("stream", "create", "mine", server=first.base_url)
        weir("append", "mine", input="kept\n", server=first.base_url)
        first.stop()  # clean: nothing is left in the WAL
        second = WeirServer(WEIR, data_dir=os.path.join(base, f"b-{len(flags)}"), args=flags)
        code, out = run_expecting_exit(second.command())
        assert code not in (None, 0) and "WAL store" in out and "is used with another metastore" in out, out
        # Another node id writes other slot keys: that deployment may share it.
        second.args = flags + ["--node-id", "other-node"]
        second.start()
        weir("stream", "create", "theirs", server=second.base_url)
        weir("append", "theirs", input="apart\n", server=second.base_url)
        second.stop()
        first.start()
        assert weir("read", "mine", server=first.base_url).stdout == "kept\n"
        first.stop()


@case
def express_wal_store():
    # The express class: the WAL on a quorum of three file:// stores (2 of 3).
    # One store that fails every write is invisible to appends; a crash then
    # loses nothing acknowledged; a start on other WAL stores than the ones an
    # unsettled chain is in is refused, and changes nothing.
    base = os.path.join(tmp.name, "express")
    os.mkdir(base)
    stores = [os.path.join(base, f"wal-{i}") for i in range(3)]
    flags = [a for s in stores for a in ("--wal-store", "file://" + s)]
    srv = start_server(os.path.join(base, "data"), flags)
    try:
        weir("stream", "create", "ex", server=srv.base_url)
        weir("append", "ex", input="one\n", server=srv.base_url)
        # The third store turns into a file: every write to it fails.
        shutil.rmtree(stores[2])
        open(stores[2], "w").close()
        weir("append", "ex", input="two\nthree\n", server=srv.base_url)
        metrics = requests.get(srv.base_url + "/metrics", timeout=30).text
        failed = re.search(r'^weir_wal_quorum_copy_failures_total\{store="2"\} (\d+)', metrics, re.M)
        assert failed and int(failed.group(1)) >= 1, metrics
        srv.kill()
        os.remove(stores[2])
        os.mkdir(stores[2])  # back, empty: its copies are gone
        srv.start()
        assert weir("read", "ex", "--count", "3", server=srv.base_url).stdout == "one\ntwo\nthree\n"
        weir("append", "ex", input="four\n", server=srv.base_url)
        srv.kill()
        # Unsettled records are in the quorum: a start on the object store is refused.
        code, out = run_expecting_exit(srv.command()[:srv.command().index(flags[0])])
        assert code not in (None, 0) and "WAL is in quorum(2 of 3" in out, out
        code, out = run_expecting_exit(srv.command() + ["--wal-quorum", "4"])
        assert code not in (None, 0) and "--wal-quorum 4 is more than the 3 --wal-store" in out, out
        srv.start()
        assert weir("read", "ex", "--count", "4", server=srv.base_url).stdout == "one\ntwo\nthree\nfour\n"
        # A clean stop settles everything: then the WAL may move.
        srv.stop()
        srv.args = []
        srv.start()
        assert weir("read", "ex", "--count", "4", server=srv.base_url).stdout == "one\ntwo\nthree\nfour\n"
    finally:
        srv.stop()


tmp.cleanup()
print(f"{passed} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
