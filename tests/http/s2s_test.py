#!/usr/bin/python3
"""Integration tests of HTTP/2 and S2S sessions on `weir serve`'s REST port
(docs/http-api.md, "HTTP/2 and S2S sessions"), with a raw HTTP/2 client, so
that frames S2's SDKs never send (bad lengths, compression, terminal frames
from the client, resets) are covered too. The SDK itself runs over S2S in
tests/js.

Usage: s2s_test.py WEIR_BINARY [unittest arguments]. Needs python3-h2 and
python3-requests (Debian). No test asserts an upper bound on time.
"""
import gzip
import http.client
import json
import os
import re
import socket
import sys
import threading
import time
import unittest
import uuid

import h2.config
import h2.connection
import h2.events
import h2.settings
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rest_api_test import pb_append_ack, pb_append_input, pb_append_record, pb_read_batch  # noqa: E402
from weir_server import WeirServer  # noqa: E402

WEIR = os.environ.get("WEIR_BIN")
SERVER = None
TIMEOUT = 60  # seconds for any one wait


def frame(message, flag=0):
    body = bytes([flag]) + message
    return len(body).to_bytes(3, "big") + body


def parse_frames(data):
    """Whole S2S frames in `data`: [(flag, payload)], and the bytes left over."""
    out, i = [], 0
    while len(data) - i >= 3:
        n = int.from_bytes(data[i:i + 3], "big")
        if len(data) - i < 3 + n:
            break
        out.append((data[i + 3], bytes(data[i + 4:i + 3 + n])))
        i += 3 + n
    return out, bytes(data[i:])


def terminal(flag, payload):
    """(status, JSON body) of a terminal frame, or None for a regular one."""
    if not flag & 0x80:
        return None
    return int.from_bytes(payload[:2], "big"), json.loads(payload[2:])


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def wait_for_pool_bytes(base, at_least=1):
    """Waits until the server at `base` holds `at_least` bytes of appends in its WAL pool."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        m = re.search(r"^weir_wal_pool_bytes (\S+)$", requests.get(f"{base}/metrics", timeout=TIMEOUT).text, re.M)
        if m and float(m.group(1)) >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"the server at {base} held less than {at_least} bytes in its WAL pool for {TIMEOUT} s")


def metric(base, line_start):
    """The value of the /metrics line of the server at `base` starting with `line_start`."""
    text = requests.get(f"{base}/metrics", timeout=TIMEOUT).text
    m = re.search(r"^" + re.escape(line_start) + r" (\S+)$", text, re.M)
    if not m:
        raise AssertionError(f"no metric {line_start} in /metrics")
    return float(m.group(1))


def wait_for_metric(base, line_start, at_least):
    deadline = time.monotonic() + TIMEOUT
    while metric(base, line_start) < at_least:
        if time.monotonic() > deadline:
            raise AssertionError(f"{line_start} stayed below {at_least} for {TIMEOUT} s")
        time.sleep(0.05)


def start_with_stream(test, prefix, args=()):
    """A server of the test's own (stopped at cleanup) and a new stream on it: (server, stream)."""
    server = WeirServer(WEIR, args=list(args)).start()
    test.addCleanup(server.cleanup)
    stream = unique(prefix)
    requests.post(f"{server.base_url}/v1/streams", json={"stream": stream}, timeout=TIMEOUT).raise_for_status()
    return server, stream


class H2Client:
    """A blocking HTTP/2 client over one cleartext connection (prior knowledge)."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        cfg = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.conn = h2.connection.H2Connection(config=cfg)
        self.conn.initiate_connection()
        self.streams = {}
        self.hold = set()  # streams whose data is not acknowledged: their window stays shut
        self.closed = False
        self.open_at_goaway = None
        self.flush()

    def close(self):
        self.sock.close()

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def request(self, method, path, headers=(), body=None, end=True):
        sid = self.conn.get_next_available_stream_id()
        hdrs = [(":method", method), (":path", path), (":scheme", "http"), (":authority", "127.0.0.1")]
        hdrs += list(headers)
        self.streams[sid] = {"status": None, "headers": {}, "data": bytearray(), "ended": False, "reset": None}
        self.conn.send_headers(sid, hdrs, end_stream=end and body is None)
        if body is not None:
            self.send(sid, body, end=end)
        self.flush()
        return sid

    def send(self, sid, data, end=False):
        """Sends `data` on stream `sid`, waiting for flow-control window as needed."""
        view = memoryview(data)
        while view:
            window = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
            if window <= 0:
                self.pump(lambda: self.conn.local_flow_control_window(sid) > 0)
                continue
            self.conn.send_data(sid, bytes(view[:window]))
            view = view[window:]
            self.flush()
        if end:
            self.conn.end_stream(sid)
        self.flush()

    def end(self, sid):
        self.conn.end_stream(sid)
        self.flush()

    def reset(self, sid):
        self.conn.reset_stream(sid)
        self.flush()

    def pump(self, until):
        while not until():
            if self.closed:
                raise AssertionError("the server closed the connection")
            data = self.sock.recv(65536)
            if not data:
                self.closed = True
                continue
            for ev in self.conn.receive_data(data):
                st = self.streams.get(getattr(ev, "stream_id", None))
                if isinstance(ev, h2.events.ResponseReceived):
                    st["headers"] = dict(ev.headers)
                    st["status"] = int(st["headers"][":status"])
                elif isinstance(ev, h2.events.DataReceived):
                    st["data"] += ev.data
                    if ev.stream_id not in self.hold:
                        self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded):
                    st["ended"] = True
                elif isinstance(ev, h2.events.StreamReset) and st is not None:
                    st["reset"] = ev.error_code
                    st["ended"] = True
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    # GOAWAY: which streams were still open when it came.
                    self.open_at_goaway = {sid for sid, st in self.streams.items() if not st["ended"]}
                    self.closed = True
            self.flush()

    def wait_end(self, sid):
        self.pump(lambda: self.streams[sid]["ended"])
        return self.streams[sid]

    def wait_frames(self, sid, n):
        """Waits for `n` whole S2S frames on `sid`; returns them."""
        self.pump(lambda: len(parse_frames(self.streams[sid]["data"])[0]) >= n or self.streams[sid]["ended"])
        return parse_frames(self.streams[sid]["data"])[0]


def setUpModule():
    global SERVER
    SERVER = WeirServer(WEIR, args=["--max-request-bytes", "65536"]).start()


def tearDownModule():
    if SERVER:
        try:
            SERVER.stop()
        finally:
            SERVER.cleanup()


class S2sTest(unittest.TestCase):
    def setUp(self):
        self.h2 = H2Client(SERVER.port)
        self.addCleanup(self.h2.close)

    def new_stream(self):
        name = unique("s2s")
        r = requests.post(f"{SERVER.base_url}/v1/streams", json={"stream": name}, timeout=TIMEOUT)
        self.assertEqual(r.status_code, 201, r.text)
        return name

    def append_session(self, stream, body=b"", end=False, headers=()):
        return self.h2.request("POST", f"/v1/streams/{stream}/records",
                               [("content-type", "s2s/proto")] + list(headers), body=body, end=end)

    def records(self, stream):
        r = requests.get(f"{SERVER.base_url}/v1/streams/{stream}/records", params={"seq_num": 0}, timeout=TIMEOUT)
        self.assertEqual(r.status_code, 200, r.text)
        return [rec["body"] for rec in r.json()["records"]]

    def test_a_stream_config_of_the_wrong_types_is_refused_and_the_server_lives(self):
        # Each once made the server abort (an uncaught JSON type error in an
        # HTTP/2 callback); now each gets 400 bad_header and creates nothing.
        for cfg in ('{"storage_class":1}', '{"timestamping":{"mode":7}}', '{"timestamping":{"uncapped":"yes"}}',
                    '{"delete_on_empty":{"min_age_secs":-1}}'):
            with self.subTest(cfg=cfg):
                stream = unique("s2s-cfg")
                sid = self.append_session(stream, end=True, headers=[("s2-stream-config", cfg)])
                st = self.h2.wait_end(sid)
                self.assertEqual(st["status"], 400, bytes(st["data"]))
                self.assertEqual(json.loads(bytes(st["data"]))["code"], "bad_header", bytes(st["data"]))
                r = requests.get(f"{SERVER.base_url}/v1/streams/{stream}/records/tail", timeout=TIMEOUT)
                self.assertEqual(r.status_code, 404, r.text)
        r = requests.get(f"{SERVER.base_url}/health", timeout=TIMEOUT)
        self.assertEqual(r.status_code, 200, r.text)

    def test_heads_waiting_for_their_bodies_hold_at_most_256_kib_of_headers(self):
        # HPACK lets a client repeat a long header field for a byte or two,
        # and a head may wait for its body: a connection's open streams hold
        # at most 256 KiB of headers; a head past that is reset.
        stream = self.new_stream()
        pad = [(f"x-pad-{i}", "p" * 4000) for i in range(15)]  # about 60 KB a head (64 KiB a stream)
        sids = [self.h2.request("POST", f"/v1/streams/{stream}/records",
                                [("content-type", "application/json")] + pad, end=False) for _ in range(6)]
        self.h2.pump(lambda: sum(self.h2.streams[sid]["reset"] is not None for sid in sids) >= 2)
        reset = [sid for sid in sids if self.h2.streams[sid]["reset"] is not None]
        self.assertEqual(len(sids) - len(reset), 4, "four heads of about 60 KB fit in 256 KiB")
        # The ones held still take their bodies.
        held = [sid for sid in sids if sid not in reset]
        self.h2.send(held[0], json.dumps({"records": [{"body": "after"}]}).encode(), end=True)
        self.assertEqual(self.h2.wait_end(held[0])["status"], 200)
        self.assertEqual(self.records(stream), ["after"])

    def test_heads_handed_over_count_no_more_against_the_256_kib(self):
        # Long-lived reads keep their streams open, but their heads went to
        # the handler with the request: six of about 60 KB each are served.
        stream = self.new_stream()
        pad = [(f"x-pad-{i}", "p" * 4000) for i in range(15)]
        sids = [self.h2.request("GET", f"/v1/streams/{stream}/records?seq_num=0",
                                [("accept", "text/event-stream")] + pad) for _ in range(6)]
        self.h2.pump(lambda: all(self.h2.streams[sid]["status"] is not None or self.h2.streams[sid]["reset"] is not None
                                 for sid in sids))
        self.assertEqual([self.h2.streams[sid]["status"] for sid in sids], [200] * 6,
                         [self.h2.streams[sid]["reset"] for sid in sids])
        for sid in sids:
            self.h2.reset(sid)

    def test_append_session_acks_each_input_in_order(self):
        stream = self.new_stream()
        inputs = [frame(pb_append_input([pb_append_record(f"r{i}".encode())])) for i in range(3)]
        sid = self.append_session(stream, b"".join(inputs))
        frames = self.h2.wait_frames(sid, 3)
        self.assertEqual(self.h2.streams[sid]["status"], 200)
        self.assertEqual(self.h2.streams[sid]["headers"]["content-type"], "s2s/proto")
        # A frame split across DATA frames, then two records in one input.
        more = frame(pb_append_input([pb_append_record(b"r3"), pb_append_record(b"r4")]))
        self.h2.send(sid, more[:5])
        self.h2.send(sid, more[5:], end=True)
        st = self.h2.wait_end(sid)
        frames, rest = parse_frames(st["data"])
        self.assertEqual(rest, b"")
        self.assertEqual(len(frames), 4)
        acks = [pb_append_ack(p) for f, p in frames if terminal(f, p) is None]
        self.assertEqual([(a["start"]["seq_num"], a["end"]["seq_num"]) for a in acks],
                         [(0, 1), (1, 2), (2, 3), (3, 5)])
        self.assertEqual(self.records(stream), ["r0", "r1", "r2", "r3", "r4"])

    def test_a_frame_of_the_largest_size_fits_the_window_left_after_acked_ones(self):
        # nghttp2 offers the client more window once half of it was given
        # back. Two acked inputs give back 2,097,150 bytes (2 bytes short of
        # half the old 4 MiB window), so no WINDOW_UPDATE; a frame of the
        # largest size then needs 2,097,155 bytes of the 2,097,154 left. The
        # window must fit it, or the client and server wait on each other
        # (our own window holds it: no stall reset either).
        stream = self.new_stream()

        def input_of(total):
            n = total - 32
            while True:
                f = frame(pb_append_input([pb_append_record(b"x" * n)]))
                if len(f) == total:
                    return f
                n += total - len(f)

        half = (4 << 20) // 2
        first, second = input_of(1 << 20), input_of(half - 2 - (1 << 20))
        self.assertEqual(len(first) + len(second), half - 2)
        sid = self.append_session(stream, first + second)
        acks = self.h2.wait_frames(sid, 2)
        self.assertEqual([terminal(f, p) for f, p in acks], [None, None], acks)
        # The largest frame the server reads: its 3-byte length says 2 MiB.
        largest = (2 << 20).to_bytes(3, "big") + b"\0" + b"\xff" * ((2 << 20) - 1)
        self.h2.send(sid, largest, end=True)
        st = self.h2.wait_end(sid)
        frames, _ = parse_frames(st["data"])
        self.assertIsNotNone(terminal(*frames[-1]), frames[-1][:1])  # refused (not an AppendInput), not hung
        r = requests.get(f"{SERVER.base_url}/v1/streams/{stream}/records/tail", timeout=TIMEOUT)
        self.assertEqual(r.json()["tail"]["seq_num"], 2, r.text)

    def test_gzip_frames_are_accepted(self):
        stream = self.new_stream()
        msg = pb_append_input([pb_append_record(b"z" * 3000)])
        sid = self.append_session(stream, frame(gzip.compress(msg), flag=0x40), end=True)
        st = self.h2.wait_end(sid)
        frames, _ = parse_frames(st["data"])
        self.assertEqual(len(frames), 1)
        self.assertIsNone(terminal(*frames[0]))
        self.assertEqual(self.records(stream), ["z" * 3000])

    def check_terminal(self, payload, status, code, acked=1):
        """One good input, then `payload`: its ack, then a terminal frame."""
        stream = self.new_stream()
        good = frame(pb_append_input([pb_append_record(b"ok")]))
        sid = self.append_session(stream, good + payload, end=False)
        st = self.h2.wait_end(sid)
        frames, _ = parse_frames(st["data"])
        self.assertEqual(len(frames), acked + 1, frames)
        for f, p in frames[:acked]:
            self.assertIsNone(terminal(f, p))
        t = terminal(*frames[-1])
        self.assertIsNotNone(t, frames[-1])
        self.assertEqual(t[0], status, t)
        if code:
            self.assertEqual(t[1].get("code"), code, t)
        self.assertEqual(self.records(stream), ["ok"])  # nothing after the bad frame was written
        self.assertEqual(self.wait_reset(sid), 0)  # the client may stop sending: RST_STREAM(NO_ERROR)
        return t

    def wait_reset(self, sid):
        """The RST_STREAM code that follows a response ended before the request."""
        self.h2.pump(lambda: self.h2.streams[sid]["reset"] is not None)
        return self.h2.streams[sid]["reset"]

    def test_bad_frames_end_the_session_after_earlier_acks(self):
        self.check_terminal(b"\x00\x00\x00", 400, "bad_frame")                       # length 0
        self.check_terminal(frame(b"", flag=0x60), 400, "bad_frame")                 # compression 3
        self.check_terminal(frame(b"\x00\xc8{}", flag=0x80), 400, "bad_frame")       # a terminal frame
        self.check_terminal(frame(b"\xff\xff\xff"), 400, "bad_proto")                # not an AppendInput
        self.check_terminal(frame(b"not gzip", flag=0x40), 400, "bad_frame")         # bad gzip
        self.check_terminal(b"\x20\x00\x01", 400, "bad_frame")                       # over 2 MiB
        self.check_terminal(frame(pb_append_input([pb_append_record(b"x")], fencing_token="f" * 37)), 422, "invalid")

    def test_input_ending_inside_a_frame_is_an_error(self):
        stream = self.new_stream()
        whole = frame(pb_append_input([pb_append_record(b"ok")]))
        sid = self.append_session(stream, whole + whole[:4], end=True)
        frames, _ = parse_frames(self.h2.wait_end(sid)["data"])
        self.assertEqual(len(frames), 2)
        self.assertEqual(terminal(*frames[1])[0], 400)

    def test_match_seq_num_miss_is_a_412_terminal(self):
        stream = self.new_stream()
        # Input pipelined behind the miss ("c") is not appended.
        body = frame(pb_append_input([pb_append_record(b"a")], match_seq_num=0)) + \
            frame(pb_append_input([pb_append_record(b"b")], match_seq_num=5)) + \
            frame(pb_append_input([pb_append_record(b"c")]))
        sid = self.append_session(stream, body)
        frames, _ = parse_frames(self.h2.wait_end(sid)["data"])
        self.assertEqual(len(frames), 2, frames)
        self.assertEqual(terminal(*frames[1]), (412, {"seq_num_mismatch": 1}))
        self.assertEqual(self.wait_reset(sid), 0)
        probe = self.append_session(stream, frame(pb_append_input([pb_append_record(b"d")])), end=True)
        self.h2.wait_end(probe)
        self.assertEqual(self.records(stream), ["a", "d"])

    def test_a_session_whose_stream_is_made_again_appends_nothing_to_the_new_one(self):
        # A session appends to the stream it opened: once that is deleted and
        # a stream made again under its name, the next input ends the session
        # with 404 rather than landing at seq 0 of the new stream (an ack
        # going backwards, in a stream someone else just made).
        stream = self.new_stream()
        sid = self.append_session(stream, frame(pb_append_input([pb_append_record(b"old")])))
        self.assertEqual(len(self.h2.wait_frames(sid, 1)), 1)
        r = requests.delete(f"{SERVER.base_url}/v1/streams/{stream}", timeout=TIMEOUT)
        self.assertEqual(r.status_code, 202, r.text)
        deadline = time.monotonic() + TIMEOUT
        while True:  # the name is taken until the delete is done
            r = requests.post(f"{SERVER.base_url}/v1/streams", json={"stream": stream}, timeout=TIMEOUT)
            if r.status_code != 409 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(r.status_code, 201, r.text)
        self.h2.send(sid, frame(pb_append_input([pb_append_record(b"stray")])), end=True)
        frames, _ = parse_frames(self.h2.wait_end(sid)["data"])
        self.assertEqual(len(frames), 2, frames)
        self.assertIsNone(terminal(*frames[0]))
        t = terminal(*frames[1])
        self.assertEqual((t[0], t[1]["code"]), (404, "stream_not_found"), t)
        r = requests.get(f"{SERVER.base_url}/v1/streams/{stream}/records/tail", timeout=TIMEOUT)
        self.assertEqual(r.json()["tail"]["seq_num"], 0, r.text)

    def test_missing_stream_is_a_plain_404(self):
        sid = self.append_session(unique("absent"), frame(pb_append_input([pb_append_record(b"x")])), end=True)
        st = self.h2.wait_end(sid)
        self.assertEqual(st["status"], 404)
        self.assertEqual(json.loads(st["data"])["code"], "stream_not_found")

    def test_producer_headers_on_a_session_are_refused(self):
        # One producer sequence cannot name a session's many inputs: refused,
        # not ignored (a retried session would append its inputs again).
        stream = self.new_stream()
        one = frame(pb_append_input([pb_append_record(b"x")]))
        producer = [("weir-producer-id", "1"), ("weir-producer-epoch", "0"), ("weir-producer-seq", "0")]
        sid = self.append_session(stream, one, end=True, headers=producer)
        st = self.h2.wait_end(sid)
        self.assertEqual(st["status"], 400)
        self.assertEqual(json.loads(st["data"])["code"], "bad_header")
        r = requests.post(f"{SERVER.base_url}/v1/streams/{stream}/records", data=one,
                          headers={"content-type": "s2s/proto", "weir-producer-seq": "0"}, timeout=TIMEOUT)
        self.assertEqual(r.status_code, 400, r.text)
        self.assertEqual(r.json()["code"], "bad_header")
        tail = requests.get(f"{SERVER.base_url}/v1/streams/{stream}/records/tail", timeout=TIMEOUT)
        self.assertEqual(tail.json()["tail"]["seq_num"], 0, "nothing appended")

    def test_read_session_sends_batches_then_heartbeats(self):
        stream = self.new_stream()
        requests.post(f"{SERVER.base_url}/v1/streams/{stream}/records", timeout=TIMEOUT,
                      json={"records": [{"body": "one"}, {"body": "two"}]}).raise_for_status()
        hdrs = [("content-type", "s2s/proto"), ("accept", "application/protobuf")]
        # Bounded: two records, then the stream ends with no terminal frame.
        sid = self.h2.request("GET", f"/v1/streams/{stream}/records?seq_num=0&count=2", hdrs)
        st = self.h2.wait_end(sid)
        self.assertEqual(st["status"], 200)
        frames, _ = parse_frames(st["data"])
        batches = [pb_read_batch(p) for f, p in frames]
        self.assertTrue(all(terminal(f, p) is None for f, p in frames))
        self.assertEqual([r["body"] for b in batches for r in b["records"]], [b"one", b"two"])
        self.assertEqual(batches[-1]["tail"]["seq_num"], 2)
        # Following at the tail: a heartbeat (no records, the tail), then a live record.
        sid = self.h2.request("GET", f"/v1/streams/{stream}/records?seq_num=2", hdrs)
        frames = self.h2.wait_frames(sid, 1)
        beat = pb_read_batch(frames[0][1])
        self.assertEqual(beat["records"], [])
        self.assertEqual(beat["tail"]["seq_num"], 2)
        requests.post(f"{SERVER.base_url}/v1/streams/{stream}/records", timeout=TIMEOUT,
                      json={"records": [{"body": "three"}]}).raise_for_status()
        got = []
        self.h2.pump(lambda: any(r["body"] == b"three" for f, p in parse_frames(self.h2.streams[sid]["data"])[0]
                                 for r in pb_read_batch(p)["records"]))
        for f, p in parse_frames(self.h2.streams[sid]["data"])[0]:
            got += pb_read_batch(p)["records"]
        self.assertEqual([(r["seq_num"], r["body"]) for r in got], [(2, b"three")])
        self.h2.reset(sid)

    def test_read_frames_are_compressed_as_the_client_accepts(self):
        stream = self.new_stream()
        requests.post(f"{SERVER.base_url}/v1/streams/{stream}/records", timeout=TIMEOUT,
                      json={"records": [{"body": "c" * 3000}]}).raise_for_status()
        def read(accept_encoding):
            hdrs = [("content-type", "s2s/proto")]
            if accept_encoding:
                hdrs.append(("accept-encoding", accept_encoding))
            sid = self.h2.request("GET", f"/v1/streams/{stream}/records?seq_num=0&count=1", hdrs)
            frames, _ = parse_frames(self.h2.wait_end(sid)["data"])
            self.assertEqual(len(frames), 1)
            return frames[0]
        flag, payload = read("gzip, deflate")
        self.assertEqual(flag & 0x60, 0x40)  # gzip
        self.assertEqual(pb_read_batch(gzip.decompress(payload))["records"][0]["body"], b"c" * 3000)
        flag, _ = read("gzip;q=0.5,\tZSTD")
        self.assertEqual(flag & 0x60, 0x20)  # zstd preferred, as on S2
        flag, payload = read(None)
        self.assertEqual(flag & 0x60, 0)
        self.assertEqual(pb_read_batch(payload)["records"][0]["body"], b"c" * 3000)
        flag, _ = read("br")
        self.assertEqual(flag & 0x60, 0)
        # q=0 refuses a coding (RFC 9110): the next acceptable one is used.
        flag, _ = read("zstd;q=0, gzip")
        self.assertEqual(flag & 0x60, 0x40)
        flag, _ = read("zstd; Q=0.000, gzip;q=0.0")
        self.assertEqual(flag & 0x60, 0)
        flag, _ = read("zstd;q=0.001")
        self.assertEqual(flag & 0x60, 0x20)

    def test_read_past_the_tail_is_a_plain_416(self):
        stream = self.new_stream()
        sid = self.h2.request("GET", f"/v1/streams/{stream}/records?seq_num=10&count=1",
                              [("content-type", "s2s/proto")])
        st = self.h2.wait_end(sid)
        self.assertEqual(st["status"], 416)
        self.assertEqual(json.loads(st["data"])["tail"]["seq_num"], 0)

    def test_requests_still_served_count_against_100_streams_once_reset(self):
        # An HTTP/2 connection has 100 streams (SETTINGS_MAX_CONCURRENT_STREAMS);
        # requests still being served count against them even once their
        # streams were reset (the server still holds their work): a stream
        # opened meanwhile is refused with RST_STREAM(REFUSED_STREAM), which
        # clients retry.
        stream = self.new_stream()
        h2c = H2Client(SERVER.port)
        self.addCleanup(h2c.close)
        h2c.pump(lambda: h2c.conn.remote_settings.max_concurrent_streams == 100)
        poll = f"/v1/streams/{stream}/records?seq_num=0&wait=30"  # long polls at the tail
        polls = [h2c.request("GET", poll) for _ in range(100)]
        wait_for_metric(SERVER.base_url, "weir_http_requests_open", 101)  # all being served (and the scrape)
        # Reset every long poll, and at once (in the same write) open more. A
        # long poll may notice its reset (on its 1 s tick) just before they
        # come: of five, at least one is refused.
        for sid in polls:
            h2c.conn.reset_stream(sid)
        for _ in range(4):
            h2c.conn.send_headers(h2c.conn.get_next_available_stream_id(), [
                (":method", "GET"), (":path", f"/v1/streams/{stream}/records/tail"), (":scheme", "http"),
                (":authority", "127.0.0.1")], end_stream=True)
        after_reset = h2c.request("GET", f"/v1/streams/{stream}/records/tail")  # flushes all five
        extra = [sid for sid in range(after_reset - 8, after_reset + 1, 2)]
        for sid in extra:
            h2c.streams.setdefault(sid, {"status": None, "headers": {}, "data": bytearray(), "ended": False,
                                         "reset": None})
        h2c.pump(lambda: all(h2c.streams[sid]["ended"] for sid in extra))
        self.assertIn(7, [h2c.streams[sid]["reset"] for sid in extra])  # REFUSED_STREAM
        # Once the long polls have noticed (within their 1 s tick), streams are served again.
        deadline = time.monotonic() + TIMEOUT
        while True:
            sid = h2c.request("GET", f"/v1/streams/{stream}/records/tail")
            st = h2c.wait_end(sid)
            if st["status"] == 200:
                break
            self.assertEqual(st["reset"], 7, st)
            self.assertLess(time.monotonic(), deadline, "streams were refused for good")
            time.sleep(0.2)
        self.assertEqual(json.loads(st["data"])["tail"]["seq_num"], 0)

    def test_sessions_share_a_connection_and_survive_a_reset(self):
        stream = self.new_stream()
        reader = self.h2.request("GET", f"/v1/streams/{stream}/records?seq_num=0",
                                 [("content-type", "s2s/proto")])
        doomed = self.append_session(stream, frame(pb_append_input([pb_append_record(b"a")])))
        self.h2.wait_frames(doomed, 1)
        self.h2.reset(doomed)
        writer = self.append_session(stream, frame(pb_append_input([pb_append_record(b"b")])), end=True)
        self.h2.wait_end(writer)
        self.h2.pump(lambda: sum(len(pb_read_batch(p)["records"])
                                 for f, p in parse_frames(self.h2.streams[reader]["data"])[0]) >= 2)
        self.assertEqual(self.records(stream), ["a", "b"])

    def test_plain_requests_over_http2(self):
        stream = self.new_stream()
        sid = self.h2.request("POST", f"/v1/streams/{stream}/records", [("content-type", "application/json")],
                              body=json.dumps({"records": [{"body": "plain"}]}).encode())
        st = self.h2.wait_end(sid)
        self.assertEqual(st["status"], 200, st)
        self.assertEqual(json.loads(st["data"])["end"]["seq_num"], 1)
        sid = self.h2.request("GET", f"/v1/streams/{stream}/records?seq_num=0")
        st = self.h2.wait_end(sid)
        self.assertEqual([r["body"] for r in json.loads(st["data"])["records"]], ["plain"])
        # Over --max-request-bytes (64 KiB): 413, and the connection stays usable.
        # The body is left open: the 413 comes early, then RST_STREAM(NO_ERROR).
        sid = self.h2.request("POST", f"/v1/streams/{stream}/records", [("content-type", "application/json")],
                              body=b"x" * 70000, end=False)
        st = self.h2.wait_end(sid)
        self.assertEqual(st["status"], 413)
        self.assertEqual(json.loads(st["data"])["code"], "request_too_large")
        self.assertEqual(self.wait_reset(sid), 0)
        sid = self.h2.request("GET", f"/v1/streams/{stream}/records/tail")
        self.assertEqual(json.loads(self.h2.wait_end(sid)["data"])["tail"]["seq_num"], 1)
        sid = self.h2.request("GET", "/no/such/route")
        self.assertEqual(self.h2.wait_end(sid)["status"], 404)
        # HEAD: the headers of a GET, no DATA.
        sid = self.h2.request("HEAD", f"/v1/streams/{stream}/records/tail")
        st = self.h2.wait_end(sid)
        self.assertEqual(st["status"], 200)
        self.assertEqual(bytes(st["data"]), b"")

    def test_a_content_length_over_the_limit_is_refused_before_the_body(self):
        # As on HTTP/1.1: a declared length over --max-request-bytes (64 KiB
        # here) is answered 413 on the head, not once the client sent 64 KiB.
        stream = self.new_stream()
        sid = self.h2.request("POST", f"/v1/streams/{stream}/records",
                              [("content-type", "application/json"), ("content-length", "100000")], end=False)
        st = self.h2.wait_end(sid)
        self.assertEqual(st["status"], 413, bytes(st["data"]))
        self.assertEqual(json.loads(bytes(st["data"]))["code"], "request_too_large", bytes(st["data"]))
        r = requests.get(f"{SERVER.base_url}/v1/streams/{stream}/records/tail", timeout=TIMEOUT)
        self.assertEqual(r.json()["tail"]["seq_num"], 0, r.text)

    def test_a_client_that_stops_reading_is_resumed_by_its_window_updates(self):
        # Read sessions whose batches wait for the client's window (over 4 MiB
        # of them): the server must keep reading the socket, or it would never
        # see the WINDOW_UPDATEs that let them drain.
        stream = self.new_stream()
        chunk = frame(pb_append_input([pb_append_record(b"r" * 1000) for _ in range(900)]))
        self.h2.wait_end(self.append_session(stream, chunk * 6, end=True))
        self.h2.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1024})
        self.h2.flush()
        readers = [self.h2.request("GET", f"/v1/streams/{stream}/records?seq_num=0&count=5400",
                                   [("content-type", "s2s/proto")]) for _ in range(6)]
        self.h2.pump(lambda: all(len(self.h2.streams[r]["data"]) >= 1024 for r in readers))
        self.h2.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 8 << 20})
        self.h2.conn.increment_flow_control_window(64 << 20)
        self.h2.flush()
        for r in readers:
            frames, _ = parse_frames(self.h2.wait_end(r)["data"])
            self.assertEqual(sum(len(pb_read_batch(p)["records"]) for f, p in frames), 5400)

    def test_append_session_over_http1_reads_the_input_whole(self):
        stream = self.new_stream()
        body = b"".join(frame(pb_append_input([pb_append_record(f"h{i}".encode())])) for i in range(2))
        r = requests.post(f"{SERVER.base_url}/v1/streams/{stream}/records", data=body,
                          headers={"content-type": "s2s/proto"}, timeout=TIMEOUT)
        self.assertEqual(r.status_code, 200)
        frames, rest = parse_frames(r.content)
        self.assertEqual(rest, b"")
        self.assertEqual([pb_append_ack(p)["end"]["seq_num"] for f, p in frames], [1, 2])
        self.assertEqual(self.records(stream), ["h0", "h1"])


class CreateOnAppendTest(unittest.TestCase):
    def test_an_http1_session_whose_first_input_is_invalid_creates_no_stream(self):
        base = SERVER.base_url
        basin = unique("s2sauto")
        requests.post(f"{base}/v1/basins", json={"basin": basin, "config": {"create_stream_on_append": True}},
                      timeout=TIMEOUT).raise_for_status()
        hdrs = {"content-type": "s2s/proto", "s2-basin": basin}
        bad = frame(pb_append_input([pb_append_record(b"x", headers=[(b"", b"x"), (b"a", b"b")])]))
        for body in (bad, frame(b"\xff\xff\xff"), bad[:4]):  # refused by the append; not an input; cut short
            r = requests.post(f"{base}/v1/streams/never/records", data=body, headers=hdrs, timeout=TIMEOUT)
            self.assertEqual(r.status_code, 422, r.text)
            r = requests.get(f"{base}/v1/streams/never", headers={"s2-basin": basin}, timeout=TIMEOUT)
            self.assertEqual(r.status_code, 404, r.text)
        # One a new stream would refuse: a new stream's answer, and no stream.
        for input_, answer in ((pb_append_input([pb_append_record(b"x")], match_seq_num=5), {"seq_num_mismatch": 0}),
                               (pb_append_input([pb_append_record(b"x")], fencing_token=b"abc"),
                                {"fencing_token_mismatch": ""})):
            r = requests.post(f"{base}/v1/streams/never/records", data=frame(input_), headers=hdrs, timeout=TIMEOUT)
            self.assertEqual((r.status_code, r.json()), (412, answer), r.text)
            r = requests.get(f"{base}/v1/streams/never", headers={"s2-basin": basin}, timeout=TIMEOUT)
            self.assertEqual(r.status_code, 404, r.text)
        good = frame(pb_append_input([pb_append_record(b"ok")]))
        r = requests.post(f"{base}/v1/streams/fresh/records", data=good, headers=hdrs, timeout=TIMEOUT)
        self.assertEqual(r.status_code, 200, r.text)
        frames, _ = parse_frames(r.content)
        self.assertEqual([pb_append_ack(p)["end"]["seq_num"] for _, p in frames], [1])


class DecompressionTest(unittest.TestCase):
    def test_compressed_frames_are_decoded_a_few_at_a_time(self):
        # 4,000 gzip frames of about 1.5 KB, each an input of one 1.5 MiB
        # record (over the batch limit): decoded all at once they would take
        # 6 GiB. The first is refused; the rest are never decoded.
        server, stream = start_with_stream(self, "bomb")
        bomb = frame(gzip.compress(pb_append_input([pb_append_record(b"\0" * (3 << 19))])), flag=0x40)
        r = requests.post(f"{server.base_url}/v1/streams/{stream}/records", data=bomb * 4000,
                          headers={"content-type": "s2s/proto"}, timeout=TIMEOUT)
        self.assertEqual(r.status_code, 200, r.text)
        frames, _ = parse_frames(r.content)
        self.assertEqual(len(frames), 1)
        self.assertEqual(terminal(*frames[0])[0], 422, frames[0])
        with open(f"/proc/{server.proc.pid}/status") as f:
            peak_kib = int(re.search(r"^VmHWM:\s+(\d+) kB", f.read(), re.M).group(1))
        self.assertLess(peak_kib, 1 << 20, "the server's peak resident memory passed 1 GiB")
        r = requests.get(f"{server.base_url}/v1/streams/{stream}/records/tail", timeout=TIMEOUT)
        self.assertEqual(r.json()["tail"]["seq_num"], 0, r.text)


class RefusedBodyTest(unittest.TestCase):
    def test_a_refused_body_is_freed_while_its_answer_waits_for_the_window(self):
        # 40 bodies of 1 MiB + 1 over HTTP/2, each refused with 413 at the
        # limit, from a client whose stream windows are shut (initial window
        # 0): the answers' bodies cannot go out, so the streams stay open.
        # The bodies taken so far must go at the refusal, not when the
        # stream closes: 40 MiB held outside every budget otherwise.
        server = WeirServer(WEIR, args=["--max-request-bytes", "1048576"]).start()
        self.addCleanup(server.cleanup)
        with open(f"/proc/{server.proc.pid}/maps") as f:
            if "libasan" in f.read():
                self.skipTest("ASan's quarantine keeps freed memory resident")
        stream = unique("refused")
        requests.post(f"{server.base_url}/v1/streams", json={"stream": stream}, timeout=TIMEOUT).raise_for_status()

        def rss_kib():
            with open(f"/proc/{server.proc.pid}/status") as f:
                return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1))

        h2c = H2Client(server.port)
        self.addCleanup(h2c.close)
        h2c.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        h2c.flush()
        # One refusal first: what the server allocates for any of them is in the baseline.
        first = h2c.request("POST", f"/v1/streams/{stream}/records", [("content-type", "application/json")],
                            body=b"x" * ((1 << 20) + 1), end=False)
        h2c.pump(lambda: h2c.streams[first]["status"] is not None)
        before = rss_kib()
        sids = []
        for _ in range(40):
            sid = h2c.request("POST", f"/v1/streams/{stream}/records", [("content-type", "application/json")],
                              body=b"x" * ((1 << 20) + 1), end=False)
            h2c.pump(lambda: h2c.streams[sid]["status"] is not None)
            sids.append(sid)
        self.assertEqual({h2c.streams[sid]["status"] for sid in sids}, {413})
        self.assertTrue(all(not h2c.streams[sid]["ended"] for sid in sids), "an answer went out through a shut window")
        grown_mib = (rss_kib() - before) / 1024
        self.assertLess(grown_mib, 20, f"the server kept {grown_mib:.0f} MiB of refused bodies")
        # Once the window opens, every answer arrives whole.
        h2c.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 65535})
        h2c.flush()
        for sid in sids:
            self.assertEqual(json.loads(h2c.wait_end(sid)["data"])["code"], "request_too_large")


class InputBudgetTest(unittest.TestCase):
    def start(self):
        """A server with 4 MiB for request bodies, an HTTP/2 client, and a new stream's records path."""
        server, stream = start_with_stream(self, "budget", args=["--http-max-in-flight-mib", "4"])
        h2c = H2Client(server.port)
        self.addCleanup(h2c.close)
        return server, h2c, f"/v1/streams/{stream}/records"

    def test_session_input_counts_against_the_request_budget(self):
        # S2S input a session holds (here half frames, which it keeps until
        # whole) counts against --http-max-in-flight-mib with request
        # bodies: once it would pass it, the session that sent the bytes
        # ends with a terminal 429 after the acks of what it took.
        server, h2c, path = self.start()
        ctype = [("content-type", "s2s/proto")]
        held = 1_500_000
        half = (2_000_000).to_bytes(3, "big") + b"\0" * (held - 3)  # never whole
        a = h2c.request("POST", path, ctype, body=half, end=False)
        b = h2c.request("POST", path, ctype, body=half, end=False)
        wait_for_metric(server.base_url, "weir_http_request_bytes_in_flight", 2 * held)
        # A third session: one whole input (acked), then half a frame that
        # does not fit beside the two held.
        self.ends_with_429_after_one_ack(h2c, path, half)
        self.assertGreaterEqual(metric(server.base_url, "weir_http_request_budget_refusals_total"), 1)
        # The sessions holding input are untouched, and give it back when reset.
        self.assertFalse(h2c.streams[a]["ended"] or h2c.streams[b]["ended"])
        h2c.reset(a)
        h2c.reset(b)
        deadline = time.monotonic() + TIMEOUT
        while metric(server.base_url, "weir_http_request_bytes_in_flight") > 0:
            self.assertLess(time.monotonic(), deadline, "the budget was not given back")
            time.sleep(0.05)
        # With room again, a session takes a large input.
        d = h2c.request("POST", path, ctype, body=frame(pb_append_input([pb_append_record(b"y" * 1_000_000)])),
                        end=True)
        frames, _ = parse_frames(h2c.wait_end(d)["data"])
        self.assertEqual(len(frames), 1, frames)
        self.assertIsNone(terminal(*frames[0]))
        r = requests.get(f"{server.base_url}{path}", params={"seq_num": 0}, headers={"s2-format": "base64"},
                         timeout=TIMEOUT)
        self.assertEqual(len(r.json()["records"]), 2, r.text[:200])
        self.assertEqual(metric(server.base_url, "weir_http_request_bytes_in_flight"), 0)

    def test_a_round_over_the_budget_ends_with_429_whatever_follows_it(self):
        # An input whose decoded records do not fit, then a frame that does
        # not decode, in one round: the first failure is the 429 (retryable),
        # not the bad frame's 400 after an input neither appended nor acked.
        server, h2c, path = self.start()
        held = self.hold_three_mb(server, h2c, path)
        big = frame(pb_append_input([pb_append_record(b"m", headers=[(b"h", b"")] * 20_000)]))
        self.ends_with_429_after_one_ack(h2c, path, big + frame(b"\xff\xff"))
        self.release(server, h2c, held)

    def ends_with_429_after_one_ack(self, h2c, path, more):
        """A session with one whole input (acked), then `more`, which does not
        fit: it ends with a terminal 429 after that one ack."""
        c = h2c.request("POST", path, [("content-type", "s2s/proto")],
                        body=frame(pb_append_input([pb_append_record(b"taken")])), end=False)
        self.assertEqual(len(h2c.wait_frames(c, 1)), 1)
        h2c.send(c, more)
        frames, _ = parse_frames(h2c.wait_end(c)["data"])
        self.assertEqual(len(frames), 2, frames)
        self.assertIsNone(terminal(*frames[0]))
        t = terminal(*frames[1])
        self.assertEqual((t[0], t[1]["code"]), (429, "rate_limited"), t)

    def hold_three_mb(self, server, h2c, path):
        """Two sessions holding half frames: 3 MB of the 4 MiB budget, until reset."""
        half = (2_000_000).to_bytes(3, "big") + b"\0" * (1_500_000 - 3)  # never whole
        held = [h2c.request("POST", path, [("content-type", "s2s/proto")], body=half, end=False) for _ in range(2)]
        wait_for_metric(server.base_url, "weir_http_request_bytes_in_flight", 3_000_000)
        return held

    def release(self, server, h2c, held):
        for sid in held:
            h2c.reset(sid)
        deadline = time.monotonic() + TIMEOUT
        while metric(server.base_url, "weir_http_request_bytes_in_flight") > 0:
            self.assertLess(time.monotonic(), deadline, "the budget was not given back")
            time.sleep(0.05)

    def test_decoded_records_count_against_the_request_budget(self):
        # A body's decoded form may take far more room than its bytes (a
        # header ("h", "") is 5 bytes of protobuf and 73 decoded; a gzip body may
        # decode to 8 MiB): what it adds is taken from the budget too, and an
        # append it does not fit is 429 (with nothing appended) instead of
        # memory past --http-max-in-flight-mib.
        server, h2c, path = self.start()
        url = f"{server.base_url}{path}"
        # (Protobuf: a JSON body's parse takes its own share first, tested below.)
        many_headers = pb_append_input([pb_append_record(b"h", headers=[(b"h", b"")] * 20_000)])
        # 1 MB of body and 1 MB of white space: 2 MB decoded.
        inflated = gzip.compress(json.dumps({"records": [{"body": "g" * 1_000_000}]}).encode() + b" " * 1_000_000)
        self.assertLess(len(many_headers), 200_000)
        self.assertLess(len(inflated), 20_000)
        gz = {"content-type": "application/json", "content-encoding": "gzip"}
        held = self.hold_three_mb(server, h2c, path)
        refusals = metric(server.base_url, "weir_backpressure_total")
        proto = {"content-type": "application/protobuf"}
        for body, headers in ((many_headers, proto), (inflated, gz)):
            r = requests.post(url, data=body, headers=headers, timeout=TIMEOUT)
            self.assertEqual(r.status_code, 429, r.text[:300])
            self.assertIn("bytes decoded" if body is many_headers else "decodes to", r.json()["message"])
            self.assertEqual(r.json()["code"], "rate_limited", r.text[:300])
            self.assertEqual(r.headers.get("Retry-After"), "1")
            self.assertIn("--http-max-in-flight-mib", r.json()["message"])
        self.assertEqual(metric(server.base_url, "weir_backpressure_total"), refusals + 2)
        self.assertEqual(metric(server.base_url, "weir_http_request_bytes_in_flight"), 3_000_000)
        tail = requests.get(f"{url}/tail", timeout=TIMEOUT).json()["tail"]["seq_num"]
        self.assertEqual(tail, 0)  # nothing appended
        # With the room back, both are appended (a request alone always fits).
        self.release(server, h2c, held)
        for body, headers in ((many_headers, proto), (inflated, gz)):
            r = requests.post(url, data=body, headers=headers, timeout=TIMEOUT)
            self.assertEqual(r.status_code, 200, r.text[:300])
        first, second = (requests.get(url, params={"seq_num": n, "count": 1}, timeout=TIMEOUT).json()["records"]
                         for n in (0, 1))
        self.assertEqual([len(first[0]["headers"]), len(second[0]["body"])], [20_000, 1_000_000])
        self.assertEqual(metric(server.base_url, "weir_http_request_bytes_in_flight"), 0)

    def test_a_json_append_parse_counts_against_the_request_budget(self):
        # Parsing JSON takes about 15 times the body (simdjson's tape and
        # index), whatever it appends: a body of fields the server ignores
        # (gzip makes megabytes of them from a few KiB) appends one small
        # record. Past what a thread's parser keeps (2 MiB), the parse's
        # share is taken from the budget while it runs. (16 MiB here: the
        # body decoded, 2.2 MB, fits beside the 3 MB held; its parse does not.)
        server, stream = start_with_stream(self, "parse", args=["--http-max-in-flight-mib", "16"])
        h2c = H2Client(server.port)
        self.addCleanup(h2c.close)
        path = f"/v1/streams/{stream}/records"
        url = f"{server.base_url}{path}"
        padded = gzip.compress(json.dumps({"records": [{"body": "p", "pad": "x" * 2_200_000}]}).encode())
        self.assertLess(len(padded), 20_000)
        gz = {"content-type": "application/json", "content-encoding": "gzip"}
        held = self.hold_three_mb(server, h2c, path)
        r = requests.post(url, data=padded, headers=gz, timeout=TIMEOUT)
        self.assertEqual(r.status_code, 429, r.text[:300])
        self.assertEqual(r.json()["code"], "rate_limited", r.text[:300])
        self.assertIn("parsing", r.json()["message"])
        self.assertIn("--http-max-in-flight-mib", r.json()["message"])
        # Its share is given back with the answer.
        self.assertEqual(metric(server.base_url, "weir_http_request_bytes_in_flight"), 3_000_000)
        self.assertEqual(requests.get(f"{url}/tail", timeout=TIMEOUT).json()["tail"]["seq_num"], 0)
        # A small body's parse takes no share: it is appended beside the held bytes.
        r = requests.post(url, json={"records": [{"body": "small"}]}, timeout=TIMEOUT)
        self.assertEqual(r.status_code, 200, r.text[:300])
        # With the room back, the padded body is appended (a request alone always fits).
        self.release(server, h2c, held)
        r = requests.post(url, data=padded, headers=gz, timeout=TIMEOUT)
        self.assertEqual(r.status_code, 200, r.text[:300])
        records = requests.get(url, params={"seq_num": 0}, timeout=TIMEOUT).json()["records"]
        self.assertEqual([x["body"] for x in records], ["small", "p"])
        self.assertEqual(metric(server.base_url, "weir_http_request_bytes_in_flight"), 0)

    def test_a_session_input_whose_decoded_records_do_not_fit_ends_it_with_429(self):
        # S2S: a round's decoded inputs take their room beside their frames
        # until they are submitted; a round that does not fit ends the
        # session with a terminal 429 after the acks of what it took.
        server, h2c, path = self.start()
        ctype = [("content-type", "s2s/proto")]
        held = self.hold_three_mb(server, h2c, path)
        many = frame(pb_append_input([pb_append_record(b"m", headers=[(b"h", b"")] * 20_000)]))
        self.assertLess(len(many), 200_000)
        self.ends_with_429_after_one_ack(h2c, path, many)
        self.assertEqual(metric(server.base_url, "weir_http_request_bytes_in_flight"), 3_000_000)
        # With the room back, the same input is taken, and its room given back.
        self.release(server, h2c, held)
        d = h2c.request("POST", path, ctype, body=many, end=True)
        frames, _ = parse_frames(h2c.wait_end(d)["data"])
        self.assertEqual(len(frames), 1, frames)
        self.assertIsNone(terminal(*frames[0]))
        r = requests.get(f"{server.base_url}{path}", params={"seq_num": 0}, timeout=TIMEOUT)
        self.assertEqual([len(x["headers"]) for x in r.json()["records"]], [0, 20_000])
        self.assertEqual(metric(server.base_url, "weir_http_request_bytes_in_flight"), 0)

    def test_a_session_alone_takes_a_round_larger_than_the_budget(self):
        # As a request alone always fits: a session holding nothing but its
        # own input takes a round whose decoded records pass the whole budget
        # (an input of 60,000 headers: about 4.4 MB decoded, 4 MiB budget).
        server, h2c, path = self.start()
        huge = frame(pb_append_input([pb_append_record(b"m", headers=[(b"h", b"")] * 60_000)]))
        self.assertLess(len(huge), 500_000)
        c = h2c.request("POST", path, [("content-type", "s2s/proto")], body=huge, end=True)
        frames, _ = parse_frames(h2c.wait_end(c)["data"])
        self.assertEqual(len(frames), 1, frames)
        self.assertIsNone(terminal(*frames[0]))
        self.assertEqual(metric(server.base_url, "weir_http_request_bytes_in_flight"), 0)

    def test_an_http2_body_over_the_budget_gets_429_at_once(self):
        # Plain HTTP/2 bodies take from the same budget as they arrive: one
        # that does not fit beside those held is answered 429 at once (the
        # connection's other streams go on), and its bytes are let go.
        server, h2c, path = self.start()
        # (Protobuf: a JSON body's parse takes 15 times its bytes, which two
        # of 1 MB would not find in this budget.)
        proto_type = [("content-type", "application/protobuf")]
        body = pb_append_input([pb_append_record(b"z" * 1_000_000)])  # about 1 MB
        held = [h2c.request("POST", path, proto_type, body=body, end=False) for _ in range(2)]
        wait_for_metric(server.base_url, "weir_http_request_bytes_in_flight", 2 * len(body))
        over = h2c.request("POST", path, [("content-type", "application/json")], body=b"[" * 2_500_000, end=False)
        st = h2c.wait_end(over)
        self.assertEqual(st["status"], 429, st)
        self.assertEqual(json.loads(st["data"])["code"], "rate_limited")
        self.assertEqual(st["headers"].get("retry-after"), "1")
        self.assertEqual(metric(server.base_url, "weir_http_request_bytes_in_flight"), 2 * len(body))
        # The held bodies, finished, are appended.
        for sid in held:
            h2c.end(sid)
        for sid in held:
            self.assertEqual(h2c.wait_end(sid)["status"], 200)
        self.assertEqual(metric(server.base_url, "weir_http_request_bytes_in_flight"), 0)


class StallTest(unittest.TestCase):
    """--http-stall-timeout-s on HTTP/2: a body that never ends, and response
    data the client's window never lets through, are not held for ever."""

    @classmethod
    def setUpClass(cls):
        # 3 s: the client here is Python on a loaded 2-core machine (and the
        # server may run under ASan); a shorter timeout would test the
        # scheduler, not the server.
        cls.server = WeirServer(WEIR, args=["--http-stall-timeout-s", "3"]).start()

    @classmethod
    def tearDownClass(cls):
        try:
            cls.server.stop()
        finally:
            cls.server.cleanup()

    def test_a_body_that_never_ends_is_reset(self):
        client = H2Client(self.server.port)
        self.addCleanup(client.close)
        sid = client.request("POST", "/v1/basins", [("content-type", "application/json")], body=b'{"basin":',
                             end=False)
        client.pump(lambda: client.streams[sid]["reset"] is not None)
        self.assertEqual(client.streams[sid]["reset"], 8)  # CANCEL
        # The connection serves on.
        sid = client.request("GET", "/health")
        self.assertEqual(client.wait_end(sid)["status"], 200)

    def test_a_head_that_never_ends_is_reset(self):
        # HEADERS without END_HEADERS, then silence: the stream (which never
        # reached a handler) is reset, so it cannot hold the connection open
        # for good. Raw frames: the h2 library will not send half a head.
        sock = socket.create_connection(("127.0.0.1", self.server.port), timeout=TIMEOUT)
        self.addCleanup(sock.close)
        block = bytes([0x82, 0x86, 0x84])  # :method GET, :scheme http, :path / (HPACK static table)
        headers = len(block).to_bytes(3, "big") + bytes([0x1, 0x0]) + (1).to_bytes(4, "big") + block
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 0x4, 0, 0, 0, 0, 0]) + headers)
        buf, deadline = b"", time.monotonic() + 30
        reset = closed = False
        while not (reset or closed) and time.monotonic() < deadline:
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                length, kind, sid = int.from_bytes(buf[:3], "big"), buf[3], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                reset |= kind == 0x3 and sid == 1
                buf = buf[9 + length:]
            if reset:
                break
            data = sock.recv(65536)
            closed = not data
            buf += data
        self.assertTrue(reset or closed, "the half-sent head held its stream open")

    def stream_and_client(self, prefix):
        """A new stream, and an HTTP/2 connection to open sessions on."""
        stream = unique(prefix)
        requests.post(f"{self.server.base_url}/v1/streams", json={"stream": stream},
                      timeout=TIMEOUT).raise_for_status()
        client = H2Client(self.server.port)
        self.addCleanup(client.close)
        return stream, client

    def test_an_append_session_sitting_on_half_a_frame_is_reset(self):
        # An append session may idle between frames as long as it likes, but
        # half a frame is held no longer than the stall timeout.
        stream, client = self.stream_and_client("stall")
        one = frame(pb_append_input([pb_append_record(b"whole")]))
        idle = client.request("POST", f"/v1/streams/{stream}/records", [("content-type", "s2s/proto")], body=one,
                              end=False)
        client.wait_frames(idle, 1)
        half = frame(pb_append_input([pb_append_record(b"x" * 100)]))[:20]
        sid = client.request("POST", f"/v1/streams/{stream}/records", [("content-type", "s2s/proto")], body=half,
                             end=False)
        client.pump(lambda: client.streams[sid]["ended"])
        self.assertEqual(client.streams[sid]["reset"], 8)  # CANCEL
        # The idle session (whole frames only) lives on.
        self.assertIsNone(client.streams[idle]["reset"])
        self.assertFalse(client.streams[idle]["ended"])

    def test_an_append_session_whose_frame_arrives_slowly_is_not_reset(self):
        # Steady progress, however slow: a frame sent a piece at a time over
        # several stall timeouts (3 s here) is taken whole and acked.
        stream, client = self.stream_and_client("slow")
        one = frame(pb_append_input([pb_append_record(b"y" * 4000)]))
        sid = client.request("POST", f"/v1/streams/{stream}/records", [("content-type", "s2s/proto")], body=b"",
                             end=False)
        # Pieces 0.4 s apart (8 s in all): a gap near the 3 s timeout would
        # test the scheduler of a loaded machine, not the server.
        for i in range(0, len(one), 200):
            client.send(sid, one[i:i + 200])
            client.flush()
            time.sleep(0.4)
        frames = client.wait_frames(sid, 1)
        self.assertIsNone(client.streams[sid]["reset"])
        self.assertEqual(len(frames), 1)

    def test_a_head_of_many_empty_fields_is_refused(self):
        # Header fields count as HPACK counts them (32 bytes each besides name
        # and value): 3,000 empty ones are over the 64 KiB limit of a head.
        client = H2Client(self.server.port)
        self.addCleanup(client.close)
        sid = client.request("GET", "/health", [("a", "")] * 3000)
        self.assertIsNotNone(client.wait_end(sid)["reset"])
        sid = client.request("GET", "/health", [("a", "")] * 100)
        self.assertEqual(client.wait_end(sid)["status"], 200)

    def test_an_upload_beside_reads_the_client_pauses_goes_on(self):
        # Responses the client has not read yet queue past 4 MiB on the
        # connection (reads it pauses). An append session beside them whose
        # acks the client reads keeps its stream's window: its input passes
        # that window (about 4 MiB) and is all acked, and no read is reset.
        stream = unique("held")
        base = self.server.base_url
        requests.post(f"{base}/v1/streams", json={"stream": stream}, timeout=TIMEOUT).raise_for_status()
        for _ in range(2):
            requests.post(f"{base}/v1/streams/{stream}/records",
                          json={"records": [{"body": "r" * 100_000} for _ in range(9)]},
                          timeout=TIMEOUT).raise_for_status()
        client = H2Client(self.server.port)
        self.addCleanup(client.close)
        client.conn.increment_flow_control_window(64 << 20)  # only the streams' windows hold answers back
        client.flush()
        reads = []
        for _ in range(6):  # 1 MB each (10 records), of which the stream's window lets 64 KB through
            sid = client.request("GET", f"/v1/streams/{stream}/records?seq_num=0")
            client.hold.add(sid)
            reads.append(sid)
        acked = 0

        def trickle(seconds, until=lambda: False):
            # The client reads a little of one answer now and then: it is not
            # one that stopped reading (whose stream is reset after 3 s).
            nonlocal acked
            deadline = time.monotonic() + seconds
            client.sock.settimeout(0.2)
            while time.monotonic() < deadline and not until():
                client.conn.acknowledge_received_data(1000, reads[0])
                acked += 1000
                client.flush()
                try:
                    client.pump(until)
                except socket.timeout:
                    pass
            client.sock.settimeout(TIMEOUT)

        trickle(30, lambda: all(len(client.streams[r]["data"]) >= 60_000 for r in reads))
        trickle(0.5)  # the rest of the answers queue on the server
        target = unique("beside")
        requests.post(f"{base}/v1/streams", json={"stream": target}, timeout=TIMEOUT).raise_for_status()
        one = frame(pb_append_input([pb_append_record(b"a" * 100_000) for _ in range(9)]))
        body = one * 6  # 5.4 MB: past the stream's window, which only acks reopen
        sid = client.request("POST", f"/v1/streams/{target}/records", [("content-type", "s2s/proto")], body=b"",
                             end=False)
        sent = 0
        deadline = time.monotonic() + 30
        while sent < len(body) and time.monotonic() < deadline:
            n = min(client.conn.local_flow_control_window(sid), client.conn.max_outbound_frame_size, len(body) - sent)
            if n > 0:
                client.conn.send_data(sid, body[sent:sent + n])
                sent += n
                client.flush()
            else:
                trickle(0.2)
        self.assertEqual(sent, len(body), "the session's window stayed shut while other streams' answers waited")
        trickle(30, lambda: len(parse_frames(client.streams[sid]["data"])[0]) >= 6 or client.streams[sid]["ended"])
        acks = [pb_append_ack(p) for _, p in parse_frames(client.streams[sid]["data"])[0]]
        self.assertEqual([a["end"]["seq_num"] for a in acks], [9 * (i + 1) for i in range(6)])
        for r in reads:
            self.assertIsNone(client.streams[r]["reset"], "a read the client paused was reset")
        # The client reads its answers; they come whole.
        client.hold.clear()
        for r in reads:
            got = len(client.streams[r]["data"]) - (acked if r == reads[0] else 0)
            if got > 0:
                client.conn.acknowledge_received_data(got, r)
        client.flush()
        client.end(sid)
        for r in reads:
            end = client.wait_end(r)
            self.assertEqual(end["status"], 200, end)
            self.assertEqual(len(json.loads(bytes(end["data"]))["records"]), 10)  # 1 MiB of them
        self.assertEqual(client.wait_end(sid)["reset"], None)

    def test_a_session_holding_input_whose_acks_are_never_read_is_reset(self):
        # The client reads none of an append session's acks, so the session
        # stops taking input and keeps what came after (counted against the
        # request budget). A read beside it the client keeps moving must not
        # let the session keep that budget: it is reset after the stall
        # timeout (3 s) of its own.
        base = self.server.base_url
        src, target = unique("moving"), unique("unread")
        for name in (src, target):
            requests.post(f"{base}/v1/streams", json={"stream": name}, timeout=TIMEOUT).raise_for_status()
        requests.post(f"{base}/v1/streams/{src}/records", json={"records": [{"body": "m" * 100_000}]},
                      timeout=TIMEOUT).raise_for_status()
        client = H2Client(self.server.port)
        self.addCleanup(client.close)
        client.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        client.conn.increment_flow_control_window(64 << 20)
        client.flush()
        read = client.request("GET", f"/v1/streams/{src}/records?seq_num=0")
        client.hold.add(read)  # its window opens only as below
        one = frame(pb_append_input([pb_append_record(b"x")]))
        sid = client.request("POST", f"/v1/streams/{target}/records", [("content-type", "s2s/proto")],
                             body=one * 1300, end=False)
        deadline = time.monotonic() + 30
        client.sock.settimeout(0.5)
        while time.monotonic() < deadline and client.streams[sid]["reset"] is None:
            client.conn.increment_flow_control_window(100, read)  # the read moves a little
            client.flush()
            try:
                client.pump(lambda: client.streams[sid]["reset"] is not None)
            except socket.timeout:
                pass
        client.sock.settimeout(TIMEOUT)
        self.assertEqual(client.streams[sid]["reset"], 8, "the session kept its input while the read moved")  # CANCEL
        self.assertIsNone(client.streams[read]["reset"])
        self.assertGreater(len(client.streams[read]["data"]), 0)

    def test_response_data_held_back_by_the_client_resets_its_stream(self):
        stream = unique("stall")
        base = self.server.base_url
        requests.post(f"{base}/v1/streams", json={"stream": stream}, timeout=TIMEOUT).raise_for_status()
        requests.post(f"{base}/v1/streams/{stream}/records", json={"records": [{"body": "x" * 1000}]},
                      timeout=TIMEOUT).raise_for_status()
        client = H2Client(self.server.port)
        self.addCleanup(client.close)
        client.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        client.flush()
        sid = client.request("GET", f"/v1/streams/{stream}/records?seq_num=0")
        # A long poll beside it, whose answer has no data to hold back yet.
        poll = client.request("GET", f"/v1/streams/{stream}/records?seq_num=1&wait=30")
        client.pump(lambda: client.streams[sid]["reset"] is not None or client.closed)
        self.assertFalse(client.closed, "the whole connection was closed for one stream's stall")
        self.assertFalse(client.streams[sid]["data"])
        self.assertIsNone(client.streams[poll]["reset"])
        # The connection serves on once the client opens its windows.
        client.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 65535})
        client.flush()
        requests.post(f"{base}/v1/streams/{stream}/records", json={"records": [{"body": "y"}]},
                      timeout=TIMEOUT).raise_for_status()
        end = client.wait_end(poll)
        self.assertEqual(end["status"], 200, end)
        self.assertEqual([r["body"] for r in json.loads(bytes(end["data"]))["records"]], ["y"])


class BackpressureTest(unittest.TestCase):
    """Under backpressure (a full WAL pool) admission waits on a worker, not
    on the HTTP I/O thread, and a connection's appends keep their order."""

    def start(self, *args):
        # One I/O thread: a request it cannot serve would show at once.
        server = WeirServer(WEIR, args=["--http-threads", "1", "--pool-budget-mib", "1", "--max-slot-bytes", "1048576", *args]).start()
        self.addCleanup(server.cleanup)
        return server

    def new_stream(self, server):
        name = unique("bp")
        r = requests.post(f"{server.base_url}/v1/streams", json={"stream": name}, timeout=TIMEOUT)
        self.assertEqual(r.status_code, 201, r.text)
        return name

    def test_appends_waiting_for_admission_hold_no_thread(self):
        # Every WAL PUT fails (and is retried): the pool fills and stays full,
        # and admission waits up to a minute. One I/O thread and one worker
        # thread: an append that waited on either (as they did on a worker, up
        # to the admission timeout) would leave none for other requests. An
        # S2S session and unary HTTP/2 appends on one connection, HTTP/1.1
        # ones on theirs.
        server = self.start("--worker-threads", "1", "--inject-put-error-rate", "1",
                            "--admission-timeout-ms", "60000")
        stream = self.new_stream(server)
        client = H2Client(server.port)
        self.addCleanup(client.close)
        big = [pb_append_record(b"s" * 300_000)]
        session = client.request("POST", f"/v1/streams/{stream}/records", [("content-type", "s2s/proto")],
                                 body=b"".join(frame(pb_append_input(big)) for _ in range(6)), end=False)
        unary = [client.request("POST", f"/v1/streams/{stream}/records", [("content-type", "application/json")],
                                body=json.dumps({"records": [{"body": "u" * 300_000}]}).encode())
                 for _ in range(4)]
        h1 = []

        def append_h1():
            try:
                h1.append(requests.post(f"{server.base_url}/v1/streams/{stream}/records",
                                        json={"records": [{"body": "h" * 300_000}]}, timeout=120).status_code)
            except requests.RequestException as e:  # the server is stopped at the end
                h1.append(repr(e))

        for _ in range(2):
            threading.Thread(target=append_h1, daemon=True).start()
        time.sleep(0.5)  # the appends reach the worker first
        # Served meanwhile, on a new connection (on a worker) and on the same one.
        for _ in range(3):
            r = requests.get(f"{server.base_url}/v1/streams", timeout=20)
            self.assertEqual(r.status_code, 200, r.text)
        sid = client.request("GET", "/health")
        self.assertEqual(client.wait_end(sid)["status"], 200)
        self.assertFalse(any(client.streams[s]["ended"] for s in [session] + unary))
        self.assertEqual(h1, [])
        self.assertGreater(metric(server.base_url, 'weir_admission_waits_total{cause="wal_pool"}'), 0)

    def test_an_s2s_session_reset_while_waiting_for_admission_is_dropped(self):
        # Every WAL PUT fails (and is retried): three appends hold the 1 MiB
        # pool for good, and the session's input waits for room. Its client
        # resets the stream: the wait ends there (abandoned), not at the
        # admission timeout, and the input is dropped.
        server = self.start("--inject-put-error-rate", "1", "--admission-timeout-ms", "60000")
        stream = self.new_stream(server)
        client = H2Client(server.port)
        self.addCleanup(client.close)
        for i in range(3):
            client.request("POST", f"/v1/streams/{stream}/records", [("content-type", "application/json")],
                           body=json.dumps({"records": [{"body": f"f{i}" + "f" * 300_000}]}).encode())
        wait_for_pool_bytes(server.base_url, 900_000)  # all three in: the session's input cannot fit
        held = metric(server.base_url, "weir_wal_pool_bytes")
        session = client.request("POST", f"/v1/streams/{stream}/records", [("content-type", "s2s/proto")],
                                 body=frame(pb_append_input([pb_append_record(b"s" * 300_000)])), end=False)
        wait_for_metric(server.base_url, 'weir_admission_waits_total{cause="wal_pool"}', 1)
        client.reset(session)
        wait_for_metric(server.base_url, "weir_admission_waits_abandoned_total", 1)
        self.assertEqual(metric(server.base_url, "weir_admission_wait_timeouts_total"), 0)
        self.assertEqual(metric(server.base_url, "weir_wal_pool_bytes"), held)  # nothing of the session's went in
        sid = client.request("GET", "/health")  # the connection goes on
        self.assertEqual(client.wait_end(sid)["status"], 200)

    def test_appends_that_waited_keep_their_order(self):
        server = self.start("--inject-put-latency-ms", "300", "--admission-timeout-ms", "60000")
        stream = self.new_stream(server)
        client = H2Client(server.port)
        self.addCleanup(client.close)
        sids = [client.request("POST", f"/v1/streams/{stream}/records", [("content-type", "application/json")],
                               body=json.dumps({"records": [{"body": f"u{i}" + "u" * 300_000}]}).encode())
                for i in range(8)]
        for i, sid in enumerate(sids):
            st = client.wait_end(sid)
            self.assertEqual(st["status"], 200, bytes(st["data"]))
            self.assertEqual(json.loads(bytes(st["data"]))["start"]["seq_num"], i)
        inputs = [frame(pb_append_input([pb_append_record(f"s{i}".encode() + b"s" * 300_000)])) for i in range(8)]
        session = client.request("POST", f"/v1/streams/{stream}/records", [("content-type", "s2s/proto")],
                                 body=b"".join(inputs), end=True)
        frames, _ = parse_frames(client.wait_end(session)["data"])
        self.assertEqual([pb_append_ack(p)["end"]["seq_num"] for _, p in frames], list(range(9, 17)))
        heads = []
        while len(heads) < 16:
            r = requests.get(f"{server.base_url}/v1/streams/{stream}/records", params={"seq_num": len(heads)},
                             timeout=TIMEOUT)
            self.assertEqual(r.status_code, 200, r.text)
            heads += [rec["body"][:3].rstrip("us") for rec in r.json()["records"]]
        self.assertEqual(heads, [f"u{i}" for i in range(8)] + [f"s{i}" for i in range(8)])


class AckBacklogTest(unittest.TestCase):
    def test_a_session_whose_client_reads_no_acks_stops_taking_input(self):
        # Tiny inputs make acks several times their size: a client that
        # sends them and never reads its acks held every ack in server memory
        # (its window came back as each ack was queued). The session now
        # stops taking input at 1,024 acks not on the wire.
        stream = unique("backlog")
        requests.post(f"{SERVER.base_url}/v1/streams", json={"stream": stream}, timeout=TIMEOUT).raise_for_status()
        client = H2Client(SERVER.port)
        self.addCleanup(client.close)
        n = 20000
        one = frame(pb_append_input([pb_append_record(b"")]))
        sid = client.request("POST", f"/v1/streams/{stream}/records", [("content-type", "s2s/proto")], body=b"",
                             end=False)
        client.hold.add(sid)  # acks are received, never acknowledged: the server's window for them shuts
        client.send(sid, one * n)  # within the 4 MiB stream window
        tail = lambda: requests.get(f"{SERVER.base_url}/v1/streams/{stream}/records/tail",
                                    timeout=TIMEOUT).json()["tail"]["seq_num"]
        # The tail must first get past the ack cap (a server slow to start
        # would otherwise look like one that stopped taking input), then stand
        # still for 2 s.
        last, still_since, deadline = -1, time.monotonic(), time.monotonic() + 120
        while time.monotonic() < deadline and (last < 1024 or time.monotonic() - still_since < 2) and last < n:
            now = tail()
            if now != last:
                last, still_since = now, time.monotonic()
            time.sleep(0.1)
        self.assertGreaterEqual(last, 1024, "the session took fewer inputs than the ack cap")
        self.assertLess(last, n // 2, "the session took input while its acks piled up")
        print(f"tail while the acks were unread: {last}", file=sys.stderr)
        # Once the client reads, the rest goes through, in order.
        client.hold.discard(sid)
        client.conn.increment_flow_control_window(1 << 30, sid)
        client.conn.increment_flow_control_window(1 << 30)
        client.flush()
        client.end(sid)
        frames, _ = parse_frames(client.wait_end(sid)["data"])
        self.assertEqual(len(frames), n)
        self.assertEqual([pb_append_ack(p)["end"]["seq_num"] for _, p in frames[:3]], [1, 2, 3])
        self.assertEqual(pb_append_ack(frames[-1][1])["end"]["seq_num"], n)
        self.assertEqual(tail(), n)


class ResponseRoomTest(unittest.TestCase):
    def test_reads_wait_for_room_among_responses_clients_have_not_read(self):
        """--http-max-unwritten-mib 2: answers HTTP/2 clients do not read (their
        windows shut) hold that room, each connection at most 1 MiB of it. A
        read takes at most half of what is left; with little left it waits, up
        to 5 s, then gets a retriable 503; once room comes back it is served.
        A connection that holds its share waits alone."""
        server = WeirServer(WEIR, args=["--kafka-addr", "", "--http-max-unwritten-mib", "2"]).start()
        self.addCleanup(server.cleanup)
        base = server.base_url
        requests.post(f"{base}/v1/streams", json={"stream": "big"}, timeout=TIMEOUT).raise_for_status()
        for _ in range(12):  # about 2.4 MB
            r = requests.post(f"{base}/v1/streams/big/records", json={"records": [{"body": "x" * 1000}] * 200},
                              timeout=TIMEOUT)
            r.raise_for_status()
        read_path = "/v1/streams/big/records?seq_num=0"
        unwritten = lambda: metric(base, "weir_http_response_bytes_unwritten")
        # An answer its client does not take in counts until its stream is reset.
        alone = H2Client(server.port)
        self.addCleanup(alone.close)
        sid = alone.request("GET", read_path)
        wait_for_metric(base, "weir_http_response_bytes_unwritten", 256 << 10)
        alone.reset(sid)
        deadline = time.monotonic() + TIMEOUT
        while unwritten() > 0:
            self.assertLess(time.monotonic(), deadline, "a reset stream's answer still counts")
            time.sleep(0.05)
        # Reads on a connection whose client takes in nothing (its windows
        # stay at 64 KiB), one at a time, until one finds too little room in
        # the connection's share and waits.
        stuck = [H2Client(server.port)]
        try:
            stuck[0].request("GET", read_path)
            while metric(base, "weir_http_read_room_waits_total") < 1:
                self.assertLess(len(stuck[0].streams), 20, "no read ever waited for room")
                time.sleep(0.2)
                stuck[0].request("GET", read_path)
            held = unwritten()
            self.assertGreater(held, 768 << 10)
            # Other connections still read: the server's room is not used up.
            r = requests.get(f"{base}/v1/streams/big/records", params={"seq_num": 0}, timeout=TIMEOUT)
            self.assertEqual(r.status_code, 200, r.text)
            # More such connections, until the server's room is used up.
            while unwritten() < (2 << 20) - (128 << 10):
                self.assertLess(len(stuck), 8, "the server's room was never used up")
                stuck.append(H2Client(server.port))
                for _ in range(6):
                    stuck[-1].request("GET", read_path)
                    time.sleep(0.2)
            # A long poll at the tail has nothing to send: it waits there, not for room.
            for start in ({"seq_num": 2400}, {}, {"tail_offset": 0}, {"timestamp": 1 << 62, "clamp": "true"}):
                r = requests.get(f"{base}/v1/streams/big/records", params={**start, "wait": 1}, timeout=TIMEOUT)
                self.assertEqual(r.status_code, 200, f"{start}: {r.text}")
                self.assertEqual(r.json()["records"], [], start)
            # A read now waits, then is told to retry.
            r = requests.get(f"{base}/v1/streams/big/records", params={"seq_num": 0}, timeout=TIMEOUT)
            self.assertEqual((r.status_code, r.json()["code"]), (503, "unavailable"), r.text)
            self.assertEqual(r.headers.get("Retry-After"), "1")
            # A read waiting when they go is served.
            waits = metric(base, "weir_http_read_room_waits_total")
            got = {}

            def read():
                got["r"] = requests.get(f"{base}/v1/streams/big/records", params={"seq_num": 0}, timeout=TIMEOUT)
            t = threading.Thread(target=read)
            t.start()
            wait_for_metric(base, "weir_http_read_room_waits_total", waits + 1)
        finally:
            for client in stuck:
                client.close()
        t.join(TIMEOUT)
        self.assertFalse(t.is_alive())
        r = got["r"]
        self.assertEqual(r.status_code, 200, r.text)
        records = r.json()["records"]
        self.assertEqual(records[0]["seq_num"], 0)
        # Cut to half its connection's room at most (512 KiB of 1,008-byte
        # records, where the read's own limits allow 1,000).
        self.assertLessEqual(len(records), (512 << 10) // 1008)
        # The closed connections' answers count no more.
        deadline = time.monotonic() + TIMEOUT
        while unwritten() > 0:
            self.assertLess(time.monotonic(), deadline, "a closed connection's answers still count")
            time.sleep(0.05)
        server.stop()


class DrainTest(unittest.TestCase):
    def test_sigterm_ends_an_open_append_session_with_server_draining(self):
        server, stream = start_with_stream(self, "drain")
        client = H2Client(server.port)
        self.addCleanup(client.close)
        sid = client.request("POST", f"/v1/streams/{stream}/records", [("content-type", "s2s/proto")],
                             body=frame(pb_append_input([pb_append_record(b"kept")])), end=False)
        client.wait_frames(sid, 1)  # acked; the session stays open
        server.proc.send_signal(15)
        frames, _ = parse_frames(client.wait_end(sid)["data"])
        self.assertEqual(len(frames), 2)
        self.assertEqual(pb_append_ack(frames[0][1])["end"]["seq_num"], 1)
        status, body = terminal(*frames[1])
        self.assertEqual((status, body["code"]), (503, "server_draining"))
        # Then GOAWAY: the connection had no stream left.
        client.pump(lambda: client.closed)
        self.assertEqual(client.open_at_goaway, set())
        self.assertEqual(server.stop(), 0)
        with open(server.log_path) as f:
            self.assertNotIn("still open at exit", f.read())


    def test_an_idle_connection_is_closed_when_the_drain_begins(self):
        # An append whose PUT takes 10 s holds the drain open; an idle HTTP/2
        # connection beside it gets GOAWAY and is closed at once, not when
        # the server stops: its client reconnects elsewhere. (10 s: the check
        # that the append is still unanswered must not race its PUT on a
        # loaded machine.)
        server, stream = start_with_stream(self, "drainidle", args=["--inject-put-latency-ms", "10000"])
        busy = H2Client(server.port)
        self.addCleanup(busy.close)
        idle = H2Client(server.port)
        self.addCleanup(idle.close)
        sid = busy.request("POST", f"/v1/streams/{stream}/records", [("content-type", "s2s/proto")],
                           body=frame(pb_append_input([pb_append_record(b"slow")])), end=True)
        wait_for_pool_bytes(server.base_url)
        server.proc.send_signal(15)
        idle.pump(lambda: idle.closed)
        self.assertEqual(idle.open_at_goaway, set(), "closed without GOAWAY")
        # What the client sends after the GOAWAY (a request that crossed it)
        # is read and dropped for a while: the server's side ends with a FIN,
        # not with a reset, which could cut off the GOAWAY before the client
        # read it. (A close without that answers the bytes with a reset, and
        # the next send fails.)
        idle.sock.settimeout(TIMEOUT)
        try:
            idle.sock.sendall(b"\0" * 4096)
            time.sleep(0.1)
            idle.sock.sendall(b"\0" * 4096)
            while idle.sock.recv(65536):
                pass
        except OSError as e:
            self.fail(f"the connection was reset after its GOAWAY: {e!r}")
        # The append's ack has not been sent yet: the drain is still on.
        # (What the busy connection has received so far is taken in without waiting.)
        busy.sock.setblocking(False)
        try:
            while True:
                data = busy.sock.recv(65536)
                if not data:
                    break
                for ev in busy.conn.receive_data(data):
                    if isinstance(ev, h2.events.DataReceived):
                        busy.streams[sid]["data"] += ev.data
                    elif isinstance(ev, h2.events.StreamEnded):
                        busy.streams[sid]["ended"] = True
        except BlockingIOError:
            pass
        busy.sock.setblocking(True)
        busy.sock.settimeout(TIMEOUT)
        self.assertFalse(busy.streams[sid]["ended"], "the idle connection was closed only after the drain")
        self.assertEqual(parse_frames(busy.streams[sid]["data"])[0], [])
        frames, _ = parse_frames(busy.wait_end(sid)["data"])
        self.assertEqual(pb_append_ack(frames[0][1])["end"]["seq_num"], 1)
        self.assertEqual(server.stop(), 0)

    def test_a_body_still_arriving_at_sigterm_is_answered_server_draining(self):
        # A request whose head came before SIGTERM and whose body comes
        # after: the drain waits for the body (for a grace of 5 s) and
        # answers 503 server_draining (a client knows nothing was applied
        # and retries elsewhere), on HTTP/1.1 and on HTTP/2, instead of
        # closing the connection under it. An upload that stalls holds the
        # drain no longer than the grace. Nothing of any body is appended.
        server, stream = start_with_stream(self, "drainbody", args=["--drain-timeout-s", "120"])
        path = f"/v1/streams/{stream}/records"
        body = json.dumps({"records": [{"body": "late"}]}).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        h1 = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
        self.addCleanup(h1.close)
        h1.sendall(head + body[:5])
        stalled = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
        self.addCleanup(stalled.close)
        stalled.sendall(head + body[:5])  # and never the rest
        h2c = H2Client(server.port)
        self.addCleanup(h2c.close)
        sid = h2c.request("POST", path, [("content-type", "application/json")], body=body[:5], end=False)
        # The three heads are in (the scrape that reads the gauge counts too).
        deadline = time.monotonic() + TIMEOUT
        while metric(server.base_url, "weir_http_requests_open") < 4:
            self.assertLess(time.monotonic(), deadline, "the bodies' requests were never counted")
            time.sleep(0.05)
        health = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
        self.addCleanup(health.close)
        health.request("GET", "/health")
        self.assertEqual(health.getresponse().read(), b'{"status":"ok"}')
        signalled = time.monotonic()
        server.proc.send_signal(15)
        # On the connection opened before: the drain is on once /health says
        # so, or an answer closes the connection (the API turns to draining
        # before the listener does).
        while True:
            health.request("GET", "/health")
            r = health.getresponse()
            if json.loads(r.read())["status"] == "draining" or r.will_close:
                break
            time.sleep(0.02)
        h1.sendall(body[5:])
        h2c.send(sid, body[5:], end=True)
        answer = b""
        while chunk := h1.recv(65536):  # the connection closes after the answer
            answer += chunk
        self.assertTrue(answer.startswith(b"HTTP/1.1 503 "), answer)
        self.assertIn(b"connection: close", answer.lower())
        self.assertIn(b'"code":"server_draining"', answer)
        st = h2c.wait_end(sid)
        self.assertEqual(st["status"], 503, st)
        self.assertEqual(json.loads(st["data"])["code"], "server_draining")
        h2c.pump(lambda: h2c.closed)  # then GOAWAY: no stream is left
        # The stalled upload is cut off unanswered once the grace is over,
        # long before the drain timeout.
        self.assertEqual(stalled.recv(65536), b"")
        self.assertEqual(server.stop(), 0)
        self.assertLess(time.monotonic() - signalled, 60, "a stalled upload held the drain")
        after = WeirServer(WEIR, data_dir=server.data_dir).start()
        self.addCleanup(after.cleanup)
        r = requests.get(f"{after.base_url}{path}/tail", timeout=TIMEOUT)
        self.assertEqual(r.json()["tail"]["seq_num"], 0, r.text)
        after.stop()

    def test_a_session_whose_input_ended_gets_its_acks_and_no_error_at_sigterm(self):
        # The client ended its input before the drain: there is no input to
        # refuse, so the session ends with its acks, not with a 503.
        server = WeirServer(WEIR, args=["--inject-put-latency-ms", "1500"]).start()
        self.addCleanup(server.cleanup)
        stream = unique("drainend")
        base = server.base_url
        requests.post(f"{base}/v1/streams", json={"stream": stream}, timeout=TIMEOUT).raise_for_status()
        client = H2Client(server.port)
        self.addCleanup(client.close)
        sid = client.request("POST", f"/v1/streams/{stream}/records", [("content-type", "s2s/proto")],
                             body=frame(pb_append_input([pb_append_record(b"last")])), end=True)
        wait_for_pool_bytes(base)  # the append is in the WAL pool, its PUT under way
        server.proc.send_signal(15)
        frames, _ = parse_frames(client.wait_end(sid)["data"])
        self.assertEqual(len(frames), 1, frames)
        self.assertEqual(pb_append_ack(frames[0][1])["end"]["seq_num"], 1)
        self.assertEqual(server.stop(), 0)
        self.assertEqual(read_back_after_restart(server, stream), [(0, "last")])


def read_back_after_restart(server, stream):
    """Starts the stopped server again without its fault flags and reads the
    whole stream: [(seq_num, body)]."""
    server.args = [a for i, a in enumerate(server.args)
                   if not a.startswith("--inject-") and not (i > 0 and server.args[i - 1].startswith("--inject-"))]
    server.start()
    r = requests.get(f"{server.base_url}/v1/streams/{stream}/records?seq_num=0", timeout=TIMEOUT)
    r.raise_for_status()
    return [(rec["seq_num"], rec["body"]) for rec in r.json()["records"]]


class DrainStallTest(unittest.TestCase):
    def test_the_drain_resets_a_stalled_read_and_answers_the_append_beside_it(self):
        # One connection: a read whose client keeps its window shut, and an
        # append whose PUT (3 s) outlasts the drain (2 s). The drain resets the
        # read after 1 s; the append still gets its answer, from the WAL's
        # close, on the same connection.
        server = WeirServer(WEIR, args=["--drain-timeout-s", "2", "--inject-put-latency-ms", "3000"]).start()
        self.addCleanup(server.cleanup)
        stream = unique("dstall")
        base = server.base_url
        requests.post(f"{base}/v1/streams", json={"stream": stream}, timeout=TIMEOUT).raise_for_status()
        requests.post(f"{base}/v1/streams/{stream}/records",
                      json={"records": [{"body": "r" * 1000} for _ in range(200)]}, timeout=TIMEOUT).raise_for_status()
        client = H2Client(server.port)
        self.addCleanup(client.close)
        client.conn.increment_flow_control_window(64 << 20)  # the connection's window stays open
        client.flush()
        reader = client.request("GET", f"/v1/streams/{stream}/records?seq_num=0")
        client.hold.add(reader)
        client.pump(lambda: len(client.streams[reader]["data"]) >= 65535)  # its stream window is used up
        append = client.request("POST", f"/v1/streams/{stream}/records", [("content-type", "application/json")],
                                body=json.dumps({"records": [{"body": "late"}]}).encode())
        wait_for_pool_bytes(base)  # the append is in the WAL pool, its PUT under way
        server.proc.send_signal(15)
        st = client.wait_end(append)
        self.assertEqual(st["status"], 200, bytes(st["data"]))
        self.assertEqual(json.loads(bytes(st["data"]))["start"]["seq_num"], 200)
        client.pump(lambda: client.streams[reader]["ended"])  # the reset may come after the answer
        self.assertEqual(client.streams[reader]["reset"], 8)  # CANCEL
        self.assertEqual(server.stop(), 0)
        self.assertEqual(read_back_after_restart(server, stream), [(i, "r" * 1000) for i in range(200)] + [(200, "late")])


def main():
    global WEIR
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        WEIR = sys.argv.pop(1)
    if not WEIR:
        sys.exit("usage: s2s_test.py WEIR_BINARY [unittest args]")
    unittest.main(verbosity=2)


if __name__ == "__main__":
    main()
