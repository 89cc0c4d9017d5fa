#!/usr/bin/python3
"""Crash test of the stream engine: per scenario, in a fresh directory, start
crash_child in append mode, SIGKILL it after a random delay, repeat; then run
it in verify mode, which recovers and checks every stream against the ack log.

Usage: crash_test.py CRASH_CHILD [--s3-env FILE] [--postgres-env FILE]
With --s3-env (the KEY=VALUE file tests/s3/ceph-s3-start.sh writes), each
scenario's objects live on that S3 server under a fresh prefix of its bucket
(s3://); otherwise in DIR/objects (file://). With --postgres-env (the file
tests/pg/pg-start.sh writes), each scenario's metastore is a fresh schema on
that PostgreSQL server; otherwise DIR/meta.db (sqlite://).
Environment: WEIR_CRASH_SEED (default random; printed), WEIR_CRASH_CYCLES
(default 30), WEIR_CRASH_KEEP=1 keeps the directory of a failed scenario,
WEIR_CRASH_EXTRA adds append-mode flags (e.g. "--threads 16 --cache-bytes 65536")."""
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

CHILD = sys.argv[1]
S3_ENV = sys.argv[sys.argv.index("--s3-env") + 1] if "--s3-env" in sys.argv else None
PG_ENV = sys.argv[sys.argv.index("--postgres-env") + 1] if "--postgres-env" in sys.argv else None
SEED = int(os.environ.get("WEIR_CRASH_SEED") or random.SystemRandom().randrange(1 << 32))
CYCLES = int(os.environ.get("WEIR_CRASH_CYCLES", "30"))
KEEP = os.environ.get("WEIR_CRASH_KEEP") == "1"
EXTRA = os.environ.get("WEIR_CRASH_EXTRA", "").split()  # more append-mode flags, for exploring
READY_TIMEOUT = 120  # seconds; generous for a loaded machine

# (name, append-mode flags, node ids): each cycle runs as one of the node ids,
# at random, and verify as a node of its own; a node that starts takes over
# the WAL each dead node of another id left unsettled.
SCENARIOS = [
    ("plain", [], ["crash-node"]),
    # A small log cache too: settle reads most batches back from their WAL slots.
    ("faults", ["--put-error-rate", "0.05", "--put-timeout-rate", "0.05", "--put-ambiguous-rate", "0.1",
                "--cache-bytes", "262144"], ["crash-node"]),
    # A killed node's heartbeat is stale at once (1 ms): the next start, of
    # another id or of its own, goes ahead.
    ("takeover", ["--put-ambiguous-rate", "0.05", "--node-live-window-ms", "1"], ["crash-a", "crash-b", "crash-c"]),
    # The express class: the WAL on a quorum of three stores (2 of 3), each
    # with faults of its own; in most cycles one of them fails every PUT.
    ("express", ["--wal-stores", "3", "--put-error-rate", "0.02", "--put-ambiguous-rate", "0.05"], ["crash-node"]),
]
if PG_ENV is not None:
    # The WAL on PostgreSQL (--wal-store postgres://), with ambiguous INSERTs.
    SCENARIOS.append(("postgres-wal", ["--put-ambiguous-rate", "0.05"], ["crash-node"]))


class Failure(Exception):
    pass


def tail_of(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def wait_ready(proc, deadline):
    """Waits for the child's READY line; False if it exited first."""
    buf = b""
    fd = proc.stdout.fileno()
    while b"READY" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Failure("the child did not report READY in time")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                return False
            buf += chunk
    return True


def read_s3_env(path):
    """The S3 server's endpoint, bucket and credentials, from KEY=VALUE lines."""
    env = {}
    with open(path) as f:
        for line in f:
            name, sep, value = line.strip().partition("=")
            if sep:
                env[name] = value
    return env


def store_for(name, seed):
    """Child flags and environment for one scenario's object store."""
    flags, env = [], None
    if name == "postgres-wal":
        # The WAL on PostgreSQL, in a schema of its own (the metastore stays where it is).
        base = read_s3_env(PG_ENV)["POSTGRES_URI"]
        schema = f"crash_wal_{seed}_{os.getpid()}"
        subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", base, "-c", f"CREATE SCHEMA {schema}"],
                       check=True, timeout=60)
        flags += ["--wal-store", f"{base}?options=-csearch_path%3D{schema}"]
    if PG_ENV is not None:
        base = read_s3_env(PG_ENV)["POSTGRES_URI"]
        schema = f"crash_{name}_{seed}_{os.getpid()}".replace("-", "_")
        subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", base, "-c", f"CREATE SCHEMA {schema}"],
                       check=True, timeout=60)
        flags += ["--metastore", f"{base}?options=-csearch_path%3D{schema}"]
    if S3_ENV is None:
        return flags, env
    s3 = read_s3_env(S3_ENV)
    uri = (f"s3://{s3['S3_BUCKET']}/crash-{name}-{seed}-{os.getpid()}"
           f"?endpoint={s3['S3_ENDPOINT']}&region={s3.get('AWS_DEFAULT_REGION', 'us-east-1')}")
    env = dict(os.environ, AWS_ACCESS_KEY_ID=s3["AWS_ACCESS_KEY_ID"], AWS_SECRET_ACCESS_KEY=s3["AWS_SECRET_ACCESS_KEY"])
    env.pop("AWS_SESSION_TOKEN", None)
    return flags + ["--object-store", uri], env


def slots_past_a_hole(d, node):
    """Whether the node's newest epoch's chain has a slot above a missing seq
    (a flight that landed past the hole the next start will poison). Only
    looked at on file://."""
    chain = os.path.join(d, "objects", "wal", node)
    if not os.path.isdir(chain):
        return False
    epochs = sorted(os.listdir(chain))
    if not epochs:
        return False
    seqs = sorted(int(s) for s in os.listdir(os.path.join(chain, epochs[-1])) if s.isdigit())
    # Settled slots below the checkpoint are deleted: look above the lowest.
    return bool(seqs) and seqs[-1] - seqs[0] + 1 != len(seqs)


def cycle(rng, d, ack_log, extra, nodes, i, log, store):
    """One append run as one of `nodes`, killed at a random moment."""
    node = nodes[0] if len(nodes) == 1 else rng.choice(nodes)
    args = [CHILD, "--dir", d, "--mode", "append", "--ack-log", ack_log, "--node", node,
            "--seed", str(rng.randrange(1, 1 << 62)),
            # Settle every stream each round, or let small ones wait (by
            # size, by age): kills land where some settled past a waiting one.
            "--settle-min-bytes", str(rng.choice([0, 2048, 16384, 1 << 20])),
            "--settle-max-delay-ms", str(rng.choice([0, 100, 400, 10000]))] + store[0] + extra + EXTRA
    if "--wal-stores" in extra:
        args += ["--wal-down-store", str(rng.randrange(-1, int(extra[extra.index("--wal-stores") + 1])))]
    err_path = os.path.join(d, "append.err")
    with open(err_path, "ab") as err:
        err.write(f"--- cycle {i}\n".encode())
        err.flush()
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, env=store[1])
    try:
        if rng.random() < 1 / 6:
            # Sometimes kill during start-up or recovery.
            delay = rng.uniform(0.0, 0.3)
            where = "start"
            time.sleep(delay)
        else:
            delay = rng.uniform(0.3, 1.5)
            where = "ready"
            if not wait_ready(proc, time.monotonic() + READY_TIMEOUT):
                raise Failure(f"cycle {i}: the child exited ({proc.wait()}) before READY:\n{tail_of(err_path)}")
            time.sleep(delay)
        if proc.poll() is not None:
            raise Failure(f"cycle {i}: the child exited by itself ({proc.returncode}):\n{tail_of(err_path)}")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        log.append((where, delay, slots_past_a_hole(d, node), node))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def count_log(ack_log):
    acks = dups = resends = resend_dups = 0
    with open(ack_log, errors="replace") as f:
        for line in f:
            if line.startswith("ACK "):
                acks += 1
                if line.split(" ", 5)[4] == "1":
                    dups += 1
            elif line.startswith("RESEND "):
                resends += 1
                if " dup 1 " in line:
                    resend_dups += 1
    return acks, dups, resends, resend_dups


def extra_node_flags(extra):
    """The append-mode flags verify takes too (the node live window, the WAL stores)."""
    out = []
    for flag in ("--node-live-window-ms", "--wal-stores"):
        if flag in extra:
            i = extra.index(flag)
            out += extra[i:i + 2]
    return out


def scenario(name, extra, nodes, seed):
    rng = random.Random(seed)
    store = store_for(name, seed)  # before the directory: a failure here leaves nothing behind
    d = tempfile.mkdtemp(prefix=f"weir-crash-{name}-")
    ack_log = os.path.join(d, "acks.log")
    ok = False
    start = time.monotonic()
    try:
        kills = []
        for i in range(CYCLES):
            cycle(rng, d, ack_log, extra, nodes, i, kills, store)
        # Verify twice: after the kills, and again after the first verify's clean close.
        # With several node ids, as a node that never appended: it takes the last one over.
        verify_node = nodes[0] if len(nodes) == 1 else "crash-verify"
        for attempt in ("after the last kill", "after a clean close"):
            verify = subprocess.run([CHILD, "--dir", d, "--mode", "verify", "--ack-log", ack_log,
                                     "--node", verify_node] + extra_node_flags(extra) + store[0],
                                    capture_output=True, text=True, timeout=600, env=store[1])
            summary = verify.stdout.strip()
            if verify.returncode != 0:
                raise Failure(f"verify {attempt} failed ({verify.returncode}):\n{summary}\n"
                              f"{verify.stderr[-3000:]}")
        acks, dups, resends, resend_dups = count_log(ack_log)
        holes = str(sum(1 for k in kills if k[2])) if S3_ENV is None else "n/a on s3://"
        switches = sum(1 for a, b in zip(kills, kills[1:]) if a[3] != b[3])
        print(f"  {len(kills)} kills ({sum(1 for k in kills if k[0] == 'start')} during start-up, "
              f"{switches} followed by another node id, "
              f"{holes} left slots past a hole); {acks} acks, {dups} duplicated (re-sends after restart: {resends}, "
              f"{resend_dups} duplicated); {time.monotonic() - start:.1f}s")
        print("  " + summary.splitlines()[0])
        if acks == 0:
            raise Failure("no acknowledgement was logged")
        if dups == 0:
            raise Failure("no duplicated ack was observed: the retry path was never exercised")
        if resends > 0 and resend_dups == 0:
            raise Failure("no re-send after a restart came back duplicated: the producers' windows were not "
                          "recovered, or the path was never exercised")
        if len(nodes) > 1 and switches == 0:
            raise Failure("no start was of another node id: the takeover path was never exercised")
        ok = True
    except Failure as e:
        print(f"  FAIL: {e}")
    except subprocess.TimeoutExpired as e:
        print(f"  FAIL: timeout: {e}")
    finally:
        if ok or not KEEP:
            shutil.rmtree(d, ignore_errors=True)
        else:
            print(f"  kept {d}")
    return ok


def main():
    print(f"crash test: seed {SEED} (WEIR_CRASH_SEED={SEED} repeats the kill schedule and fault seeds), "
          f"{CYCLES} cycles per scenario, on {'s3:// (' + S3_ENV + ')' if S3_ENV else 'file://'}"
          f"{' with a postgres:// metastore (' + PG_ENV + ')' if PG_ENV else ''}")
    passed = failed = 0
    for n, (name, extra, nodes) in enumerate(SCENARIOS):
        print(f"scenario {name}")
        if scenario(name, extra, nodes, SEED * 1000 + n):
            passed += 1
        else:
            failed += 1
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
