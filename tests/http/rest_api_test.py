#!/usr/bin/python3
"""Integration tests of `weir serve`'s HTTP API (docs/http-api.md): every
endpoint and every error status, against the real binary on a free port.

Usage: rest_api_test.py WEIR_BINARY [unittest arguments, e.g. -k Sse -v]
(or WEIR_BIN=... rest_api_test.py). Needs python3-requests (Debian).

Most tests share one server; auth + request limits, backpressure and the
restart/drain/lock tests start their own. Names are unique per test, so the
shared server's state does not couple tests. No test asserts an upper bound
on time; waits are generous (CI is a loaded 2-core machine).
"""
import base64
import datetime
import functools
import http.client
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import shutil
import tempfile
import threading
import time
import unittest
import urllib.parse
import uuid

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from weir_server import ServerError, WeirServer, run_expecting_exit  # noqa: E402

WEIR = os.environ.get("WEIR_BIN")
REQ_TIMEOUT = 60           # seconds per plain request
ALL_SERVERS = []           # every server started, for log dumps on failure
SHARED = None              # the shared server (setUpModule)
DEFAULT_BASIN = "weir-default"


# --------------------------------------------------------------------------
# S2 protobuf messages (s2/v1/s2.proto), hand-encoded.

def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(num, wire):
    return _varint((num << 3) | wire)


def _f_varint(num, n):
    return _key(num, 0) + _varint(n)


def _f_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return _key(num, 2) + _varint(len(b)) + b


def pb_append_record(body=b"", headers=(), timestamp=None):
    """AppendRecord{timestamp=1 (optional), headers=2, body=3}"""
    out = b""
    if timestamp is not None:
        out += _f_varint(1, timestamp)
    for name, value in headers:
        out += _f_bytes(2, _f_bytes(1, name) + _f_bytes(2, value))  # Header{name=1,value=2}
    return out + _f_bytes(3, body)


def pb_append_input(records, match_seq_num=None, fencing_token=None):
    """AppendInput{records=1, match_seq_num=2 (optional), fencing_token=3 (optional)}"""
    out = b"".join(_f_bytes(1, r) for r in records)
    if match_seq_num is not None:
        out += _f_varint(2, match_seq_num)
    if fencing_token is not None:
        out += _f_bytes(3, fencing_token)
    return out


def pb_parse(buf):
    """Field number -> list of values (int for varints, bytes for length-delimited)."""
    fields, i = {}, 0

    def varint():
        nonlocal i
        shift = n = 0
        while True:
            b = buf[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    while i < len(buf):
        key = varint()
        num, wire = key >> 3, key & 7
        if wire == 0:
            val = varint()
        elif wire == 2:
            ln = varint()
            val = bytes(buf[i:i + ln])
            i += ln
        elif wire == 1:
            val = bytes(buf[i:i + 8])
            i += 8
        elif wire == 5:
            val = bytes(buf[i:i + 4])
            i += 4
        else:
            raise ValueError(f"wire type {wire}")
        fields.setdefault(num, []).append(val)
    return fields


def _last(fields, num, default):
    return fields.get(num, [default])[-1]


def pb_position(buf):
    """StreamPosition{seq_num=1, timestamp=2}"""
    f = pb_parse(buf)
    return {"seq_num": _last(f, 1, 0), "timestamp": _last(f, 2, 0)}


def pb_append_ack(buf):
    """AppendAck{start=1, end=2, tail=3}; each must be present."""
    f = pb_parse(buf)
    return {k: pb_position(f[n][-1]) for k, n in (("start", 1), ("end", 2), ("tail", 3))}


def pb_read_batch(buf):
    """ReadBatch{records=1, tail=2 (optional)} of
    SequencedRecord{seq_num=1, timestamp=2, headers=3, body=4}"""
    f = pb_parse(buf)
    records = []
    for rb in f.get(1, []):
        r = pb_parse(rb)
        headers = []
        for hb in r.get(3, []):
            h = pb_parse(hb)
            headers.append((_last(h, 1, b""), _last(h, 2, b"")))
        records.append({"seq_num": _last(r, 1, 0), "timestamp": _last(r, 2, 0),
                        "headers": headers, "body": _last(r, 4, b"")})
    tail = pb_position(f[2][-1]) if 2 in f else None
    return {"records": records, "tail": tail}


# --------------------------------------------------------------------------
# Helpers

KNOWN_SERVER_BUGS = {}  # test name -> note, printed with the summary


def server_bug(note):
    """Marks a test that fails because of a known server bug: it still runs
    and still fails (or passes once fixed); a failure message carries the note."""
    def deco(fn):
        KNOWN_SERVER_BUGS[fn.__name__] = note

        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except AssertionError as e:
                raise AssertionError(f"[known server bug: {note}]\n{e}") from e
        return wrapper
    return deco


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def q(name):
    return urllib.parse.quote(name, safe="")


def metered(body, headers=()):
    """Metered size of a record as docs/http-api.md (and S2) define it:
    8 + body + for each header 2 + name + value."""
    if isinstance(body, str):
        body = body.encode()
    size = 8 + len(body)
    for n, v in headers:
        size += 2 + len(n.encode() if isinstance(n, str) else n) + len(v.encode() if isinstance(v, str) else v)
    return size


def now_ms():
    return int(time.time() * 1000)


def b64(b):
    return base64.b64encode(b if isinstance(b, bytes) else b.encode()).decode()


OPEN_CLIENTS = []  # closed after each test


def ended_by(p, sig, timeout, before=None):
    """Runs `before` (checks while `p` runs), sends `sig` and returns p's exit
    code; kills `p` if anything fails or it outlives the wait."""
    try:
        if before:
            before()
        p.send_signal(sig)
        return p.wait(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


class Client:
    """A keep-alive session against one server; `basin` sets s2-basin."""

    def __init__(self, server, basin=None, token=None):
        self.server = server
        self.s = requests.Session()
        OPEN_CLIENTS.append(self.s)
        self.basin = basin
        self.token = token

    def request(self, method, path, headers=None, timeout=REQ_TIMEOUT, **kw):
        h = {}
        if self.basin:
            h["s2-basin"] = self.basin
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        h.update(headers or {})
        return self.s.request(method, self.server.url(path), headers=h, timeout=timeout, **kw)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, **kw):
        return self.request("POST", path, **kw)

    def put(self, path, **kw):
        return self.request("PUT", path, **kw)

    def patch(self, path, **kw):
        return self.request("PATCH", path, **kw)

    def delete(self, path, **kw):
        return self.request("DELETE", path, **kw)

    # Stream shortcuts --------------------------------------------------
    def create_stream(self, name, config=None):
        body = {"stream": name}
        if config is not None:
            body["config"] = config
        r = self.post("/v1/streams", json=body)
        assert r.status_code == 201, f"create stream {name!r}: {r.status_code} {r.text}"
        return r.json()

    def append(self, stream, records, fmt=None, expect=200, **extra):
        headers = {"s2-format": fmt} if fmt else {}
        headers.update(extra.pop("headers", {}))
        body = {"records": records}
        body.update(extra)
        r = self.post(f"/v1/streams/{q(stream)}/records", json=body, headers=headers)
        assert r.status_code == expect, f"append to {stream!r}: {r.status_code} {r.text}"
        return r.json()

    def read(self, stream, params=None, fmt=None, expect=200, timeout=REQ_TIMEOUT):
        """A unary read; from seq_num 0 unless params name a start (the
        server's own default is the tail)."""
        headers = {"s2-format": fmt} if fmt else {}
        params = dict(params or {})
        if not {"seq_num", "timestamp", "tail_offset"} & params.keys():
            params["seq_num"] = 0
        r = self.get(f"/v1/streams/{q(stream)}/records", params=params or {}, headers=headers,
                     timeout=timeout)
        assert r.status_code == expect, f"read {stream!r} {params}: {r.status_code} {r.text}"
        return r.json()

    def tail(self, stream):
        r = self.get(f"/v1/streams/{q(stream)}/records/tail")
        assert r.status_code == 200, f"tail of {stream!r}: {r.status_code} {r.text}"
        return r.json()["tail"]

    def read_all(self, stream, fmt=None):
        """Every record from the first retained one to the tail, page by page."""
        out, params = [], {"seq_num": 0}
        while True:
            r = self.get(f"/v1/streams/{q(stream)}/records", params=params,
                         headers={"s2-format": fmt} if fmt else {})
            if r.status_code == 416:  # at the tail (S2 answers 416 there)
                return out
            assert r.status_code == 200, f"read {stream!r} {params}: {r.status_code} {r.text}"
            batch = r.json()["records"]
            if not batch:
                return out
            out += batch
            params = {"seq_num": batch[-1]["seq_num"] + 1}


class ClosingTestCase(unittest.TestCase):
    """Closes every Client's connections after each test."""

    def tearDown(self):
        while OPEN_CLIENTS:
            OPEN_CLIENTS.pop().close()


class ApiTestCase(ClosingTestCase):
    maxDiff = 4000

    def setUp(self):
        self.c = Client(SHARED)

    def assertJson(self, r):
        ctype = r.headers.get("Content-Type", "")
        self.assertTrue(ctype.startswith("application/json"),
                        f"{r.request.method} {r.request.url}: Content-Type {ctype!r}, body {r.text[:200]!r}")
        return r.json()

    def assertError(self, r, status, code=None):
        """Status, JSON content type, and the {code, message} body."""
        self.assertEqual(r.status_code, status, f"{r.request.method} {r.request.url}: {r.text[:500]}")
        body = self.assertJson(r)
        self.assertIsInstance(body.get("message"), str, body)
        self.assertIsInstance(body.get("code"), str, body)
        if code is not None:
            self.assertEqual(body["code"], code, body)
        return body

    def assertPosition(self, pos):
        self.assertIsInstance(pos, dict)
        self.assertIsInstance(pos.get("seq_num"), int, pos)
        self.assertIsInstance(pos.get("timestamp"), int, pos)

    def assertRfc3339(self, value):
        self.assertIsInstance(value, str)
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        self.assertIsNotNone(parsed.tzinfo, value)

    def config(self, name, client=None):
        r = (client or self.c).get(f"/v1/streams/{q(name)}")
        self.assertEqual(r.status_code, 200, r.text)
        return self.assertJson(r)

    def new_stream(self, prefix="s", config=None, client=None):
        name = unique(prefix)
        (client or self.c).create_stream(name, config)
        return name

    def metric(self, name):
        """One unlabelled value from /metrics."""
        m = re.search(rf"(?m)^{name} (\S+)$", self.c.get("/metrics").text)
        self.assertIsNotNone(m, name)
        return float(m.group(1))

    def wait_for_status(self, fn, status, timeout=30):
        """Polls fn() until it returns `status` (deletion may be asynchronous)."""
        deadline = time.monotonic() + timeout
        while True:
            r = fn()
            if r.status_code == status or time.monotonic() > deadline:
                return r
            time.sleep(0.2)


# --------------------------------------------------------------------------
# Operations

class HealthAndMetricsTest(ApiTestCase):
    def test_health(self):
        r = self.c.get("/health")
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(self.assertJson(r), {"status": "ok"})

    def test_head_is_get_without_a_body(self):
        # On one keep-alive connection: a body after a HEAD answer would be
        # read as the start of the next response.
        stream = f"head-{uuid.uuid4().hex[:8]}"
        self.assertEqual(self.c.post("/v1/streams", json={"stream": stream}).status_code, 201)
        conn = http.client.HTTPConnection("127.0.0.1", SHARED.port, timeout=REQ_TIMEOUT)
        try:
            # The read session last: its GET runs until the connection closes.
            for path, headers in [("/health", {}), ("/v1/basins", {}), (f"/v1/streams/{stream}/records", {}),
                                  ("/no/such/route", {}),
                                  (f"/v1/streams/{stream}/records", {"Accept": "text/event-stream"})]:
                conn.request("HEAD", path, headers=headers)
                r = conn.getresponse()
                self.assertEqual(r.read(), b"", path)
                conn.request("GET", path, headers=headers)
                g = conn.getresponse()
                self.assertEqual(r.status, g.status, path)
                if "Accept" in headers:  # a read session: its GET runs until closed
                    break
                body = g.read()
                self.assertEqual(r.getheader("Content-Length"), str(len(body)), path)
        finally:
            conn.close()

    def test_a_head_for_a_read_session_ends_the_session(self):
        # HTTP/1.1 keeps the connection: the session must see on its own that
        # nothing will be sent (it would otherwise wait at the tail, with a
        # tail watch and a timer, until the connection closes).
        stream = f"headsess-{uuid.uuid4().hex[:8]}"
        self.assertEqual(self.c.post("/v1/streams", json={"stream": stream}).status_code, 201)

        def gauge():
            m = re.search(r"(?m)^weir_read_sessions (\S+)$", self.c.get("/metrics").text)
            self.assertIsNotNone(m)
            return float(m.group(1))

        before = gauge()
        conn = http.client.HTTPConnection("127.0.0.1", SHARED.port, timeout=REQ_TIMEOUT)
        self.addCleanup(conn.close)
        for _ in range(5):
            conn.request("HEAD", f"/v1/streams/{stream}/records", headers={"Accept": "text/event-stream"})
            r = conn.getresponse()
            self.assertEqual(r.status, 200)
            self.assertEqual(r.read(), b"")
        deadline = time.monotonic() + 30
        while gauge() > before and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertLessEqual(gauge(), before)
        # The connection still serves requests.
        conn.request("GET", "/health")
        self.assertEqual(conn.getresponse().status, 200)

    @staticmethod
    def scrape(c):
        r = c.get("/metrics")
        assert r.status_code == 200, r.text
        return r

    @staticmethod
    def samples(text):
        """{series: value} of every sample line; raises on a malformed line."""
        out = {}
        line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+-?\d+)?$')
        for line in text.splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            m = line_re.match(line)
            if not m:
                raise AssertionError(f"not a Prometheus sample line: {line!r}")
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        return out

    def test_metrics_text_and_counters(self):
        first = self.scrape(self.c)
        self.assertTrue(first.headers.get("Content-Type", "").startswith("text/plain"),
                        first.headers.get("Content-Type"))
        before = self.samples(first.text)
        self.assertIn("# TYPE", first.text)
        self.assertRegex(first.text, r"(?m)^# TYPE \S+ histogram$", "no histogram (PUT/ack latency)")

        s = self.new_stream("metrics")
        appends, per_append, body = 3, 4, "m" * 100
        for _ in range(appends):
            self.c.append(s, [{"body": body}] * per_append)
        after = self.samples(self.scrape(self.c).text)

        def grew(pred, by):
            return [k for k in after if pred(k) and after[k] - before.get(k, 0) >= by]

        plain = lambda k: not re.search(r"_(bucket|sum|count)\b|latency|seconds", k)  # noqa: E731
        self.assertTrue(grew(lambda k: "append" in k and not re.search("bytes|record", k) and plain(k), appends),
                        f"no appends counter grew by {appends}: {sorted(after)}")
        self.assertTrue(grew(lambda k: "record" in k and "bytes" not in k and plain(k), appends * per_append),
                        f"no records counter grew by {appends * per_append}: {sorted(after)}")
        self.assertTrue(grew(lambda k: "bytes" in k and "pool" not in k and plain(k),
                             appends * per_append * len(body)),
                        f"no bytes counter grew by {appends * per_append * len(body)}: {sorted(after)}")

        # Each family issue #4 names, by name and type.
        text = self.scrape(self.c).text
        for name, kind in (("weir_wal_slots_total", "counter"), ("weir_wal_put_seconds", "histogram"),
                           ("weir_wal_ack_seconds", "histogram"), ("weir_append_ack_seconds", "histogram"),
                           ("weir_wal_pool_bytes", "gauge"), ("weir_wal_stalls_total", "counter"),
                           ("weir_metastore_ops_total", "counter")):
            self.assertRegex(text, rf"(?m)^# TYPE {name} {kind}$", f"{name} is not a {kind}")
        self.assertGreaterEqual(after["weir_wal_slots_total"] - before["weir_wal_slots_total"], 1)
        for name in ("weir_wal_put_seconds", "weir_wal_ack_seconds"):
            self.assertGreaterEqual(after[name + "_count"] - before[name + "_count"], 1, name)
        self.assertGreaterEqual(after["weir_append_ack_seconds_count"] - before["weir_append_ack_seconds_count"],
                                appends)
        for cause in ("budget_uploads", "budget_halted", "window", "admission_timeout"):
            self.assertIn(f'weir_wal_stalls_total{{cause="{cause}"}}', after)
        self.assertGreater(after['weir_metastore_ops_total{op="read"}'], 0)
        # Creating the stream was a metastore write.
        self.assertGreaterEqual(after['weir_metastore_ops_total{op="write"}']
                                - before['weir_metastore_ops_total{op="write"}'], 1)


# --------------------------------------------------------------------------
# Basins

class BasinTest(ApiTestCase):
    def list_basins(self, **params):
        r = self.c.get("/v1/basins", params=params)
        self.assertEqual(r.status_code, 200, r.text)
        body = self.assertJson(r)
        self.assertIsInstance(body.get("has_more"), bool, body)
        return body

    def assertBasinInfo(self, info, name):
        self.assertEqual(info["name"], name)
        self.assertRfc3339(info["created_at"])
        self.assertIsNone(info.get("deleted_at"))

    def test_default_basin_exists(self):
        names = [b["name"] for b in self.list_basins()["basins"]]
        self.assertIn(DEFAULT_BASIN, names)
        r = self.c.get(f"/v1/basins/{DEFAULT_BASIN}")
        self.assertEqual(r.status_code, 200, r.text)
        self.assertIsInstance(self.assertJson(r), dict)

    def test_create_get_list_delete(self):
        name = unique("basin")
        r = self.c.post("/v1/basins", json={"basin": name})
        self.assertEqual(r.status_code, 201, r.text)
        self.assertEqual(r.headers.get("s2-provision-result"), "created")
        self.assertBasinInfo(self.assertJson(r), name)

        self.assertError(self.c.post("/v1/basins", json={"basin": name}), 409, "resource_already_exists")

        r = self.c.get(f"/v1/basins/{name}")
        self.assertEqual(r.status_code, 200, r.text)
        self.assertIsInstance(self.assertJson(r), dict)

        listed = [b for b in self.list_basins(prefix=name)["basins"]]
        self.assertEqual([b["name"] for b in listed], [name])
        self.assertBasinInfo(listed[0], name)

        r = self.c.delete(f"/v1/basins/{name}")
        self.assertEqual(r.status_code, 202, r.text)
        r = self.wait_for_status(lambda: self.c.get(f"/v1/basins/{name}"), 404)
        self.assertError(r, 404, "basin_not_found")
        # A retried delete (its first answer lost) is accepted again, as S2
        # does while a deletion is pending.
        self.assertEqual(self.c.delete(f"/v1/basins/{name}").status_code, 202)
        self.assertNotIn(name, [b["name"] for b in self.list_basins(prefix=name)["basins"]])

    def test_missing_basin(self):
        name = unique("nobasin")
        self.assertError(self.c.get(f"/v1/basins/{name}"), 404, "basin_not_found")
        self.assertError(self.c.delete(f"/v1/basins/{name}"), 404, "basin_not_found")

    def test_put_creates_then_reports_existing(self):
        name = unique("ensure")
        r = self.c.put(f"/v1/basins/{name}", json={})
        self.assertEqual(r.status_code, 201, r.text)
        self.assertEqual(r.headers.get("s2-provision-result"), "created")
        self.assertBasinInfo(self.assertJson(r), name)
        r = self.c.put(f"/v1/basins/{name}", json={})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.headers.get("s2-provision-result"), "noop")
        self.assertBasinInfo(self.assertJson(r), name)

    def test_basin_config_round_trips_and_reconfigures(self):
        name = unique("bcfg")
        config = {"create_stream_on_append": True,
                  "default_stream_config": {"storage_class": "express", "retention_policy": {"infinite": {}}}}
        r = self.c.post("/v1/basins", json={"basin": name, "config": config})
        self.assertEqual(r.status_code, 201, r.text)
        got = self.assertJson(self.c.get(f"/v1/basins/{name}"))
        self.assertTrue(got["create_stream_on_append"])
        self.assertFalse(got["create_stream_on_read"])
        self.assertEqual(got["default_stream_config"],
                         {"storage_class": "express", "retention_policy": {"infinite": {}},
                          "timestamping": None, "delete_on_empty": None})
        # PATCH is a BasinReconfiguration: absent fields stay, nested ones merge.
        r = self.c.patch(f"/v1/basins/{name}", json={"create_stream_on_read": True,
                                                     "default_stream_config": {"timestamping": {"mode": "arrival"},
                                                                               "storage_class": None}})
        self.assertEqual(r.status_code, 200, r.text)
        got = self.assertJson(r)
        self.assertEqual(got, self.assertJson(self.c.get(f"/v1/basins/{name}")))
        self.assertTrue(got["create_stream_on_append"])
        self.assertTrue(got["create_stream_on_read"])
        self.assertEqual(got["default_stream_config"],
                         {"storage_class": None, "retention_policy": {"infinite": {}},
                          "timestamping": {"mode": "arrival", "uncapped": None}, "delete_on_empty": None})
        r = self.c.patch(f"/v1/basins/{name}", json={"default_stream_config": None})
        self.assertIsNone(self.assertJson(r)["default_stream_config"])
        # PUT (S2's ensure) of an existing basin sets its whole config: what
        # the body leaves out takes its default.
        whole = {"create_stream_on_append": True, "default_stream_config": {"storage_class": "express"}}
        r = self.c.put(f"/v1/basins/{name}", json={"config": whole})
        self.assertEqual((r.status_code, r.headers.get("s2-provision-result")), (200, "updated"), r.text)
        got = self.assertJson(self.c.get(f"/v1/basins/{name}"))
        self.assertEqual((got["create_stream_on_append"], got["create_stream_on_read"]), (True, False))
        self.assertEqual(got["default_stream_config"],
                         {"storage_class": "express", "retention_policy": None, "timestamping": None,
                          "delete_on_empty": None})
        r = self.c.put(f"/v1/basins/{name}", json={"config": whole})
        self.assertEqual((r.status_code, r.headers.get("s2-provision-result")), (200, "noop"), r.text)
        self.assertEqual(self.assertJson(self.c.get(f"/v1/basins/{name}")), got)
        for body in ({"config": {"create_stream_on_read": True}}, None):
            r = self.c.put(f"/v1/basins/{name}", json=body)
            self.assertEqual((r.status_code, r.headers.get("s2-provision-result")), (200, "updated"), r.text)
        got = self.assertJson(self.c.get(f"/v1/basins/{name}"))
        self.assertEqual(got, {"create_stream_on_append": False, "create_stream_on_read": False,
                               "default_stream_config": None, "stream_cipher": None})
        r = self.c.put(f"/v1/basins/{name}")
        self.assertEqual((r.status_code, r.headers.get("s2-provision-result")), (200, "noop"), r.text)
        r = self.c.put(f"/v1/basins/{name}", json={"config": whole})
        self.assertEqual((r.status_code, r.headers.get("s2-provision-result")), (200, "updated"), r.text)
        got = self.assertJson(self.c.get(f"/v1/basins/{name}"))
        # Bad configs change nothing.
        before = self.assertJson(self.c.get(f"/v1/basins/{name}"))
        self.assertError(self.c.patch(f"/v1/basins/{name}", json={"stream_cipher": "aegis-256"}),
                         501, "not_implemented")
        self.assertError(self.c.patch(f"/v1/basins/{name}",
                                      json={"default_stream_config": {"retention_policy": {"age": 0}}}),
                         422, "invalid")
        for flag in ["yes", 1]:
            self.assertError(self.c.patch(f"/v1/basins/{name}", json={"create_stream_on_append": flag}),
                             400, "bad_json")
        # As S2's BasinReconfiguration: null is "no change".
        r = self.c.patch(f"/v1/basins/{name}", json={"create_stream_on_append": None, "create_stream_on_read": None})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertError(self.c.patch(f"/v1/basins/{name}",
                                      json={"default_stream_config": {"storage_class": "premium"}}),
                         400, "bad_json")
        self.assertEqual(self.assertJson(self.c.get(f"/v1/basins/{name}")), before)
        other = unique("bcfg")
        self.assertError(self.c.post("/v1/basins", json={"basin": other, "config": {"create_stream_on_read": 1}}),
                         400, "bad_json")
        self.assertError(self.c.get(f"/v1/basins/{other}"), 404, "basin_not_found")
        self.assertError(self.c.patch(f"/v1/basins/{other}", json={}), 404, "basin_not_found")

    def test_request_token_retry_needs_the_same_config(self):
        name = unique("tokcfg")
        tok = {"s2-request-token": unique("t")}
        for _ in range(2):
            r = self.c.post("/v1/basins", json={"basin": name, "config": {"create_stream_on_append": True}},
                            headers=tok)
            self.assertEqual(r.status_code, 201, r.text)
        self.assertError(self.c.post("/v1/basins", json={"basin": name}, headers=tok),
                         409, "resource_already_exists")
        p = self.c.patch(f"/v1/basins/{name}", json={"create_stream_on_read": True})
        self.assertEqual(p.status_code, 200, p.text)
        r = self.c.post("/v1/basins", json={"basin": name, "config": {"create_stream_on_append": True}}, headers=tok)
        self.assertEqual((r.status_code, r.headers.get("s2-provision-result")), (201, "noop"), r.text)

    def test_streams_take_the_basin_defaults(self):
        basin = unique("bdef")
        config = {"default_stream_config": {"storage_class": "express", "retention_policy": {"age": 3600}}}
        self.assertEqual(self.c.post("/v1/basins", json={"basin": basin, "config": config}).status_code, 201)
        c = Client(SHARED, basin=basin)
        c.create_stream("s", {"timestamping": {"mode": "arrival"}})
        got = self.assertJson(c.get("/v1/streams/s"))
        self.assertEqual(got["storage_class"], "express")
        self.assertEqual(got["retention_policy"], {"age": 3600})
        self.assertEqual(got["timestamping"]["mode"], "arrival")
        # The stream's own value wins; a null in a reconfiguration goes back to the basin's default.
        r = c.patch("/v1/streams/s", json={"retention_policy": {"age": 60}, "storage_class": "standard"})
        self.assertEqual(self.assertJson(r)["retention_policy"], {"age": 60})
        r = c.patch("/v1/streams/s", json={"retention_policy": None, "storage_class": None})
        self.assertEqual(self.assertJson(r)["retention_policy"], {"age": 3600})
        self.assertEqual(self.assertJson(r)["storage_class"], "express")
        # A later change of the basin's defaults leaves existing streams alone.
        self.c.patch(f"/v1/basins/{basin}", json={"default_stream_config": {"retention_policy": {"age": 7200}}})
        self.assertEqual(self.assertJson(c.get("/v1/streams/s"))["retention_policy"], {"age": 3600})
        r = c.put("/v1/streams/t", json={})
        self.assertEqual(r.status_code, 201, r.text)
        self.assertEqual(self.assertJson(c.get("/v1/streams/t"))["retention_policy"], {"age": 7200})
        # In a config, delete_on_empty {} is an explicit "never" (min_age_secs
        # defaults to 0), overriding the basin's default; in a reconfiguration, no change.
        self.c.patch(f"/v1/basins/{basin}", json={"default_stream_config": {"delete_on_empty": {"min_age_secs": 600}}})
        c.create_stream("doe-default")
        self.assertEqual(self.assertJson(c.get("/v1/streams/doe-default"))["delete_on_empty"], {"min_age_secs": 600})
        c.create_stream("doe-never", {"delete_on_empty": {}})
        self.assertError(c.post("/v1/streams", json={"stream": "doe-null",
                                                     "config": {"delete_on_empty": {"min_age_secs": None}}}),
                         400, "bad_json")
        self.assertIsNone(self.assertJson(c.get("/v1/streams/doe-never"))["delete_on_empty"])
        r = c.patch("/v1/streams/doe-default", json={"delete_on_empty": {}})
        self.assertEqual(self.assertJson(r)["delete_on_empty"], {"min_age_secs": 600})

    def test_create_stream_on_append_and_on_read(self):
        basin = unique("bauto")
        config = {"create_stream_on_append": True, "default_stream_config": {"retention_policy": {"infinite": {}}}}
        self.assertEqual(self.c.post("/v1/basins", json={"basin": basin, "config": config}).status_code, 201)
        c = Client(SHARED, basin=basin)
        # An append that is invalid anyway creates nothing.
        self.assertError(c.post("/v1/streams/never/records", json={"records": []}), 422, "invalid")
        for bad in ({"headers": [["", "x"], ["a", "b"]]},              # an empty name outside a command
                    {"headers": [["", "nope"]]},                       # an unknown command
                    {"headers": [["", "trim"]], "body": "abc"}):       # a trim without its 8 bytes
            self.assertError(c.post("/v1/streams/never/records", json={"records": [bad]}), 422, "invalid")
        # So does one a new stream would refuse; it gets a new stream's answer.
        r = c.post("/v1/streams/never/records", json={"records": [{"body": "x"}], "match_seq_num": 5})
        self.assertEqual((r.status_code, r.json()), (412, {"seq_num_mismatch": 0}), r.text)
        r = c.post("/v1/streams/never/records", json={"records": [{"body": "x"}], "fencing_token": "abc"})
        self.assertEqual((r.status_code, r.json()), (412, {"fencing_token_mismatch": ""}), r.text)
        pid = self.assertJson(self.c.post("/v1/producers"))["id"]
        producer = producer_headers(pid, 0, 3)
        self.assertError(c.post("/v1/streams/never/records", json={"records": [{"body": "x"}]}, headers=producer),
                         409, "out_of_order_sequence")
        self.assertError(c.get("/v1/streams/never"), 404, "stream_not_found")
        # Where the basin creates nothing, a missing stream is 404 whatever the append asks.
        for extra, headers in (({"match_seq_num": 5}, {}), ({"fencing_token": "abc"}, {}),
                               ({}, producer_headers(pid, 0, 3))):
            body = dict({"records": [{"body": "x"}]}, **extra)
            self.assertError(self.c.post(f"/v1/streams/{unique('missing')}/records", json=body, headers=headers),
                             404, "stream_not_found")
        strict = unique("bstrict")
        self.assertEqual(self.c.post("/v1/basins", json={"basin": strict, "config": {
            "create_stream_on_append": True,
            "default_stream_config": {"timestamping": {"mode": "client-require"}}}}).status_code, 201)
        sc = Client(SHARED, basin=strict)
        self.assertError(sc.post("/v1/streams/never/records", json={"records": [{"body": "no time"}]}),
                         422, "invalid")
        self.assertError(sc.get("/v1/streams/never"), 404, "stream_not_found")
        self.assertEqual(sc.append("never", [{"body": "timed", "timestamp": 1000}])["end"]["seq_num"], 1)
        ack = c.append("fresh", [{"body": "a"}, {"body": "b"}])
        self.assertEqual(ack["end"]["seq_num"], 2)
        self.assertEqual([r["body"] for r in c.read("fresh")["records"]], ["a", "b"])
        self.assertEqual(self.assertJson(c.get("/v1/streams/fresh"))["retention_policy"], {"infinite": {}})
        # Reads do not create unless the basin says so.
        self.assertError(c.get("/v1/streams/r1/records/tail"), 404, "stream_not_found")
        self.assertError(c.get("/v1/streams/r1/records", params={"seq_num": 0}), 404, "stream_not_found")
        self.c.patch(f"/v1/basins/{basin}", json={"create_stream_on_read": True})
        # A HEAD is safe: it creates nothing (a missing stream is 404).
        for path in ("/v1/streams/h1/records/tail", "/v1/streams/h1/records"):
            self.assertEqual(c.request("HEAD", path).status_code, 404, path)
        self.assertEqual(c.tail("r1")["seq_num"], 0)
        self.assertEqual(c.read("r2", {"wait": 0}, expect=416), {"tail": {"seq_num": 0, "timestamp": 0}})
        names = [s["name"] for s in self.assertJson(c.get("/v1/streams"))["streams"]]
        self.assertEqual(names, ["fresh", "r1", "r2"])
        # Without the flag, a missing stream stays missing.
        self.c.patch(f"/v1/basins/{basin}", json={"create_stream_on_append": False})
        self.assertError(c.post("/v1/streams/other/records", json={"records": [{"body": "x"}]}),
                         404, "stream_not_found")
        ghost = Client(SHARED, basin=unique("ghost"))
        self.assertError(ghost.post("/v1/streams/x/records", json={"records": [{"body": "x"}]}),
                         404, "basin_not_found")

    def test_a_stream_created_on_append_or_read_takes_the_s2_stream_config_header(self):
        # As S2: the header's config, over the basin's default, for a stream
        # an append or a read creates; ignored for one that exists.
        basin = unique("bhdr")
        config = {"create_stream_on_append": True, "create_stream_on_read": True,
                  "default_stream_config": {"retention_policy": {"age": 3600}, "storage_class": "express"}}
        self.assertEqual(self.c.post("/v1/basins", json={"basin": basin, "config": config}).status_code, 201)
        c = Client(SHARED, basin=basin)
        header = {"s2-stream-config": json.dumps({"retention_policy": {"infinite": {}}})}
        r = c.post("/v1/streams/on-append/records", json={"records": [{"body": "x"}]}, headers=header)
        self.assertEqual(r.status_code, 200, r.text)
        got = self.assertJson(c.get("/v1/streams/on-append"))
        self.assertEqual((got["retention_policy"], got["storage_class"]), ({"infinite": {}}, "express"))
        r = c.get("/v1/streams/on-read/records/tail", headers=header)
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(self.assertJson(c.get("/v1/streams/on-read"))["retention_policy"], {"infinite": {}})
        r = c.get("/v1/streams/on-read-2/records", params={"seq_num": 0, "wait": 0}, headers=header)
        self.assertEqual(r.status_code, 416, r.text)
        self.assertEqual(self.assertJson(c.get("/v1/streams/on-read-2"))["retention_policy"], {"infinite": {}})
        # An existing stream keeps its config.
        other = {"s2-stream-config": json.dumps({"retention_policy": {"age": 60}})}
        self.assertEqual(c.post("/v1/streams/on-append/records", json={"records": [{"body": "y"}]},
                                headers=other).status_code, 200)
        self.assertEqual(self.assertJson(c.get("/v1/streams/on-append"))["retention_policy"], {"infinite": {}})
        # A header that is not a config is refused, and creates nothing.
        for bad in ("{", "[]", json.dumps({"retention_policy": {"age": "soon"}}),
                    json.dumps({"storage_class": "cold"})):
            r = c.post("/v1/streams/never/records", json={"records": [{"body": "x"}]},
                       headers={"s2-stream-config": bad})
            self.assertError(r, 400, "bad_header")
        self.assertError(c.get("/v1/streams/never"), 404, "stream_not_found")

    def test_compressed_request_bodies(self):
        # As S2's server: Content-Encoding gzip or zstd bodies are decoded
        # (S2's Rust SDK and CLI compress them); S2S frames are not concerned.
        import gzip

        def zstd(data):
            return subprocess.run(["zstd", "-q", "-c"], input=data, capture_output=True, check=True).stdout

        for name, enc, pack in (("gz", "gzip", gzip.compress), ("zs", "zstd", zstd)):
            basin = unique(f"benc{name}")
            body = json.dumps({"basin": basin}).encode()
            r = self.c.post("/v1/basins", data=pack(body), headers={"content-encoding": enc,
                                                                     "content-type": "application/json"})
            self.assertEqual(r.status_code, 201, r.text)
            s = unique(f"enc{name}")
            r = self.c.post("/v1/streams", data=pack(json.dumps({"stream": s}).encode()),
                            headers={"content-encoding": enc.upper(), "content-type": "application/json"})
            self.assertEqual(r.status_code, 201, r.text)
            r = self.c.post(f"/v1/streams/{q(s)}/records",
                            data=pack(json.dumps({"records": [{"body": "j"}]}).encode()),
                            headers={"content-encoding": enc, "content-type": "application/json"})
            self.assertEqual(r.status_code, 200, r.text)
            r = self.c.post(f"/v1/streams/{q(s)}/records", data=pack(pb_append_input([pb_append_record(b"p")])),
                            headers={"content-encoding": enc, "content-type": "application/protobuf"})
            self.assertEqual(r.status_code, 200, r.text)
            self.assertEqual([x["body"] for x in self.c.read(s)["records"]], ["j", "p"])
        s = self.new_stream("encbad")
        for headers, data, status, code in (
                ({"content-encoding": "br"}, b"{}", 415, "unsupported_encoding"),
                ({"content-encoding": "gzip"}, b"not gzip at all", 400, "bad_body"),
                # 9 MiB of zeros: over the 8 MiB a body may decode to.
                ({"content-encoding": "gzip"}, gzip.compress(b"0" * (9 << 20)), 413, "request_too_large")):
            r = self.c.post(f"/v1/streams/{q(s)}/records", data=data,
                            headers=dict(headers, **{"content-type": "application/json"}))
            self.assertError(r, status, code)
        self.assertEqual(self.c.tail(s)["seq_num"], 0)  # nothing was appended
        # identity is no coding at all.
        r = self.c.post(f"/v1/streams/{q(s)}/records", data=json.dumps({"records": [{"body": "i"}]}),
                        headers={"content-encoding": "identity", "content-type": "application/json"})
        self.assertEqual(r.status_code, 200, r.text)
        # A request without a body has nothing encoded: the header is not looked at.
        r = self.c.get(f"/v1/streams/{q(s)}/records", params={"seq_num": 0}, headers={"content-encoding": "br"})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual([x["body"] for x in r.json()["records"]], ["i"])

    def test_list_pagination(self):
        prefix = unique("page")
        names = [f"{prefix}-{c}" for c in "abc"]
        for n in reversed(names):
            self.assertEqual(self.c.post("/v1/basins", json={"basin": n}).status_code, 201)
        page = self.list_basins(prefix=prefix, limit=2)
        self.assertEqual([b["name"] for b in page["basins"]], names[:2])
        self.assertTrue(page["has_more"])
        page = self.list_basins(prefix=prefix, start_after=names[1])
        self.assertEqual([b["name"] for b in page["basins"]], names[2:])
        self.assertFalse(page["has_more"])
        page = self.list_basins(prefix=prefix, limit=5000)  # capped at 1000, not an error
        self.assertEqual([b["name"] for b in page["basins"]], names)

    def test_name_rules(self):
        ok = ["a" * 8, "b" * 48, "a1-b2-c3", "12345678"]
        bad = ["a" * 7, "b" * 49, "Upper-case", "-leading-hyphen", "trailing-hyphen-", "under_score",
               "dot.ted.name", ""]
        for name in ok:  # each server run starts with an empty data dir
            r = self.c.post("/v1/basins", json={"basin": name})
            self.assertEqual(r.status_code, 201, f"{name!r}: {r.text}")
        for name in bad:
            with self.subTest(name=name):
                self.assertError(self.c.post("/v1/basins", json={"basin": name}), 422, "invalid")
        # In a path, as S2's path extractor: 400 bad_path, whatever the method.
        self.assertError(self.c.put("/v1/basins/Bad_Name_Here", json={}), 400, "bad_path")
        for method in ("GET", "PATCH", "DELETE"):
            with self.subTest(method=method):
                self.assertError(self.c.request(method, "/v1/basins/short", json={}), 400, "bad_path")


# --------------------------------------------------------------------------
# Streams

DEFAULT_CONFIG = {
    "storage_class": "standard",
    "retention_policy": {"age": 7 * 24 * 3600},
    "timestamping": {"mode": "client-prefer", "uncapped": False},
}


class StreamTest(ApiTestCase):
    def assertConfigHas(self, config, expected):
        for k, v in expected.items():
            self.assertEqual(config.get(k), v, f"{k} in {config}")

    def test_create_get_delete(self):
        name = unique("stream")
        r = self.c.post("/v1/streams", json={"stream": name})
        self.assertEqual(r.status_code, 201, r.text)
        self.assertEqual(r.headers.get("s2-provision-result"), "created")
        info = self.assertJson(r)
        self.assertEqual(info["name"], name)
        self.assertRfc3339(info["created_at"])
        self.assertIsNone(info.get("deleted_at"))

        self.assertError(self.c.post("/v1/streams", json={"stream": name}), 409, "resource_already_exists")
        self.assertConfigHas(self.config(name), DEFAULT_CONFIG)

        r = self.c.delete(f"/v1/streams/{q(name)}")
        self.assertEqual(r.status_code, 202, r.text)
        r = self.wait_for_status(lambda: self.c.get(f"/v1/streams/{q(name)}"), 404)
        self.assertError(r, 404, "stream_not_found")
        # A retried delete (its first answer lost) is accepted again; other
        # calls see the stream gone.
        self.assertEqual(self.c.delete(f"/v1/streams/{q(name)}").status_code, 202)
        self.assertError(self.c.get(f"/v1/streams/{q(name)}/records/tail"), 404, "stream_not_found")
        # The name can be used again at once.
        self.assertEqual(self.c.post("/v1/streams", json={"stream": name}).status_code, 201)

    def test_missing_stream(self):
        name = unique("nostream")
        p = f"/v1/streams/{q(name)}"
        self.assertError(self.c.get(p), 404, "stream_not_found")
        self.assertError(self.c.delete(p), 404, "stream_not_found")
        self.assertError(self.c.patch(p, json={"retention_policy": {"age": 60}}), 404, "stream_not_found")
        self.assertError(self.c.post(p + "/records", json={"records": [{"body": "x"}]}), 404,
                         "stream_not_found")
        self.assertError(self.c.get(p + "/records"), 404, "stream_not_found")
        self.assertError(self.c.get(p + "/records/tail"), 404, "stream_not_found")

    def test_create_with_config(self):
        config = {"storage_class": "express", "retention_policy": {"infinite": {}},
                  "timestamping": {"mode": "arrival", "uncapped": True}}
        name = self.new_stream("configured", config)
        self.assertConfigHas(self.config(name), config)

    def test_put_creates_then_reconfigures(self):
        name = unique("put")
        r = self.c.put(f"/v1/streams/{q(name)}", json={})
        self.assertEqual(r.status_code, 201, r.text)
        self.assertEqual(r.headers.get("s2-provision-result"), "created")
        info = self.assertJson(r)  # StreamInfo
        self.assertEqual(info["name"], name)
        self.assertRfc3339(info["created_at"])
        self.assertConfigHas(self.config(name), DEFAULT_CONFIG)
        r = self.c.put(f"/v1/streams/{q(name)}", json={"retention_policy": {"age": 7200}})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.headers.get("s2-provision-result"), "updated")
        self.assertEqual(self.assertJson(r)["name"], name)
        self.assertEqual(self.config(name)["retention_policy"], {"age": 7200})
        r = self.c.put(f"/v1/streams/{q(name)}", json={"retention_policy": {"age": 7200}})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.headers.get("s2-provision-result"), "noop")
        # An existing stream's PUT (S2's ensure) sets its whole config: the
        # fields it leaves out take the basin's defaults, then weir's.
        whole = {"timestamping": {"mode": "arrival"}, "delete_on_empty": {"min_age_secs": 60},
                 "storage_class": "express"}
        r = self.c.put(f"/v1/streams/{q(name)}", json=whole)
        self.assertEqual(r.headers.get("s2-provision-result"), "updated", r.text)
        cfg = self.config(name)
        self.assertEqual((cfg["retention_policy"], cfg["timestamping"]["mode"], cfg["delete_on_empty"],
                          cfg["storage_class"]), (DEFAULT_CONFIG["retention_policy"], "arrival",
                                                  {"min_age_secs": 60}, "express"), cfg)
        r = self.c.put(f"/v1/streams/{q(name)}", json=whole)
        self.assertEqual((r.status_code, r.headers.get("s2-provision-result")), (200, "noop"), r.text)
        self.assertEqual(self.config(name), cfg)
        r = self.c.put(f"/v1/streams/{q(name)}", json=dict(whole, delete_on_empty={}))
        self.assertEqual((r.status_code, r.headers.get("s2-provision-result")), (200, "updated"), r.text)
        self.assertIsNone(self.config(name)["delete_on_empty"])
        for body, outcome in (({}, "updated"), (None, "noop")):
            r = self.c.put(f"/v1/streams/{q(name)}", json=body)
            self.assertEqual((r.status_code, r.headers.get("s2-provision-result")), (200, outcome), r.text)
            self.assertConfigHas(self.config(name), DEFAULT_CONFIG)
        r = self.c.put(f"/v1/streams/{q(name)}", json=whole)
        self.assertEqual(r.headers.get("s2-provision-result"), "updated", r.text)
        cfg = self.config(name)
        # Bad values change nothing.
        self.assertError(self.c.put(f"/v1/streams/{q(name)}", json={"retention_policy": {"age": 0}}), 422, "invalid")
        self.assertError(self.c.put(f"/v1/streams/{q(name)}", json=[]), 400, "bad_json")
        self.assertEqual(self.config(name), cfg)

    def test_patch(self):
        name = self.new_stream("patch")
        # A reconfiguration is a JSON object (S2 requires the body).
        for body in ["", "null", "[]"]:
            with self.subTest(body=body):
                self.assertError(self.c.patch(f"/v1/streams/{q(name)}", data=body,
                                              headers={"content-type": "application/json"}), 400, "bad_json")
        r = self.c.patch(f"/v1/streams/{q(name)}", json={"retention_policy": {"age": 3600}})
        self.assertEqual(r.status_code, 200, r.text)
        out = self.assertJson(r)
        self.assertEqual(out["retention_policy"], {"age": 3600})
        self.assertEqual(out["storage_class"], "standard")  # untouched fields stay
        self.assertEqual(self.config(name)["retention_policy"], {"age": 3600})
        r = self.c.patch(f"/v1/streams/{q(name)}", json={"timestamping": {"mode": "client-require"}})
        self.assertEqual(r.status_code, 200, r.text)
        cfg = self.config(name)
        self.assertEqual(cfg["timestamping"]["mode"], "client-require")
        self.assertEqual(cfg["retention_policy"], {"age": 3600})
        # An explicit null puts a field back to its default, as on S2.
        r = self.c.patch(f"/v1/streams/{q(name)}", json={"retention_policy": None, "timestamping": {"mode": None}})
        self.assertEqual(r.status_code, 200, r.text)
        cfg = self.config(name)
        self.assertEqual(cfg["retention_policy"], {"age": 7 * 24 * 3600})
        self.assertEqual(cfg["timestamping"]["mode"], "client-prefer")

    def test_list_pagination(self):
        prefix = unique("list")
        names = [f"{prefix}/{c}" for c in "abc"]
        for n in reversed(names):
            self.c.create_stream(n)
        r = self.c.get("/v1/streams", params={"prefix": prefix, "limit": 2})
        self.assertEqual(r.status_code, 200, r.text)
        page = self.assertJson(r)
        self.assertEqual([s["name"] for s in page["streams"]], names[:2])
        self.assertIs(page["has_more"], True)
        for s in page["streams"]:
            self.assertRfc3339(s["created_at"])
            self.assertIsNone(s.get("deleted_at"))
        page = self.c.get("/v1/streams", params={"prefix": prefix, "start_after": names[1]}).json()
        self.assertEqual([s["name"] for s in page["streams"]], names[2:])
        self.assertIs(page["has_more"], False)
        # start_after before the prefix could only start a page outside it.
        self.assertError(self.c.get("/v1/streams", params={"prefix": "z", "start_after": "a"}), 422, "invalid")
        self.assertError(self.c.get("/v1/basins", params={"prefix": "z", "start_after": "a"}), 422, "invalid")

    def test_name_needing_url_encoding(self):
        name = unique("odd name/with?chars#and%é")
        self.c.create_stream(name)
        ack = self.c.append(name, [{"body": "x"}])
        self.assertEqual(ack["end"]["seq_num"], 1)
        self.assertEqual([r["body"] for r in self.c.read(name)["records"]], ["x"])
        listed = self.c.get("/v1/streams", params={"prefix": name}).json()["streams"]
        self.assertEqual([s["name"] for s in listed], [name])

    def test_request_token_makes_a_create_retry_safe(self):
        # S2's s2-request-token: a retried create (same token) succeeds again;
        # another token, or none, is a conflict.
        name = unique("tok")
        tok = {"s2-request-token": "retry-" + uuid.uuid4().hex[:8]}
        first = self.c.post("/v1/streams", json={"stream": name}, headers=tok)
        self.assertEqual(first.status_code, 201, first.text)
        again = self.c.post("/v1/streams", json={"stream": name}, headers=tok)
        self.assertEqual(again.status_code, 201, again.text)
        self.assertEqual(again.headers.get("s2-provision-result"), "noop")
        self.assertEqual(again.json()["created_at"], first.json()["created_at"])
        # The same token with another config is another request.
        self.assertError(self.c.post("/v1/streams", json={"stream": name, "config": {"storage_class": "express"}},
                                     headers=tok), 409, "resource_already_exists")
        self.assertError(self.c.post("/v1/streams", json={"stream": name}, headers={"s2-request-token": "other"}),
                         409, "resource_already_exists")
        self.assertError(self.c.post("/v1/streams", json={"stream": name}), 409, "resource_already_exists")
        # The key is the config as requested, so a retry still matches after a reconfiguration.
        self.assertEqual(self.c.patch(f"/v1/streams/{q(name)}", json={"storage_class": "express"}).status_code, 200)
        again = self.c.post("/v1/streams", json={"stream": name, "config": {}}, headers=tok)
        self.assertEqual((again.status_code, again.headers.get("s2-provision-result")), (201, "noop"), again.text)
        self.assertError(self.c.post("/v1/streams", json={"stream": unique("long")},
                                     headers={"s2-request-token": "x" * 37}), 400, "bad_header")
        basin = unique("tokbasin")
        for _ in range(2):
            r = self.c.post("/v1/basins", json={"basin": basin}, headers=tok)
            self.assertEqual(r.status_code, 201, r.text)
        self.assertError(self.c.post("/v1/basins", json={"basin": basin}), 409, "resource_already_exists")

    def test_deeply_nested_json_is_refused(self):
        # Ten thousand brackets, under the 64 KiB a config body may hold (a
        # million would be refused for its size first): 400, and the server
        # stays up.
        deep = "[" * 10_000 + "]" * 10_000
        name = unique("deep")
        for method, path, body in (("POST", "/v1/streams", '{"stream":"%s","config":%s}' % (name, deep)),
                                   ("POST", "/v1/basins", '{"basin":"%s","config":%s}' % (name, deep)),
                                   ("PUT", f"/v1/basins/{name}", '{"config":%s}' % deep)):
            r = self.c.request(method, path, data=body, headers={"Content-Type": "application/json"})
            self.assertError(r, 400, "bad_json")
        self.assertEqual(self.c.get("/health").status_code, 200)
        self.assertError(self.c.get(f"/v1/streams/{name}"), 404, "stream_not_found")
        self.assertError(self.c.get(f"/v1/basins/{name}"), 404, "basin_not_found")
        # 64 levels are fine (an unknown config field is ignored); 65 are not.
        def nested(levels):  # the body, config and field take 3 levels
            return '{"stream":"%s","config":{"zz":%s}}' % (name, "[" * (levels - 2) + "]" * (levels - 2))
        r = self.c.post("/v1/streams", data=nested(65), headers={"Content-Type": "application/json"})
        self.assertError(r, 400, "bad_json")
        r = self.c.post("/v1/streams", data=nested(64), headers={"Content-Type": "application/json"})
        self.assertEqual(r.status_code, 201, r.text)

    def test_invalid_names_and_config(self):
        for bad in ["", "x" * 513, "nul\u0000byte", ".", ".."]:
            with self.subTest(name=bad[:20]):
                self.assertError(self.c.post("/v1/streams", json={"stream": bad}), 422, "invalid")
        # A name in the path that is not UTF-8 could never be shown back as itself.
        self.assertError(self.c.put("/v1/streams/%FF"), 422, "invalid")
        self.assertError(self.c.get("/v1/streams/%FF"), 404, "stream_not_found")
        self.c.create_stream(unique("y" * 490))  # 501 bytes: allowed
        self.assertError(self.c.post("/v1/streams", json={"stream": unique("cfg"),
                                                          "config": {"retention_policy": {"age": 0}}}),
                         422, "invalid")
        # Values the JSON schema does not allow are 400, as on S2.
        for config in [{"retention_policy": {"age": -1}}, {"retention_policy": {"age": 1.5}},
                       {"retention_policy": {"age": "60"}}, {"storage_class": "premium"},
                       {"timestamping": {"mode": "sometimes"}}]:
            with self.subTest(config=config):
                name = unique("cfg")
                self.assertError(self.c.post("/v1/streams", json={"stream": name, "config": config}),
                                 400, "bad_json")
                self.assertError(self.c.get(f"/v1/streams/{q(name)}"), 404, "stream_not_found")


class BasinRoutingTest(ApiTestCase):
    def test_s2_basin_header_selects_basin(self):
        basin = unique("route")
        self.assertEqual(self.c.post("/v1/basins", json={"basin": basin}).status_code, 201)
        in_basin = Client(SHARED, basin=basin)
        default = Client(SHARED)
        explicit_default = Client(SHARED, basin=DEFAULT_BASIN)
        name = unique("same-name")
        in_basin.create_stream(name)
        default.create_stream(name)
        in_basin.append(name, [{"body": "in-basin"}])
        default.append(name, [{"body": "in-default"}, {"body": "two"}])

        self.assertEqual([r["body"] for r in in_basin.read(name)["records"]], ["in-basin"])
        self.assertEqual([r["body"] for r in default.read(name)["records"]], ["in-default", "two"])
        self.assertEqual([r["body"] for r in explicit_default.read(name)["records"]], ["in-default", "two"])
        self.assertEqual(in_basin.tail(name)["seq_num"], 1)
        listed = in_basin.get("/v1/streams", params={"prefix": name}).json()["streams"]
        self.assertEqual(len(listed), 1)

        only_here = unique("only-in-basin")
        in_basin.create_stream(only_here)
        self.assertError(default.get(f"/v1/streams/{q(only_here)}"), 404, "stream_not_found")

    def test_invalid_basin_header(self):
        bad = Client(SHARED, basin="Not_A_Basin")
        self.assertError(bad.get("/v1/streams"), 400, "bad_header")

    def test_missing_basin_header(self):
        ghost = Client(SHARED, basin=unique("ghost"))
        self.assertError(ghost.get("/v1/streams"), 404, "basin_not_found")
        self.assertError(ghost.post("/v1/streams", json={"stream": "x"}), 404, "basin_not_found")
        for method, path in (("GET", "/v1/streams/x"), ("DELETE", "/v1/streams/x"),
                             ("GET", "/v1/streams/x/records"), ("GET", "/v1/streams/x/records/tail")):
            self.assertError(ghost.request(method, path), 404, "basin_not_found")
        self.assertError(ghost.post("/v1/streams/x/records", json={"records": [{"body": "x"}]}), 404,
                         "basin_not_found")


# --------------------------------------------------------------------------
# Appends and reads (JSON)

class AppendReadJsonTest(ApiTestCase):
    def test_append_ack_and_read_raw(self):
        s = self.new_stream("raw")
        ack = self.c.append(s, [{"body": "hello", "headers": [["k", "v"], ["k2", ""]]}, {"body": "wörld"}])
        for k in ("start", "end", "tail"):
            self.assertPosition(ack[k])
        self.assertEqual((ack["start"]["seq_num"], ack["end"]["seq_num"], ack["tail"]["seq_num"]), (0, 2, 2))
        self.assertIs(ack["duplicated"], False)
        self.assertLessEqual(ack["start"]["timestamp"], ack["end"]["timestamp"])

        ack2 = self.c.append(s, [{"body": ""}])
        self.assertEqual((ack2["start"]["seq_num"], ack2["end"]["seq_num"]), (2, 3))

        r = self.c.get(f"/v1/streams/{q(s)}/records", params={"seq_num": 0})
        self.assertEqual(r.status_code, 200, r.text)
        recs = self.assertJson(r)["records"]
        self.assertEqual([x["seq_num"] for x in recs], [0, 1, 2])
        self.assertEqual([x.get("body", "") for x in recs], ["hello", "wörld", ""])
        self.assertEqual(recs[0]["headers"], [["k", "v"], ["k2", ""]])
        self.assertEqual(recs[1].get("headers") or [], [])
        ts = [x["timestamp"] for x in recs]
        self.assertEqual(ts, sorted(ts))

        tail = self.c.tail(s)
        self.assertPosition(tail)
        self.assertEqual(tail["seq_num"], 3)
        self.assertEqual(tail["timestamp"], recs[-1]["timestamp"])

    def test_base64(self):
        s = self.new_stream("b64")
        body = bytes(range(256))
        hname, hval = b"\x00bin\xff", b"\xfe\x01"
        ack = self.c.append(s, [{"body": b64(body), "headers": [[b64(hname), b64(hval)]]}], fmt="base64")
        self.assertEqual(ack["end"]["seq_num"], 1)
        self.c.append(s, [{"body": "plain text"}], fmt="raw")
        recs = self.c.read(s, fmt="base64")["records"]
        self.assertEqual(base64.b64decode(recs[0]["body"]), body)
        self.assertEqual([[base64.b64decode(n), base64.b64decode(v)] for n, v in recs[0]["headers"]],
                         [[hname, hval]])
        self.assertEqual(base64.b64decode(recs[1]["body"]), b"plain text")
        raw = self.c.read(s, {"seq_num": 1})["records"]  # text record back as raw
        self.assertEqual(raw[0]["body"], "plain text")
        # S2's older names for the two formats.
        self.c.append(s, [{"body": b64(b"\x01")}], fmt="json-binsafe")
        self.c.append(s, [{"body": "as json"}], fmt="json")
        recs = self.c.read(s, {"seq_num": 2}, fmt="base64")["records"]
        self.assertEqual([base64.b64decode(r["body"]) for r in recs], [b"\x01", b"as json"])
        self.assertError(self.c.post(f"/v1/streams/{q(s)}/records", json={"records": [{"body": "x"}]},
                                     headers={"s2-format": "hex"}), 400, "bad_header")

    def test_the_first_accepted_type_decides(self):
        # As S2: a unary read that also accepts an event stream is still unary.
        s = self.new_stream("accept")
        self.c.append(s, [{"body": "one"}])
        r = self.c.get(f"/v1/streams/{q(s)}/records", params={"seq_num": 0},
                       headers={"Accept": "application/json, text/event-stream"}, stream=True)
        self.addCleanup(r.close)  # an event stream (the old mistake) would never end
        self.assertEqual(r.status_code, 200)
        self.assertTrue(r.headers["Content-Type"].startswith("application/json"), r.headers)
        self.assertEqual([x["body"] for x in r.json()["records"]], ["one"])
        # Media types are case-insensitive, and a tab may precede parameters.
        r = self.c.get(f"/v1/streams/{q(s)}/records", params={"seq_num": 0},
                       headers={"Accept": "Text/Event-Stream\t;q=1, application/json"}, stream=True)
        self.addCleanup(r.close)
        self.assertEqual(r.status_code, 200)
        self.assertTrue(r.headers["Content-Type"].startswith("text/event-stream"), r.headers)
        r.close()

    def test_empty_stream_tail(self):
        s = self.new_stream("empty")
        self.assertEqual(self.c.tail(s)["seq_num"], 0)
        # As S2: a read at the tail that may not wait is 416 with the tail ...
        self.assertEqual(self.c.read(s, expect=416), {"tail": {"seq_num": 0, "timestamp": 0}})
        # ... and with `wait`, a long poll that ends empty.
        self.assertEqual(self.c.read(s, {"wait": 1})["records"], [])

    def test_default_start_is_the_tail(self):
        s = self.new_stream("deftail")
        self.c.append(s, [{"body": "old"}])
        r = self.c.get(f"/v1/streams/{q(s)}/records")
        self.assertEqual(r.status_code, 416, r.text)
        self.assertEqual(r.json()["tail"]["seq_num"], 1)
        # A long poll from the tail returns records appended after it began,
        # never the old one. (Appends repeat until it answers: the poll may
        # reach the server after the first of them.)
        # The client gives up (45 s) before the server's wait ends (60 s): only
        # a wake-up by the append can answer in time.
        out = {}
        reader = threading.Thread(target=lambda: out.update(
            r=self.c.get(f"/v1/streams/{q(s)}/records", params={"wait": 60}, timeout=45)))
        reader.start()
        for i in range(100):
            time.sleep(0.2)
            if not reader.is_alive():
                break
            self.c.append(s, [{"body": f"new-{i}"}])
        reader.join()
        self.assertIn("r", out, "the long poll was not woken by the appends")
        self.assertEqual(out["r"].status_code, 200, out["r"].text)
        bodies = [x["body"] for x in out["r"].json()["records"]]
        self.assertTrue(bodies and all(b.startswith("new-") for b in bodies), bodies)

    def test_client_timestamps(self):
        s = self.new_stream("ts")
        t = now_ms() - 3_600_000
        ack = self.c.append(s, [{"body": "a", "timestamp": t}])
        self.assertEqual(ack["start"]["timestamp"], t)
        self.c.append(s, [{"body": "b", "timestamp": t - 5000}])  # older: raised to the previous
        self.c.append(s, [{"body": "c"}])                         # none: arrival time
        recs = self.c.read(s)["records"]
        self.assertEqual(recs[0]["timestamp"], t)
        self.assertEqual(recs[1]["timestamp"], t)
        self.assertGreater(recs[2]["timestamp"], t + 1_800_000)

    def test_timestamps_past_int64(self):
        # S2's timestamps are u64: a larger one than weir keeps (2^63-1) is
        # taken as 2^63-1, which a capped stream (the default) caps at arrival.
        s = self.new_stream("bigts")
        start = now_ms()
        self.c.append(s, [{"body": "x", "timestamp": 2**64 - 1}])
        ts = self.c.read(s)["records"][0]["timestamp"]
        self.assertGreaterEqual(ts, start - 600_000)
        self.assertLess(ts, start + 3_600_000)
        u = self.new_stream("bigts-uncapped", {"timestamping": {"uncapped": True}})
        self.c.append(u, [{"body": "x", "timestamp": 2**63}])
        self.assertEqual(self.c.read(u)["records"][0]["timestamp"], 2**63 - 1)

    def test_arrival_timestamping_ignores_client_value(self):
        s = self.new_stream("arrival", {"timestamping": {"mode": "arrival"}})
        start = now_ms()
        self.c.append(s, [{"body": "x", "timestamp": 1000}])
        ts = self.c.read(s)["records"][0]["timestamp"]
        self.assertGreater(ts, start - 600_000)

    def test_read_start_and_limits(self):
        s = self.new_stream("limits")
        base = now_ms() - 3_600_000
        self.c.append(s, [{"body": f"r{i}", "timestamp": base + i * 1000} for i in range(10)])

        def seqs(params):
            return [x["seq_num"] for x in self.c.read(s, params)["records"]]

        self.assertEqual(seqs({}), list(range(10)))
        self.assertEqual(seqs({"seq_num": 3, "count": 4}), [3, 4, 5, 6])
        self.assertEqual(seqs({"timestamp": base + 5000}), [5, 6, 7, 8, 9])
        self.assertEqual(seqs({"timestamp": base + 4500, "count": 2}), [5, 6])
        self.assertEqual(seqs({"tail_offset": 3}), [7, 8, 9])
        self.assertEqual(seqs({"seq_num": 0, "until": base + 3000}), [0, 1, 2])
        one = metered("r0")
        self.assertEqual(seqs({"seq_num": 0, "bytes": 3 * one + one // 2}), [0, 1, 2])
        # At the tail with no wait, even clamped from past it: 416, as in S2.
        for params in ({"seq_num": 10}, {"seq_num": 99, "clamp": "true"}, {"timestamp": base + 9001, "clamp": "true"}):
            self.assertEqual(self.c.read(s, params, expect=416)["tail"]["seq_num"], 10, params)
        self.assertEqual(seqs({"seq_num": 10, "wait": 1}), [])        # a long poll ends empty
        self.assertEqual(seqs({"seq_num": 99, "clamp": "true", "wait": 1}), [])
        self.assertEqual(self.c.read(s, {"timestamp": base + 9001}, expect=416)["tail"]["seq_num"], 10)
        self.assertError(self.c.get(f"/v1/streams/{q(s)}/records", params={"timestamp": base + 5, "until": base + 5}),
                         422, "invalid")

        r = self.c.get(f"/v1/streams/{q(s)}/records", params={"seq_num": 11})
        self.assertEqual(r.status_code, 416, r.text)
        body = self.assertJson(r)
        self.assertEqual(body, {"tail": self.c.tail(s)})  # S2's TailResponse, nothing else
        self.assertPosition(body["tail"])
        self.assertEqual(body["tail"]["seq_num"], 10)

    def test_bytes_limit_is_never_exceeded(self):
        # As S2: records past the bytes limit are not returned, even the first.
        s = self.new_stream("bytes")
        self.c.append(s, [{"body": "x" * 100}, {"body": "y" * 100}])
        one = metered("x" * 100)
        tiny = self.c.read(s, {"seq_num": 0, "bytes": 10})
        self.assertEqual(tiny["records"], [])
        self.assertNotIn("tail", tiny)  # not caught up: a record is there, over the limit
        self.assertEqual([r["seq_num"] for r in self.c.read(s, {"seq_num": 0, "bytes": one})["records"]], [0])
        self.assertEqual([r["seq_num"] for r in self.c.read(s, {"seq_num": 0, "bytes": 2 * one - 1})["records"]], [0])

    def test_default_count_and_bytes_caps(self):
        s = self.new_stream("caps")
        for _ in range(2):
            self.c.append(s, [{"body": "c"}] * 600)
        recs = self.c.read(s, {"seq_num": 0})["records"]
        self.assertEqual([x["seq_num"] for x in recs], list(range(1000)))

        big = self.new_stream("bigcaps")
        body = "x" * 400_000  # 3 records exceed the 1 MiB metered default, 2 do not
        for _ in range(3):
            self.c.append(big, [{"body": body}])
        self.assertEqual([x["seq_num"] for x in self.c.read(big, {"seq_num": 0})["records"]], [0, 1])

    def test_append_limits(self):
        s = self.new_stream("alimits")
        self.c.append(s, [{"body": "x"}] * 1000)
        self.assertError(self.c.post(f"/v1/streams/{q(s)}/records", json={"records": []}), 422, "invalid")
        self.assertError(self.c.post(f"/v1/streams/{q(s)}/records", json={"records": [{"body": "x"}] * 1001}),
                         422, "invalid")
        exact = "y" * (1024 * 1024 - 8)  # metered size exactly 1 MiB
        self.c.append(s, [{"body": exact}])
        self.assertError(self.c.post(f"/v1/streams/{q(s)}/records", json={"records": [{"body": exact + "y"}]}),
                         422, "invalid")
        self.assertEqual(self.c.tail(s)["seq_num"], 1001)

    def test_long_poll(self):
        s = self.new_stream("poll")
        self.c.append(s, [{"body": "first"}])
        result = {}

        # The client gives up (45 s) before the server's wait ends (60 s): only
        # a wake-up by the append can answer in time.
        def reader():
            c = Client(SHARED)
            result["r"] = c.get(f"/v1/streams/{q(s)}/records", params={"seq_num": 1, "wait": 60}, timeout=45)

        t = threading.Thread(target=reader)
        t.start()
        time.sleep(1.0)
        self.c.append(s, [{"body": "late"}])
        t.join(REQ_TIMEOUT + 40)
        self.assertFalse(t.is_alive())
        self.assertIn("r", result, "the long poll was not woken by the append")
        r = result["r"]
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual([(x["seq_num"], x["body"]) for x in r.json()["records"]], [(1, "late")])

    def test_wait_times_out_empty(self):
        s = self.new_stream("pollempty")
        t0 = time.monotonic()
        recs = self.c.read(s, {"seq_num": 0, "wait": 1}, timeout=REQ_TIMEOUT + 1)["records"]
        self.assertEqual(recs, [])
        self.assertGreaterEqual(time.monotonic() - t0, 0.9)  # it did wait


# --------------------------------------------------------------------------
# Protobuf

class ProtobufTest(ApiTestCase):
    PB = "application/protobuf"

    def post_pb(self, s, payload, accept=PB):
        return self.c.post(f"/v1/streams/{q(s)}/records", data=payload,
                           headers={"Content-Type": self.PB, "Accept": accept})

    def test_append_and_read(self):
        s = self.new_stream("pb")
        t = now_ms() - 60_000
        recs = [pb_append_record(b"\x00\xffbinary", [(b"h\x00", b"\x01v")], timestamp=t),
                pb_append_record(b"second"),
                pb_append_record(b"")]
        r = self.post_pb(s, pb_append_input(recs))
        self.assertEqual(r.status_code, 200, r.text)
        self.assertTrue(r.headers.get("Content-Type", "").startswith(self.PB), r.headers)
        ack = pb_append_ack(r.content)
        self.assertEqual((ack["start"]["seq_num"], ack["end"]["seq_num"], ack["tail"]["seq_num"]), (0, 3, 3))
        self.assertEqual(ack["start"]["timestamp"], t)

        r = self.c.get(f"/v1/streams/{q(s)}/records", params={"seq_num": 0}, headers={"Accept": self.PB})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertTrue(r.headers.get("Content-Type", "").startswith(self.PB), r.headers)
        batch = pb_read_batch(r.content)
        self.assertEqual([x["seq_num"] for x in batch["records"]], [0, 1, 2])
        self.assertEqual([x["body"] for x in batch["records"]], [b"\x00\xffbinary", b"second", b""])
        self.assertEqual(batch["records"][0]["headers"], [(b"h\x00", b"\x01v")])
        self.assertEqual(batch["records"][0]["timestamp"], t)

        # JSON (base64) sees the same bytes.
        j = self.c.read(s, {"seq_num": 0, "count": 1}, fmt="base64")["records"][0]
        self.assertEqual(base64.b64decode(j["body"]), b"\x00\xffbinary")

    def test_conditions_fail_with_json_412(self):
        s = self.new_stream("pbcond")
        self.assertEqual(self.post_pb(s, pb_append_input([pb_append_record(b"a")])).status_code, 200)
        r = self.post_pb(s, pb_append_input([pb_append_record(b"b")], match_seq_num=7))
        self.assertEqual(r.status_code, 412, r.content)
        self.assertEqual(self.assertJson(r), {"seq_num_mismatch": 1})
        r = self.post_pb(s, pb_append_input([pb_append_record(b"b")], match_seq_num=1, fencing_token="nope"))
        self.assertEqual(r.status_code, 412, r.content)
        self.assertEqual(self.assertJson(r), {"fencing_token_mismatch": ""})
        r = self.post_pb(s, pb_append_input([pb_append_record(b"b")], match_seq_num=1))
        self.assertEqual(r.status_code, 200, r.content)
        self.assertEqual(pb_append_ack(r.content)["start"]["seq_num"], 1)

    def test_media_types(self):
        s = self.new_stream("pbtypes")
        # The older spelling of the protobuf type is accepted too.
        r = self.c.post(f"/v1/streams/{q(s)}/records", data=pb_append_input([pb_append_record(b"x")]),
                        headers={"Content-Type": "application/x-protobuf", "Accept": self.PB})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(pb_append_ack(r.content)["end"]["seq_num"], 1)
        # The first type the client accepts decides.
        r = self.c.get(f"/v1/streams/{q(s)}/records", params={"seq_num": 0},
                       headers={"Accept": "application/json, application/protobuf"})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(self.assertJson(r)["records"][0]["body"], "x")
        r = self.c.get(f"/v1/streams/{q(s)}/records", params={"seq_num": 0},
                       headers={"Accept": "application/protobuf;q=1, application/json"})
        self.assertEqual(pb_read_batch(r.content)["records"][0]["body"], b"x")

    def test_malformed(self):
        s = self.new_stream("pbbad")
        r = self.post_pb(s, b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", accept="application/json")
        self.assertError(r, 400, "bad_proto")
        r = self.post_pb(s, _f_bytes(1, b"\x1a\x05ab"), accept="application/json")  # body length past the end
        self.assertError(r, 400, "bad_proto")


# --------------------------------------------------------------------------
# Conditions and command records

def fence(token):
    return {"headers": [["", "fence"]], "body": token}


def trim_b64(seq):
    return {"headers": [[b64(b""), b64(b"trim")]], "body": b64(seq.to_bytes(8, "big"))}


class ConditionsAndCommandsTest(ApiTestCase):
    def test_match_seq_num(self):
        s = self.new_stream("match")
        self.c.append(s, [{"body": "a"}, {"body": "b"}], match_seq_num=0)
        body = self.c.append(s, [{"body": "c"}], expect=412, match_seq_num=0)
        self.assertEqual(body, {"seq_num_mismatch": 2})
        ack = self.c.append(s, [{"body": "c"}], match_seq_num=2)
        self.assertEqual(ack["start"]["seq_num"], 2)
        self.assertEqual(self.c.tail(s)["seq_num"], 3)

    def test_fence(self):
        s = self.new_stream("fence")
        self.c.append(s, [{"body": "before"}], fencing_token="")  # initial token is empty
        self.c.append(s, [fence("tok-1")])
        body = self.c.append(s, [{"body": "x"}], expect=412, fencing_token="wrong")
        self.assertEqual(body, {"fencing_token_mismatch": "tok-1"})
        self.c.append(s, [{"body": "fenced-ok"}], fencing_token="tok-1")
        self.c.append(s, [{"body": "no-token"}])  # no fencing_token: not checked
        # Re-fencing needs the current token when one is given.
        self.c.append(s, [fence("tok-2")], fencing_token="tok-1")
        self.assertEqual(self.c.append(s, [{"body": "x"}], expect=412, fencing_token="tok-1"),
                         {"fencing_token_mismatch": "tok-2"})
        recs = self.c.read(s)["records"]
        self.assertEqual([x.get("body", "") for x in recs], ["before", "tok-1", "fenced-ok", "no-token", "tok-2"])
        self.assertEqual(recs[1]["headers"], [["", "fence"]])  # command records are records

    def test_trim(self):
        s = self.new_stream("trim")
        self.c.append(s, [{"body": f"r{i}"} for i in range(5)])
        ack = self.c.append(s, [trim_b64(3)], fmt="base64")
        self.assertEqual(ack["start"]["seq_num"], 5)
        recs = self.c.read(s, {"seq_num": 0})["records"]
        self.assertEqual([x["seq_num"] for x in recs], [3, 4, 5])
        self.assertEqual(self.c.tail(s)["seq_num"], 6)
        # A trim command trims through itself, never past it (as on S2).
        ack = self.c.append(s, [trim_b64(1000), {"body": b64(b"after")}], fmt="base64")
        self.assertEqual(ack["start"]["seq_num"], 6)
        recs = self.c.read(s, {"seq_num": 0})["records"]
        self.assertEqual([x["seq_num"] for x in recs], [7])
        self.assertEqual(recs[0]["body"], "after")

    def test_a_read_below_the_tail_of_a_stream_trimmed_through_it_is_empty_not_416(self):
        s = self.new_stream("trimall")
        self.c.append(s, [{"body": "a"}, {"body": "b"}])
        self.c.append(s, [trim_b64(1000)], fmt="base64")  # trims through itself: nothing left
        self.assertEqual(self.c.tail(s)["seq_num"], 3)
        # As S2: a start below the tail that finds nothing is 200 with no
        # records; only a start at the tail is 416.
        for params in ({"seq_num": 0}, {"tail_offset": 2}, {"timestamp": 0}, {"seq_num": 1, "count": 5}):
            with self.subTest(params=params):
                self.assertEqual(self.c.read(s, params)["records"], [])
        for params in ({"seq_num": 3}, {"tail_offset": 0}, {"seq_num": 7, "clamp": "true"}):
            with self.subTest(params=params):
                self.assertEqual(self.c.read(s, params, expect=416)["tail"]["seq_num"], 3)

    def test_delete_on_empty(self):
        s = self.new_stream("doe", {"delete_on_empty": {"min_age_secs": 1}})
        self.assertEqual(self.config(s)["delete_on_empty"], {"min_age_secs": 1})
        self.c.append(s, [{"body": "a"}, {"body": "b"}])
        kept = self.new_stream("doe-kept", {"delete_on_empty": {"min_age_secs": 1}})
        self.c.append(kept, [{"body": "stays"}])
        time.sleep(1.5)  # both are old enough; neither is empty
        self.assertEqual(self.c.get(f"/v1/streams/{q(s)}").status_code, 200)
        # Trimming through the trim command leaves s empty: it goes within a
        # retention interval once a second has passed.
        self.c.append(s, [trim_b64(1000)], fmt="base64")
        r = self.wait_for_status(lambda: self.c.get(f"/v1/streams/{q(s)}"), 404)
        self.assertError(r, 404, "stream_not_found")
        self.assertNotIn(s, [x["name"] for x in self.c.get("/v1/streams", params={"prefix": s}).json()["streams"]])
        self.assertError(self.c.post(f"/v1/streams/{q(s)}/records", json={"records": [{"body": "x"}]}),
                         404, "stream_not_found")
        self.assertEqual([x["body"] for x in self.c.read(kept, {"seq_num": 0})["records"]], ["stays"])
        metrics = self.c.get("/metrics").text
        self.assertRegex(metrics, r"(?m)^weir_empty_streams_deleted_total [1-9]")

    def test_delete_on_empty_config(self):
        name = self.new_stream("doecfg")
        self.assertIsNone(self.config(name)["delete_on_empty"])
        p = f"/v1/streams/{q(name)}"
        r = self.c.patch(p, json={"delete_on_empty": {"min_age_secs": 3600}})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(self.config(name)["delete_on_empty"], {"min_age_secs": 3600})
        self.assertEqual(self.c.patch(p, json={"delete_on_empty": {}}).status_code, 200)  # nothing changes
        self.assertEqual(self.config(name)["delete_on_empty"], {"min_age_secs": 3600})
        # Not an unsigned integer: the schema refuses it (400), as a negative retention age.
        self.assertError(self.c.patch(p, json={"delete_on_empty": {"min_age_secs": -1}}), 400, "bad_json")
        self.assertError(self.c.patch(p, json={"delete_on_empty": {"min_age_secs": 2**63}}), 422)
        self.assertError(self.c.patch(p, json={"delete_on_empty": {"min_age_secs": "1"}}), 400, "bad_json")
        self.assertError(self.c.patch(p, json={"delete_on_empty": 5}), 400, "bad_json")
        self.assertEqual(self.config(name)["delete_on_empty"], {"min_age_secs": 3600})  # bad input changed nothing
        self.assertEqual(self.c.patch(p, json={"delete_on_empty": {"min_age_secs": 0}}).status_code, 200)
        self.assertIsNone(self.config(name)["delete_on_empty"])
        self.c.patch(p, json={"delete_on_empty": {"min_age_secs": 60}})
        self.assertEqual(self.c.patch(p, json={"delete_on_empty": None}).status_code, 200)
        self.assertIsNone(self.config(name)["delete_on_empty"])

    def test_invalid_command_records(self):
        s = self.new_stream("badcmd")
        self.assertError(self.c.post(f"/v1/streams/{q(s)}/records", json={"records": [fence("t" * 37)]}),
                         422, "invalid")
        short_trim = {"headers": [[b64(b""), b64(b"trim")]], "body": b64(b"\x00\x01\x02")}
        self.assertError(self.c.post(f"/v1/streams/{q(s)}/records", json={"records": [short_trim]},
                                     headers={"s2-format": "base64"}), 422, "invalid")
        unknown = {"headers": [["", "explode"]], "body": ""}
        self.assertError(self.c.post(f"/v1/streams/{q(s)}/records", json={"records": [unknown]}),
                         422, "invalid")
        # As S2: a fencing token is text; one that is not could never be matched.
        binary_token = {"headers": [[b64(b""), b64(b"fence")]], "body": b64(b"\xff")}
        self.assertError(self.c.post(f"/v1/streams/{q(s)}/records", json={"records": [binary_token]},
                                     headers={"s2-format": "base64"}), 422, "invalid")
        self.assertEqual(self.c.tail(s)["seq_num"], 0)


# --------------------------------------------------------------------------
# Idempotent producers (weir extension)

def producer_headers(pid, epoch, seq):
    return {"weir-producer-id": str(pid), "weir-producer-epoch": str(epoch), "weir-producer-seq": str(seq)}


class ProducerTest(ApiTestCase):
    def new_producer(self):
        r = self.c.post("/v1/producers")
        self.assertEqual(r.status_code, 201, r.text)
        body = self.assertJson(r)
        self.assertIsInstance(body["id"], int)
        self.assertEqual(body["epoch"], 0)
        return body["id"]

    def test_ids_are_distinct(self):
        self.assertNotEqual(self.new_producer(), self.new_producer())

    def test_dedup_and_order(self):
        s = self.new_stream("prod")
        pid = self.new_producer()
        two = [{"body": "p0"}, {"body": "p1"}]
        first = self.c.append(s, two, headers=producer_headers(pid, 0, 0))
        self.assertIs(first["duplicated"], False)
        again = self.c.append(s, two, headers=producer_headers(pid, 0, 0))
        self.assertIs(again["duplicated"], True)
        self.assertEqual((again["start"]["seq_num"], again["end"]["seq_num"]),
                         (first["start"]["seq_num"], first["end"]["seq_num"]))
        self.assertEqual(self.c.tail(s)["seq_num"], 2)  # nothing appended twice

        nxt = self.c.append(s, [{"body": "p2"}], headers=producer_headers(pid, 0, 2))
        self.assertIs(nxt["duplicated"], False)
        self.assertEqual(nxt["start"]["seq_num"], 2)

        gap = self.c.post(f"/v1/streams/{q(s)}/records", json={"records": [{"body": "gap"}]},
                          headers=producer_headers(pid, 0, 10))
        self.assertError(gap, 409, "out_of_order_sequence")

        bumped = self.c.append(s, [{"body": "e1"}], headers=producer_headers(pid, 1, 0))
        self.assertIs(bumped["duplicated"], False)
        old = self.c.post(f"/v1/streams/{q(s)}/records", json={"records": [{"body": "old"}]},
                          headers=producer_headers(pid, 0, 3))
        self.assertError(old, 409, "invalid_producer_epoch")
        self.assertEqual([x["body"] for x in self.c.read(s)["records"]], ["p0", "p1", "p2", "e1"])

    def test_plain_ack_not_duplicated(self):
        s = self.new_stream("noprod")
        self.assertIs(self.c.append(s, [{"body": "x"}])["duplicated"], False)

    def test_malformed_producer_headers(self):
        s = self.new_stream("badprod")
        r = self.c.post(f"/v1/streams/{q(s)}/records", json={"records": [{"body": "x"}]},
                        headers=producer_headers("abc", 0, 0))
        self.assertError(r, 400, "bad_header")
        # Ids are Kafka's signed 64-bit producer ids.
        r = self.c.post(f"/v1/streams/{q(s)}/records", json={"records": [{"body": "x"}]},
                        headers=producer_headers(2**63, 0, 0))
        self.assertError(r, 400, "bad_header")
        # An id never allocated (it could be a Kafka producer's later).
        last = self.assertJson(self.c.post("/v1/producers"))["id"]
        for pid in (0, last + 1000):
            r = self.c.post(f"/v1/streams/{q(s)}/records", json={"records": [{"body": "x"}]},
                            headers=producer_headers(pid, 0, 0))
            self.assertError(r, 400, "bad_header")
            self.assertIn("never allocated", r.json()["message"])
        self.assertEqual(self.c.get(f"/v1/streams/{q(s)}/records/tail").json()["tail"]["seq_num"], 0)
        r = self.c.post(f"/v1/streams/{q(s)}/records", json={"records": [{"body": "x"}]},
                        headers=producer_headers(last, 0, 0))
        self.assertEqual(r.status_code, 200, r.text)


# --------------------------------------------------------------------------
# SSE read sessions

class Sse:
    """One SSE session over http.client, read event by event."""

    def __init__(self, server, stream, params, headers=None, timeout=60):
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
        h = {"Accept": "text/event-stream"}
        h.update(headers or {})
        self.conn.request("GET", f"/v1/streams/{q(stream)}/records?" + urllib.parse.urlencode(params), headers=h)
        self.resp = self.conn.getresponse()

    def events(self):
        """Yields {event, data, id} dicts until the server ends the response."""
        ev = {}
        while True:
            line = self.resp.readline()
            if not line:
                return
            line = line.decode().rstrip("\r\n")
            if line == "":
                if ev:
                    yield ev
                ev = {}
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                ev["data"] = ev["data"] + "\n" + value if "data" in ev else value
            elif field in ("event", "id"):
                ev[field] = value

    def close(self):
        self.conn.close()


class SseTest(ApiTestCase):
    def setUp(self):
        super().setUp()
        self.sessions = []

    def tearDown(self):
        for s in self.sessions:
            s.close()

    def open(self, stream, params, headers=None, timeout=60):
        sse = Sse(SHARED, stream, params, headers, timeout)
        self.sessions.append(sse)
        return sse

    def collect(self, sse):
        """Every event until the server closes: (records, batch ids, events)."""
        records, ids, events = [], [], []
        for ev in sse.events():
            events.append(ev)
            if ev.get("event") == "batch":
                records += json.loads(ev["data"])["records"]
                ids.append(ev.get("id"))
        return records, ids, events

    def filled(self, n):
        s = self.new_stream("sse")
        base = now_ms() - 3_600_000
        self.c.append(s, [{"body": f"e{i}", "timestamp": base + i * 1000} for i in range(n)])
        return s, base

    def test_bounded_session(self):
        s, _ = self.filled(5)
        sse = self.open(s, {"seq_num": 0, "count": 5})
        self.assertEqual(sse.resp.status, 200)
        self.assertTrue(sse.resp.getheader("Content-Type", "").startswith("text/event-stream"))
        records, ids, events = self.collect(sse)
        self.assertEqual([r["seq_num"] for r in records], list(range(5)))
        self.assertEqual([r["body"] for r in records], [f"e{i}" for i in range(5)])
        for i in ids:
            self.assertRegex(i or "", r"^\d+,\d+,\d+$")
        # The id names the last record delivered, then the records and bytes so far.
        self.assertEqual(ids[-1], f"4,5,{5 * metered('e0')}")
        kinds = [e.get("event") for e in events]
        self.assertEqual(events[-1], {"data": "[DONE]"})  # S2's done event has no name
        self.assertTrue(set(kinds) <= {"batch", "ping", None}, kinds)

    def test_bounded_session_ends_at_the_tail(self):
        # As S2: a session bounded by count, bytes or until does not wait for
        # records past the tail unless `wait` says so; at the tail it is a 416.
        s, _ = self.filled(3)
        records, _, events = self.collect(self.open(s, {"seq_num": 0, "count": 10}))
        self.assertEqual([r["seq_num"] for r in records], [0, 1, 2])
        self.assertEqual(events[-1], {"data": "[DONE]"})
        at_tail = self.open(s, {"seq_num": 3, "count": 10})
        self.assertEqual(at_tail.resp.status, 416)
        self.assertEqual(json.loads(at_tail.resp.read()), {"tail": self.c.tail(s)})

    def test_resume_with_last_event_id(self):
        s, _ = self.filled(5)
        one = metered("e0")
        # Records 0..2 were delivered: the id names seq 2; the session goes on at 3.
        sse = self.open(s, {"seq_num": 0, "count": 5}, headers={"Last-Event-ID": f"2,3,{3 * one}"})
        records, ids, events = self.collect(sse)
        self.assertEqual([r["seq_num"] for r in records], [3, 4])
        self.assertEqual(ids[-1], f"4,5,{5 * one}")
        self.assertEqual(events[-1], {"data": "[DONE]"})

    def test_resume_at_the_limit_ends_the_session(self):
        # A client that dropped after the last batch but before [DONE] resumes
        # with everything delivered. As S2 (the limit left is 0): 200 and
        # [DONE], or 416 if the session resumes at the tail.
        s, _ = self.filled(5)
        one = metered("e0")
        sse = self.open(s, {"seq_num": 0, "count": 3}, headers={"Last-Event-ID": f"2,3,{3 * one}"})
        self.assertEqual(sse.resp.status, 200)
        records, _, events = self.collect(sse)
        self.assertEqual(records, [])
        self.assertEqual(events[-1], {"data": "[DONE]"})
        sse = self.open(s, {"seq_num": 0, "bytes": 2 * one}, headers={"Last-Event-ID": f"1,2,{2 * one}"})
        self.assertEqual(sse.resp.status, 200)
        self.assertEqual(self.collect(sse)[2][-1], {"data": "[DONE]"})
        sse = self.open(s, {"seq_num": 0, "count": 5}, headers={"Last-Event-ID": f"4,5,{5 * one}"})
        self.assertEqual(sse.resp.status, 416)
        self.assertEqual(json.loads(sse.resp.read())["tail"]["seq_num"], 5)

    def test_resume_past_the_tail_is_a_416_unless_clamped(self):
        # As S2: an id past the tail (the stream is shorter than the session
        # saw: made again since) is not clamped unless the request says so.
        s, _ = self.filled(5)
        sse = self.open(s, {"seq_num": 0, "wait": 1}, headers={"Last-Event-ID": "1000,1,10"})
        self.assertEqual(sse.resp.status, 416)
        self.assertEqual(json.loads(sse.resp.read())["tail"]["seq_num"], 5)
        sse = self.open(s, {"seq_num": 0, "wait": 1, "clamp": "true"}, headers={"Last-Event-ID": "1000,1,10"})
        self.assertEqual(sse.resp.status, 200)
        records, _, events = self.collect(sse)
        self.assertEqual(records, [])
        self.assertEqual(events[-1], {"data": "[DONE]"})

    def test_a_zero_limit_is_a_limit(self):
        # As S2 (and its SDK, which resumes with what is left of a limit): 0
        # records or 0 bytes means nothing, not "no limit".
        s, _ = self.filled(3)
        for limit in ({"count": 0}, {"bytes": 0}):
            records, _, events = self.collect(self.open(s, {"seq_num": 1, **limit}))
            self.assertEqual(records, [], limit)
            self.assertEqual(events[-1], {"data": "[DONE]"}, limit)
            at_tail = self.open(s, {"seq_num": 3, **limit})
            self.assertEqual(at_tail.resp.status, 416, limit)
            at_tail.resp.read()
            unary = self.c.read(s, {"seq_num": 1, **limit})
            self.assertEqual(unary["records"], [], limit)
            self.assertNotIn("tail", unary)
            self.assertEqual(self.c.read(s, {"seq_num": 3, **limit}, expect=416)["tail"]["seq_num"], 3)
        # At the tail with a wait: it waits (here, for a record), then ends
        # empty. The wait (60 s) outlasts the join below, so only the wake
        # can end it in time.
        got = {}
        polls = self.metric("weir_long_polls")
        reader = threading.Thread(target=lambda: got.update(self.c.read(s, {"seq_num": 3, "count": 0, "wait": 60})))
        reader.start()
        deadline = time.monotonic() + 60
        low = polls  # another test's leftover poll may end meanwhile: above the lowest value seen
        while (g := self.metric("weir_long_polls")) <= low:  # the read waits at the tail
            self.assertLess(time.monotonic(), deadline, "the read never waited")
            low = min(low, g)
            time.sleep(0.05)
        self.assertTrue(reader.is_alive(), "a zero limit with a wait answered at once")
        self.c.append(s, [{"body": "wake"}])
        reader.join(30)
        self.assertFalse(reader.is_alive(), "the append did not wake the read")
        self.assertEqual(got.get("records"), [])

    def test_an_unbounded_session_without_wait_at_the_tail_ends(self):
        # S2's may_follow: no limits means the session may follow, whatever
        # `wait` says; wait=0 then ends it at once, with 200.
        s, _ = self.filled(2)
        sse = self.open(s, {"seq_num": 2, "wait": 0})
        self.assertEqual(sse.resp.status, 200)
        records, _, events = self.collect(sse)
        self.assertEqual(records, [])
        self.assertEqual(events[-1], {"data": "[DONE]"})

    def test_bad_last_event_id_changes_nothing(self):
        basin = unique("bresume")
        self.assertEqual(self.c.post("/v1/basins", json={"basin": basin,
                                                         "config": {"create_stream_on_read": True}}).status_code, 201)
        c = Client(SHARED, basin=basin)
        conn = http.client.HTTPConnection("127.0.0.1", SHARED.port, timeout=60)
        self.addCleanup(conn.close)
        conn.request("GET", "/v1/streams/lazy/records?seq_num=0",
                     headers={"Accept": "text/event-stream", "s2-basin": basin, "Last-Event-ID": "not-an-id"})
        r = conn.getresponse()
        self.assertEqual(r.status, 400)
        self.assertEqual(json.loads(r.read())["code"], "bad_header")
        self.assertError(c.get("/v1/streams/lazy"), 404, "stream_not_found")
        # A refused session was never counted as open (so never counted off).
        def gauge():
            m = re.search(r"(?m)^weir_read_sessions (\S+)$", self.c.get("/metrics").text)
            self.assertIsNotNone(m)
            return float(m.group(1))
        before = gauge()
        for _ in range(3):
            conn.request("GET", "/v1/streams/lazy/records?seq_num=0",
                         headers={"Accept": "text/event-stream", "s2-basin": basin, "Last-Event-ID": "1,2"})
            r = conn.getresponse()
            self.assertEqual(r.status, 400)
            r.read()
        # Sessions of earlier tests may still be closing, never opening.
        self.assertLessEqual(gauge(), before)
        self.assertGreaterEqual(gauge(), 0)

    def test_until_and_bytes(self):
        s, base = self.filled(6)
        records, _, events = self.collect(self.open(s, {"seq_num": 0, "until": base + 3000}))
        self.assertEqual([r["seq_num"] for r in records], [0, 1, 2])
        self.assertEqual(events[-1], {"data": "[DONE]"})
        records, _, events = self.collect(self.open(s, {"seq_num": 1, "bytes": 2 * metered("e0")}))
        self.assertEqual([r["seq_num"] for r in records], [1, 2])
        self.assertEqual(events[-1], {"data": "[DONE]"})
        # Never past the limit, in any batch.
        records, _, events = self.collect(self.open(s, {"seq_num": 1, "bytes": 2 * metered("e0") - 1}))
        self.assertEqual([r["seq_num"] for r in records], [1])
        self.assertEqual(events[-1], {"data": "[DONE]"})

    def test_base64_session(self):
        s = self.new_stream("sse64")
        self.c.append(s, [{"body": b64(b"\x00\x01\xfe")}], fmt="base64")
        records, _, _ = self.collect(self.open(s, {"seq_num": 0, "count": 1}, headers={"s2-format": "base64"}))
        self.assertEqual([base64.b64decode(r["body"]) for r in records], [b"\x00\x01\xfe"])

    def test_live_tail_with_ping(self):
        s, _ = self.filled(2)
        sse = self.open(s, {}, timeout=60)  # no start: S2 starts at the tail
        self.assertEqual(sse.resp.status, 200)
        events = sse.events()
        ping = None
        for ev in events:  # the server pings every 5 s while idle
            if ev.get("event") == "ping":
                ping = json.loads(ev["data"])
                break
            self.assertNotEqual(ev.get("event"), "error", ev)
        self.assertIsNotNone(ping, "session ended without a ping")
        self.assertIsInstance(ping.get("timestamp"), int, ping)
        self.assertEqual(ping.get("tail", {}).get("seq_num"), 2, ping)

        self.c.append(s, [{"body": "live"}])
        got = None
        for ev in events:
            if ev.get("event") == "batch":
                recs = json.loads(ev["data"])["records"]
                if recs:
                    got = recs
                    break
        self.assertIsNotNone(got, "no batch after the append")
        self.assertEqual([(r["seq_num"], r["body"]) for r in got], [(2, "live")])

    def test_turning_to_follow_sends_a_heartbeat_with_the_tail(self):
        # As S2: a ping with the tail whenever the session turns to following,
        # at once (pings otherwise come every 5 s; this session waits 3).
        s, _ = self.filled(2)
        _, _, events = self.collect(self.open(s, {"seq_num": 0, "wait": 3}, timeout=120))
        kinds = [e.get("event", "data") for e in events]
        self.assertEqual(kinds, ["batch", "ping", "data"], events)
        self.assertEqual(json.loads(events[1]["data"])["tail"]["seq_num"], 2)
        self.assertEqual(events[-1], {"data": "[DONE]"})
        # At the tail from the start: the heartbeat is the first event.
        _, _, events = self.collect(self.open(s, {"tail_offset": 0, "wait": 3}, timeout=120))
        self.assertEqual(events[0].get("event"), "ping", events)
        self.assertEqual(json.loads(events[0]["data"])["tail"]["seq_num"], 2)
        self.assertEqual(events[-1], {"data": "[DONE]"})

    def test_wait_ends_idle_session(self):
        s, _ = self.filled(1)
        records, _, events = self.collect(self.open(s, {"seq_num": 0, "wait": 1}, timeout=120))
        self.assertEqual([r["seq_num"] for r in records], [0])
        self.assertNotIn("error", [e.get("event") for e in events])
        self.assertEqual(events[-1], {"data": "[DONE]"})

    def test_errors_before_the_session(self):
        missing = self.open(unique("nosuch"), {"seq_num": 0})
        self.assertEqual(missing.resp.status, 404)
        self.assertEqual(json.loads(missing.resp.read())["code"], "stream_not_found")
        s, _ = self.filled(1)
        past = self.open(s, {"seq_num": 5})
        self.assertEqual(past.resp.status, 416)
        self.assertEqual(json.loads(past.resp.read())["tail"]["seq_num"], 1)
        bad = self.open(s, {"seq_num": 0}, headers={"Last-Event-ID": "not-an-id"})
        self.assertEqual(bad.resp.status, 400)
        self.assertEqual(json.loads(bad.resp.read())["code"], "bad_header")
        # Content-Type: s2s/proto makes it an S2S session (tests/http/s2s_test.py), over HTTP/1.1 too.
        s2s = self.open(s, {"seq_num": 0, "count": 1}, headers={"Content-Type": "s2s/proto"})
        self.assertEqual(s2s.resp.status, 200)
        self.assertEqual(s2s.resp.getheader("Content-Type"), "s2s/proto")
        body = s2s.resp.read()
        self.assertEqual(int.from_bytes(body[:3], "big"), len(body) - 3)  # one frame
        self.assertEqual(pb_read_batch(body[4:])["records"][0]["body"], b"e0")


# --------------------------------------------------------------------------
# Remaining error statuses: 400, 404 not_found, 405

class ErrorStatusTest(ApiTestCase):
    def test_not_found_paths(self):
        for path in ("/v1/nothing-here", "/nothing", "/v1/streams/a/records/tail/more",
                     "/v1/streams//records", "/v1//streams", "/v1/streams/", "/v1/basins/"):
            with self.subTest(path=path):
                self.assertError(self.c.get(path), 404, "not_found")
        # An empty stream name is no name: nothing is created under "records".
        self.assertError(self.c.post("/v1/streams//records", json={"records": [{"body": "x"}]}), 404, "not_found")
        self.assertError(self.c.get("/v1/streams/records"), 404, "stream_not_found")

    def test_an_absolute_form_target_is_its_path(self):
        # RFC 9112 §3.2.2: a server accepts "http://host/path?query" as a target.
        s = self.new_stream("absolute")
        self.c.append(s, [{"body": "a"}])
        conn = http.client.HTTPConnection("127.0.0.1", SHARED.port, timeout=30)
        self.addCleanup(conn.close)
        for target in (f"http://127.0.0.1:{SHARED.port}/v1/streams/{q(s)}/records?seq_num=0",
                       f"HTTP://elsewhere/v1/streams/{q(s)}/records?seq_num=0"):
            conn.request("GET", target, headers={"Accept": "application/json"})
            r = conn.getresponse()
            body = r.read()
            self.assertEqual(r.status, 200, body)
            self.assertEqual([x["body"] for x in json.loads(body)["records"]], ["a"])
        conn.request("GET", f"http://127.0.0.1:{SHARED.port}")
        r = conn.getresponse()
        self.assertEqual(r.status, 404, r.read())

    def test_method_not_allowed(self):
        s = self.new_stream("methods")
        for method, path in (("PUT", f"/v1/streams/{q(s)}/records"),
                             ("DELETE", f"/v1/streams/{q(s)}/records"),
                             ("POST", f"/v1/streams/{q(s)}/records/tail"),
                             ("DELETE", "/v1/basins"),
                             ("PATCH", "/v1/streams"),
                             ("GET", "/v1/producers")):
            with self.subTest(method=method, path=path):
                self.assertError(self.c.request(method, path), 405, "method_not_allowed")

    def test_a_config_body_over_64_kib_is_refused_before_it_is_parsed(self):
        # A JSON tree costs up to about 20 times its text: config bodies (a few
        # hundred bytes in practice) are refused past 64 KiB, and nothing is made.
        name = unique("bigcfg")
        body = json.dumps({"stream": name, "x": [[]] * 30000}).encode()
        self.assertGreater(len(body), 64 << 10)
        self.assertError(self.c.post("/v1/streams", data=body, headers={"Content-Type": "application/json"}),
                         413, "request_too_large")
        self.assertError(self.c.get(f"/v1/streams/{q(name)}/records/tail"), 404, "stream_not_found")
        # A config body just under it is parsed (and refused for what it says).
        small = json.dumps({"stream": name, "config": {"storage_class": "nope"}}).encode()
        self.assertError(self.c.post("/v1/streams", data=small, headers={"Content-Type": "application/json"}),
                         400, "bad_json")

    def test_bad_requests(self):
        s = self.new_stream("bad")
        rec = f"/v1/streams/{q(s)}/records"
        cases = [
            # S2's codes say what was malformed: the body, a query value or a header.
            ("malformed JSON", "bad_json", lambda: self.c.post(rec, data=b'{"records": [',
                                                               headers={"Content-Type": "application/json"})),
            ("body of the wrong type", "bad_json", lambda: self.c.post(rec, json={"records": [{"body": 5}]})),
            ("records not a list", "bad_json", lambda: self.c.post(rec, json={"records": "x"})),
            ("bad s2-format", "bad_header", lambda: self.c.post(rec, json={"records": [{"body": "x"}]},
                                                                headers={"s2-format": "hex"})),
            ("bad base64", "bad_json", lambda: self.c.post(rec, json={"records": [{"body": "!!not base64!!"}]},
                                                           headers={"s2-format": "base64"})),
            ("count not a number", "bad_query", lambda: self.c.get(rec, params={"count": "abc"})),
            ("negative seq_num", "bad_query", lambda: self.c.get(rec, params={"seq_num": "-1"})),
            ("clamp not a bool", "bad_query", lambda: self.c.get(rec, params={"clamp": "maybe"})),
            ("clamp as 1 (S2 takes true or false)", "bad_query", lambda: self.c.get(rec, params={"clamp": "1"})),
            ("wait too large", "bad_query", lambda: self.c.get(rec, params={"wait": 2**32})),
            ("bad list limit", "bad_query", lambda: self.c.get("/v1/streams", params={"limit": "lots"})),
            ("malformed create", "bad_json", lambda: self.c.post("/v1/streams", data=b"{",
                                                                 headers={"Content-Type": "application/json"})),
            ("malformed basin create", "bad_json", lambda: self.c.post("/v1/basins", data=b"[1,",
                                                                       headers={"Content-Type": "application/json"})),
            ("a scope S2 does not have", "bad_json",
             lambda: self.c.post("/v1/basins", json={"basin": unique("scoped"), "scope": "mars"})),
            ("a scope that is not a string, in a PUT", "bad_json",
             lambda: self.c.put(f"/v1/basins/{unique('scoped')}", json={"scope": 5})),
            ("retention by age and infinite at once", "bad_json",
             lambda: self.c.post("/v1/streams", json={"stream": unique("ret"),
                                                      "config": {"retention_policy": {"age": 10, "infinite": {}}}})),
            ("infinite retention that is not an object", "bad_json",
             lambda: self.c.patch(f"/v1/streams/{q(s)}", json={"retention_policy": {"infinite": 5}})),
            ("bad protobuf", "bad_proto", lambda: self.c.post(rec, data=b"\x0a\xff",
                                                              headers={"Content-Type": "application/protobuf"})),
            # A field given twice is refused (S2's serde does), not one of them taken.
            ("records twice", "bad_json", lambda: self.c.post(rec, data=b'{"records":[{"body":"a"}],"records":[]}',
                                                              headers={"Content-Type": "application/json"})),
            ("a record's body twice", "bad_json",
             lambda: self.c.post(rec, data=b'{"records":[{"body":"a","body":"b"}]}',
                                 headers={"Content-Type": "application/json"})),
            ("a record's headers twice, one null", "bad_json",
             lambda: self.c.post(rec, data=b'{"records":[{"headers":[["h","v"]],"headers":null}]}',
                                 headers={"Content-Type": "application/json"})),
            ("fencing_token twice", "bad_json",
             lambda: self.c.post(rec, data=b'{"records":[{"body":"a"}],"fencing_token":"x","fencing_token":"y"}',
                                 headers={"Content-Type": "application/json"})),
            ("a create's config key twice", "bad_json",
             lambda: self.c.post("/v1/streams", data=('{"stream":"%s","config":{"storage_class":"standard",'
                                                      '"storage_class":"express"}}' % unique("twice")).encode(),
                                 headers={"Content-Type": "application/json"})),
            ("s2-stream-config key twice", "bad_header",
             lambda: self.c.post(rec, json={"records": [{"body": "x"}]},
                                 headers={"s2-stream-config": '{"storage_class":"standard","storage_class":"standard"}'})),
        ]
        for what, code, fn in cases:
            with self.subTest(what):
                self.assertError(fn(), 400, code)
        self.assertEqual(self.c.tail(s)["seq_num"], 0)
        self.assertEqual(self.c.get(f"/v1/streams/{q(s)}").json()["retention_policy"],
                         DEFAULT_CONFIG["retention_policy"])
        basins = [b["name"] for b in self.c.get("/v1/basins", params={"prefix": "scoped"}).json()["basins"]]
        self.assertEqual(basins, [])
        r = self.c.post("/v1/basins", json={"basin": unique("scoped"), "scope": "aws:eu-north-1"})
        self.assertEqual(r.status_code, 201, r.text)
        self.assertIsNone(r.json()["scope"])

    def test_a_bad_escape_in_the_path_is_bad_path(self):
        # Sent as is (requests would encode the "%").
        conn = http.client.HTTPConnection("127.0.0.1", SHARED.port, timeout=REQ_TIMEOUT)
        try:
            for path in ("/v1/streams/%zz", "/v1/streams/a%2/records", "/v1/basins/%g0"):
                with self.subTest(path=path):
                    conn.request("GET", path)
                    r = conn.getresponse()
                    body = r.read()
                    self.assertEqual(r.status, 400, body)
                    self.assertEqual(json.loads(body)["code"], "bad_path", body)
        finally:
            conn.close()

    def test_a_refused_head_carries_no_body(self):
        # A HEAD refused by the server itself (here a bad escape in the query,
        # which closes the connection) answers with headers only (RFC 9110).
        with socket.create_connection(("127.0.0.1", SHARED.port), timeout=REQ_TIMEOUT) as sock:
            sock.sendall(b"HEAD /v1/streams?prefix=%zz HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 400"), head)
        self.assertEqual(rest, b"", data)

    def test_a_stream_that_backs_a_kafka_partition_is_changed_only_with_its_topic(self):
        if not SHARED.kafka_addr:
            self.skipTest("the shared server has no Kafka listener")
        topic = unique("ktopic")
        # Metadata v1 for the topic auto-creates it (one partition).
        cid = b"rest-api-test"
        body = (struct.pack(">hhi", 3, 1, 7) + struct.pack(">h", len(cid)) + cid + struct.pack(">i", 1)
                + struct.pack(">h", len(topic)) + topic.encode())
        host, port = SHARED.kafka_addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=REQ_TIMEOUT) as k, k.makefile("rb") as f:
            k.sendall(struct.pack(">i", len(body)) + body)
            size = struct.unpack(">i", f.read(4))[0]
            self.assertEqual(len(f.read(size)), size, "a short Metadata response")
        kc = Client(SHARED, basin="weir-kafka")
        self.assertEqual(kc.get(f"/v1/streams/{q(topic + '/0')}").status_code, 200)
        self.assertError(kc.delete(f"/v1/streams/{q(topic + '/0')}"), 409, "conflict")
        self.assertEqual(kc.get(f"/v1/streams/{q(topic + '/0')}").status_code, 200)
        # Its config is the topic's: a PUT or PATCH changes what it names.
        before = kc.get(f"/v1/streams/{q(topic + '/0')}").json()
        r = kc.put(f"/v1/streams/{q(topic + '/0')}", json={})
        self.assertEqual((r.status_code, r.headers.get("s2-provision-result")), (200, "noop"), r.text)
        self.assertEqual(kc.get(f"/v1/streams/{q(topic + '/0')}").json(), before)
        r = kc.patch(f"/v1/streams/{q(topic + '/0')}", json={"retention_policy": {"age": 60}})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(kc.get(f"/v1/streams/{q(topic + '/0')}").json(), dict(before, retention_policy={"age": 60}))
        # No plain streams beside the topics (a partition is found by name),
        # and the basin stays.
        for name in (topic + "/1", unique("plain")):
            self.assertError(kc.post("/v1/streams", json={"stream": name}), 409, "conflict")
            self.assertError(kc.put(f"/v1/streams/{q(name)}", json={}), 409, "conflict")
            self.assertEqual(kc.get(f"/v1/streams/{q(name)}").status_code, 404)
        self.assertError(self.c.delete("/v1/basins/weir-kafka"), 422, "invalid")
        self.assertEqual(kc.get(f"/v1/streams/{q(topic + '/0')}").status_code, 200)

    def test_empty_header_name_outside_a_command(self):
        # s2.proto: a header name cannot be empty, except in a command record
        # (exactly one header); the whole append is refused.
        s = self.new_stream("emptyhdr")
        rec = f"/v1/streams/{q(s)}/records"
        r = self.c.post(rec, json={"records": [{"body": "ok"}, {"body": "x", "headers": [["", "x"], ["a", "b"]]}]})
        self.assertError(r, 422, "invalid")
        self.assertEqual(self.c.tail(s)["seq_num"], 0)

    def test_ambiguous_invalid_reads(self):
        # Several start positions, or wait out of range: the docs do not say 400
        # or 422; either is a client error, never a read.
        s = self.new_stream("ambig")
        rec = f"/v1/streams/{q(s)}/records"
        for params in ({"seq_num": 0, "timestamp": 0}, {"seq_num": 0, "tail_offset": 0}):
            with self.subTest(params=params):
                r = self.c.get(rec, params=params)
                self.assertIn(r.status_code, (400, 422), r.text)
                self.assertJson(r)


# --------------------------------------------------------------------------
# Servers of their own: auth + request size limit, backpressure, lifecycle

class AuthAndRequestLimitTest(ClosingTestCase):
    TOKEN = "s3cret-token-42"

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="weir-auth-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        token_file = os.path.join(cls.tmp, "token")
        with open(token_file, "w") as f:
            f.write(cls.TOKEN + "\n")  # trimmed by the server
        cls.server = start_server(args=["--auth-token-file", token_file, "--max-request-bytes", "65536"])

    @classmethod
    def tearDownClass(cls):
        stop_server(cls.server)

    def check_401(self, r):
        self.assertEqual(r.status_code, 401, r.text)
        self.assertEqual(r.json()["code"], "authn")

    def test_bearer_token(self):
        anon = Client(self.server)
        wrong = Client(self.server, token="not-it")
        right = Client(self.server, token=self.TOKEN)
        r = anon.get("/health")
        self.assertEqual(r.status_code, 200, r.text)  # /health needs no token
        for path in ("/v1/basins", "/v1/streams", "/metrics"):
            with self.subTest(path=path):
                self.check_401(anon.get(path))
                self.check_401(wrong.get(path))
                self.check_401(anon.get(path, headers={"Authorization": f"Basic {self.TOKEN}"}))
                self.check_401(anon.get(path, headers={"Authorization": f"Bearer {self.TOKEN}x"}))
                self.assertEqual(right.get(path).status_code, 200)
        self.check_401(anon.post("/v1/streams", json={"stream": "x"}))
        self.check_401(anon.post("/v1/producers"))
        name = unique("authed")
        right.create_stream(name)
        self.check_401(anon.post(f"/v1/streams/{q(name)}/records", json={"records": [{"body": "x"}]}))
        self.check_401(anon.get(f"/v1/streams/{q(name)}/records"))
        right.append(name, [{"body": "x"}])
        self.assertEqual(right.tail(name)["seq_num"], 1)

    def test_401_comes_before_the_body(self):
        # A request without the token and with a body of 64 KiB or more is answered
        # on its head: its body is never read (nor memory set aside for it),
        # and the connection closes. (A smaller body is read, then refused.)
        def answer_to_head(head):
            # Sends only the head (no body) and reads the answer's head.
            sock = socket.create_connection(("127.0.0.1", self.server.port), timeout=30)
            self.addCleanup(sock.close)
            sock.sendall(head)
            got = b""
            while b"\r\n\r\n" not in got:
                data = sock.recv(65536)
                self.assertTrue(data, "closed without an answer")
                got += data
            return got

        got = answer_to_head(b"POST /v1/streams HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 65536\r\n\r\n")  # and no body (64 KiB)
        self.assertTrue(got.startswith(b"HTTP/1.1 401"), got[:100])
        self.assertIn(b"WWW-Authenticate: Bearer", got)
        # A target that cannot be parsed is answered on its head too.
        got = answer_to_head(b"POST /v1/streams?%zz HTTP/1.1\r\nHost: t\r\nContent-Length: 65536\r\n\r\n")
        self.assertTrue(got.startswith(b"HTTP/1.1 400"), got[:100])

    def test_request_too_large(self):
        c = Client(self.server, token=self.TOKEN)
        name = unique("big")
        c.create_stream(name)
        c.append(name, [{"body": "z" * 60_000}])  # under the 64 KiB limit
        try:
            r = c.post(f"/v1/streams/{q(name)}/records", json={"records": [{"body": "z" * 70_000}]})
        except requests.ConnectionError as e:
            self.fail(f"no 413 response: the server closed the connection ({e})")
        self.assertEqual(r.status_code, 413, r.text)
        self.assertEqual(r.json()["code"], "request_too_large")
        # Nothing appended; the server still serves (on a fresh connection, if it closed this one).
        self.assertEqual(Client(self.server, token=self.TOKEN).tail(name)["seq_num"], 1)


class BackpressureTest(ClosingTestCase):
    """A 2 MiB write pool (and 2 MiB slots, as the pool must hold one) and
    60 s PUTs: six concurrent appends of 900 KB cannot all be admitted while
    the first ones wait for their PUT; those left out must get 429
    backpressure with Retry-After after the admission timeout, long before
    any PUT finishes."""

    def test_429_when_pool_full(self):
        server = start_server(args=["--pool-budget-mib", "2", "--max-slot-bytes", str(2 << 20),
                                    "--inject-put-latency-ms", "60000,60000"])
        try:
            c = Client(server)
            name = unique("bp")
            c.create_stream(name)
            body = {"records": [{"body": "b" * 900_000}]}
            results = []

            def append():
                try:
                    r = Client(server).post(f"/v1/streams/{q(name)}/records", json=body, timeout=120)
                    results.append(r)
                except requests.RequestException as e:  # the server is killed at the end
                    results.append(e)

            for _ in range(6):
                threading.Thread(target=append, daemon=True).start()
            deadline = time.monotonic() + 50  # the first PUT lands after 60 s
            while time.monotonic() < deadline and not any(
                    isinstance(r, requests.Response) and r.status_code == 429 for r in results):
                time.sleep(0.2)
            got = [r.status_code if isinstance(r, requests.Response) else repr(r) for r in results]
            too_many = [r for r in results if isinstance(r, requests.Response) and r.status_code == 429]
            self.assertTrue(too_many, f"no 429 while the pool was full; responses so far: {got}")
            r = too_many[0]
            self.assertEqual(r.headers.get("Retry-After"), "1", r.headers)
            self.assertEqual(r.json()["code"], "rate_limited")
            for r in results:
                if isinstance(r, requests.Response):
                    self.assertIn(r.status_code, (200, 429), r.text)
        finally:
            server.kill()  # a drain would wait out the slow PUT
            if sys.exc_info()[0] is not None:
                print(server.log_tail())
            server.cleanup()


def metric_matching(server, pattern):
    """The value a /metrics line matching `pattern` (one group) has now."""
    m = re.search(pattern, Client(server).get("/metrics").text)
    return float(m.group(1))


ADMISSION_WAITS = r'(?m)^weir_admission_waits_total\{cause="wal_pool"\} (\S+)$'


class RetryUnderBackpressureTest(ClosingTestCase):
    """An idempotent producer's retry of an append already acknowledged needs
    no room in the WAL pool: it is answered (duplicated) while the pool is
    full, not after waiting for room, and makes no admission wait."""

    def test_a_retry_is_answered_without_waiting_for_room(self):
        server = start_server(args=["--pool-budget-mib", "2", "--max-slot-bytes", str(2 << 20),
                                    "--inject-put-latency-ms", "3000,3000", "--admission-timeout-ms", "120000"])
        try:
            c = Client(server)
            name = unique("retry")
            c.create_stream(name)
            pid = c.post("/v1/producers").json()
            headers = producer_headers(pid["id"], pid["epoch"], 0)
            body = {"records": [{"body": "r" * 400_000}]}  # more than the room the fillers leave
            first = c.post(f"/v1/streams/{q(name)}/records", json=body, headers=headers, timeout=60)
            self.assertEqual(first.status_code, 200, first.text)

            def metric(pattern):
                return metric_matching(server, pattern)

            def waits():
                return metric(ADMISSION_WAITS)

            before = waits()
            big = {"records": [{"body": "b" * 900_000}]}

            def fill():
                try:
                    Client(server).post(f"/v1/streams/{q(name)}/records", json=big, timeout=120)
                except requests.RequestException:  # the server is killed at the end
                    pass

            for _ in range(2):  # both fit the 2 MiB pool, and leave less than the retry's size
                threading.Thread(target=fill, daemon=True).start()
            deadline = time.monotonic() + 60
            while metric(r"(?m)^weir_wal_pool_bytes (\S+)$") < 1_800_000 and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertGreaterEqual(metric(r"(?m)^weir_wal_pool_bytes (\S+)$"), 1_800_000, "the pool never filled")
            retry = c.post(f"/v1/streams/{q(name)}/records", json=body, headers=headers, timeout=60)
            self.assertEqual(retry.status_code, 200, retry.text)
            ack = retry.json()
            self.assertTrue(ack["duplicated"], ack)
            self.assertEqual((ack["start"]["seq_num"], ack["end"]["seq_num"]), (0, 1), ack)
            self.assertEqual(waits(), before, "the retry waited for room")
        finally:
            server.kill()  # a drain would wait out the slow PUTs
            if sys.exc_info()[0] is not None:
                print(server.log_tail())
            server.cleanup()


class AdmissionAfterALookTest(ClosingTestCase):
    """An append is served on the I/O thread when admission looks free by
    its body's size; its records may take more room than their body (a
    header of 9 bytes of JSON takes 21), so the room may not be there. It
    then waits for admission on a worker, as an append that looked full
    does, rather than being answered 429 at once."""

    def test_an_append_without_room_after_the_look_waits_for_it(self):
        server = start_server(args=["--pool-budget-mib", "2", "--max-slot-bytes", str(128 << 10),
                                    "--inject-put-latency-ms", "15000,15000", "--admission-timeout-ms", "1500"])
        try:
            c = Client(server)
            name = unique("look")
            c.create_stream(name)

            def metric(pattern):
                return metric_matching(server, pattern)

            def waits():
                return metric(ADMISSION_WAITS)

            def fill():
                try:
                    Client(server).post(f"/v1/streams/{q(name)}/records", json={"records": [{"body": "f" * 125_000}]},
                                        timeout=120)
                except requests.RequestException:  # the server is killed at the end
                    pass

            # About 1.38 MB of the 2 MiB pool held by PUTs that take 15 s (the
            # server's start waited out one).
            for _ in range(11):
                threading.Thread(target=fill, daemon=True).start()
            deadline = time.monotonic() + 60
            while metric(r"(?m)^weir_wal_pool_bytes (\S+)$") < 1_375_000 and time.monotonic() < deadline:
                time.sleep(0.05)
            pooled = metric(r"(?m)^weir_wal_pool_bytes (\S+)$")
            self.assertGreaterEqual(pooled, 1_375_000, "the pool never filled")
            self.assertLess(pooled, 1_500_000)
            # 360 KB of body looks as if it fits beside them (with a slot's
            # margin); its 40,000 headers take about 840 KB of the pool, which
            # is not there.
            body = json.dumps({"records": [{"body": "p", "headers": [["h", ""]] * 40_000}]},
                              separators=(",", ":"))
            self.assertLess(len(body), 361_000)
            before = waits()
            r = c.post(f"/v1/streams/{q(name)}/records", data=body, headers={"Content-Type": "application/json"},
                       timeout=60)
            self.assertEqual(r.status_code, 429, r.text)
            self.assertEqual(r.json()["code"], "rate_limited")
            self.assertEqual(r.headers.get("Retry-After"), "1", r.headers)
            self.assertEqual(waits(), before + 1, "the append did not wait for room")
            self.assertEqual(c.tail(name)["seq_num"], 0)  # the fillers' PUTs have not landed
        finally:
            server.kill()  # a drain would wait out the slow PUTs
            if sys.exc_info()[0] is not None:
                print(server.log_tail())
            server.cleanup()


class ServeFlagsTest(ClosingTestCase):
    """weir serve's flags through their WEIR_<NAME> variables, on servers of
    their own; and the SSE error event a draining server ends sessions with."""

    @staticmethod
    def metric(server, name):
        text = Client(server).get("/metrics").text
        m = re.search(rf"(?m)^{re.escape(name)} (\S+)$", text)
        return float(m.group(1)) if m else None

    def test_flags_from_the_environment(self):
        with tempfile.TemporaryDirectory() as d:
            objects, meta = os.path.join(d, "objects-elsewhere"), os.path.join(d, "meta-elsewhere.db")
            env = {"WEIR_KAFKA_ADDR": "",  # "" turns Kafka off, as the flag does
                   "WEIR_OBJECT_STORE": "file://" + objects, "WEIR_METASTORE": "sqlite://" + meta,
                   "WEIR_NODE_ID": "node-env", "WEIR_PIPELINE_WINDOW": "3", "WEIR_LINGER_MS": "2",
                   "WEIR_INJECT_PUT_AMBIGUOUS_RATE": "0.5"}
            server = WeirServer(WEIR, data_dir=os.path.join(d, "data"), env=env)
            ALL_SERVERS.append(server)
            self.addCleanup(server.cleanup)
            server.start()
            self.assertIsNone(server.kafka_addr, "WEIR_KAFKA_ADDR=\"\" left the Kafka listener on")
            c = Client(server)
            s = unique("env")
            c.create_stream(s)
            for i in range(20):
                c.append(s, [{"body": f"e{i}"}])
            # Half the PUTs landed but answered a timeout: each was read back.
            self.assertGreater(self.metric(server, "weir_wal_put_ambiguous_resolved_total"), 0)
            self.assertTrue(os.path.isdir(os.path.join(objects, "wal", "node-env")), os.listdir(objects))
            self.assertTrue(os.path.isfile(meta))
            self.assertFalse(os.path.exists(os.path.join(d, "data", "objects")))
            server.restart()
            self.assertEqual([r["body"] for r in Client(server).read_all(s)], [f"e{i}" for i in range(20)])
            server.stop()

    def test_bad_flags_change_nothing_on_disk(self):
        with tempfile.TemporaryDirectory() as d:
            data = os.path.join(d, "data")
            with socket.socket() as taken:
                taken.bind(("127.0.0.1", 0))
                taken.listen()
                kafka_in_use = f"127.0.0.1:{taken.getsockname()[1]}"
                for args, needle in [
                        (["--http-addr", "bogus"], "--http-addr"),
                        (["--inject-put-latency-ms", "120,50"], "P99 is below P50"),
                        (["--inject-put-latency-ms", "50,"], "\"\" is not a latency"),
                        (["--inject-put-latency-ms", "1,2,3"], "more than two values"),
                        (["--inject-put-error-rate", "0.8", "--inject-put-ambiguous-rate", "0.5"], "more than 1"),
                        # Found before recovery, not after it.
                        (["--kafka-addr", kafka_in_use], "cannot listen there"),
                        (["--http-addr", kafka_in_use], "cannot listen there"),
                        # Two listeners on one (free) port; stores of unknown schemes.
                        (["--http-addr", "127.0.0.1:1", "--kafka-addr", "127.0.0.1:1"], "both name port 1"),
                        (["--http-addr", "127.0.0.1:1", "--kafka-addr", "0.0.0.0:1",
                          "--kafka-advertised-addr", "127.0.0.1:1"], "both name port 1"),
                        (["--object-store", "bogus://x"], "unsupported object store URI scheme"),
                        (["--metastore", "mysql://x"], "unsupported metastore URI scheme")]:
                    kafka = [] if "--kafka-addr" in args else ["--kafka-addr", ""]
                    http = [] if "--http-addr" in args else ["--http-addr", "127.0.0.1:0"]
                    cmd = [WEIR, "serve", "--data-dir", data] + http + kafka + args
                    code, out = run_expecting_exit(cmd)
                    self.assertEqual(code, 1, f"{args}: {out}")
                    self.assertIn(needle, out, args)
                    self.assertEqual(len(out.strip().splitlines()), 1, f"{args}: not one line: {out}")
                    self.assertFalse(os.path.exists(data), f"{args} made {data}")

    def test_servers_that_keep_nothing_on_disk_share_a_directory(self):
        # mem:// (and s3:// with postgres://) use no data dir: neither made
        # nor locked, so two such servers run side by side.
        with tempfile.TemporaryDirectory() as d:
            data = os.path.join(d, "data")
            servers = [WeirServer(WEIR, data_dir=data, args=["--object-store", "mem://"]) for _ in range(2)]
            for server in servers:
                ALL_SERVERS.append(server)
                self.addCleanup(server.cleanup)
                server.start()
            for server in servers:
                self.assertEqual(Client(server).get("/health").status_code, 200)
            self.assertFalse(os.path.exists(data))
            for server in servers:
                server.stop()

    def test_health_is_503_until_recovery_has_finished(self):
        with tempfile.TemporaryDirectory() as d:
            data = os.path.join(d, "data")
            first = WeirServer(WEIR, data_dir=data, args=["--kafka-addr", ""])
            ALL_SERVERS.append(first)
            self.addCleanup(first.cleanup)
            first.start()
            c = Client(first)
            s = unique("recover")
            c.create_stream(s)
            c.append(s, [{"body": "before the crash"}])
            first.kill()  # unsettled slots stay: the next start fences and replays them
            # The next start's object store takes 3 s a PUT (its fence is one).
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            log = open(os.path.join(d, "second.log"), "wb")
            self.addCleanup(log.close)
            proc = subprocess.Popen([WEIR, "serve", "--data-dir", data, "--http-addr", f"127.0.0.1:{port}",
                                     "--kafka-addr", "", "--inject-put-latency-ms", "3000,3000"],
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            self.addCleanup(lambda: proc.poll() is None and proc.kill())
            seen = []
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and 200 not in seen:
                try:
                    seen.append(requests.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code)
                except requests.RequestException:
                    pass  # not listening yet, or slow to answer on a loaded machine
                time.sleep(0.05)
            self.assertIn(503, seen, "no 503 while recovering")
            self.assertEqual(seen[-1], 200, seen)
            self.assertEqual(sorted(set(seen)), [200, 503], seen)
            self.assertTrue(all(code == 503 for code in seen[:seen.index(200)]), seen)
            r = requests.get(f"http://127.0.0.1:{port}/v1/streams/{q(s)}/records", params={"seq_num": 0},
                             timeout=30)
            self.assertEqual([rec["body"] for rec in r.json()["records"]], ["before the crash"])
            proc.send_signal(signal.SIGTERM)
            self.assertEqual(proc.wait(timeout=120), 0)

    def test_creates_past_max_streams_get_quota_exhausted(self):
        server = start_server(args=["--max-streams", "3", "--kafka-addr", ""])
        self.addCleanup(stop_server, server)
        c = Client(server)
        basin = unique("cap")
        config = {"create_stream_on_append": True}
        self.assertEqual(c.post("/v1/basins", json={"basin": basin, "config": config}).status_code, 201)
        bc = Client(server, basin=basin)
        names = [unique("cap") for _ in range(3)]
        for s in names:
            bc.create_stream(s)
        r = bc.post("/v1/streams", json={"stream": "one-too-many"})
        self.assertEqual((r.status_code, r.json()["code"]), (403, "quota_exhausted"), r.text)
        self.assertIn("--max-streams", r.json()["message"])
        # A name that exists needs no room: 409, or a request token's retry answered as made.
        r = bc.post("/v1/streams", json={"stream": names[0]})
        self.assertEqual((r.status_code, r.json()["code"]), (409, "resource_already_exists"), r.text)
        tok = {"s2-request-token": unique("tok")}
        self.assertEqual(bc.delete(f"/v1/streams/{names[2]}").status_code, 202)
        self.assertEqual(bc.post("/v1/streams", json={"stream": names[2]}, headers=tok).status_code, 201)
        r = bc.post("/v1/streams", json={"stream": names[2]}, headers=tok)
        self.assertEqual(r.status_code, 201, r.text)
        # An append that would create its stream is refused too, and writes nothing.
        r = bc.post("/v1/streams/by-append/records", json={"records": [{"body": "x"}]})
        self.assertEqual((r.status_code, r.json()["code"]), (403, "quota_exhausted"), r.text)
        listed = [s["name"] for s in bc.get("/v1/streams").json()["streams"]]
        self.assertEqual(sorted(listed), sorted(names))
        metrics = c.get("/metrics").text
        self.assertRegex(metrics, r"(?m)^weir_streams 3$")
        self.assertRegex(metrics, r"(?m)^weir_stream_creates_refused_total 2$")
        # A delete makes room.
        self.assertEqual(bc.delete(f"/v1/streams/{names[0]}").status_code, 202)
        self.assertEqual(bc.append("by-append", [{"body": "x"}])["start"]["seq_num"], 0)

    def test_basin_creates_past_max_basins_get_quota_exhausted(self):
        # The server's own basins (the default one, Kafka's) are made whatever
        # the cap, and count against it.
        server = start_server(args=["--max-basins", "3"])
        self.addCleanup(stop_server, server)
        c = Client(server)
        own = sorted(b["name"] for b in c.get("/v1/basins").json()["basins"])
        self.assertEqual(own, ["weir-default", "weir-kafka"])
        first, second = unique("cap"), unique("cap")
        tok = {"s2-request-token": unique("tok")}
        self.assertEqual(c.post("/v1/basins", json={"basin": first}, headers=tok).status_code, 201)
        r = c.post("/v1/basins", json={"basin": second})
        self.assertEqual((r.status_code, r.json()["code"]), (403, "quota_exhausted"), r.text)
        self.assertIn("--max-basins", r.json()["message"])
        r = c.put(f"/v1/basins/{second}", json={})
        self.assertEqual((r.status_code, r.json()["code"]), (403, "quota_exhausted"), r.text)
        self.assertEqual(c.get(f"/v1/basins/{second}").status_code, 404)
        # A basin that exists needs no room: a retry of its create, a PUT, a 409.
        r = c.post("/v1/basins", json={"basin": first}, headers=tok)
        self.assertEqual((r.status_code, r.headers.get("s2-provision-result")), (201, "noop"), r.text)
        r = c.put(f"/v1/basins/{first}", json={"config": {"create_stream_on_append": True}})
        self.assertEqual((r.status_code, r.headers.get("s2-provision-result")), (200, "updated"), r.text)
        r = c.post("/v1/basins", json={"basin": first})
        self.assertEqual((r.status_code, r.json()["code"]), (409, "resource_already_exists"), r.text)
        # A delete makes room.
        self.assertEqual(c.delete(f"/v1/basins/{first}").status_code, 202)
        self.assertEqual(c.put(f"/v1/basins/{second}", json={}).status_code, 201)
        names = sorted(b["name"] for b in c.get("/v1/basins").json()["basins"])
        self.assertEqual(names, sorted(own + [second]))

    def test_kafka_off_by_flag(self):
        server = start_server(args=["--kafka-addr", ""])
        self.addCleanup(stop_server, server)
        self.assertIsNone(server.kafka_addr)
        self.assertEqual(Client(server).get("/health").status_code, 200)

    def test_a_draining_server_ends_sse_sessions_with_an_error_event(self):
        server = start_server()
        self.addCleanup(server.cleanup)
        c = Client(server)
        s = unique("drain-sse")
        c.create_stream(s)
        c.append(s, [{"body": "before"}])
        sse = Sse(server, s, {"seq_num": 0}, timeout=120)
        self.addCleanup(sse.close)
        events = sse.events()
        first = next(events)
        self.assertEqual(first.get("event"), "batch", first)
        server.proc.send_signal(signal.SIGTERM)
        rest = list(events)
        errors = [e for e in rest if e.get("event") == "error"]
        self.assertEqual(len(errors), 1, rest)
        self.assertEqual(json.loads(errors[0]["data"])["code"], "server_draining", errors[0])
        self.assertEqual(server.stop(), 0)


class LifecycleTest(ClosingTestCase):
    """Restart, SIGTERM drain and the data-dir lock, on a server of its own."""

    def test_restart_drain_and_lock(self):
        server = start_server()
        self.addCleanup(server.cleanup)
        c = Client(server)
        basin = unique("life")
        self.assertEqual(c.post("/v1/basins", json={"basin": basin}).status_code, 201)
        bc = Client(server, basin=basin)
        cfg_stream = unique("cfg")
        bc.create_stream(cfg_stream, {"retention_policy": {"age": 3600}, "storage_class": "express"})
        bc.append(cfg_stream, [{"body": "in-basin"}])

        s = unique("life")
        c.create_stream(s)
        c.append(s, [{"body": "r0", "headers": [["h", "v"]]}, {"body": "r1"}])
        c.append(s, [{"body": b64(b"\x00\xff"), "headers": []}], fmt="base64")
        c.append(s, [fence("life-token")])
        pid = c.post("/v1/producers").json()["id"]
        c.append(s, [{"body": "prod"}], headers=producer_headers(pid, 0, 0), fencing_token="life-token")
        trimmed = unique("trimmed")
        c.create_stream(trimmed)
        c.append(trimmed, [{"body": f"t{i}"} for i in range(4)])
        c.append(trimmed, [trim_b64(2)], fmt="base64")
        before = {"s": c.read_all(s, fmt="base64"), "trimmed": c.read_all(trimmed),
                  "basin": bc.read_all(cfg_stream)}

        # A second server on the same data dir refuses to start: flags, then env vars.
        code, out = run_expecting_exit(server.command())
        self.assertIsNotNone(code, f"a second server started on a locked data dir:\n{out}")
        self.assertNotEqual(code, 0, out)
        self.assertIn("lock", out.lower(), out)
        # Also on the first one's own port (as two `weir serve` in one
        # directory with the default flags): the lock is named, not the port.
        code, out = run_expecting_exit([WEIR, "serve", "--data-dir", server.data_dir,
                                        "--http-addr", f"127.0.0.1:{server.port}", "--kafka-addr", ""])
        self.assertIsNotNone(code, f"a second server started on a locked data dir and a busy port:\n{out}")
        self.assertNotEqual(code, 0, out)
        self.assertIn("another weir server is using data dir", out, out)
        with tempfile.TemporaryDirectory() as cwd:
            code, out = run_expecting_exit([WEIR, "serve"], cwd=cwd, env={
                "WEIR_DATA_DIR": server.data_dir, "WEIR_HTTP_ADDR": "127.0.0.1:0",
                # Not the default Kafka port, which anything on the machine may hold.
                "WEIR_KAFKA_ADDR": "127.0.0.1:0"})
            self.assertIsNotNone(code, f"a second server (env vars) started on a locked data dir:\n{out}")
            self.assertNotEqual(code, 0, out)
            self.assertIn("lock", out.lower(), out)
            # The reason is said whatever WEIR_LOG_LEVEL says (spdlog took
            # words it does not know, upper case included, as "off").
            for level in ("INFO", "", "verbose", "off"):
                code, out = run_expecting_exit([WEIR, "serve"], cwd=cwd, env={
                    "WEIR_DATA_DIR": server.data_dir, "WEIR_HTTP_ADDR": "localhost:0", "WEIR_LOG_LEVEL": level,
                    "WEIR_KAFKA_ADDR": "127.0.0.1:0"})
                self.assertIsNotNone(code, f"WEIR_LOG_LEVEL={level!r}: a second server started:\n{out}")
                self.assertNotEqual(code, 0, out)
                self.assertIn("lock", out.lower(), f"WEIR_LOG_LEVEL={level!r}: {out}")
        self.assertEqual(c.get("/health").status_code, 200)  # the first one is unharmed

        # A Kafka listener on every interface needs an address to advertise.
        with tempfile.TemporaryDirectory() as d:
            for flags, needle in ((["--kafka-addr", "0.0.0.0:0"], "--kafka-advertised-addr"),
                                  (["--kafka-addr", ":0"], "--kafka-advertised-addr"),
                                  (["--kafka-addr", "127.0.0.1:0", "--kafka-advertised-addr", "0.0.0.0:9092"],
                                   "not an address a client can connect to"),
                                  (["--kafka-addr", "127.0.0.1:0", "--kafka-advertised-addr", "localhost:0"],
                                   "port 0"),
                                  (["--kafka-addr", "127.0.0.1:0", "--kafka-advertised-addr", "localhost:+80"],
                                   "bad port"),
                                  # A store that forgets everything with a metastore that would not,
                                  (["--object-store", "mem://", "--metastore", f"sqlite://{d}/meta.db"],
                                   "sqlite://:memory:"),
                                  # and the other way round.
                                  (["--metastore", "sqlite://:memory:"], "--metastore sqlite://:memory:"),
                                  (["--object-store", "mem://", "--wal-store", f"file://{d}/wal"],
                                   "use mem:// WAL stores with it"),
                                  # WAL flags are checked before the data dir is made.
                                  (["--node-id", "a/b"], "--node-id"),
                                  (["--pool-budget-mib", "4"], "--pool-budget-mib 4 must hold at least one slot"),
                                  # A slot is one bytea value on PostgreSQL (1 GB at most there).
                                  (["--wal-store", "postgres://127.0.0.1:1/x", "--max-slot-bytes", str(1 << 30),
                                    "--pool-budget-mib", "2048"], "the most a --wal-store on PostgreSQL takes"),
                                  (["--auth-token-file", d], "is a directory")):
                code, out = run_expecting_exit([WEIR, "serve", "--data-dir", f"{d}/data", "--http-addr", "127.0.0.1:0"]
                                               + flags)
                self.assertIsNotNone(code, f"weir serve {flags} started:\n{out}")
                self.assertNotEqual(code, 0, out)
                self.assertIn(needle, out, out)
                self.assertFalse(os.path.exists(f"{d}/data"), f"weir serve {flags} made its data dir")
            with open(f"{d}/token", "w") as f:
                f.write("two words\n")
            code, out = run_expecting_exit([WEIR, "serve", "--data-dir", f"{d}/data", "--http-addr", "127.0.0.1:0",
                                            "--auth-token-file", f"{d}/token"])
            self.assertNotEqual(code, None, out)
            self.assertIn("blanks or control characters", out)
            code, out = run_expecting_exit([WEIR, "serve", "--data-dir", "", "--http-addr", "127.0.0.1:0"], cwd=d)
            self.assertNotIn(code, (None, 0), out)
            self.assertIn("--data-dir must not be empty", out)
            self.assertEqual(sorted(os.listdir(d)), ["token"])

        # mem:// alone pairs with a metastore in memory: nothing is left on disk
        # to name objects the next start would not find.
        with WeirServer(WEIR, args=["--object-store", "mem://"]) as m:
            mc = Client(m)
            mc.create_stream("in-memory")
            mc.append("in-memory", [{"body": "x"}])
            self.assertFalse(os.path.exists(m.data_dir), os.listdir(m.data_dir) if os.path.isdir(m.data_dir) else "")

        # SIGTERM while appenders run: every acked record survives the restart.
        acked, unexpected, stop = [], [], threading.Event()
        busy = unique("busy")
        c.create_stream(busy)

        def appender(k):
            w = Client(server)
            i = 0
            while not stop.is_set():
                body = f"w{k}-{i}"
                try:
                    r = w.post(f"/v1/streams/{q(busy)}/records", json={"records": [{"body": body}]}, timeout=60)
                except requests.RequestException:
                    return
                if r.status_code == 429:
                    continue  # backpressure on a loaded machine: the same record again
                if r.status_code != 200:
                    if r.status_code != 503 or r.json().get("code") != "server_draining":
                        unexpected.append(f"{r.status_code} {r.text}")
                    return
                acked.append((r.json()["start"]["seq_num"], body))
                i += 1

        threads = [threading.Thread(target=appender, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(acked) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            server.stop()  # SIGTERM mid-traffic; exit status 0
        finally:
            stop.set()
            for t in threads:
                t.join(120)
        self.assertGreaterEqual(len(acked), 20)
        self.assertEqual(unexpected, [], "appends refused otherwise than with 503 server_draining")

        server.start()
        c = Client(server)
        bc = Client(server, basin=basin)
        self.assertEqual(c.get("/health").status_code, 200)
        stored = {r["seq_num"]: r["body"] for r in c.read_all(busy)}
        for seq, body in acked:
            self.assertEqual(stored.get(seq), body, f"acked record {seq} lost or changed")
        self.assertEqual(len(set(stored.values())), len(stored), "a record was stored twice")

        # Everything else is as it was.
        self.assertEqual(c.read_all(s, fmt="base64"), before["s"])
        self.assertEqual(c.read_all(trimmed), before["trimmed"])
        self.assertEqual(bc.read_all(cfg_stream), before["basin"])
        self.assertIn(basin, [b["name"] for b in c.get("/v1/basins", params={"prefix": basin}).json()["basins"]])
        cfg = bc.get(f"/v1/streams/{q(cfg_stream)}").json()
        self.assertEqual((cfg["retention_policy"], cfg["storage_class"]), ({"age": 3600}, "express"))
        self.assertEqual(c.tail(s)["seq_num"], 5)
        self.assertEqual(c.append(s, [{"body": "x"}], expect=412, fencing_token="stale"),
                         {"fencing_token_mismatch": "life-token"})
        dup = c.append(s, [{"body": "prod"}], headers=producer_headers(pid, 0, 0))
        self.assertIs(dup["duplicated"], True)
        self.assertEqual(dup["start"]["seq_num"], 4)
        self.assertEqual(c.tail(s)["seq_num"], 5)

        # Restart once more, idle: still the same, and a clean exit.
        server.restart()
        self.assertEqual(Client(server).read_all(s, fmt="base64"), before["s"])
        stop_server(server)

    def test_drain_ends_a_read_session_whose_client_stopped_reading(self):
        # The drain and stall timeouts are far longer than the stop's wait:
        # only the drain's closing of the stalled connection lets the server
        # exit in time.
        server = start_server(["--drain-timeout-s", "600", "--http-stall-timeout-s", "600"])
        self.addCleanup(server.cleanup)
        c = Client(server)
        s = unique("stuck")
        c.create_stream(s)
        body = "x" * 1000
        for _ in range(24):  # 24 MB, more than the loopback socket buffers hold
            c.append(s, [{"body": body}] * 1000)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        self.addCleanup(sock.close)
        sock.sendall(f"GET /v1/streams/{q(s)}/records?seq_num=0 HTTP/1.1\r\nHost: t\r\n"
                     "Accept: text/event-stream\r\n\r\n".encode())
        # The session is open (and fills the buffers; the client reads nothing).
        deadline = time.monotonic() + REQ_TIMEOUT
        while not re.search(r"^weir_read_sessions [1-9]", c.get("/metrics").text, re.M):
            self.assertLess(time.monotonic(), deadline, "the read session did not open")
            time.sleep(0.1)
        time.sleep(0.5)
        server.stop(timeout=120)

    def test_health_is_503_once_another_process_holds_the_node(self):
        # Two processes of one node id on one store and metastore (named, so
        # no data dir is locked): the second start supersedes the first, which
        # learns it from its next refused heartbeat (every 5 s), or sooner
        # from a refused change (retention, merges), says so, and serves the
        # node's streams no more.
        with tempfile.TemporaryDirectory() as d:
            args = ["--kafka-addr", "", "--object-store", "file://" + os.path.join(d, "objects"),
                    "--metastore", "sqlite://" + os.path.join(d, "meta.db")]
            first = WeirServer(WEIR, data_dir=os.path.join(d, "first"), args=args)
            second = WeirServer(WEIR, data_dir=os.path.join(d, "second"), args=args)
            for server in (first, second):
                ALL_SERVERS.append(server)
                self.addCleanup(server.cleanup)
            first.start()
            self.assertEqual(requests.get(first.url("/health"), timeout=30).json(), {"status": "ok"})
            c1 = Client(first, basin="superseded")
            self.assertEqual(c1.post("/v1/basins", json={"basin": "superseded"}).status_code, 201)
            c1.create_stream("s")
            c1.append("s", [{"body": "a"}])
            # A long poll at the tail: the first process ends it once it knows
            # (unwoken, it would answer 200 with no records after 60 s).
            polled = {}

            def poll():
                polled["r"] = Client(first, basin="superseded").get(
                    "/v1/streams/s/records", params={"seq_num": 1, "wait": 60}, timeout=120)

            poller = threading.Thread(target=poll)
            poller.start()
            deadline = time.monotonic() + 60
            while not re.search(r"(?m)^weir_long_polls [1-9]", c1.get("/metrics").text):  # it waits at the tail
                self.assertLess(time.monotonic(), deadline, "the read never waited")
                time.sleep(0.05)
            second.start()
            deadline = time.monotonic() + 120
            while True:
                r = requests.get(first.url("/health"), timeout=30)
                if r.status_code == 503:
                    break
                self.assertEqual(r.status_code, 200, r.text)
                self.assertLess(time.monotonic(), deadline, "the first process never learnt it was superseded")
                time.sleep(0.2)
            self.assertEqual(r.json(), {"status": "superseded"})
            self.assertEqual(requests.get(second.url("/health"), timeout=30).json(), {"status": "ok"})
            poller.join(150)
            self.assertFalse(poller.is_alive())
            r = polled["r"]
            self.assertEqual((r.status_code, r.json()["code"]), (503, "unavailable"), r.text)
            # It serves the streams no more (what it holds goes stale once the
            # second appends); the second serves them.
            for r in (c1.get("/v1/streams/s/records", params={"seq_num": 0}), c1.get("/v1/streams/s/records/tail"),
                      c1.post("/v1/streams/s/records", json={"records": [{"body": "b"}]})):
                self.assertEqual((r.status_code, r.json()["code"]), (503, "unavailable"), r.text)
            c2 = Client(second, basin="superseded")
            c2.append("s", [{"body": "b"}])
            self.assertEqual([x["body"] for x in c2.read_all("s")], ["a", "b"])
            second.stop()
            first.stop(expect_code=None)

    def test_a_signal_during_recovery_ends_the_process_at_once(self):
        # Every PUT takes 60 s, and recovery writes one (a first start claims
        # the store: _weir/deployment): the signal ends the process as it
        # would without a handler, not after the PUT and a drain. The next
        # start recovers.
        for sig in (signal.SIGTERM, signal.SIGINT):
            with tempfile.TemporaryDirectory() as d:
                data = os.path.join(d, "data")
                cmd = [WEIR, "serve", "--data-dir", data, "--http-addr", "127.0.0.1:0", "--kafka-addr", "",
                       "--inject-put-latency-ms", "60000"]
                with tempfile.TemporaryFile() as out:
                    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=dict(os.environ, WEIR_LOG_LEVEL="info"))

                    def recovering():
                        deadline = time.monotonic() + 60
                        while True:
                            out.seek(0)
                            text = out.read().decode(errors="replace")
                            if "weir serve: recovering" in text:
                                break
                            self.assertIsNone(p.poll(), text)
                            self.assertLess(time.monotonic(), deadline, text)
                            time.sleep(0.05)
                    code = ended_by(p, sig, timeout=50, before=recovering)  # the PUT would take 60 s
                    out.seek(0)
                    text = out.read().decode(errors="replace")
                self.assertEqual(code, -sig, text)
                self.assertIn("signal during recovery; stopping now", text)
                self.assertNotIn("listening on", text)
                server = WeirServer(WEIR, data_dir=data, args=["--kafka-addr", ""])
                self.addCleanup(server.cleanup)
                server.start()
                c = Client(server)
                s = unique("after")
                c.create_stream(s)
                c.append(s, [{"body": "x"}])
                self.assertEqual([r["body"] for r in c.read_all(s)], ["x"])
                server.stop()

    def test_a_signal_while_the_stores_open_ends_the_process_at_once(self):
        # An S3 endpoint that takes connections and never answers: the
        # start-up probe would retry for minutes. A signal meanwhile ends
        # the process at once, as during recovery.
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # connections wait in the backlog, unanswered
        self.addCleanup(silent.close)
        port = silent.getsockname()[1]
        with tempfile.TemporaryDirectory() as d:
            cmd = [WEIR, "serve", "--data-dir", os.path.join(d, "data"), "--http-addr", "127.0.0.1:0",
                   "--kafka-addr", "", "--object-store",
                   f"s3://bucket/p?endpoint=http://127.0.0.1:{port}&access_key=k&secret_key=s&region=us-east-1"]
            with tempfile.TemporaryFile() as out:
                p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

                def opening():
                    time.sleep(1.5)
                    self.assertIsNone(p.poll())
                code = ended_by(p, signal.SIGTERM, timeout=30, before=opening)
                out.seek(0)
                text = out.read().decode(errors="replace")
        self.assertEqual(code, -signal.SIGTERM, text)
        self.assertIn("signal during recovery; stopping now", text)

    def test_a_stderr_pipe_whose_reader_left_does_not_end_the_drain(self):
        # The log lines of the stop go to a pipe nobody reads any more: the
        # write fails (EPIPE) instead of killing the process (SIGPIPE), and
        # the drain ends with status 0.
        with tempfile.TemporaryDirectory() as d:
            cmd = [WEIR, "serve", "--data-dir", os.path.join(d, "data"), "--http-addr", "127.0.0.1:0",
                   "--kafka-addr", ""]
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                 env=dict(os.environ, WEIR_LOG_LEVEL="info"))

            def ready_then_reader_leaves():
                seen = b""
                while b"listening on" not in seen:
                    line = p.stderr.readline()
                    self.assertTrue(line, f"weir serve ended before it was ready:\n{seen.decode(errors='replace')}")
                    seen += line
                p.stderr.close()  # the reader leaves
            code = ended_by(p, signal.SIGTERM, timeout=120, before=ready_then_reader_leaves)
            self.assertEqual(code, 0, "weir serve did not end its drain cleanly (-13 is SIGPIPE)")

    def test_a_stderr_pipe_whose_reader_left_before_the_ready_line_does_not_end_the_server(self):
        # The ready line (printed at every log level) goes to a pipe nobody
        # reads any more: the server serves on (it ended with SIGABRT, the
        # failed write thrown out of it) and drains cleanly.
        with tempfile.TemporaryDirectory() as d:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            cmd = [WEIR, "serve", "--data-dir", os.path.join(d, "data"), "--http-addr", f"127.0.0.1:{port}",
                   "--kafka-addr", ""]
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                 env=dict(os.environ, WEIR_LOG_LEVEL="info"))

            def reader_leaves_then_server_serves():
                first = p.stderr.readline()
                self.assertNotIn(b"listening on", first)
                p.stderr.close()  # the reader leaves before the ready line
                deadline = time.monotonic() + 120
                while True:
                    self.assertIsNone(p.poll(), "weir serve ended (-6 is SIGABRT)")
                    try:
                        if requests.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200:
                            break
                    except requests.RequestException:
                        pass  # not listening yet
                    self.assertLess(time.monotonic(), deadline, "weir serve never became healthy")
                    time.sleep(0.05)
                s = unique("piped")
                r = requests.post(f"http://127.0.0.1:{port}/v1/streams", json={"stream": s}, timeout=REQ_TIMEOUT)
                self.assertEqual(r.status_code, 201, r.text)
                self.assertIsNone(p.poll(), "weir serve ended (-6 is SIGABRT)")
            code = ended_by(p, signal.SIGTERM, timeout=120, before=reader_leaves_then_server_serves)
            self.assertEqual(code, 0, "weir serve did not end cleanly")

    def test_drain_answers_appends_left_open_by_the_drain_timeout(self):
        # Every PUT takes 3 s and the drain gives up at once: the WAL's close
        # still acknowledges the append in flight before connections close.
        server = start_server(["--drain-timeout-s", "0", "--inject-put-latency-ms", "3000"])
        self.addCleanup(server.cleanup)
        c = Client(server)
        s = unique("late")
        c.create_stream(s)
        result = []

        def append():
            try:
                result.append(Client(server).post(f"/v1/streams/{q(s)}/records",
                                                  json={"records": [{"body": "late"}]}, timeout=120))
            except requests.RequestException as e:
                result.append(e)

        t = threading.Thread(target=append)
        t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the append is in the WAL pool, its PUT under way
            m = re.search(r"^weir_wal_pool_bytes (\S+)$", c.get("/metrics").text, re.M)
            if m and float(m.group(1)) > 0:
                break
            time.sleep(0.05)
        else:
            self.fail("the append never reached the WAL")
        server.stop()
        t.join(120)
        self.assertEqual(len(result), 1)
        self.assertIsInstance(result[0], requests.Response, f"no answer: {result[0]!r}")
        self.assertEqual(result[0].status_code, 200, result[0].text)
        seq = result[0].json()["start"]["seq_num"]
        server.start()
        self.assertEqual([(r["seq_num"], r["body"]) for r in Client(server).read_all(s)], [(seq, "late")])
        stop_server(server)


# --------------------------------------------------------------------------

def start_server(args=()):
    server = WeirServer(WEIR, args=args)
    ALL_SERVERS.append(server)
    server.start()
    return server


def stop_server(server):
    try:
        server.stop()
    finally:
        server.cleanup()


def setUpModule():
    global SHARED
    # Retention (and delete_on_empty) checked every second, not every minute.
    SHARED = start_server(["--retention-interval-s", "1"])


def tearDownModule():
    stop_server(SHARED)


def main():
    global WEIR
    args = sys.argv[1:]
    if args and not args[0].startswith("-"):
        WEIR = args.pop(0)
    if not WEIR or not os.access(WEIR, os.X_OK):
        sys.exit("usage: rest_api_test.py WEIR_BINARY [unittest args] (or set WEIR_BIN)")
    WEIR = os.path.abspath(WEIR)
    prog = unittest.main(argv=[sys.argv[0]] + args, exit=False, verbosity=2)
    ok = prog.result.wasSuccessful()
    if not ok:
        for server in ALL_SERVERS:
            print(f"\n{server.log_tail(40)}")
        failed = [t.id() for t, _ in prog.result.failures + prog.result.errors]
        for name, note in KNOWN_SERVER_BUGS.items():
            if any(f".{name}" in f for f in failed):
                print(f"known server bug, {name}: {note}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
