#!/usr/bin/python3
"""Debian's python3-confluent-kafka (librdkafka 2.0) against a real `weir serve`.

Usage: confluent_test.py WEIR_BINARY [unittest arguments, e.g. -k Group]
(or WEIR_BIN=... confluent_test.py). Needs /usr/bin/python3 with the Debian
package python3-confluent-kafka.

Covers: AdminClient create_topics / list_topics / delete_topics /
describe_configs / create_partitions (and their
error codes), a CreateTopics asking for the default partition count; an idempotent producer (enable.idempotence, acks=all) whose
delivery reports all succeed with offsets 0, 1, 2, ... per partition; a
consumer group of two members that together read every record exactly once,
committing explicitly, both getting partitions, and listed by
AdminClient.list_groups (ListGroups + DescribeGroups); a restart of weir, after
which a new member of the group resumes from the committed offsets; a
restart between produce and consume that loses nothing; an idempotent
producer that keeps producing while the server restarts on the same port
(no loss, no duplicates); the same producer, bootstrapped with two
addresses, moving to a second process of the node that supersedes the first
while it runs; ListOffsets through get_watermark_offsets and
offsets_for_times; a transactional producer rejected with
TRANSACTIONAL_ID_AUTHORIZATION_FAILED.

Every wait is bounded (librdkafka timeouts and deadlines here), no test
asserts an upper bound on time, and group tests allow for the server's
initial rebalance delay (3 s).
"""
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka_support as ks  # noqa: E402
from kafka_support import rest_read, unique  # noqa: E402

try:
    from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer,
                                 TopicPartition)
    from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic
except ImportError:  # reported in setUpModule
    Producer = None

OP_TIMEOUT = 120       # seconds for one admin operation, flush or metadata call
CONSUME_TIMEOUT = 300  # seconds for a consumer (group) to read what it expects
SHARED = None


# --------------------------------------------------------------------------
# Clients

def common(addr):
    # Generous socket and request timeouts: CI is a loaded 2-core machine.
    return {"bootstrap.servers": addr, "socket.timeout.ms": 60000, "api.version.request.timeout.ms": 60000}


def admin(server):
    return AdminClient(common(server.kafka_addr))


def create_topic(server, topic, partitions):
    a = admin(server)  # held until the result is in (a collected client cancels it)
    futures = a.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                                          operation_timeout=60, request_timeout=OP_TIMEOUT)
    futures[topic].result(timeout=OP_TIMEOUT)


def partitions_of(server, topic):
    md = admin(server).list_topics(topic=topic, timeout=OP_TIMEOUT)
    t = md.topics[topic]
    if t.error is not None:
        raise AssertionError(f"metadata of {topic}: {t.error}")
    return sorted(t.partitions)


def producer(server_or_addr, **conf):
    addr = server_or_addr if isinstance(server_or_addr, str) else server_or_addr.kafka_addr
    c = common(addr)
    c.update({"enable.idempotence": True, "acks": "all", "linger.ms": 5, "message.timeout.ms": 180000,
              "request.timeout.ms": 60000})
    c.update(conf)
    return Producer(c)


class Deliveries:
    """Collects delivery reports: (partition, offset, key, value) in report order."""

    def __init__(self):
        self.ok = []
        self.errors = []
        self.lock = threading.Lock()

    def __call__(self, err, msg):
        with self.lock:
            if err is not None:
                self.errors.append((err, msg.key(), msg.value()))
            else:
                self.ok.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    def by_partition(self):
        out = {}
        for p, off, k, v in self.ok:
            out.setdefault(p, []).append((off, k, v))
        return out


def produce_all(p, topic, records, report, partition=None):
    """Produces [(key, value)] (or [(key, value, timestamp)]), then flushes;
    fails if anything is left undelivered after OP_TIMEOUT."""
    for rec in records:
        kw = {"key": rec[0], "value": rec[1], "on_delivery": report}
        if len(rec) > 2:
            kw["timestamp"] = rec[2]
        if partition is not None:
            kw["partition"] = partition
        while True:
            try:
                p.produce(topic, **kw)
                break
            except BufferError:  # local queue full: serve delivery reports
                p.poll(0.1)
        p.poll(0)
    left = p.flush(OP_TIMEOUT)
    if left:
        raise AssertionError(f"{left} messages still undelivered after {OP_TIMEOUT} s")


def produce_through(test, p, topic, prefix, report, event, what):
    """Produces keyed records "PREFIX-n" over two partitions; after 2,000
    runs `event` on a thread and spreads the rest over it (at most ~1000/s),
    until it is over and 4,000 are produced. Returns (n, the thread)."""
    n = 0
    done = threading.Event()

    def run():
        try:
            event()
        finally:
            done.set()
    t = None
    deadline = time.monotonic() + CONSUME_TIMEOUT
    while not done.is_set() or n < 4000:
        test.assertLess(time.monotonic(), deadline, f"producing through {what} took too long")
        try:
            p.produce(topic, key=f"k{n % 2}".encode(), value=f"{prefix}-{n}".encode(), on_delivery=report)
            n += 1
        except BufferError:
            p.poll(0.1)
        p.poll(0)
        if n == 2000 and t is None:
            t = threading.Thread(target=run)
            t.start()
        if t is not None:
            time.sleep(0.001)
    return n, t


def assert_stored_once(test, p, server, topic, report, n):
    """After produce_through: every one of the n records was delivered, at
    offsets 0, 1, ... per partition, and `server` holds exactly those (read
    back over both partitions). Returns what was read."""
    test.assertEqual(p.flush(OP_TIMEOUT * 2), 0, "records left undelivered")
    test.assertEqual(report.errors, [])
    test.assertEqual(len(report.ok), n)
    for part, recs in report.by_partition().items():
        test.assertEqual([o for o, _, _ in recs], list(range(len(recs))), f"partition {part}")
    got = read_assigned(server, topic, [0, 1], n)
    test.assertEqual(got, {(part, o): (k, v) for part, o, k, v in report.ok})
    # Nothing past the acknowledged records: a retry appended again would
    # sit past them, unread by the exact read above.
    for part, recs in report.by_partition().items():
        test.assertEqual(watermarks(server, topic, part), (0, len(recs)), f"partition {part}")
    return got


def consumer(server_or_addr, group, **conf):
    addr = server_or_addr if isinstance(server_or_addr, str) else server_or_addr.kafka_addr
    c = common(addr)
    c.update({"group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
              "session.timeout.ms": 30000, "heartbeat.interval.ms": 2000, "max.poll.interval.ms": 600000,
              "enable.partition.eof": False})
    c.update(conf)
    return Consumer(c)


def read_assigned(server_or_addr, topic, partitions, count, timeout=CONSUME_TIMEOUT):
    """Reads `count` records from the start of the given partitions with
    assign() (no group): {(partition, offset): (key, value)}."""
    c = consumer(server_or_addr, unique("assign"))
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        got = {}
        deadline = time.monotonic() + timeout
        while len(got) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"read {len(got)} of {count} records of {topic} in {timeout} s")
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    raise AssertionError(f"consume error: {m.error()}")
                if (m.partition(), m.offset()) in got:
                    raise AssertionError(f"offset {m.offset()} of partition {m.partition()} delivered twice")
                got[(m.partition(), m.offset())] = (m.key(), m.value())
        return got
    finally:
        c.close()


def error_code(exc):
    err = exc.args[0] if exc.args else None
    return err.code() if isinstance(err, KafkaError) else None


class Member:
    """One consumer of a group: polls, records what it read, commits after
    every batch (synchronously, so nothing read is left uncommitted when the
    next poll serves a rebalance)."""

    def __init__(self, name, c, topic):
        self.name = name
        self.c = c
        self.topic = topic
        self.read = []        # (partition, offset, key, value)
        self.assigned = []    # partition lists, one per assignment
        self.revoked = 0
        c.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, c, partitions):
        self.assigned.append(sorted(tp.partition for tp in partitions))

    def _on_revoke(self, c, partitions):
        self.revoked += 1

    def poll(self, timeout=0.5):
        msgs = self.c.consume(num_messages=500, timeout=timeout)
        nexts = {}
        for m in msgs:
            if m.error():
                raise AssertionError(f"{self.name}: consume error {m.error()}")
            self.read.append((m.partition(), m.offset(), m.key(), m.value()))
            nexts[m.partition()] = m.offset() + 1
        if nexts:
            res = self.c.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in sorted(nexts.items())],
                                asynchronous=False)
            bad = [tp for tp in res or [] if tp.error is not None]
            if bad:
                raise AssertionError(f"{self.name}: commit failed: {bad}")
        return len(msgs)

    def current(self):
        return sorted(tp.partition for tp in self.c.assignment())

    def __repr__(self):
        return (f"{self.name}: read {len(self.read)}, assignments {self.assigned}, revoked {self.revoked}, "
                f"now {self.current()}")


def committed(server_or_addr, group, topic, partitions):
    c = consumer(server_or_addr, group)
    try:
        res = c.committed([TopicPartition(topic, p) for p in partitions], timeout=OP_TIMEOUT)
        return {tp.partition: tp.offset for tp in res}
    finally:
        c.close()


def watermarks(server_or_addr, topic, partition):
    c = consumer(server_or_addr, unique("wm"))
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=OP_TIMEOUT, cached=False)
    finally:
        c.close()


def setUpModule():
    global SHARED
    if Producer is None:
        raise unittest.SkipTest("python3-confluent-kafka is not installed (apt-get install python3-confluent-kafka)")
    SHARED = ks.start_server(shared=True)


def tearDownModule():
    ks.stop_server(SHARED)


# --------------------------------------------------------------------------

class Admin(ks.TestCase):
    def test_create_list_delete(self):
        topic = unique("admin")
        create_topic(SHARED, topic, 4)
        self.assertEqual(partitions_of(SHARED, topic), [0, 1, 2, 3])
        md = admin(SHARED).list_topics(timeout=OP_TIMEOUT)
        self.assertIn(topic, md.topics)
        self.assertEqual(len(md.brokers), 1)
        broker = next(iter(md.brokers.values()))
        self.assertEqual(f"{broker.host}:{broker.port}", SHARED.kafka_addr)
        self.assertEqual(md.controller_id, broker.id)

        # describe_configs (DescribeConfigs): the topic's configs as applied,
        # and the broker's.
        a = admin(SHARED)  # kept alive until the futures are done
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = a.describe_configs([res], request_timeout=OP_TIMEOUT)[res].result(timeout=OP_TIMEOUT)
        self.assertEqual(entries["cleanup.policy"].value, "delete")
        self.assertEqual(entries["retention.ms"].value, str(7 * 24 * 3600 * 1000))
        self.assertTrue(entries["retention.ms"].is_default)
        res = ConfigResource(ConfigResource.Type.BROKER, str(broker.id))
        entries = a.describe_configs([res], request_timeout=OP_TIMEOUT)[res].result(timeout=OP_TIMEOUT)
        self.assertEqual(entries["broker.id"].value, str(broker.id))
        with self.assertRaises(KafkaException) as cm:
            res = ConfigResource(ConfigResource.Type.TOPIC, unique("missing"))
            a.describe_configs([res], request_timeout=OP_TIMEOUT)[res].result(timeout=OP_TIMEOUT)
        self.assertEqual(error_code(cm.exception), KafkaError.UNKNOWN_TOPIC_OR_PART, cm.exception)

        # alter_configs (AlterConfigs): the topic's configs become the given set.
        res = ConfigResource(ConfigResource.Type.TOPIC, topic,
                             set_config={"retention.ms": "3600000", "message.timestamp.type": "LogAppendTime"})
        a.alter_configs([res], request_timeout=OP_TIMEOUT)[res].result(timeout=OP_TIMEOUT)
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = a.describe_configs([res], request_timeout=OP_TIMEOUT)[res].result(timeout=OP_TIMEOUT)
        self.assertEqual(entries["retention.ms"].value, "3600000")
        self.assertFalse(entries["retention.ms"].is_default)
        self.assertEqual(entries["message.timestamp.type"].value, "LogAppendTime")
        with self.assertRaises(KafkaException) as cm:
            res = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"cleanup.policy": "compact"})
            a.alter_configs([res], request_timeout=OP_TIMEOUT)[res].result(timeout=OP_TIMEOUT)
        self.assertEqual(error_code(cm.exception), KafkaError.INVALID_CONFIG, cm.exception)
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = a.describe_configs([res], request_timeout=OP_TIMEOUT)[res].result(timeout=OP_TIMEOUT)
        self.assertEqual(entries["retention.ms"].value, "3600000")  # the refused change changed nothing

        # create_partitions (CreatePartitions): more partitions, never fewer.
        futures = a.create_partitions([NewPartitions(topic, 6)], request_timeout=OP_TIMEOUT)
        futures[topic].result(timeout=OP_TIMEOUT)
        self.assertEqual(partitions_of(SHARED, topic), [0, 1, 2, 3, 4, 5])
        with self.assertRaises(KafkaException) as cm:
            a.create_partitions([NewPartitions(topic, 2)], request_timeout=OP_TIMEOUT)[topic].result(timeout=OP_TIMEOUT)
        self.assertEqual(error_code(cm.exception), KafkaError.INVALID_PARTITIONS, cm.exception)

        # Creating it again is TOPIC_ALREADY_EXISTS; zero partitions is INVALID_PARTITIONS.
        with self.assertRaises(KafkaException) as cm:
            create_topic(SHARED, topic, 4)
        self.assertEqual(error_code(cm.exception), KafkaError.TOPIC_ALREADY_EXISTS, cm.exception)
        with self.assertRaises(KafkaException) as cm:
            create_topic(SHARED, unique("zero"), 0)
        self.assertEqual(error_code(cm.exception), KafkaError.INVALID_PARTITIONS, cm.exception)

        # Records in it, then delete: gone from the metadata; a new topic of
        # the same name starts empty.
        rep = Deliveries()
        p = producer(SHARED)
        produce_all(p, topic, [(b"k%d" % i, b"v%d" % i) for i in range(40)], rep)
        self.assertEqual(len(rep.ok), 40)
        a = admin(SHARED)
        futures = a.delete_topics([topic], operation_timeout=60, request_timeout=OP_TIMEOUT)
        futures[topic].result(timeout=OP_TIMEOUT)
        deadline = time.monotonic() + OP_TIMEOUT
        while topic in admin(SHARED).list_topics(timeout=OP_TIMEOUT).topics:
            self.assertLess(time.monotonic(), deadline, f"{topic} still listed {OP_TIMEOUT} s after its deletion")
            time.sleep(0.5)
        with self.assertRaises(KafkaException) as cm:
            f = a.delete_topics([topic], operation_timeout=60, request_timeout=OP_TIMEOUT)
            f[topic].result(timeout=OP_TIMEOUT)
        self.assertEqual(error_code(cm.exception), KafkaError.UNKNOWN_TOPIC_OR_PART, cm.exception)

        create_topic(SHARED, topic, 2)
        self.assertEqual(partitions_of(SHARED, topic), [0, 1])
        for part in (0, 1):
            self.assertEqual(watermarks(SHARED, topic, part), (0, 0), f"partition {part} of the re-created topic")


class DefaultPartitions(ks.TestCase):
    def test_num_partitions_is_the_auto_create_count(self):
        # Kafka's num.partitions: topics created on first use and a
        # CreateTopics that asks for the default (-1) get the same count.
        server = ks.start_server(["--kafka-auto-create-partitions", "3"])
        try:
            a = admin(server)
            topic = unique("dflt")
            futures = a.create_topics([NewTopic(topic, num_partitions=-1, replication_factor=-1)],
                                      operation_timeout=60, request_timeout=OP_TIMEOUT)
            futures[topic].result(timeout=OP_TIMEOUT)
            self.assertEqual(partitions_of(server, topic), [0, 1, 2])
            md = a.list_topics(timeout=OP_TIMEOUT)
            res = ConfigResource(ConfigResource.Type.BROKER, str(next(iter(md.brokers))))
            entries = a.describe_configs([res], request_timeout=OP_TIMEOUT)[res].result(timeout=OP_TIMEOUT)
            self.assertEqual(entries["num.partitions"].value, "3")
        finally:
            ks.stop_server(server)


class MaxStreams(ks.TestCase):
    def test_topics_past_max_streams_are_a_policy_violation(self):
        # --max-streams counts partitions: past it CreateTopics (also when
        # only validating) and CreatePartitions are POLICY_VIOLATION, and a
        # topic auto-created on first use stays missing.
        server = ks.start_server(["--max-streams", "4", "--kafka-auto-create-partitions", "2"])
        try:
            a = admin(server)
            first, second = unique("cap"), unique("cap")
            create_topic(server, first, 3)

            def refused(futures, name):
                with self.assertRaises(KafkaException) as ctx:
                    futures[name].result(timeout=OP_TIMEOUT)
                err = ctx.exception.args[0]
                self.assertEqual(err.code(), KafkaError.POLICY_VIOLATION, err)
                self.assertIn("--max-streams", err.str())

            for validate in (True, False):
                refused(a.create_topics([NewTopic(second, num_partitions=2, replication_factor=1)],
                                        validate_only=validate, operation_timeout=60, request_timeout=OP_TIMEOUT),
                        second)
            refused(a.create_partitions([NewPartitions(first, 5)], operation_timeout=60,
                                        request_timeout=OP_TIMEOUT), first)
            md = a.list_topics(timeout=OP_TIMEOUT)
            self.assertNotIn(second, md.topics)
            self.assertEqual(partitions_of(server, first), [0, 1, 2])
            # Auto-creation (Metadata) past the limit: the topic stays missing.
            auto = unique("auto")
            md = a.list_topics(topic=auto, timeout=OP_TIMEOUT)
            (t,) = md.topics.values()
            self.assertEqual(t.error.code(), KafkaError.UNKNOWN_TOPIC_OR_PART, t.error)
            # Room for one more partition: a topic of one, but still not the
            # auto-created topic's two.
            create_topic(server, second, 1)
            self.assertEqual(partitions_of(server, second), [0])
            # A delete makes room: the same Metadata now creates it.
            a.delete_topics([first], operation_timeout=60, request_timeout=OP_TIMEOUT)[first].result(timeout=OP_TIMEOUT)
            md = a.list_topics(topic=auto, timeout=OP_TIMEOUT)
            self.assertEqual(sorted(md.topics[auto].partitions), [0, 1], md.topics[auto].error)
        finally:
            ks.stop_server(server)


class IdempotentProducer(ks.TestCase):
    def test_keyed_records_across_four_partitions(self):
        topic = unique("idem")
        create_topic(SHARED, topic, 4)
        m = 3000
        records = [(f"key-{i % 57}".encode(), f"value-{i}".encode()) for i in range(m)]
        rep = Deliveries()
        p = producer(SHARED)
        produce_all(p, topic, records, rep)
        self.assertEqual(rep.errors, [])
        self.assertEqual(len(rep.ok), m)
        parts = rep.by_partition()
        self.assertGreater(len(parts), 1, "57 keys all hashed to one partition?")
        key_part = {}
        for part, recs in parts.items():
            # Offsets in report order are 0, 1, 2, ...: increasing, no gap, no duplicate.
            self.assertEqual([off for off, _, _ in recs], list(range(len(recs))), f"partition {part}")
            for _, k, _ in recs:  # one key, one partition
                self.assertEqual(key_part.setdefault(k, part), part)
        # Per key, the records are in the order they were sent.
        by_key = {}
        for part in sorted(parts):
            for _, k, v in parts[part]:
                by_key.setdefault(k, []).append(int(v.split(b"-")[1]))
        for k, seq in by_key.items():
            self.assertEqual(seq, sorted(seq), k)

        # ListOffsets: [0, count) for every partition.
        for part in range(4):
            self.assertEqual(watermarks(SHARED, topic, part), (0, len(parts.get(part, []))), f"partition {part}")
        # And the records through the REST API, values as bodies.
        for part, recs in parts.items():
            self.assertEqual([r["body"] for r in rest_read(SHARED, topic, part, len(recs))],
                             [v for _, _, v in recs], f"partition {part}")


class ConsumerGroup(ks.TestCase):
    def test_two_members_exactly_once_then_resume_after_restart(self):
        topic, group = unique("grp"), unique("group")
        create_topic(SHARED, topic, 4)
        m = 2000
        rep = Deliveries()
        produce_all(producer(SHARED), topic, [(f"k{i % 31}".encode(), f"g-{i}".encode()) for i in range(m)], rep)
        self.assertEqual((len(rep.ok), rep.errors), (m, []))
        sent = {(part, off): v for part, off, _, v in rep.ok}
        counts = {part: len(recs) for part, recs in rep.by_partition().items()}

        # Two members join together (within the initial rebalance delay).
        a = Member("a", consumer(SHARED, group), topic)
        b = Member("b", consumer(SHARED, group), topic)
        members = [a, b]
        try:
            deadline = time.monotonic() + CONSUME_TIMEOUT
            seen = {}
            dups = []
            while len(seen) < m:
                self.assertLess(time.monotonic(), deadline, f"read {len(seen)} of {m}: {members}")
                for mem in members:
                    start = len(mem.read)
                    mem.poll()
                    for part, off, _, v in mem.read[start:]:
                        if (part, off) in seen:
                            dups.append((part, off, seen[(part, off)][0], mem.name))
                        seen[(part, off)] = (mem.name, v)
            self.assertEqual(dups, [], f"records read twice: {dups[:20]} ... {members}")
            self.assertEqual({k: v for k, (_, v) in seen.items()}, sent)
            self.assertEqual(len(a.read) + len(b.read), m, members)
            # Both members got partitions (and read from them).
            self.assertTrue(a.current() and b.current(), members)
            self.assertEqual(sorted(a.current() + b.current()), [0, 1, 2, 3], members)
            self.assertTrue(a.read and b.read, members)
            # The committed offsets are the ends of the partitions.
            self.assertEqual(committed(SHARED, group, topic, range(4)), {p: counts.get(p, 0) for p in range(4)})
            # librdkafka's group listing (ListGroups, then DescribeGroups) sees
            # the live group, its two members and their assignments.
            [g] = admin(SHARED).list_groups(group, timeout=OP_TIMEOUT)
            self.assertEqual((g.id, g.error, g.state, g.protocol_type), (group, None, "Stable", "consumer"))
            self.assertEqual(len(g.members), 2)
            self.assertTrue(all(mem.assignment for mem in g.members), g.members)
            self.assertIn(group, [x.id for x in admin(SHARED).list_groups(timeout=OP_TIMEOUT)])
        finally:
            for mem in members:
                mem.c.close()

        # Restart weir: the committed offsets survive, and a new member of
        # the group starts there: it reads only what is produced afterwards.
        SHARED.restart()
        self.assertEqual(committed(SHARED, group, topic, range(4)), {p: counts.get(p, 0) for p in range(4)})
        c = Member("c", consumer(SHARED, group), topic)
        try:
            deadline = time.monotonic() + CONSUME_TIMEOUT
            while c.current() != [0, 1, 2, 3]:
                self.assertLess(time.monotonic(), deadline, f"no assignment after the restart: {c}")
                c.poll()
            for _ in range(6):  # a few more polls: nothing old may show up
                c.poll()
            self.assertEqual(c.read, [], "read records committed before the restart")
            k = 400
            rep2 = Deliveries()
            produce_all(producer(SHARED), topic, [(f"k{i % 31}".encode(), f"after-{i}".encode()) for i in range(k)],
                        rep2)
            self.assertEqual((len(rep2.ok), rep2.errors), (k, []))
            while len(c.read) < k:
                self.assertLess(time.monotonic(), deadline, f"read {len(c.read)} of {k} new records: {c}")
                c.poll()
            for _ in range(4):
                c.poll()
            self.assertEqual(sorted((p, o, v) for p, o, _, v in c.read),
                             sorted((p, o, v) for p, o, _, v in rep2.ok))
            for p, o, _, _ in rep2.ok:
                self.assertGreaterEqual(o, counts.get(p, 0))
            ends = {p: counts.get(p, 0) for p in range(4)}
            for p, _, _, _ in rep2.ok:
                ends[p] += 1
            self.assertEqual(committed(SHARED, group, topic, range(4)), ends)
        finally:
            c.c.close()


class Restart(ks.TestCase):
    def test_restart_between_produce_and_consume_loses_nothing(self):
        server = ks.start_server()
        try:
            topic = unique("rst")
            create_topic(server, topic, 3)
            rep = Deliveries()
            produce_all(producer(server), topic,
                        [(f"k{i % 11}".encode(), f"r-{i}".encode() * (1 + i % 40)) for i in range(1500)], rep)
            self.assertEqual((len(rep.ok), rep.errors), (1500, []))
            # SIGKILL, not SIGTERM: no drain settles anything first, so every
            # acknowledged record must already have been durable.
            server.crash_restart()
            self.assertEqual(partitions_of(server, topic), [0, 1, 2])
            got = read_assigned(server, topic, [0, 1, 2], 1500)
            self.assertEqual(got, {(p, o): (k, v) for p, o, k, v in rep.ok})
            for part, recs in rep.by_partition().items():
                self.assertEqual(watermarks(server, topic, part), (0, len(recs)))
        finally:
            ks.stop_server(server)

    def test_idempotent_producer_through_a_restart(self):
        """Produces while the server is killed (SIGKILL) and started again on
        the same port: answers to batches in flight are lost, so librdkafka
        retries them with the same producer id and sequences; every record
        ends up stored exactly once, in order per partition."""
        port = ks.free_port()
        server = ks.start_server(["--kafka-addr", f"127.0.0.1:{port}"])
        try:
            topic = unique("idem-rst")
            create_topic(server, topic, 2)
            rep = Deliveries()
            p = producer(server, **{"retry.backoff.ms": 200, "reconnect.backoff.max.ms": 2000})
            n, t = produce_through(self, p, topic, "x", rep, server.crash_restart, "the restart")
            t.join(OP_TIMEOUT * 3)
            self.assertFalse(t.is_alive(), "the restart did not finish")
            self.assertTrue(server.running(), "the server did not come back\n" + server.log_tail())
            got = assert_stored_once(self, p, server, topic, rep, n)
            self.assertEqual(sorted(v for _, v in got.values()), sorted(f"x-{i}".encode() for i in range(n)))
        finally:
            ks.stop_server(server)


class Failover(ks.TestCase):
    def test_idempotent_producer_reaches_a_successor_process(self):
        """A second process of the node starts (on another port, on the same
        store and metastore) while the first still runs and a producer
        sends to it: the first learns it was superseded, closes its Kafka
        listener and connections, and librdkafka, bootstrapped with both
        addresses, finds the node at the second one. Every record is stored
        exactly once, in order per partition."""
        # Kept after a failure, so the run's summary can print both logs.
        d = tempfile.mkdtemp(prefix="weir-failover-")
        ports = [ks.free_port(), ks.free_port()]
        shared = ["--object-store", "file://" + os.path.join(d, "objects"),
                  "--metastore", "sqlite://" + os.path.join(d, "meta.db")]
        first = ks.start_server(shared + ["--kafka-addr", f"127.0.0.1:{ports[0]}"],
                                data_dir=os.path.join(d, "first"))
        second = ks.WeirServer(ks.WEIR, data_dir=os.path.join(d, "second"),
                               args=shared + ["--kafka-addr", f"127.0.0.1:{ports[1]}"])
        ks.SERVERS.append(second)
        try:
            topic = unique("failover")
            create_topic(first, topic, 2)
            rep = Deliveries()
            p = producer(",".join(f"127.0.0.1:{port}" for port in ports),
                         **{"retry.backoff.ms": 200, "reconnect.backoff.max.ms": 1000,
                            "topic.metadata.refresh.interval.ms": 1000})
            n, t = produce_through(self, p, topic, "f", rep, second.start, "the failover")
            t.join(OP_TIMEOUT)
            self.assertTrue(second.running(), "the second process did not start\n" + second.log_tail())
            assert_stored_once(self, p, second, topic, rep, n)
            # The first process's Kafka listener is closed (its HTTP one
            # stays, for /health to say superseded).
            with socket.socket() as sock:
                sock.settimeout(OP_TIMEOUT)
                with self.assertRaises(ConnectionRefusedError):
                    sock.connect(("127.0.0.1", ports[0]))
        finally:
            ks.stop_server(second)
            if first.running():
                first.stop(expect_code=None)
        shutil.rmtree(d)


class ListOffsets(ks.TestCase):
    def test_watermarks_and_offsets_for_times(self):
        topic = unique("times")
        create_topic(SHARED, topic, 1)
        self.assertEqual(watermarks(SHARED, topic, 0), (0, 0))
        base = int(time.time() * 1000) - 3_600_000  # an hour ago, one record a second
        rep = Deliveries()
        produce_all(producer(SHARED), topic, [(b"t", f"t{i}".encode(), base + 1000 * i) for i in range(20)], rep,
                    partition=0)
        self.assertEqual(len(rep.ok), 20)
        self.assertEqual(watermarks(SHARED, topic, 0), (0, 20))
        c = consumer(SHARED, unique("times"))
        try:
            def at(ts):
                res = c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=OP_TIMEOUT)
                self.assertIsNone(res[0].error)
                return res[0].offset
            self.assertEqual(at(base - 10_000), 0)        # before everything: the first
            self.assertEqual(at(base), 0)
            self.assertEqual(at(base + 5000), 5)          # exactly a record's timestamp
            self.assertEqual(at(base + 5001), 6)          # the first at or after it
            self.assertEqual(at(base + 19_000), 19)
            self.assertEqual(at(base + 20_000), -1)       # past the last: none (OFFSET_END)
        finally:
            c.close()
        # The timestamps are stored as the producer set them (CreateTime).
        got = read_assigned(SHARED, topic, [0], 20)
        self.assertEqual([got[(0, i)][1] for i in range(20)], [f"t{i}".encode() for i in range(20)])


class Transactions(ks.TestCase):
    def test_transactional_producer_is_rejected(self):
        p = Producer(dict(common(SHARED.kafka_addr), **{"transactional.id": unique("txn"),
                                                        "transaction.timeout.ms": 60000}))
        with self.assertRaises(KafkaException) as cm:
            p.init_transactions(OP_TIMEOUT)
        err = cm.exception.args[0]
        self.assertEqual(err.code(), KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                         f"init_transactions failed with {err.name()}: {err.str()}")
        # An idempotent producer on the same server still works.
        rep = Deliveries()
        topic = unique("after-txn")
        produce_all(producer(SHARED), topic, [(None, b"ok")], rep)
        self.assertEqual([(part, off) for part, off, _, _ in rep.ok], [(0, 0)])


if __name__ == "__main__":
    if Producer is None:
        print("SKIP: python3-confluent-kafka is not installed (apt-get install python3-confluent-kafka)")
        sys.exit(ks.missing_client_exit_code())  # CTest's SKIP_RETURN_CODE: shown as skipped, not passed
    ks.main("confluent_test.py WEIR_BINARY [unittest args] (or set WEIR_BIN)")
