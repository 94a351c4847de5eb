// The client-answered bridge from Node (`llm: "client"`, `onLlm`) against a real daemon:
// calls made at once answered concurrently over every transport, a cancelled call, a client
// that disconnects mid-call (the session survives and raises LlmError), usage counted, and a
// session without `llm` (the functions are absent).

import assert from "node:assert/strict";
import { test } from "node:test";

import { connect } from "../dist/index.js";
import { daemonForFile, waitFor } from "./support/daemon.js";

const shared = daemonForFile();

// Two threads ask at once and a batched call follows: onLlm holds the first two answers until
// both calls are in flight, so they are answered concurrently.
const CONCURRENT = `import threading
got = {}
def ask(p): got[p] = llm_query(p)
ts = [threading.Thread(target=ask, args=(p,)) for p in ('a', 'b')]
[t.start() for t in ts]; [t.join() for t in ts]
try:
    llm_query('boom')
except LlmError as err:
    failed = str(err)
(got['a'], got['b'], llm_query_batched(['x', 'y']), failed)`;

for (const name of ["socket", "stdio", "http"]) {
  test(`over ${name}, onLlm answers calls made at once concurrently`, async () => {
    const client = await shared.backends[name]();
    try {
      const session = await client.createSession({ llm: "client" });
      const calls = [];
      let release;
      const bothInFlight = new Promise((resolve) => (release = resolve));
      const result = await session.run(CONCURRENT, {
        onLlm: async (call) => {
          calls.push(call);
          if (call.prompts[0] === "boom") throw new Error("provider down");
          if (call.kind === "llm_batched") {
            return { answers: call.prompts.map((p) => p + p), usage: { input_tokens: 3, output_tokens: 4 } };
          }
          if (calls.filter((c) => c.kind === "llm").length === 2) release();
          await bothInFlight;
          return call.prompts[0].toUpperCase();
        },
      });
      assert.equal(result.status, "ok", JSON.stringify(result));
      assert.match(result.result.repr, /^\('A', 'B', \['xx', 'yy'\], '.*provider down.*'\)$/);
      const first = calls[0];
      assert.equal(first.session_id, session.id);
      assert.equal(first.depth, 0);
      assert.equal(first.call_id.length > 0, true);
      await session.close();
    } finally {
      await client.close();
    }
  });
}

test("an aborted run cancels the call it waits on", async () => {
  const client = await connect({ backend: "socket", socket: shared.daemon.socket });
  const session = await client.createSession({ llm: "client" });
  const controller = new AbortController();
  let cancelled;
  const result = await session.run("llm_query('slow')", {
    signal: controller.signal,
    onLlm: (_call, { signal }) => {
      controller.abort();
      return new Promise((_resolve, reject) => {
        cancelled = new Promise((resolve) => signal.addEventListener("abort", () => resolve(true)));
        signal.addEventListener("abort", () => reject(signal.reason));
      });
    },
  });
  assert.equal(result.status, "interrupted");
  assert.equal(await cancelled, true, "bridge.cancel reached onLlm's signal");
  await session.close();
  await client.close();
});

test("a client that disconnects mid-call leaves a live session whose call raised LlmError", async () => {
  const owner = await connect({ backend: "socket", socket: shared.daemon.socket });
  const session = await owner.createSession({ llm: "client" });
  const code = "try:\n    llm_query('orphan')\nexcept LlmError as err:\n    orphaned = str(err)";
  const running = session.run(code, {
    onLlm: () => {
      owner.close();
      return new Promise(() => {});
    },
  });
  await assert.rejects(running, { name: "ConnectionClosed" });
  const other = await connect({ backend: "socket", socket: shared.daemon.socket });
  const again = await other.session(session.id);
  const shown = await waitFor(async () => {
    const ran = await again.run("globals().get('orphaned')");
    return ran.result.repr !== "None" && ran.result.repr;
  }, 30_000, "the orphaned call to fail");
  assert.match(shown, /connection/);
  const stats = await other.stats();
  assert.ok(stats.llm.input_tokens >= 3, JSON.stringify(stats.llm));
  await again.close();
  await other.close();
});

test("a session without llm has none of the functions", async () => {
  const client = await connect({ backend: "socket", socket: shared.daemon.socket });
  const session = await client.createSession();
  const result = await session.run("import builtins\n[hasattr(builtins, n) for n in ('llm_query', 'llm_query_batched', 'rlm_query')]");
  assert.equal(result.result.repr, "[False, False, False]");
  await session.close();
  await client.close();
});
