#!/usr/bin/python3
"""kcat (Debian's, on librdkafka 2.0) against a real `weir serve`.

Usage: kcat_test.py WEIR_BINARY [unittest arguments, e.g. -k Compression]
(or WEIR_BIN=... kcat_test.py). Needs /usr/bin/kcat (Debian package kcat).

Covers: `kcat -L` metadata (the broker, topics and partitions, -J form);
a file of lines produced with `kcat -P` (keys split with -K:) and consumed
back exactly with `kcat -C -e -o beginning -f '%k:%s\\n'`; a 3-partition
topic auto-created by a server run with --kafka-auto-create-partitions 3 and
produced partition by partition with -p; every compression codec (-z), read
back by kcat and through the REST API; records appended through the REST API
read back by kcat; --kafka-advertised-addr. Every kcat run is bounded by a
subprocess timeout; no test asserts an upper bound on time.

kcat's line mode skips empty lines (it never produces an empty message from
one), and splits a line at its first -K delimiter: "k:v" has key "k", a line
without the delimiter has no key. `expected_output` models exactly that.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka_support as ks  # noqa: E402
from kafka_support import rest_append, rest_read, rest_tail, unique  # noqa: E402

KCAT = os.environ.get("KCAT", "/usr/bin/kcat")
KCAT_TIMEOUT = 240         # seconds per kcat run (a loaded 2-core machine)
# librdkafka settings that turn a server that stops answering into an error
# well within KCAT_TIMEOUT instead of librdkafka's 5-minute defaults.
COMMON = ["-m", "60", "-X", "socket.timeout.ms=60000", "-X", "topic.request.timeout.ms=60000"]
PRODUCE = ["-X", "message.timeout.ms=150000"]
SHARED = None


def kcat(server_or_addr, *args, input=None, timeout=KCAT_TIMEOUT, check=True):
    addr = server_or_addr if isinstance(server_or_addr, str) else server_or_addr.kafka_addr
    cmd = [KCAT, "-b", addr, *COMMON, *args]
    try:
        out = subprocess.run(cmd, input=input, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"kcat did not finish within {timeout} s: {' '.join(cmd)}\n"
                             f"stderr: {(e.stderr or b'')[-2000:].decode(errors='replace')}") from None
    if check and out.returncode != 0:
        raise AssertionError(f"kcat exited {out.returncode}: {' '.join(cmd)}\n"
                             f"stderr: {out.stderr[-3000:].decode(errors='replace')}")
    return out


def produce(server, topic, lines, *args, path=None):
    """kcat -P of `lines` (bytes, joined with newlines) from stdin, or from
    the file `path` in line mode (-l) when given."""
    data = b"".join(line + b"\n" for line in lines)
    if path:
        with open(path, "wb") as f:
            f.write(data)
        return kcat(server, "-P", "-t", topic, *PRODUCE, *args, "-l", path)
    return kcat(server, "-P", "-t", topic, *PRODUCE, *args, input=data)


def consume(server, topic, *args, fmt="%k:%s\\n"):
    """Everything in `topic` (or the partition given with -p), as kcat prints it."""
    return kcat(server, "-C", "-t", topic, "-e", "-o", "beginning", "-f", fmt, *args).stdout


def consume_json(server, topic, *args):
    """kcat -C -J: one JSON object per message."""
    out = kcat(server, "-C", "-t", topic, "-e", "-o", "beginning", "-J", *args).stdout
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


def metadata(server, *args):
    out = kcat(server, "-L", "-J", *args).stdout
    return json.loads(out)


def topic_meta(md, topic):
    for t in md["topics"]:
        if t["topic"] == topic:
            return t
    raise AssertionError(f"topic {topic} not in metadata: {json.dumps(md)[:2000]}")


def expected_output(lines, key_delim=b":"):
    """What `kcat -C -f '%k:%s\\n'` prints for lines produced with `kcat -P
    -K:`: empty lines are not produced; a line without ':' has a null key,
    printed as nothing."""
    out = []
    for line in lines:
        if not line:
            continue
        out.append(line if key_delim in line else b":" + line)
    return b"".join(x + b"\n" for x in out)


def values_of(lines, key_delim=b":"):
    """The message values kcat -P -K: produces from `lines`."""
    return [line.split(key_delim, 1)[1] if key_delim in line else line for line in lines if line]


def sample_lines(n, tag):
    """n lines: most keyed (k:v), some without a key, a few empty (skipped
    by kcat), one with a second ':' in the value, one with an empty key and
    one with an empty value."""
    lines = []
    for i in range(n):
        if i % 10 == 3:
            lines.append(b"")
        elif i % 7 == 0:
            lines.append(f"{tag} unkeyed line {i}".encode())
        else:
            lines.append(f"key-{i % 13}:{tag} value {i} {'x' * (i % 50)}".encode())
    lines += [b":empty key", b"key-e:", b"k:v:with:colons", "k\u00e9y:v\u00e4lue \u2713".encode()]
    return lines


def setUpModule():
    global SHARED
    if not os.access(KCAT, os.X_OK):
        raise unittest.SkipTest(f"{KCAT} not found (apt-get install kcat)")
    SHARED = ks.start_server(shared=True)


def tearDownModule():
    ks.stop_server(SHARED)


class Metadata(ks.TestCase):
    def test_broker_and_auto_created_topic(self):
        topic = unique("meta")
        produce(SHARED, topic, [b"hello"])  # auto-creates it with 1 partition (the default)
        md = metadata(SHARED)
        self.assertEqual(len(md["brokers"]), 1, md)
        broker = md["brokers"][0]
        self.assertEqual(broker["name"], SHARED.kafka_addr, md)
        if "controllerid" in md:  # newer kcat builds print it
            self.assertEqual(md["controllerid"], broker["id"], "the controller is the one broker")
        t = topic_meta(md, topic)
        self.assertNotIn("error", t)
        self.assertEqual([p["partition"] for p in t["partitions"]], [0])
        p = t["partitions"][0]
        self.assertEqual(p["leader"], broker["id"])
        self.assertEqual([r["id"] for r in p["replicas"]], [broker["id"]])
        self.assertEqual([r["id"] for r in p["isrs"]], [broker["id"]])

        # One topic asked by name.
        md1 = metadata(SHARED, "-t", topic)
        self.assertEqual([t["topic"] for t in md1["topics"]], [topic])

    def test_plain_listing(self):
        topic = unique("meta-plain")
        produce(SHARED, topic, [b"x"])
        text = kcat(SHARED, "-L", "-t", topic).stdout.decode()
        self.assertIn("1 brokers:", text)
        self.assertIn(f"at {SHARED.kafka_addr} (controller)", text)
        self.assertIn(f'topic "{topic}" with 1 partitions:', text)
        self.assertIn("partition 0, leader", text)


class ProduceConsume(ks.TestCase):
    def test_file_round_trip_exact(self):
        topic = unique("file")
        lines = sample_lines(1000, "file")
        with tempfile.TemporaryDirectory() as d:
            produce(SHARED, topic, lines, "-K:", path=os.path.join(d, "in.txt"))
        got = consume(SHARED, topic)
        self.assertEqual(got, expected_output(lines))
        # Offsets 0..n-1 in order, keys as split by -K.
        msgs = consume_json(SHARED, topic)
        nonempty = [line for line in lines if line]
        self.assertEqual([m["offset"] for m in msgs], list(range(len(nonempty))))
        self.assertEqual({m["partition"] for m in msgs}, {0})
        keys = [line.split(b":", 1)[0].decode() if b":" in line else None for line in nonempty]
        self.assertEqual([m["key"] for m in msgs], keys)
        # Every record is there through the REST API too, values as bodies.
        recs = rest_read(SHARED, topic, 0, len(nonempty))
        self.assertEqual([r["body"] for r in recs], values_of(lines))
        self.assertEqual([r["seq_num"] for r in recs], list(range(len(nonempty))))
        self.assertEqual(rest_tail(SHARED, topic, 0), len(nonempty))

    def test_stdin_appends_continue_the_partition(self):
        topic = unique("stdin")
        first = [f"a{i}".encode() for i in range(50)]
        second = [f"k{i}:b{i}".encode() for i in range(70)]
        produce(SHARED, topic, first, "-K:")
        produce(SHARED, topic, second, "-K:")
        self.assertEqual(consume(SHARED, topic), expected_output(first + second))
        # From an absolute offset, and the last 10 (relative to the end).
        self.assertEqual(kcat(SHARED, "-C", "-t", topic, "-e", "-o", "60", "-f", "%o %s\\n").stdout,
                         b"".join(f"{60 + i} b{10 + i}\n".encode() for i in range(60)))
        self.assertEqual(kcat(SHARED, "-C", "-t", topic, "-e", "-o", "-10", "-f", "%s\\n").stdout,
                         b"".join(f"b{i}\n".encode() for i in range(60, 70)))

    def test_large_values(self):
        topic = unique("large")
        lines = [f"big-{i}:".encode() + bytes([65 + i % 26]) * (100_000 + i) for i in range(30)]
        produce(SHARED, topic, lines, "-K:")
        self.assertEqual(consume(SHARED, topic), expected_output(lines))

    def test_headers(self):
        topic = unique("headers")
        produce(SHARED, topic, [b"h1", b"h2"], "-H", "trace=abc", "-H", "empty=")
        msgs = consume_json(SHARED, topic)
        self.assertEqual([m["payload"] for m in msgs], ["h1", "h2"])
        for m in msgs:
            self.assertEqual(header_pairs(m), [("trace", "abc"), ("empty", "")], m)
        recs = rest_read(SHARED, topic, 0, 2)
        self.assertEqual([r["headers"] for r in recs], [[(b"trace", b"abc"), (b"empty", b"")]] * 2)


def header_pairs(msg):
    """kcat -J headers, as (name, value) pairs: kcat prints them as a flat
    [name, value, ...] list."""
    h = msg.get("headers") or []
    if isinstance(h, dict):
        return list(h.items())
    return list(zip(h[0::2], h[1::2]))


class MultiPartition(ks.TestCase):
    """A server that auto-creates topics with 3 partitions."""

    @classmethod
    def setUpClass(cls):
        cls.server = ks.start_server(["--kafka-auto-create-partitions", "3"])

    @classmethod
    def tearDownClass(cls):
        ks.stop_server(cls.server)

    def test_per_partition_produce_and_consume(self):
        s = self.server
        topic = unique("multi")
        per = {p: [f"p{p}-key-{i % 5}:p{p} value {i}".encode() for i in range(200 + 37 * p)] for p in range(3)}
        for p in range(3):  # the first produce auto-creates the topic
            produce(s, topic, per[p], "-K:", "-p", str(p))
        t = topic_meta(metadata(s, "-t", topic), topic)
        self.assertEqual(sorted(p["partition"] for p in t["partitions"]), [0, 1, 2])
        for p in range(3):
            self.assertEqual(consume(s, topic, "-p", str(p)), expected_output(per[p]), f"partition {p}")
            self.assertEqual([r["body"] for r in rest_read(s, topic, p, len(per[p]))], values_of(per[p]))
        # All partitions at once: each partition's lines in order.
        out = kcat(s, "-C", "-t", topic, "-e", "-o", "beginning", "-f", "%p|%k:%s\\n").stdout
        by_part = {0: [], 1: [], 2: []}
        for line in out.splitlines():
            p, rest = line.split(b"|", 1)
            by_part[int(p)].append(rest + b"\n")
        for p in range(3):
            self.assertEqual(b"".join(by_part[p]), expected_output(per[p]), f"partition {p}")

    def test_random_partitioner_spreads_and_loses_nothing(self):
        s = self.server
        topic = unique("spread")
        lines = [f"r{i}".encode() for i in range(600)]
        # Random partitioner, record by record (librdkafka's sticky
        # partitioning would send a quick burst of keyless records to one or two).
        produce(s, topic, lines, "-p", "-1", "-X", "sticky.partitioning.linger.ms=0")
        msgs = consume_json(s, topic)
        self.assertEqual(sorted(m["payload"] for m in msgs), sorted(x.decode() for x in lines))
        parts = {m["partition"] for m in msgs}
        self.assertEqual(parts, {0, 1, 2})
        for p in parts:
            offs = [m["offset"] for m in msgs if m["partition"] == p]
            self.assertEqual(offs, list(range(len(offs))), f"partition {p}")


class Compression(ks.TestCase):
    def _codec(self, codec):
        topic = unique(f"z-{codec}")
        # Compressible lines: librdkafka sends a batch uncompressed when
        # compression does not make it smaller. -d msg logs each produced
        # batch with its codec, so the test knows the batches were compressed.
        lines = [f"k{i % 7}:{codec} record {i} ".encode() + b"abcdefgh" * (10 + i % 20) for i in range(2000)]
        lines += [b"", b"no key here " * 20]
        out = produce(SHARED, topic, lines, "-K:", "-z", codec, "-X", "linger.ms=50", "-d", "msg")
        self.assertEqual(consume(SHARED, topic), expected_output(lines))
        log = out.stderr.decode(errors="replace")
        batches = [line for line in log.splitlines() if "Produce MessageSet" in line]
        self.assertTrue(batches, log[-3000:])
        self.assertEqual([b for b in batches if not b.endswith(f", {codec})")], [],
                         f"batches not sent with {codec}:\n" +
                         "\n".join(line for line in log.splitlines() if "compress" in line.lower())[:2000])
        vals = values_of(lines)
        recs = rest_read(SHARED, topic, 0, len(vals))
        self.assertEqual([r["body"] for r in recs], vals, "REST bodies of a compressed topic")
        self.assertEqual([r["seq_num"] for r in recs], list(range(len(vals))))

    def test_gzip(self):
        self._codec("gzip")

    def test_snappy(self):
        self._codec("snappy")

    def test_lz4(self):
        self._codec("lz4")

    def test_zstd(self):
        self._codec("zstd")


class RestInterop(ks.TestCase):
    def test_rest_appends_read_by_kcat(self):
        topic = unique("rest")
        produce(SHARED, topic, [b"k0:from kafka"], "-K:")  # creates the topic
        rest_append(SHARED, topic, 0, [{"body": "from rest 1"},
                                       {"body": "from rest 2", "headers": [["h", "v"]]},
                                       {"body": ""}])
        produce(SHARED, topic, [b"k4:kafka again"], "-K:")
        # %K is the key length, -1 for a null key: S2 records have none.
        self.assertEqual(consume(SHARED, topic, fmt="%o %K %k:%s\\n"),
                         b"0 2 k0:from kafka\n1 -1 :from rest 1\n2 -1 :from rest 2\n3 -1 :\n4 2 k4:kafka again\n")
        msgs = consume_json(SHARED, topic)
        self.assertEqual([m["payload"] or "" for m in msgs],
                         ["from kafka", "from rest 1", "from rest 2", "", "kafka again"])
        self.assertEqual([m["key"] for m in msgs], ["k0", None, None, None, "k4"])
        self.assertEqual(header_pairs(msgs[2]), [("h", "v")])
        self.assertEqual(header_pairs(msgs[1]), [])
        # S2 appends carry their arrival time, a real timestamp (not -1 or 0).
        stamps = [int(x) for x in consume(SHARED, topic, fmt="%T\\n").split()]
        self.assertEqual(len(stamps), 5)
        for ts in stamps[1:4]:
            self.assertGreater(ts, 1_600_000_000_000, stamps)


class AdvertisedAddr(ks.TestCase):
    def test_metadata_names_the_advertised_address(self):
        port = ks.free_port()
        s = ks.start_server(["--kafka-addr", f"127.0.0.1:{port}", "--kafka-advertised-addr", f"localhost:{port}"])
        try:
            md = metadata(s)
            self.assertEqual([b["name"] for b in md["brokers"]], [f"localhost:{port}"])
            topic = unique("adv")
            produce(s, topic, [b"a:1", b"b:2"], "-K:")
            self.assertEqual(consume(s, topic), b"a:1\nb:2\n")
        finally:
            ks.stop_server(s)


if __name__ == "__main__":
    if not os.access(KCAT, os.X_OK):
        print(f"SKIP: {KCAT} not found (apt-get install kcat)")
        sys.exit(ks.missing_client_exit_code())  # CTest's SKIP_RETURN_CODE: shown as skipped, not passed
    ks.main("kcat_test.py WEIR_BINARY [unittest args] (or set WEIR_BIN)")
