// Runs a real `weir serve` for the SDK tests: a temp data dir, port 0, ready
// when the server logs `listening on http://HOST:PORT` (the same line names
// `kafka://HOST:PORT`: kafkaAddr, "host:port", or null when the listener is
// off; and `grpc://HOST:PORT` when args turn Flight on: flightAddr); the Kafka
// listener takes a free port unless args name --kafka-addr.
// stop() sends SIGTERM and expects exit status 0; crash() sends SIGKILL;
// start() again reuses the same data dir.
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const READY_RE = /listening on (http:\/\/[^\s/]+:(\d+))/;
const KAFKA_RE = /kafka:\/\/([^\s/]+:\d+)/;
const FLIGHT_RE = /grpc:\/\/([^\s/]+:\d+)/;
const START_TIMEOUT_MS = 120_000; // a loaded 2-core machine recovers slowly
const STOP_TIMEOUT_MS = Number(process.env.WEIR_STOP_TIMEOUT_MS) || 120_000;

export class WeirServer {
  constructor(binary, { args = [] } = {}) {
    if (!binary) throw new Error("set WEIR_BIN to the weir binary");
    this.binary = binary;
    this.args = args;
    this.tmp = mkdtempSync(join(tmpdir(), "weir-js-"));
    this.dataDir = join(this.tmp, "data");
    this.log = "";
    this.proc = null;
    this.url = null;
    this.kafkaAddr = null;
    this.flightAddr = null;
  }

  logTail(lines = 60) {
    return `--- weir serve log, last ${lines} lines ---\n` +
      this.log.split("\n").slice(-lines).join("\n");
  }

  start() {
    const kafka = this.args.some((a) => a.startsWith("--kafka-addr")) ? [] : ["--kafka-addr", "127.0.0.1:0"];
    const args = ["serve", "--data-dir", this.dataDir, "--http-addr", "127.0.0.1:0", ...kafka, ...this.args];
    this.log += `\n===== start: ${this.binary} ${args.join(" ")}\n`;
    const from = this.log.length;
    const proc = spawn(this.binary, args, { stdio: ["ignore", "pipe", "pipe"] });
    this.proc = proc;
    this.exit = new Promise((resolve) => proc.on("exit", (code, signal) => resolve({ code, signal })));
    return new Promise((resolve, reject) => {
      let done = false;
      const finish = (err) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        if (err) {
          this.kill();
          reject(new Error(`${err}\n${this.logTail()}`));
        } else {
          resolve(this);
        }
      };
      const onData = (chunk) => {
        this.log += chunk.toString();
        const text = this.log.slice(from);
        const m = READY_RE.exec(text);
        if (m && !done) {
          const line = text.slice(m.index);
          if (!line.includes("\n")) return; // the rest of the line is on its way
          this.url = m[1];
          const k = KAFKA_RE.exec(line.split("\n", 1)[0]);
          this.kafkaAddr = k ? k[1] : null;
          const f = FLIGHT_RE.exec(line.split("\n", 1)[0]);
          this.flightAddr = f ? f[1] : null;
          finish();
        }
      };
      proc.stdout.on("data", onData);
      proc.stderr.on("data", onData);
      proc.on("error", (e) => finish(`cannot run ${this.binary}: ${e.message}`));
      proc.on("exit", (code, signal) => finish(`weir serve exited (${code ?? signal}) before it was ready`));
      const timer = setTimeout(() => finish(`weir serve not ready after ${START_TIMEOUT_MS} ms`), START_TIMEOUT_MS);
    });
  }

  async stop() {
    const proc = this.proc;
    if (!proc) return;
    if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGTERM");
    let timer;
    const timeout = new Promise((resolve) => { timer = setTimeout(() => resolve(null), STOP_TIMEOUT_MS); });
    const result = await Promise.race([this.exit, timeout]);
    clearTimeout(timer);
    this.proc = null;
    if (result === null) {
      const stacks = threadStacks(proc.pid);
      proc.kill("SIGKILL");
      throw new Error(`weir serve did not exit within ${STOP_TIMEOUT_MS} ms of SIGTERM\n${this.logTail()}${stacks}`);
    }
    if (result.code !== 0) {
      throw new Error(`weir serve exited with ${result.code ?? result.signal} after SIGTERM\n${this.logTail()}`);
    }
  }

  // SIGKILL and wait for the exit: no drain, so what was acknowledged must
  // already be durable when start() runs again.
  async crash() {
    const proc = this.proc;
    if (!proc) return;
    if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
    await this.exit;
    this.proc = null;
  }

  kill() {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill("SIGKILL");
    this.proc = null;
  }

  cleanup() {
    this.kill();
    rmSync(this.tmp, { recursive: true, force: true });
  }
}

// Every thread's stack of a process that does not exit, for the failure
// message: gdb, when installed and allowed to attach; else nothing.
function threadStacks(pid) {
  const r = spawnSync("gdb", ["-batch", "-p", String(pid), "-ex", "thread apply all bt"], {
    encoding: "utf8",
    timeout: 60_000,
    maxBuffer: 16 << 20,
  });
  if (r.error || !r.stdout) return "";
  return `\n--- thread stacks (gdb) ---\n${r.stdout}`;
}
