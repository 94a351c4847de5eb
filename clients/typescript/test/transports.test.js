// Every transport against a real daemon: the Unix socket, a child `pyvisor serve --stdio`
// (chosen by `auto` when no socket answers), and HTTP + WebSocket with a token. Each runs the
// same checks: state between runs, streamed output in order, input(), an AbortSignal that
// interrupts, checkpoint and restore, typed errors, Symbol.asyncDispose, hints computed
// ahead, and fork.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { connect, ConnectError, UnknownSession, Unauthorized } from "../dist/index.js";
import { TOKEN, daemonForFile, waitFor } from "./support/daemon.js";

const shared = daemonForFile();

for (const name of ["socket", "stdio", "http"]) {
  describe(`over ${name}`, () => {
    let client;
    before(async () => {
      client = await shared.backends[name]();
      assert.equal(client.backend, name);
    });
    after(async () => client?.close());

    test("state persists, output streams in order, input() is answered", async () => {
      const session = await client.createSession();
      assert.equal((await session.run("x = 1")).status, "ok");
      const chunks = [];
      const prompts = [];
      const result = await session.run(
        "import sys\nprint('one', flush=True)\nsys.stderr.write('two\\n'); sys.stderr.flush()\n" +
          "name = input('who? ')\nprint('hi', name)\nx + 41",
        {
          onStdout: (text) => chunks.push(["out", text]),
          onStderr: (text) => chunks.push(["err", text]),
          onInput: async (prompt, { password }) => {
            prompts.push([prompt, password]);
            return "ada";
          },
        },
      );
      assert.equal(result.status, "ok", JSON.stringify(result));
      assert.equal(result.result.repr, "42");
      assert.deepEqual(prompts, [["who? ", false]]);
      // Each stream arrives whole and in its order. stdout and stderr are two pipes, so how
      // chunks written close together interleave between them is not kept (print() may write
      // its text and its newline apart, and stderr may come between them).
      const streamed = (which) => chunks.filter(([stream]) => stream === which).map(([, text]) => text);
      assert.equal(streamed("out").join(""), "one\nhi ada\n");
      assert.equal(streamed("err").join(""), "two\n");
      assert.ok(streamed("out").length >= 2, "stdout streamed before input() was answered");
      await session[Symbol.asyncDispose]();
      await assert.rejects(session.info(), name === "http" ? Error : UnknownSession);
    });

    test("an AbortSignal interrupts, checkpoints restore, errors are typed", async () => {
      const session = await client.createSession();
      await session.run("import time\nkept = 'before'");
      const checkpoint = await session.checkpoint();
      assert.match(checkpoint.checkpoint_id, /^c-/);
      await session.run("kept = 'after'");
      const controller = new AbortController();
      let started = false;
      const running = session.run("print('sleeping', flush=True)\ntime.sleep(60)", {
        signal: controller.signal,
        onStdout: () => (started = true),
      });
      await waitFor(() => started, 30_000, "the code to start");
      controller.abort();
      const interrupted = await running;
      assert.equal(interrupted.status, "interrupted");
      assert.equal(interrupted.error.type, "KeyboardInterrupt");
      await assert.rejects(session.run("1", { signal: controller.signal }), { name: "AbortError" });
      await session.restore(checkpoint.checkpoint_id);
      assert.equal((await session.run("kept")).result.repr, "'before'");
      const again = await client.session(session.id);
      assert.equal((await again.run("kept")).result.repr, "'before'");
      await session.close();
      await assert.rejects(client.session("s-does-not-exist"), UnknownSession);
    });

    test("a hinted cell is computed ahead and answered from it", async () => {
      const session = await client.createSession();
      await session.run("xs = list(range(10))");
      assert.equal(await session.hint(["sum(xs) * 2", "not python ("]), 1);
      await waitFor(
        async () => ((await session.info()).proactive?.ahead ?? []).includes("sum(xs)*2"),
        30_000,
        "the hint to be computed ahead",
      );
      const answer = await session.run("sum(xs) * 2");
      assert.equal(answer.result.repr, "90");
      assert.equal(answer.from_cache, true, JSON.stringify(answer));
      await assert.rejects(session.hint(Array(65).fill("1")), (err) => err.code === -32602);
      await session.close();
    });

    test("fork makes clones that start from the source and diverge", async () => {
      const source = await client.createSession();
      await source.run("trail = ['source']");
      const forked = await source.fork({ names: [`${name}-left`, `${name}-right`] });
      assert.equal(forked.sessions.length, 2);
      assert.equal(forked.sessions[0].name, `${name}-left`);
      assert.ok(forked.duration_ms > 0);
      const [left, right] = await Promise.all(forked.sessions.map((s) => client.session(s.session_id)));
      await left.run("trail.append('left')");
      assert.equal((await left.run("trail")).result.repr, "['source', 'left']");
      assert.equal((await right.run("trail")).result.repr, "['source']");
      assert.equal((await source.run("trail")).result.repr, "['source']");
      await assert.rejects(source.fork({ count: 17 }), (err) => err.code === -32602);
      for (const session of [left, right, source]) await session.close();
    });
  });
}

test("auto picks the daemon whose socket answers", async () => {
  const client = await connect({ socket: shared.daemon.socket, pyvisor: "/nonexistent/pyvisor" });
  assert.equal(client.backend, "socket");
  await client.close();
});

test("nothing to reach, or a wrong token, is a typed error", async () => {
  await assert.rejects(connect({ backend: "socket", socket: "/nonexistent/pyvisor.sock" }), ConnectError);
  await assert.rejects(connect({ socket: "/nonexistent/pyvisor.sock", pyvisor: "/nonexistent/pyvisor" }), ConnectError);
  const wrong = await connect({ backend: "http", url: shared.daemon.url, token: "wrong" }).catch((err) => err);
  const client = wrong instanceof Error ? undefined : wrong;
  const refused = client ? await client.createSession().catch((err) => err) : wrong;
  assert.ok(refused instanceof Unauthorized, String(refused));
});
