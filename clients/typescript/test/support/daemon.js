// A real `pyvisor serve` for the tests: the binary the workspace built (`target/debug/pyvisor`,
// or $PYVISOR_BIN), in a private home under a temp dir, on a Unix socket and on HTTP at a
// loopback port it picks itself, with a bearer token. Stopped with SIGTERM at the end.

import { spawn } from "node:child_process";
import { mkdtempSync, mkdirSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before } from "node:test";
import { fileURLToPath } from "node:url";

import { connect } from "../../dist/index.js";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");
export const BIN = process.env.PYVISOR_BIN || join(REPO, "target", "debug", "pyvisor");
export const TOKEN = "node-test-token";

/** Polls `condition` until it returns a truthy value, for at most `limitMs`. */
export async function waitFor(condition, limitMs, what) {
  const deadline = Date.now() + limitMs;
  while (Date.now() < deadline) {
    const value = await condition();
    if (value) return value;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error("timed out waiting for " + what);
}

/** A private home: its directories, a config, and the environment that confines a daemon to it. */
export function home(config = "") {
  const dir = mkdtempSync(join(tmpdir(), "pyvisor-node-"));
  for (const name of ["run", "config/pyvisor", "state", "cache"]) mkdirSync(join(dir, name), { recursive: true });
  writeFileSync(join(dir, "config/pyvisor/config.toml"), "[pool]\nmin_idle = 1\n[proactive]\nyield_to_load = false\n" + config);
  const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith("PYVISOR_")));
  Object.assign(env, {
    HOME: dir,
    XDG_RUNTIME_DIR: join(dir, "run"),
    XDG_CONFIG_HOME: join(dir, "config"),
    XDG_STATE_HOME: join(dir, "state"),
    XDG_CACHE_HOME: join(dir, "cache"),
    PYVISOR_LOG: "info",
  });
  return { dir, env, remove: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Starts a daemon, with more `[llm]` settings; resolves once its socket and HTTP answer. */
export async function startDaemon(llm = "") {
  const place = home(`[server]\ntoken = "${TOKEN}"\n[llm]\nclient_timeout_s = 20\n` + llm);
  const socket = join(place.dir, "run", "pyvisor.sock");
  const logPath = join(place.dir, "daemon.log");
  const child = spawn(BIN, ["serve", "--socket", socket, "--http", "127.0.0.1:0"], {
    cwd: place.dir,
    env: place.env,
    stdio: ["ignore", "ignore", openSync(logPath, "a")],
  });
  const log = () => readFileSync(logPath, "utf8");
  const url = await waitFor(() => {
    if (child.exitCode !== null) throw new Error("pyvisor serve exited: " + log());
    return /HTTP on (http:\/\/\S+) /.exec(log())?.[1];
  }, 60_000, "the daemon's HTTP address");
  await waitFor(async () => {
    try {
      const client = await connect({ backend: "socket", socket });
      const health = await client.health();
      await client.close();
      return health.status === "ok";
    } catch {
      return false;
    }
  }, 60_000, "the daemon's socket");
  return {
    socket,
    url,
    home: place,
    log,
    async stop() {
      child.kill("SIGTERM");
      await waitFor(() => child.exitCode !== null || child.signalCode !== null, 60_000, "the daemon to stop");
      place.remove();
    },
  };
}

/**
 * For a test file: a daemon, and a home for the children of the stdio backend, started before
 * its tests and removed after them; and a way to open a client over each backend.
 */
export function daemonForFile() {
  const shared = {};
  before(async () => {
    shared.daemon = await startDaemon();
    shared.childHome = home();
  });
  after(async () => {
    await shared.daemon?.stop();
    shared.childHome?.remove();
  });
  shared.backends = {
    socket: () => connect({ backend: "socket", socket: shared.daemon.socket }),
    // No daemon at this socket: auto falls back to a child of its own.
    stdio: () => connect({ socket: shared.childHome.dir + "/no.sock", pyvisor: BIN, env: shared.childHome.env }),
    http: () => connect({ backend: "http", url: shared.daemon.url, token: TOKEN }),
  };
  return shared;
}
