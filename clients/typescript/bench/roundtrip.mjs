// What pyvisor costs a Node program, measured against a real daemon (the workspace's
// target/debug/pyvisor, or $PYVISOR_BIN; build with --release for the figures of the README):
//
// 1. `x = 1` round trip from Node over the Unix socket (p50, p99), beside spawning
//    `python3 -c "x = 1"` per call (the interpreter `python3` on PATH resolves to), the other
//    way to run Python without a sandbox server;
// 2. the client-answered bridge's overhead per `llm_query`: a run of `llm_query('hi')` whose
//    onLlm asks a local fake OpenAI-compatible server, less a run of `x = 1` and less the
//    fake server's own latency as Node sees it, with `[llm] batch_window_ms` 0 and 10.
//
//     node bench/roundtrip.mjs [runs]      (after npx tsc -p .)

import { spawnSync } from "node:child_process";
import { createServer } from "node:http";
import { performance } from "node:perf_hooks";

import { connect } from "../dist/index.js";
import { startDaemon } from "../test/support/daemon.js";

const RUNS = Number(process.argv[2] ?? 300);

function percentiles(samples) {
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
  return { p50: at(0.5), p99: at(0.99) };
}

async function timed(runs, once) {
  const samples = [];
  for (let i = 0; i < runs; i++) {
    const start = performance.now();
    await once();
    samples.push(performance.now() - start);
  }
  return percentiles(samples);
}

const fmt = ({ p50, p99 }) => `p50 ${p50.toFixed(2)} ms, p99 ${p99.toFixed(2)} ms`;

/** A chat completions endpoint that answers at once. */
function fakeModel() {
  const server = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      res.setHeader("Content-Type", "application/json");
      res.end(JSON.stringify({ choices: [{ message: { role: "assistant", content: "ok" } }], usage: { prompt_tokens: 1, completion_tokens: 1 } }));
    });
  });
  return new Promise((done) => server.listen(0, "127.0.0.1", () => done(server)));
}

async function ask(port) {
  const response = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: "fake", messages: [{ role: "user", content: "hi" }] }),
  });
  return (await response.json()).choices[0].message.content;
}

const model = await fakeModel();
const port = model.address().port;
console.log(`runs: ${RUNS}`);

for (const window of [0, 10]) {
  const daemon = await startDaemon(`batch_window_ms = ${window}\n`);
  const client = await connect({ backend: "socket", socket: daemon.socket });
  const session = await client.createSession({ llm: "client" });
  const onLlm = async () => ask(port);
  for (let i = 0; i < 20; i++) {
    await session.run("x = 1");
    await session.run("llm_query('hi')", { onLlm });
    await ask(port);
  }
  if (window === 0) {
    console.log(`x = 1 over the socket:           ${fmt(await timed(RUNS, () => session.run("x = 1")))}`);
    // The interpreter itself, not a shim on PATH that would add its own start-up.
    const python = spawnSync("python3", ["-c", "import sys; print(sys.executable)"], { encoding: "utf8" }).stdout.trim();
    const spawned = await timed(Math.min(RUNS, 50), () => spawnSync(python, ["-c", "x = 1"]));
    console.log(`spawn python3 -c "x = 1":        ${fmt(spawned)}`);
  }
  const plain = await timed(RUNS, () => session.run("x = 1"));
  const fetched = await timed(RUNS, () => ask(port));
  const asked = await timed(RUNS, () => session.run("llm_query('hi')", { onLlm }));
  const overhead = asked.p50 - plain.p50 - fetched.p50;
  console.log(
    `batch_window_ms = ${window}: llm_query run ${fmt(asked)}; x = 1 run p50 ${plain.p50.toFixed(2)} ms; ` +
      `fake server from Node p50 ${fetched.p50.toFixed(2)} ms; bridge overhead per llm_query (p50) ${overhead.toFixed(2)} ms`,
  );
  await session.close();
  await client.close();
  await daemon.stop();
}
model.close();
