// kafkajs (pinned in package-lock.json), an unmodified Kafka client in pure
// JavaScript, against a real weir server.
// Run: WEIR_BIN=/path/to/weir node --test kafkajs.test.mjs  (or ./run.sh WEIR)
//
// Admin (createTopics, fetchTopicMetadata, listTopics, deleteTopics,
// fetchTopicOffsets, fetchOffsets), an idempotent producer sending batches
// (plain and gzip), a consumer group of two members reading everything back
// exactly once with eachMessage and committing (visible through
// admin.fetchOffsets), and a restart of weir between produce and consume that
// loses nothing. Every wait is bounded; no test asserts an upper bound on time.
// KAFKAJS_LOG=warn (or info, debug) shows kafkajs's own log.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, it } from "node:test";

import { CompressionTypes, Kafka, Partitioners, logLevel } from "kafkajs";

import { WeirServer } from "../../js/weir_server.mjs";

const BIN = process.env.WEIR_BIN;
const T = { timeout: 300_000 };
const WAIT_MS = 180_000; // bound on any one wait (a loaded 2-core machine)
const LOG_LEVEL = { warn: logLevel.WARN, info: logLevel.INFO, debug: logLevel.DEBUG }[process.env.KAFKAJS_LOG] ??
  logLevel.NOTHING;

const unique = (prefix) => `${prefix}-${randomBytes(5).toString("hex")}`;

function kafka(server, clientId = "weir-kafkajs-test") {
  assert.ok(server.kafkaAddr, "the server's ready line names no kafka://HOST:PORT");
  return new Kafka({
    clientId,
    brokers: [server.kafkaAddr],
    logLevel: LOG_LEVEL,
    connectionTimeout: 30_000,
    authenticationTimeout: 30_000,
    requestTimeout: 60_000,
    retry: { retries: 10, initialRetryTime: 300, maxRetryTime: 5_000 },
  });
}

// Resolves with `promise`, or rejects after `ms` naming `what`.
async function within(ms, what, promise) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: nothing after ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

// Polls `check` (async, returns a truthy value when done) until it is done.
async function until(what, check, ms = WAIT_MS) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    last = await check();
    if (last) return last;
    if (Date.now() > deadline) throw new Error(`${what}: not done after ${ms} ms`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

function idempotentProducer(client) {
  return client.producer({
    idempotent: true,
    maxInFlightRequests: 1,
    createPartitioner: Partitioners.DefaultPartitioner,
    retry: { retries: 10, initialRetryTime: 300, maxRetryTime: 5_000 },
  });
}

// Sends `batches` batches of `per` records, record i going to partition
// i % partitions; checks each send's base offsets against the running count
// of its partition (starting at `start[p]`, or 0). Returns the records:
// [{partition, offset, key, value}].
async function produceBatches(producer, topic, { batches, per, partitions, tag, compression, start = {} }) {
  const counts = Array.from({ length: partitions }, (_, p) => start[p] ?? 0);
  const sent = [];
  for (let b = 0; b < batches; b++) {
    const messages = [];
    for (let i = 0; i < per; i++) {
      const n = b * per + i;
      messages.push({ partition: n % partitions, key: `key-${n % 17}`, value: `${tag}-${n}` });
    }
    const res = await within(WAIT_MS, `send of batch ${b}`, producer.send({ topic, acks: -1, messages, compression }));
    for (const r of res) {
      assert.equal(r.errorCode, 0, JSON.stringify(r));
      assert.equal(Number(r.baseOffset), counts[r.partition], `base offset of partition ${r.partition}, batch ${b}`);
    }
    assert.equal(res.length, Math.min(partitions, per));
    for (const m of messages) {
      sent.push({ partition: m.partition, offset: counts[m.partition]++, key: m.key, value: m.value });
    }
  }
  return sent;
}

const id = (partition, offset) => `${partition}:${offset}`;
const asMap = (records) => new Map(records.map((r) => [id(r.partition, r.offset), `${r.key}=${r.value}`]));

// Members of one group, run together: resolves once `expected` distinct
// records have been read. Returns {members, read: Map id -> "key=value", dups}.
async function consumeInGroup(client, { groupId, topic, members, expected }) {
  const read = new Map();
  const dups = [];
  const joins = [];
  let resolveAll;
  const all = new Promise((r) => { resolveAll = r; });
  const consumers = [];
  for (let m = 0; m < members; m++) {
    const c = client.consumer({
      groupId,
      sessionTimeout: 30_000,
      rebalanceTimeout: 60_000,
      heartbeatInterval: 3_000,
      maxWaitTimeInMs: 1_000,
      retry: { retries: 10, initialRetryTime: 300, maxRetryTime: 5_000 },
    });
    const me = { name: `member-${m}`, consumer: c, read: 0, assignment: [] };
    c.on(c.events.GROUP_JOIN, ({ payload }) => {
      me.assignment = payload.memberAssignment[topic] ?? [];
      joins.push({ member: me.name, assignment: me.assignment });
    });
    consumers.push(me);
  }
  try {
    await Promise.all(consumers.map(async (me) => {
      await within(WAIT_MS, `${me.name} connect`, me.consumer.connect());
      await within(WAIT_MS, `${me.name} subscribe`, me.consumer.subscribe({ topics: [topic], fromBeginning: true }));
    }));
    // All run together, so all join within the initial rebalance delay.
    await within(WAIT_MS, "consumer run", Promise.all(consumers.map((me) => me.consumer.run({
      eachMessage: async ({ partition, message }) => {
        const key = id(partition, message.offset);
        if (read.has(key)) dups.push({ key, member: me.name });
        read.set(key, `${message.key?.toString()}=${message.value?.toString()}`);
        me.read++;
        if (read.size >= expected) resolveAll();
      },
    }))));
    await within(WAIT_MS, `reading ${expected} records`, all);
  } catch (e) {
    e.message += `; read ${read.size} of ${expected}; joins ${JSON.stringify(joins)}`;
    await Promise.all(consumers.map((me) => me.consumer.disconnect().catch(() => {})));
    throw e;
  }
  return { members: consumers, read, dups, joins };
}

async function committedOffsets(admin, groupId, topic) {
  const [res] = await within(WAIT_MS, "fetchOffsets", admin.fetchOffsets({ groupId, topics: [topic] }));
  assert.equal(res.topic, topic);
  return Object.fromEntries(res.partitions.map((p) => [p.partition, Number(p.offset)]));
}

async function highWatermarks(admin, topic) {
  const offs = await within(WAIT_MS, "fetchTopicOffsets", admin.fetchTopicOffsets(topic));
  return Object.fromEntries(offs.map((p) => [p.partition, Number(p.high)]));
}

function countsByPartition(records, partitions) {
  const out = {};
  for (let p = 0; p < partitions; p++) out[p] = 0;
  for (const r of records) out[r.partition]++;
  return out;
}

describe("kafkajs against weir", () => {
  let server;
  let client;
  let admin;
  const topic = unique("kjs");
  const groupId = unique("kjs-group");
  let sent = [];

  // Adds the server's log tail to a failure.
  const test = (name, fn) => it(name, T, async () => {
    try {
      await fn();
    } catch (e) {
      e.message += `\n${server?.logTail() ?? ""}`;
      throw e;
    }
  });

  before(async () => {
    server = new WeirServer(BIN);
    await server.start();
    client = kafka(server);
    admin = client.admin();
    await within(WAIT_MS, "admin connect", admin.connect());
  });

  after(async () => {
    try {
      await admin?.disconnect();
      await server?.stop();
    } finally {
      server?.cleanup();
    }
  });

  test("admin: createTopics, fetchTopicMetadata, listTopics, deleteTopics", async () => {
    const cluster = await within(WAIT_MS, "describeCluster", admin.describeCluster());
    assert.equal(cluster.brokers.length, 1);
    assert.equal(`${cluster.brokers[0].host}:${cluster.brokers[0].port}`, server.kafkaAddr);
    assert.equal(cluster.controller, cluster.brokers[0].nodeId);

    const other = unique("kjs-del");
    assert.equal(await within(WAIT_MS, "createTopics", admin.createTopics({
      topics: [{ topic, numPartitions: 3 }, { topic: other, numPartitions: 2 }],
      waitForLeaders: true,
      timeout: 60_000,
    })), true);
    // Again: kafkajs answers false for topics that already exist.
    assert.equal(await within(WAIT_MS, "createTopics again",
      admin.createTopics({ topics: [{ topic, numPartitions: 3 }], timeout: 60_000 })), false);

    const md = await within(WAIT_MS, "fetchTopicMetadata", admin.fetchTopicMetadata({ topics: [topic, other] }));
    const byName = Object.fromEntries(md.topics.map((t) => [t.name, t]));
    assert.deepEqual(byName[topic].partitions.map((p) => p.partitionId).sort(), [0, 1, 2]);
    assert.deepEqual(byName[other].partitions.map((p) => p.partitionId).sort(), [0, 1]);
    for (const p of byName[topic].partitions) {
      assert.equal(p.partitionErrorCode, 0);
      assert.equal(p.leader, cluster.brokers[0].nodeId);
    }
    // createPartitions: the new partitions show in the metadata.
    await within(WAIT_MS, "createPartitions", admin.createPartitions({ topicPartitions: [{ topic: other, count: 4 }] }));
    const grown = await within(WAIT_MS, "fetchTopicMetadata", admin.fetchTopicMetadata({ topics: [other] }));
    assert.deepEqual(grown.topics[0].partitions.map((p) => p.partitionId).sort(), [0, 1, 2, 3]);
    // describeConfigs: the topic's configs as weir applies them (kafkajs' ConfigResourceTypes.TOPIC = 2).
    const configs = await within(WAIT_MS, "describeConfigs", admin.describeConfigs({
      resources: [{ type: 2, name: topic, configNames: ["retention.ms", "cleanup.policy"] }, { type: 2, name: other }],
      includeSynonyms: false,
    }));
    assert.equal(configs.resources[0].errorCode, 0);
    assert.deepEqual(Object.fromEntries(configs.resources[0].configEntries.map((e) => [e.configName, e.configValue])),
      { "cleanup.policy": "delete", "retention.ms": String(7 * 24 * 3600 * 1000) });
    // No names (kafkajs sends an empty list): every config.
    const all = Object.fromEntries(configs.resources[1].configEntries.map((e) => [e.configName, e.configValue]));
    assert.equal(all["message.timestamp.type"], "CreateTime");
    assert.equal(all["cleanup.policy"], "delete");
    const names = await within(WAIT_MS, "listTopics", admin.listTopics());
    assert.ok(names.includes(topic) && names.includes(other), JSON.stringify(names));
    assert.deepEqual(await highWatermarks(admin, topic), { 0: 0, 1: 0, 2: 0 });

    await within(WAIT_MS, "deleteTopics", admin.deleteTopics({ topics: [other], timeout: 60_000 }));
    await until(`${other} gone from listTopics`, async () => !(await admin.listTopics()).includes(other));
    assert.ok((await admin.listTopics()).includes(topic));
  });

  test("an idempotent producer sends batches (plain and gzip)", async () => {
    const producer = idempotentProducer(client);
    await within(WAIT_MS, "producer connect", producer.connect());
    try {
      sent = await produceBatches(producer, topic, { batches: 12, per: 100, partitions: 3, tag: "plain" });
      const counts = countsByPartition(sent, 3);
      sent = sent.concat(await produceBatches(producer, topic, {
        batches: 3, per: 50, partitions: 3, tag: "gzip", compression: CompressionTypes.GZIP, start: counts,
      }));
      // sendBatch: several topics' messages in one request (here one topic).
      const res = await within(WAIT_MS, "sendBatch", producer.sendBatch({
        acks: -1,
        topicMessages: [{ topic, messages: [{ partition: 1, key: "sb", value: "send-batch-1" },
          { partition: 1, key: "sb", value: "send-batch-2" }] }],
      }));
      assert.equal(res.length, 1);
      assert.equal(Number(res[0].baseOffset), countsByPartition(sent, 3)[1]);
      const base = Number(res[0].baseOffset);
      sent.push({ partition: 1, offset: base, key: "sb", value: "send-batch-1" },
        { partition: 1, offset: base + 1, key: "sb", value: "send-batch-2" });
    } finally {
      await producer.disconnect();
    }
    assert.deepEqual(await highWatermarks(admin, topic), countsByPartition(sent, 3));
  });

  test("an idempotent producer goes on after its topic is deleted and created again", async () => {
    // The new topic's partitions do not know the producer, whose next batch
    // is past sequence 0: taken (Kafka since KIP-360); kafkajs does not
    // recover from UNKNOWN_PRODUCER_ID.
    const again = unique("kjs-again");
    const producer = idempotentProducer(client);
    await within(WAIT_MS, "producer connect", producer.connect());
    try {
      await within(WAIT_MS, "createTopics", admin.createTopics({ topics: [{ topic: again }], timeout: 60_000 }));
      const send = (value) => within(WAIT_MS, `send ${value}`, producer.send({
        topic: again, acks: -1, messages: [{ partition: 0, value }],
      }));
      await send("before-1");
      await send("before-2");
      await within(WAIT_MS, "deleteTopics", admin.deleteTopics({ topics: [again], timeout: 60_000 }));
      await until(`${again} gone`, async () => !(await admin.listTopics()).includes(again));
      await within(WAIT_MS, "createTopics", admin.createTopics({ topics: [{ topic: again }], timeout: 60_000 }));
      const res = await send("after-1");
      assert.equal(Number(res[0].baseOffset), 0);
      assert.equal(Number((await send("after-2"))[0].baseOffset), 1);
    } finally {
      await producer.disconnect();
    }
    assert.deepEqual(await highWatermarks(admin, again), { 0: 2 });
  });

  test("a plain (not idempotent) producer sends too", async () => {
    // kafkajs sends producer id -1 with epoch 0 and sequence 0 here.
    const producer = client.producer({ createPartitioner: Partitioners.DefaultPartitioner });
    await within(WAIT_MS, "plain producer connect", producer.connect());
    try {
      const counts = countsByPartition(sent, 3);
      const res = await within(WAIT_MS, "plain send", producer.send({
        topic, acks: -1, messages: [{ partition: 2, key: "plain", value: "plain-1" }],
      }));
      assert.equal(Number(res[0].baseOffset), counts[2]);
      sent.push({ partition: 2, offset: counts[2], key: "plain", value: "plain-1" });
    } finally {
      await producer.disconnect();
    }
  });

  test("a consumer group of two members reads everything exactly once and commits", async () => {
    assert.ok(sent.length > 0, "the producer test ran first");
    const expected = asMap(sent);
    const { members, read, dups, joins } = await consumeInGroup(client, {
      groupId, topic, members: 2, expected: expected.size,
    });
    try {
      assert.deepEqual(dups, [], `records read twice; joins ${JSON.stringify(joins)}`);
      assert.deepEqual(read, expected);
      for (const me of members) {
        assert.ok(me.assignment.length > 0, `${me.name} got no partitions: ${JSON.stringify(joins)}`);
      }
      assert.deepEqual(members.flatMap((me) => me.assignment).sort(), [0, 1, 2]);
      // The admin API sees the live group: listGroups, describeGroups.
      const { groups } = await within(WAIT_MS, "listGroups", admin.listGroups());
      assert.deepEqual(groups.filter((g) => g.groupId === groupId), [{ groupId, protocolType: "consumer" }]);
      const described = await within(WAIT_MS, "describeGroups", admin.describeGroups([groupId]));
      assert.equal(described.groups.length, 1);
      assert.equal(described.groups[0].state, "Stable");
      assert.equal(described.groups[0].protocolType, "consumer");
      assert.equal(described.groups[0].members.length, 2);
      // The group's committed offsets reach the end of every partition.
      const ends = countsByPartition(sent, 3);
      await until("committed offsets at the ends of the partitions", async () => {
        const c = await committedOffsets(admin, groupId, topic);
        return JSON.stringify(c) === JSON.stringify(ends) ? c : null;
      });
    } finally {
      await Promise.all(members.map((me) => me.consumer.disconnect()));
    }
    assert.deepEqual(await committedOffsets(admin, groupId, topic), countsByPartition(sent, 3));
  });

  test("a restart of weir between produce and consume loses nothing", async () => {
    const t = unique("kjs-restart");
    assert.equal(await within(WAIT_MS, "createTopics", admin.createTopics({
      topics: [{ topic: t, numPartitions: 2 }], waitForLeaders: true, timeout: 60_000,
    })), true);
    const producer = idempotentProducer(client);
    await within(WAIT_MS, "producer connect", producer.connect());
    let records;
    try {
      records = await produceBatches(producer, t, { batches: 8, per: 125, partitions: 2, tag: "before-restart" });
    } finally {
      await producer.disconnect();
    }
    const before = await highWatermarks(admin, t);
    await admin.disconnect();

    // SIGKILL, not SIGTERM: no drain settles anything first, so every
    // acknowledged record must already have been durable.
    await server.crash();
    await server.start(); // same data dir, new ports
    client = kafka(server);
    admin = client.admin();
    await within(WAIT_MS, "admin connect", admin.connect());

    assert.deepEqual(await highWatermarks(admin, t), before);
    // The committed offsets of the earlier group survived too.
    assert.deepEqual(await committedOffsets(admin, groupId, topic), countsByPartition(sent, 3));

    const g = unique("kjs-restart-group");
    const expected = asMap(records);
    const { members, read, dups } = await consumeInGroup(client, { groupId: g, topic: t, members: 1,
      expected: expected.size });
    try {
      assert.deepEqual(dups, []);
      assert.deepEqual(read, expected);
      await until("committed offsets after the restart", async () => {
        const c = await committedOffsets(admin, g, t);
        return JSON.stringify(c) === JSON.stringify(before) ? c : null;
      });
    } finally {
      await Promise.all(members.map((me) => me.consumer.disconnect()));
    }
  });

  test("admin: a group without members is described as Empty and deleted with its offsets", async () => {
    // After the restart the first group has committed offsets and no members.
    const described = await within(WAIT_MS, "describeGroups", admin.describeGroups([groupId]));
    assert.equal(described.groups[0].state, "Empty");
    assert.deepEqual(described.groups[0].members, []);
    assert.ok((await admin.listGroups()).groups.some((g) => g.groupId === groupId));
    await within(WAIT_MS, "deleteGroups", admin.deleteGroups([groupId]));
    assert.ok(!(await admin.listGroups()).groups.some((g) => g.groupId === groupId));
    assert.deepEqual(await committedOffsets(admin, groupId, topic), { 0: -1, 1: -1, 2: -1 });
    // Deleting it again names the missing group.
    await assert.rejects(admin.deleteGroups([groupId]), (e) => {
      assert.match(String(e.groups?.[0]?.error?.type ?? e.message), /GROUP_ID_NOT_FOUND/);
      return true;
    });
  });

  test("admin: deleteTopicRecords moves the low watermark; alterConfigs replaces a topic's configs", async () => {
    const trimmed = unique("kjs-trim");
    assert.equal(await within(WAIT_MS, "createTopics", admin.createTopics({
      topics: [{ topic: trimmed, numPartitions: 2 }], waitForLeaders: true, timeout: 60_000,
    })), true);
    const producer = client.producer({ createPartitioner: Partitioners.DefaultPartitioner });
    await within(WAIT_MS, "producer connect", producer.connect());
    try {
      await within(WAIT_MS, "send", producer.send({
        topic: trimmed, acks: -1, messages: ["a", "b", "c", "d", "e"].map((value) => ({ partition: 0, value })),
      }));
      await within(WAIT_MS, "send", producer.send({ topic: trimmed, acks: -1, messages: [{ partition: 1, value: "x" }] }));
    } finally {
      await producer.disconnect();
    }
    // kafkajs looks the partition leaders up in its metadata cache: load it first.
    await within(WAIT_MS, "fetchTopicMetadata", admin.fetchTopicMetadata({ topics: [trimmed] }));
    // DeleteRecords: below offset 3 on partition 0, everything (-1) on partition 1.
    await within(WAIT_MS, "deleteTopicRecords", admin.deleteTopicRecords({
      topic: trimmed, partitions: [{ partition: 0, offset: "3" }, { partition: 1, offset: "-1" }],
    }));
    const offs = await within(WAIT_MS, "fetchTopicOffsets", admin.fetchTopicOffsets(trimmed));
    const byPartition = Object.fromEntries(offs.map((p) => [p.partition, [Number(p.low), Number(p.high)]]));
    assert.deepEqual(byPartition, { 0: [3, 5], 1: [1, 1] });
    // Past the high watermark: OFFSET_OUT_OF_RANGE, nothing changes.
    await assert.rejects(admin.deleteTopicRecords({ topic: trimmed, partitions: [{ partition: 0, offset: "9" }] }),
      (e) => {
        const partitions = e.partitions ?? e.cause?.partitions ?? [];
        assert.deepEqual(partitions.map((p) => [p.partition, p.error?.type]), [[0, "OFFSET_OUT_OF_RANGE"]]);
        return true;
      });
    assert.equal(Number((await admin.fetchTopicOffsets(trimmed)).find((p) => p.partition === 0).low), 3);
    // A consumer from the beginning starts at the new low watermark.
    const consumer = client.consumer({ groupId: unique("kjs-trim-group") });
    await within(WAIT_MS, "consumer connect", consumer.connect());
    const seen = [];
    try {
      await consumer.subscribe({ topic: trimmed, fromBeginning: true });
      await consumer.run({ eachMessage: async ({ partition, message }) => {
        seen.push([partition, Number(message.offset), message.value.toString()]);
      } });
      await until("the consumer reads offsets 3 and 4", async () => seen.length >= 2);
    } finally {
      await consumer.disconnect();
    }
    assert.deepEqual(seen.sort(), [[0, 3, "d"], [0, 4, "e"]]);

    // AlterConfigs: the new set replaces the old one (kafkajs' ConfigResourceTypes.TOPIC = 2).
    await within(WAIT_MS, "alterConfigs", admin.alterConfigs({
      validateOnly: false,
      resources: [{ type: 2, name: trimmed, configEntries: [{ name: "retention.ms", value: "3600000" },
        { name: "message.timestamp.type", value: "LogAppendTime" }] }],
    }));
    const described = await within(WAIT_MS, "describeConfigs", admin.describeConfigs({
      resources: [{ type: 2, name: trimmed, configNames: ["retention.ms", "message.timestamp.type"] }],
      includeSynonyms: false,
    }));
    assert.deepEqual(Object.fromEntries(described.resources[0].configEntries.map((e) => [e.configName, e.configValue])),
      { "retention.ms": "3600000", "message.timestamp.type": "LogAppendTime" });
    await assert.rejects(admin.alterConfigs({
      validateOnly: false, resources: [{ type: 2, name: trimmed, configEntries: [{ name: "cleanup.policy", value: "compact" }] }],
    }), (e) => {
      assert.match(String(e.type ?? e.message), /INVALID_CONFIG|compact/);
      return true;
    });
  });
});
