#!/usr/bin/python3
"""The Kafka listener of a real `weir serve` over raw sockets: what only the
transport shows (framing, pipelining, hostile bytes, many connections).
Protocol semantics are tests/kafka_broker_test.cc.

Usage: wire_test.py WEIR_BINARY [unittest arguments] (or WEIR_BIN=...).
Stdlib only. One server for every test, started with a 64 KiB request limit;
each test checks that bad input changed nothing and the server still serves.
No test asserts an upper bound on time; every wait is bounded.
"""
import os
import re
import socket
import struct
import sys
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "http"))
from weir_server import WeirServer  # noqa: E402

WEIR = os.environ.get("WEIR_BIN")
MAX_REQUEST = 65536
WAIT = 60  # seconds: a bound on any single wait, never a timing assertion
SERVER = None
TOPIC = "wire-topic"

API_PRODUCE, API_LIST_OFFSETS, API_METADATA, API_API_VERSIONS = 0, 2, 3, 18


# --------------------------------------------------------------------------
# Encoding (non-flexible versions: int16 strings, int32 arrays and bytes).

def i8(v): return struct.pack(">b", v)
def i16(v): return struct.pack(">h", v)
def i32(v): return struct.pack(">i", v)
def u32(v): return struct.pack(">I", v)
def i64(v): return struct.pack(">q", v)


def string(s):
    b = s.encode() if isinstance(s, str) else s
    return i16(len(b)) + b


def array(items):
    return i32(len(items)) + b"".join(items)


def uvarint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def varint(n):
    return uvarint((n << 1) if n >= 0 else ((-n) << 1) - 1)


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC32C_TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC32C_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def record_batch(values, ts=1700000000000):
    """An uncompressed RecordBatch v2 (magic 2) without a producer id."""
    recs = b""
    for i, v in enumerate(values):
        body = i8(0) + varint(0) + varint(i) + varint(-1) + varint(len(v)) + v + varint(0)
        recs += varint(len(body)) + body
    tail = (i16(0) + i32(len(values) - 1) + i64(ts) + i64(ts) + i64(-1) + i16(-1) + i32(-1)
            + i32(len(values)) + recs)
    head = i32(0) + i8(2) + u32(crc32c(tail))
    return i64(0) + i32(len(head) + len(tail)) + head + tail


def request(key, version, cid, body, client_id=b"wire-test"):
    return i16(key) + i16(version) + i32(cid) + string(client_id) + body


def frame(payload):
    return i32(len(payload)) + payload


def api_versions(cid, version=0):
    return request(API_API_VERSIONS, version, cid, b"")


def api_versions_v3(cid):
    # Flexible: header v2 (tagged fields), compact strings in the body.
    return (i16(API_API_VERSIONS) + i16(3) + i32(cid) + string(b"wire-test") + b"\x00"
            + uvarint(5) + b"weir" + uvarint(4) + b"1.0" + b"\x00")


def metadata(cid, topics, allow_create=True):
    """Metadata v4; topics None asks for all topics."""
    names = i32(-1) if topics is None else array([string(t) for t in topics])
    return request(API_METADATA, 4, cid, names + i8(1 if allow_create else 0))


def produce(cid, topic, batch, acks=1, partition=0):
    body = (i16(-1) + i16(acks) + i32(30000)
            + array([string(topic) + array([i32(partition) + i32(len(batch)) + batch])]))
    return request(API_PRODUCE, 3, cid, body)


def fetch(cid, topic, offset, max_wait_ms=0, min_bytes=1, partition=0):
    """Fetch v4."""
    body = (i32(-1) + i32(max_wait_ms) + i32(min_bytes) + i32(1 << 20) + i8(0)
            + array([string(topic) + array([i32(partition) + i64(offset) + i32(1 << 20)])]))
    return request(1, 4, cid, body)


def list_offsets(cid, topic, timestamp=-1, partition=0):
    body = i32(-1) + array([string(topic) + array([i32(partition) + i64(timestamp)])])
    return request(API_LIST_OFFSETS, 1, cid, body)


# --------------------------------------------------------------------------
# Decoding.

class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, n):
        if self.pos + n > len(self.data):
            raise ValueError(f"response truncated at {self.pos} (+{n} of {len(self.data)})")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def i8(self): return struct.unpack(">b", self.take(1))[0]
    def i16(self): return struct.unpack(">h", self.take(2))[0]
    def i32(self): return struct.unpack(">i", self.take(4))[0]
    def i64(self): return struct.unpack(">q", self.take(8))[0]

    def string(self):
        n = self.i16()
        return None if n < 0 else self.take(n).decode()

    def array(self, fn):
        n = self.i32()
        return [] if n < 0 else [fn() for _ in range(n)]

    def done(self):
        if self.pos != len(self.data):
            raise ValueError(f"{len(self.data) - self.pos} bytes left over")


def decode_api_versions(r, version):
    err = r.i16()
    apis = r.array(lambda: (r.i16(), r.i16(), r.i16()))
    if version >= 1:
        r.i32()
    r.done()
    return err, apis


def decode_produce(r):
    out = r.array(lambda: (r.string(), r.array(lambda: (r.i32(), r.i16(), r.i64(), r.i64()))))
    r.i32()
    r.done()
    (_, [(_, err, base, _)]), = out
    return err, base


def decode_list_offsets(r):
    out = r.array(lambda: (r.string(), r.array(lambda: (r.i32(), r.i16(), r.i64(), r.i64()))))
    r.done()
    (_, [(_, err, _, offset)]), = out
    return err, offset


def decode_fetch(r):
    """(error, high watermark, records bytes) of the only partition."""
    r.i32()  # throttle
    out = r.array(lambda: (r.string(), r.array(lambda: (
        r.i32(), r.i16(), r.i64(), r.i64(), r.array(lambda: (r.i64(), r.i64())), r.take(max(r.i32(), 0))))))
    r.done()
    (_, [(_, err, high, _, _, records)]), = out
    return err, high, records


def decode_metadata(r):
    r.i32()  # throttle
    brokers = r.array(lambda: (r.i32(), r.string(), r.i32(), r.string()))
    r.string()  # cluster id
    controller = r.i32()
    topics = r.array(lambda: (r.i16(), r.string(), r.i8(),
                              r.array(lambda: (r.i16(), r.i32(), r.i32(), r.array(r.i32), r.array(r.i32)))))
    r.done()
    return brokers, controller, {name: (err, parts) for err, name, _, parts in topics}


# --------------------------------------------------------------------------
# Sockets.

def host_port():
    host, port = SERVER.kafka_addr.rsplit(":", 1)
    return host, int(port)


def connect():
    s = socket.create_connection(host_port(), timeout=WAIT)
    s.settimeout(WAIT)
    return s


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def read_response(s, expect_cid=None):
    """One response: (correlation id, Reader over the body)."""
    size = struct.unpack(">i", recv_exact(s, 4))[0]
    payload = recv_exact(s, size)
    cid = struct.unpack(">i", payload[:4])[0]
    if expect_cid is not None and cid != expect_cid:
        raise AssertionError(f"correlation id {cid}, expected {expect_cid}")
    return cid, Reader(payload[4:])


def closed_by_server(s):
    """True when the server closes the connection without sending anything
    more (EOF or reset); False when bytes arrive first."""
    try:
        data = s.recv(65536)
    except ConnectionResetError:
        return True
    except socket.timeout:
        raise AssertionError(f"the server neither answered nor closed within {WAIT} s")
    return data == b""


def call(payload, cid):
    with connect() as s:
        s.sendall(frame(payload))
        return read_response(s, cid)[1]


def latest(topic=TOPIC, partition=0):
    err, offset = decode_list_offsets(call(list_offsets(9999, topic, -1, partition), 9999))
    if err != 0:
        raise AssertionError(f"ListOffsets {topic}[{partition}]: error {err}")
    return offset


def wait_latest(expected, topic=TOPIC):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        got = latest(topic)
        if got >= expected:
            return got
        time.sleep(0.02)
    return latest(topic)


def health():
    with urllib.request.urlopen(SERVER.url("/health"), timeout=WAIT) as r:
        return r.status


# --------------------------------------------------------------------------

def fetches_waiting():
    """The server's count of Kafka fetches waiting for data (long polls)."""
    with urllib.request.urlopen(SERVER.url("/metrics"), timeout=WAIT) as r:
        m = re.search(rb"(?m)^weir_kafka_fetches_waiting (\S+)$", r.read())
    assert m, "no weir_kafka_fetches_waiting in /metrics"
    return float(m.group(1))


class WireTest(unittest.TestCase):
    """Each test keeps the topic's expected high watermark in `expected`;
    tearDown checks that the server is up and nothing else landed."""

    expected = 0

    def setUp(self):
        self.assertTrue(SERVER.running(), "the server is not running")
        WireTest.expected = latest()

    def tearDown(self):
        self.assertTrue(SERVER.running(), "the server died")
        # A fresh connection still works, and no bad frame changed the log.
        err, apis = decode_api_versions(call(api_versions(4242, 2), 4242), 2)
        self.assertEqual(err, 0)
        self.assertTrue(apis)
        self.assertEqual(latest(), WireTest.expected)
        self.assertEqual(health(), 200)

    def test_pipelined_requests_are_answered_in_order(self):
        # 20 mixed requests in one write; the Produce at index 10 has acks=0
        # and gets no response. The produces of one connection are sequenced
        # in request order, so they take consecutive offsets in that order.
        batch = record_batch([b"pipelined"])
        base = WireTest.expected
        kinds = ["versions", "metadata", "produce", "offsets"] * 5
        kinds[10] = "produce0"
        reqs, expect, produced = [], [], 0
        for i, kind in enumerate(kinds):
            cid = 100 + i
            if kind == "versions":
                reqs.append(api_versions(cid, i % 3))
            elif kind == "metadata":
                reqs.append(metadata(cid, [TOPIC]))
            elif kind.startswith("produce"):
                reqs.append(produce(cid, TOPIC, batch, acks=0 if kind == "produce0" else 1))
            else:
                reqs.append(list_offsets(cid, TOPIC))
            if kind != "produce0":
                expect.append((cid, kind, i, base + produced))
            if kind.startswith("produce"):
                produced += 1
        with connect() as s:
            s.sendall(b"".join(frame(r) for r in reqs))
            for cid, kind, i, offset in expect:
                got, r = read_response(s)
                self.assertEqual(got, cid, f"response {i} out of order")
                if kind == "versions":
                    self.assertEqual(decode_api_versions(r, i % 3)[0], 0)
                elif kind == "metadata":
                    self.assertEqual(decode_metadata(r)[2][TOPIC][0], 0)
                elif kind == "produce":
                    self.assertEqual(decode_produce(r), (0, offset), f"produce {i}")
                else:
                    # Handled concurrently with the produces before it: any
                    # high watermark they may have reached.
                    err, high = decode_list_offsets(r)
                    self.assertEqual(err, 0)
                    self.assertGreaterEqual(high, base)
            # Nothing more: the acks=0 request left no response behind.
            s.sendall(frame(api_versions(999, 0)))
            self.assertEqual(read_response(s)[0], 999)
        WireTest.expected = base + produced
        self.assertEqual(wait_latest(WireTest.expected), WireTest.expected)

    def test_more_requests_in_flight_than_the_window(self):
        # More than the per-connection in-flight limit (64) in one write:
        # reading pauses and resumes; every response comes, in order.
        n = 150
        with connect() as s:
            s.sendall(b"".join(frame(api_versions(1000 + i, i % 3)) for i in range(n)))
            for i in range(n):
                cid, r = read_response(s)
                self.assertEqual(cid, 1000 + i)
                self.assertEqual(decode_api_versions(r, i % 3)[0], 0)

    def test_long_poll_fetch_wakes_on_a_produce_from_another_connection(self):
        offset = WireTest.expected
        with connect() as waiting, connect() as producer:
            # The client gives up (20 s) before the fetch's wait ends (30 s):
            # only a wake-up by the produce can answer in time.
            waiting.settimeout(20)
            before = fetches_waiting()
            waiting.sendall(frame(fetch(300, TOPIC, offset, max_wait_ms=30000, min_bytes=1)))
            # Produce only once the fetch waits: one handled after the
            # produce would answer at once, woken or not.
            deadline = time.monotonic() + WAIT
            low = before  # an earlier fetch may end meanwhile: above the lowest value seen
            while (g := fetches_waiting()) <= low:
                self.assertLess(time.monotonic(), deadline, "the fetch never waited")
                low = min(low, g)
                time.sleep(0.02)
            producer.sendall(frame(produce(301, TOPIC, record_batch([b"wake up"]), acks=-1)))
            self.assertEqual(decode_produce(read_response(producer, 301)[1]), (0, offset))
            WireTest.expected += 1
            err, high, records = decode_fetch(read_response(waiting, 300)[1])
            self.assertEqual(err, 0)
            self.assertEqual(high, offset + 1)
            self.assertIn(b"wake up", records)
            # The same connection serves the next request.
            waiting.sendall(frame(fetch(302, TOPIC, offset + 2)))
            err, _, records = decode_fetch(read_response(waiting, 302)[1])
            self.assertEqual(err, 1)  # OFFSET_OUT_OF_RANGE
            self.assertEqual(records, b"")

    def test_frames_split_across_writes(self):
        payload = frame(api_versions(7, 1)) + frame(metadata(8, [TOPIC]))
        with connect() as s:
            for i in range(0, len(payload), 3):
                s.sendall(payload[i:i + 3])
                time.sleep(0.001)
            err, _ = decode_api_versions(read_response(s, 7)[1], 1)
            self.assertEqual(err, 0)
            _, _, topics = decode_metadata(read_response(s, 8)[1])
            self.assertIn(TOPIC, topics)

    def test_oversized_size_prefix_closes_without_reading_the_body(self):
        for size in (MAX_REQUEST + 1, 0x7FFFFFFF, -1, -2147483648):
            with self.subTest(size=size), connect() as s:
                s.sendall(i32(size))  # and never the body
                self.assertTrue(closed_by_server(s))
        # Requests before it are answered first.
        with connect() as s:
            s.sendall(frame(api_versions(31, 0)) + i32(MAX_REQUEST + 1) + b"x" * 100)
            err, _ = decode_api_versions(read_response(s, 31)[1], 0)
            self.assertEqual(err, 0)
            self.assertTrue(closed_by_server(s))
        # A Produce of exactly the limit is read (and fails or succeeds on its own merits).
        with connect() as s:
            pad = MAX_REQUEST - len(produce(32, TOPIC, b""))
            body = produce(32, TOPIC, b"\x00" * pad)
            self.assertEqual(len(body), MAX_REQUEST)
            s.sendall(frame(body))
            err, _ = decode_produce(read_response(s, 32)[1])
            self.assertNotEqual(err, 0)  # not a record batch

    def test_truncated_frame_then_client_close(self):
        good = produce(40, TOPIC, record_batch([b"never"]))
        for cut in (2, 10, len(good) // 2, len(good) - 1):
            with connect() as s:
                s.sendall(i32(len(good)) + good[:cut])
            # The client is gone; the server must not care.
        with connect() as s:
            s.sendall(i32(len(good)) + good[:20])
            s.shutdown(socket.SHUT_WR)
            self.assertTrue(closed_by_server(s))

    def test_bad_frames_close_the_connection(self):
        batch = record_batch([b"bad"])
        good = produce(50, TOPIC, batch)
        # Records whose length runs past the frame.
        past = bytearray(good)
        at = len(good) - len(batch) - 4
        past[at:at + 4] = i32(len(batch) + 100)
        # A topic name that is not UTF-8, in a Produce and in a Metadata.
        bad_name_produce = request(API_PRODUCE, 3, 51, i16(-1) + i16(1) + i32(30000) + array(
            [i16(4) + b"ba\xc3\x28" + array([i32(0) + i32(len(batch)) + batch])]))
        bad_name_metadata = request(API_METADATA, 4, 52, array([i16(3) + b"\xed\xa0\x80"]) + i8(1))
        cases = {
            "empty frame": b"",
            "garbage": bytes(range(200, 256)) * 3,
            "header only, cut": good[:6],
            "string length past the frame": request(API_METADATA, 1, 53, i32(1) + i16(1000) + b"abc"),
            "records length past the frame": bytes(past),
            "array count past the frame": request(API_METADATA, 1, 54, i32(1000000)),
            "a byte left over": good + b"\x00",
            "invalid utf-8 topic (produce)": bad_name_produce,
            "invalid utf-8 topic (metadata)": bad_name_metadata,
            "unknown api key 4": request(4, 0, 55, b""),
            "unknown api key 1000": request(1000, 0, 56, b""),
            "negative api key": request(-5, 0, 57, b""),
            "produce v2": request(API_PRODUCE, 2, 58, good[len(request(0, 3, 0, b"")) + 2:]),
            "produce v9": request(API_PRODUCE, 9, 59, b""),
            "fetch v12": request(1, 12, 60, b"\x00" * 40),
        }
        for name, payload in cases.items():
            with self.subTest(name), connect() as s:
                s.sendall(frame(payload))
                self.assertTrue(closed_by_server(s), f"{name}: got bytes instead of a close")
        # Pipelined: what came before a bad frame is answered; what came
        # after it is neither answered nor applied, also while the request
        # before it is still in flight (a produce waiting for durability).
        for first in ("versions", "produce"):
            for bad in (b"\xff" * 12, request(4, 0, 71, b""), good[:-1]):
                with self.subTest(first=first, bad=bad[:12]), connect() as s:
                    head = api_versions(70, 2) if first == "versions" else produce(70, TOPIC, batch, acks=-1)
                    s.sendall(frame(head) + frame(bad)
                              + b"".join(frame(produce(72 + j, TOPIC, batch)) for j in range(5)))
                    r = read_response(s, 70)[1]
                    if first == "versions":
                        self.assertEqual(decode_api_versions(r, 2)[0], 0)
                    else:
                        self.assertEqual(decode_produce(r), (0, WireTest.expected))
                        WireTest.expected += 1
                    self.assertTrue(closed_by_server(s))
                self.assertEqual(latest(), WireTest.expected, "a request after a bad frame was applied")
        # None of it created a topic.
        _, _, topics = decode_metadata(call(metadata(90, None), 90))
        self.assertEqual(set(topics), {TOPIC})

    def test_api_versions_v3_gets_error_35_in_the_v0_layout(self):
        with connect() as s:
            s.sendall(frame(api_versions_v3(80)))
            err, apis = decode_api_versions(read_response(s, 80)[1], 0)
            self.assertEqual(err, 35)
            keys = {k: (lo, hi) for k, lo, hi in apis}
            self.assertEqual(keys[API_API_VERSIONS], (0, 2))
            self.assertEqual(keys[API_PRODUCE][1], 7)
            # The connection stays usable: the client retries with v2.
            s.sendall(frame(api_versions(81, 2)))
            err, apis2 = decode_api_versions(read_response(s, 81)[1], 2)
            self.assertEqual(err, 0)
            self.assertEqual(apis2, apis)

    def test_many_connections_at_once(self):
        n = 40
        errors = []
        socks = [connect() for _ in range(n)]
        try:
            def work(i, s):
                try:
                    s.sendall(frame(api_versions(i, 2)) + frame(metadata(1000 + i, [TOPIC]))
                              + frame(list_offsets(2000 + i, TOPIC)))
                    read_response(s, i)
                    brokers, controller, topics = decode_metadata(read_response(s, 1000 + i)[1])
                    if topics[TOPIC][0] != 0 or controller != brokers[0][0]:
                        errors.append(f"{i}: metadata {brokers} {controller} {topics}")
                    err, _ = decode_list_offsets(read_response(s, 2000 + i)[1])
                    if err:
                        errors.append(f"{i}: list offsets error {err}")
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(f"{i}: {e!r}")
            threads = [threading.Thread(target=work, args=(i, s)) for i, s in enumerate(socks)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(WAIT)
            self.assertFalse(any(t.is_alive() for t in threads), "a connection hung")
            self.assertEqual(errors, [])
        finally:
            for s in socks:
                s.close()

    def test_concurrent_producers_get_dense_offsets(self):
        n, per = 8, 10
        offsets, errors = [], []
        lock = threading.Lock()

        def work(i):
            try:
                with connect() as s:
                    reqs = [produce(i * 100 + j, TOPIC, record_batch([b"c%d-%d" % (i, j)]), acks=-1)
                            for j in range(per)]
                    s.sendall(b"".join(frame(r) for r in reqs))
                    got = []
                    for j in range(per):
                        err, off = decode_produce(read_response(s, i * 100 + j)[1])
                        if err:
                            errors.append(f"{i}/{j}: error {err}")
                        got.append(off)
                    if got != sorted(got):
                        errors.append(f"{i}: offsets of one connection out of order: {got}")
                    with lock:
                        offsets.extend(got)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(f"{i}: {e!r}")
        base = WireTest.expected
        threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        self.assertEqual(errors, [])
        self.assertEqual(sorted(offsets), list(range(base, base + n * per)))
        WireTest.expected = base + n * per


def setUpModule():
    global SERVER
    SERVER = WeirServer(WEIR, args=["--kafka-max-request-bytes", str(MAX_REQUEST)])
    SERVER.start()
    try:
        if not SERVER.kafka_addr:
            raise RuntimeError("the server did not report a Kafka address\n" + SERVER.log_tail())
        # The topic every test checks: created by Metadata, one record in it.
        _, _, topics = decode_metadata(call(metadata(1, [TOPIC]), 1))
        if topics[TOPIC][0] != 0:
            raise AssertionError(f"metadata of {TOPIC}: {topics}")
        err, _ = decode_produce(call(produce(2, TOPIC, record_batch([b"seed"]), acks=-1), 2))
        if err != 0:
            raise AssertionError(f"produce error {err}")
    except BaseException:
        SERVER.cleanup()  # tearDownModule does not run after a failed setUpModule
        raise


def tearDownModule():
    if SERVER is None:
        return
    try:
        alive = SERVER.running()
        # Stop with a long poll still waiting: the drain ends it.
        poll = connect() if alive else None
        if poll:
            poll.sendall(frame(fetch(9, TOPIC, latest(), max_wait_ms=5000)))
        SERVER.stop()  # SIGTERM; exit status 0 expected
        if poll:
            poll.close()
        if not alive:
            raise AssertionError("the server was not running at the end")
    finally:
        SERVER.cleanup()


def main():
    global WEIR
    args = sys.argv[1:]
    if args and not args[0].startswith("-"):
        WEIR = args.pop(0)
    if not WEIR or not os.access(WEIR, os.X_OK):
        sys.exit("usage: wire_test.py WEIR_BINARY [unittest args] (or set WEIR_BIN)")
    WEIR = os.path.abspath(WEIR)
    prog = unittest.main(argv=[sys.argv[0]] + args, exit=False, verbosity=2)
    ok = prog.result.wasSuccessful()
    if not ok and SERVER is not None:
        print(SERVER.log_tail(60))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
