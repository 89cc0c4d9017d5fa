"""Shared bits of the Kafka client suites (kcat_test.py, confluent_test.py):
servers, the REST view of a topic's partitions, unique names and a unittest
runner that prints the server logs of a failed run.

Partition p of topic t is the stream "t/p" of the basin `weir-kafka`; the
REST helpers here read and append there (stdlib urllib only).
"""
import base64
import functools
import json
import os
import sys
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "http"))
from weir_server import ServerError, WeirServer  # noqa: E402,F401

KAFKA_BASIN = "weir-kafka"
REQ_TIMEOUT = 60        # seconds per REST request
READ_TIMEOUT = 180      # seconds to wait for records to show up through REST
LOG_LINES = int(os.environ.get("WEIR_TEST_LOG_LINES", "60"))  # server log lines shown on a failure
SERVERS = []            # every server started, for log dumps and cleanup
KNOWN_SERVER_BUGS = {}  # test name -> note, printed with the summary
WEIR = None             # the binary, set by main()


def unique(prefix):
    """A topic or group name no other test uses: [a-z0-9-] only."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def server_bug(note):
    """Marks a test that fails because of a known server bug: it still runs
    and still asserts the right behaviour; a failure carries the note."""
    def deco(fn):
        KNOWN_SERVER_BUGS[fn.__name__] = note

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except AssertionError as e:
                raise AssertionError(f"[known server bug: {note}]\n{e}") from e
        return wrapper
    return deco


# --------------------------------------------------------------------------
# Servers

def start_server(args=(), data_dir=None, shared=False):
    """A running `weir serve` with its Kafka listener on a free port. A
    shared server that dies is started again (see TestCase)."""
    server = WeirServer(WEIR, data_dir=data_dir, args=list(args))
    server.shared = shared
    SERVERS.append(server)
    server.start()
    if not server.kafka_addr:
        raise ServerError("the ready line names no kafka://HOST:PORT\n" + server.log_tail())
    return server


def stop_server(server):
    """SIGTERM and check exit 0; the temp dir stays until the run ends so a
    failure can still print the log."""
    if server.running():
        server.stop()


def missing_client_exit_code():
    """77 (CTest's SKIP_RETURN_CODE: shown as skipped, not passed) when a
    client is not installed, but 1 where the suite must run (scripts/test.sh
    sets WEIR_REQUIRE_CLIENTS=1, so CI never passes without the clients)."""
    return 1 if os.environ.get("WEIR_REQUIRE_CLIENTS") == "1" else 77


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CRASHES = []            # servers found dead between tests: they fail the run
_last_test = None


def _reap_dead():
    """Notes for every server that died (not stopped), and starts the shared
    ones again on their data dirs so that later tests still run."""
    notes = []
    for s in SERVERS:
        if s.proc is None or s.proc.poll() is None:
            continue
        notes.append(f"weir serve{' (shared)' if getattr(s, 'shared', False) else ''} on {s.data_dir} died "
                     f"with exit status {s.proc.returncode}\n" + s.log_tail(LOG_LINES))
        s.proc = None
        if getattr(s, "shared", False):
            try:
                s.start()
            except Exception as e:  # the next tests will fail on their own
                notes.append(f"starting it again failed: {e}")
    return notes


class TestCase(unittest.TestCase):
    """Fails the test during which a server died (a crash, not a stop), with
    its exit status and log; a death noticed before a test (after the
    previous one passed) fails the run at the end. A shared server is started
    again on its data dir so that the tests after it still run."""

    def setUp(self):
        global _last_test
        notes = _reap_dead()
        if notes:
            CRASHES.append(f"between {_last_test} and {self.id()}:\n" + "\n".join(notes))
            print(f"\n!!! {CRASHES[-1]}", flush=True)
        _last_test = self.id()

    def tearDown(self):
        notes = _reap_dead()
        if notes:
            self.fail("noticed at the end of this test (it died during it or just before): " + "\n".join(notes))


# --------------------------------------------------------------------------
# REST view of a partition

def stream_of(topic, partition):
    return f"{topic}/{partition}"


def _request(server, method, path, body=None, headers=None, timeout=REQ_TIMEOUT):
    h = {"s2-basin": KAFKA_BASIN}
    h.update(headers or {})
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        h["content-type"] = "application/json"
    req = urllib.request.Request(server.url(path), data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def rest_read(server, topic, partition, count, start=0, timeout=READ_TIMEOUT):
    """Records [start, start+count) of partition `partition` of `topic`,
    read through the REST API with base64 bodies: a list of dicts
    {seq_num, timestamp, headers: [(bytes, bytes)], body: bytes}. Waits (long
    polls) until there are `count` of them; fails after `timeout` seconds."""
    path = "/v1/streams/" + urllib.parse.quote(stream_of(topic, partition), safe="") + "/records"
    out = []
    deadline = time.monotonic() + timeout
    last = None
    while len(out) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"REST read of {stream_of(topic, partition)}: {len(out)} of {count} records "
                                 f"after {timeout} s; last answer {last}")
        q = urllib.parse.urlencode({"seq_num": start + len(out), "count": min(1000, count - len(out)),
                                    "wait": 5})
        status, body = _request(server, "GET", f"{path}?{q}", headers={"s2-format": "base64"})
        last = (status, body[:300])
        if status in (404, 416):  # not there yet
            time.sleep(0.5)
            continue
        if status != 200:
            raise AssertionError(f"REST read of {stream_of(topic, partition)}: HTTP {status} {body[:500]!r}")
        for r in json.loads(body)["records"]:
            out.append({"seq_num": r["seq_num"], "timestamp": r["timestamp"],
                        "headers": [(base64.b64decode(n), base64.b64decode(v)) for n, v in r["headers"]],
                        "body": base64.b64decode(r["body"])})
    return out


def rest_tail(server, topic, partition):
    path = "/v1/streams/" + urllib.parse.quote(stream_of(topic, partition), safe="") + "/records/tail"
    status, body = _request(server, "GET", path)
    if status != 200:
        raise AssertionError(f"REST tail of {stream_of(topic, partition)}: HTTP {status} {body[:500]!r}")
    return json.loads(body)["tail"]["seq_num"]


def rest_append(server, topic, partition, records):
    """Appends [{"body": str, "headers": [[name, value]]}] (raw format) to
    partition `partition` of `topic`; returns the ack."""
    path = "/v1/streams/" + urllib.parse.quote(stream_of(topic, partition), safe="") + "/records"
    status, body = _request(server, "POST", path, body={"records": records})
    if status != 200:
        raise AssertionError(f"REST append to {stream_of(topic, partition)}: HTTP {status} {body[:500]!r}")
    return json.loads(body)


# --------------------------------------------------------------------------
# Runner

class _Result(unittest.TextTestResult):
    """Prints the tail of every server's log right after a failed test."""

    def _dump(self):
        for s in SERVERS:
            print("\n" + s.log_tail(LOG_LINES), flush=True)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._dump()

    def addError(self, test, err):
        super().addError(test, err)
        self._dump()


def main(usage):
    """usage: NAME WEIR_BINARY [unittest arguments] (or WEIR_BIN=...)."""
    global WEIR
    args = sys.argv[1:]
    WEIR = os.environ.get("WEIR_BIN")
    if args and not args[0].startswith("-"):
        WEIR = args.pop(0)
    if not WEIR or not os.access(WEIR, os.X_OK):
        sys.exit(f"usage: {usage}")
    WEIR = os.path.abspath(WEIR)
    ok = False
    try:
        runner = unittest.TextTestRunner(verbosity=2, resultclass=_Result)
        prog = unittest.main(module="__main__", argv=[sys.argv[0]] + args, exit=False, testRunner=runner)
        ok = prog.result.wasSuccessful()
        if CRASHES:
            print(f"\n{len(CRASHES)} server death(s) outside any test's own run (see the !!! lines above)")
            ok = False
        if not ok:
            failed = [t.id() for t, _ in prog.result.failures + prog.result.errors]
            for name, note in KNOWN_SERVER_BUGS.items():
                if any(f".{name}" in f for f in failed):
                    print(f"known server bug, {name}: {note}")
    finally:
        for s in SERVERS:
            try:
                if s.running():
                    s.stop(expect_code=None)
            except Exception as e:  # never leave a server behind
                print(f"stopping a server: {e}")
            s.cleanup()
    sys.exit(0 if ok else 1)
