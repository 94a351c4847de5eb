// The drop-in sandbox object against a real daemon: execute's fields, JSON values in and out
// (never run as code), reset, dispose, and onLlm through its run options.

import assert from "node:assert/strict";
import { test } from "node:test";

import { PyvisorSandbox, SandboxError } from "../dist/index.js";
import { daemonForFile } from "./support/daemon.js";

const shared = daemonForFile();

test("a Pyodide-style sandbox over a pyvisor session", async () => {
  const sandbox = await PyvisorSandbox.create({
    socket: shared.daemon.socket,
    session: { llm: "client" },
    run: { onLlm: (call) => "answer to " + call.prompts[0] },
  });
  try {
    const data = { rows: [1, 2, 3], name: "q\"uote'\n\\", nested: { ok: true, none: null } };
    await sandbox.setVariable("data", data);
    const ran = await sandbox.execute("print('n =', len(data['rows']))\nsum(data['rows'])");
    assert.equal(ran.stdout, "n = 3\n");
    assert.equal(ran.result, "6");
    assert.equal(ran.error, undefined);
    assert.ok(ran.durationMs >= 0);
    assert.deepEqual(await sandbox.getVariable("data"), data);

    const failing = await sandbox.execute("1 / 0");
    assert.match(failing.error, /^ZeroDivisionError: division by zero/);
    assert.equal(failing.result, undefined);

    assert.equal((await sandbox.execute("llm_query('hi')")).result, "'answer to hi'");

    await assert.rejects(sandbox.setVariable("x = 1; y", 1), SandboxError);
    await assert.rejects(sandbox.setVariable("f", () => 1), SandboxError);
    await assert.rejects(sandbox.getVariable("unbound"), /NameError/);
    await sandbox.execute("import os\nhandle = os");
    await assert.rejects(sandbox.getVariable("handle"), /not JSON serializable/);

    await sandbox.reset();
    assert.match((await sandbox.execute("data")).error, /^NameError/);
  } finally {
    await sandbox.dispose();
  }
});
