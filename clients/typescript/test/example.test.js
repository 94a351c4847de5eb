// examples/rlm-node end to end: the RLM loop against a local fake OpenAI-compatible server on
// loopback, with pyvisor found through $PYVISOR_SOCKET. The fake model writes code that asks
// llm_query about the context held in the session, then answers with FINAL_VAR.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createServer } from "node:http";
import { dirname, join, resolve } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { startDaemon } from "./support/daemon.js";

const EXAMPLE = resolve(dirname(fileURLToPath(import.meta.url)), "../../../examples/rlm-node/rlm.mjs");

/** A chat completions endpoint that plays a scripted model; it keeps the requests. */
function fakeModel() {
  const requests = [];
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (chunk) => (body += chunk));
    req.on("end", () => {
      const request = JSON.parse(body);
      requests.push({ auth: req.headers.authorization, path: req.url, ...request });
      const messages = request.messages;
      let content;
      if (messages[0].role !== "system") {
        content = "a summary of: " + messages[0].content.split(": ")[1];
      } else if (!messages.some((m) => m.role === "assistant")) {
        content = "Let me look.\n```repl\nwords = context.split()\nsummary = llm_query('Summarise: ' + ' '.join(words[:3]))\nprint(len(words), 'words')\n```";
      } else {
        content = "FINAL_VAR(summary)";
      }
      res.setHeader("Content-Type", "application/json");
      res.end(JSON.stringify({ choices: [{ message: { role: "assistant", content } }], usage: { prompt_tokens: 7, completion_tokens: 2 } }));
    });
  });
  return new Promise((done) => server.listen(0, "127.0.0.1", () => done({ server, requests, port: server.address().port })));
}

let daemon;
let model;
before(async () => {
  daemon = await startDaemon();
  model = await fakeModel();
});
after(async () => {
  model?.server.close();
  await daemon?.stop();
});

test("the RLM example answers from the session, its llm_query answered by Node", async () => {
  const child = spawn(process.execPath, [EXAMPLE, "What is this about?"], {
    env: {
      ...process.env,
      PYVISOR_SOCKET: daemon.socket,
      OPENAI_BASE_URL: `http://127.0.0.1:${model.port}/v1`,
      OPENAI_API_KEY: "test-key",
      OPENAI_MODEL: "fake",
    },
    stdio: ["pipe", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (chunk) => (stdout += chunk));
  child.stderr.on("data", (chunk) => (stderr += chunk));
  child.stdin.end("pyvisor runs Python sessions for agents and more words here");
  const code = await new Promise((done) => child.on("exit", done));
  assert.equal(code, 0, stderr);
  assert.equal(stdout, "a summary of: pyvisor runs Python\n");
  assert.match(stderr, /2 iteration\(s\), 3 completion\(s\) of which 1 from the session/);
  assert.equal(model.requests.length, 3);
  assert.ok(model.requests.every((r) => r.auth === "Bearer test-key" && r.path === "/v1/chat/completions" && r.model === "fake"));
  // The context never went to the model; the code's output did.
  assert.ok(!JSON.stringify(model.requests[0].messages).includes("more words here"));
  assert.match(model.requests[2].messages.at(-1).content, /^Output:\n10 words\n/);
});
