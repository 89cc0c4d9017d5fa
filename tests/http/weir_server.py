"""Runs a real `weir serve` for integration tests.

WeirServer(binary) owns a temporary data dir (or uses the one given), starts
the server on 127.0.0.1:0 (HTTP, and Kafka on another free port unless the
args name --kafka-addr), waits for its `listening on http://HOST:PORT` line
(which also names `kafka://HOST:PORT`; see kafka_addr),
and stops it with SIGTERM, expecting exit status 0. Every start appends the
server's stdout and stderr to one log file next to the data dir; a failed
start or stop raises ServerError carrying the end of that log, and the
server is killed whenever a start or stop goes wrong.
"""
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

READY_RE = re.compile(r"listening on (http://[^\s/]+:(\d+))")
KAFKA_RE = re.compile(r"kafka://([^\s/]+):(\d+)")
# How weir serve refuses a port someone else holds (before recovery, or at
# the listener's own bind after it).
PORT_IN_USE_RE = re.compile(r"Address already in use")
START_TIMEOUT = 120  # seconds; recovery on a loaded 2-core machine can be slow
STOP_TIMEOUT = 120


class ServerError(Exception):
    pass


class PortInUse(ServerError):
    """A start that failed only because a port it names was taken."""


class WeirServer:
    def __init__(self, binary, data_dir=None, args=(), env=None):
        self.binary = binary
        self.args = list(args)
        self.env = env
        self._own_tmp = None
        if data_dir is None:
            self._own_tmp = tempfile.mkdtemp(prefix="weir-http-")
            data_dir = os.path.join(self._own_tmp, "data")
        self.data_dir = data_dir
        self.log_path = os.path.join(os.path.dirname(os.path.abspath(data_dir)),
                                     os.path.basename(data_dir) + ".log")
        self.proc = None
        self.base_url = None
        self.port = None
        self.kafka_addr = None  # "host:port" of the Kafka listener, if on
        self.starts = 0

    # --- lifecycle -------------------------------------------------------
    def command(self):
        named = any(a.startswith("--kafka-addr") for a in self.args) or "WEIR_KAFKA_ADDR" in (self.env or {})
        kafka = [] if named else ["--kafka-addr", "127.0.0.1:0"]
        return [self.binary, "serve", "--data-dir", self.data_dir,
                "--http-addr", "127.0.0.1:0"] + kafka + self.args

    def start(self, timeout=START_TIMEOUT):
        """Starts the server and waits for its ready line. A port named in
        the command (a restart on the same port, a port from free_port())
        can be taken for a moment by another test's connection or listener:
        such a start is tried again until `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self._start_once(max(1.0, deadline - time.monotonic()))
            except PortInUse:
                if time.monotonic() + 0.5 > deadline:
                    raise
                time.sleep(0.5)

    def _start_once(self, timeout):
        if self.proc is not None and self.proc.poll() is None:
            raise ServerError("already running")
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts}: {' '.join(self.command())}\n".encode())
            offset = log.tell()
            env = dict(os.environ, **(self.env or {}))
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env)
        try:
            self.base_url, self.port = self._wait_ready(offset, timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_ready(self, offset, timeout):
        deadline = time.monotonic() + timeout
        while True:
            text = self._log_from(offset)
            m = READY_RE.search(text)
            if m:
                k = KAFKA_RE.search(text[m.start():].split("\n", 1)[0])
                self.kafka_addr = f"{k.group(1)}:{k.group(2)}" if k else None
                return m.group(1), int(m.group(2))
            if self.proc.poll() is not None:
                out = self._log_from(offset)
                # (Not a port held by another server on this data dir: that lasts.)
                taken = PORT_IN_USE_RE.search(out) and "another weir server" not in out
                error = PortInUse if taken else ServerError
                raise error(f"weir serve exited with {self.proc.returncode} before it was ready\n"
                            + self.log_tail())
            if time.monotonic() > deadline:
                raise ServerError(f"weir serve not ready after {timeout} s\n" + self.log_tail())
            time.sleep(0.05)

    def stop(self, timeout=STOP_TIMEOUT, expect_code=0):
        """SIGTERM, wait, and check the exit status (None: do not check)."""
        if self.proc is None:
            return None
        proc = self.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stacks = thread_stacks(proc.pid)
            self.kill()
            raise ServerError(f"weir serve did not exit within {timeout} s of SIGTERM\n" + self.log_tail() + stacks)
        self.proc = None
        if expect_code is not None and code != expect_code:
            raise ServerError(f"weir serve exited with {code} after SIGTERM, expected {expect_code}\n"
                              + self.log_tail())
        return code

    def restart(self):
        self.stop()
        return self.start()

    def crash_restart(self):
        """SIGKILL (no drain: what was acknowledged must already be durable),
        then start again on the same data dir."""
        self.kill()
        return self.start()

    def kill(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def cleanup(self):
        """Kills the server if still running and removes an owned temp dir."""
        self.kill()
        if self._own_tmp:
            shutil.rmtree(self._own_tmp, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.stop()
            else:
                print(self.log_tail(), flush=True)
        finally:
            self.cleanup()
        return False

    # --- helpers ---------------------------------------------------------
    def url(self, path):
        return self.base_url + path

    def _log_from(self, offset):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_text(self):
        return self._log_from(0)

    def log_tail(self, lines=60):
        text = self.log_text().splitlines()
        return f"--- server log ({self.log_path}), last {lines} lines ---\n" + "\n".join(text[-lines:])


def run_expecting_exit(cmd, timeout=START_TIMEOUT, env=None, cwd=None):
    """Runs a command that should fail to start a server: (exit code, output).
    The code is None if it printed the ready line or outlived `timeout`
    instead (it is killed then)."""
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=dict(os.environ, **(env or {})), cwd=cwd)
        deadline = time.monotonic() + timeout
        code = None
        try:
            while True:
                code = p.poll()
                out.seek(0)
                text = out.read().decode(errors="replace")
                if code is not None:
                    break
                if READY_RE.search(text) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        return code, text


def thread_stacks(pid):
    """Every thread's stack of a process that does not exit, for a failure
    message: gdb's, when it is installed and may attach; else ""."""
    try:
        out = subprocess.run(["gdb", "-batch", "-p", str(pid), "-ex", "thread apply all bt"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return f"\n--- thread stacks (gdb) ---\n{out.stdout}" if out.stdout else ""
