// `session.files` against a real daemon, over each backend: a file larger than one JSON-RPC
// chunk both ways (and what the session's code sees of it), ranges, appends, listings and
// removal, streamed upload and download, and path escapes, limits and unknown sessions as
// typed errors. Over HTTP the bytes go through the streamed file routes, never through
// base64 on the WebSocket (the test watches fetch).

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, describe, test } from "node:test";

import { CHUNK_BYTES, InvalidParams, LimitExceeded, UnknownSession } from "../dist/index.js";
import { daemonForFile } from "./support/daemon.js";

const shared = daemonForFile();
// More than one write call's chunk, so that JSON-RPC appends, and not a multiple of it.
const BIG = Buffer.from(Array.from({ length: CHUNK_BYTES + 4099 }, (_, i) => i % 251));
const sha256 = (bytes) => createHash("sha256").update(bytes).digest("hex");

/** The pieces of `bytes`, `size` at a time, from an async generator. */
async function* piecesOf(bytes, size) {
  for (let start = 0; start < bytes.length; start += size) yield bytes.subarray(start, start + size);
}

for (const name of ["socket", "stdio", "http"]) {
  describe(`files over ${name}`, () => {
    let client;
    const fileRequests = [];
    const realFetch = globalThis.fetch;
    before(async () => {
      client = await shared.backends[name]();
      globalThis.fetch = (url, init) => {
        if (String(url).includes("/files")) fileRequests.push(`${init?.method ?? "GET"} ${new URL(url).pathname}`);
        return realFetch(url, init);
      };
    });
    after(async () => {
      globalThis.fetch = realFetch;
      await client?.close();
    });

    test("a large file goes both ways, whole and in ranges, and the code sees it", async () => {
      const session = await client.createSession();
      const files = session.files;
      assert.equal(await files.write("data/big.bin", BIG), BIG.length);
      const seen = await session.run("import hashlib\nhashlib.sha256(open('data/big.bin', 'rb').read()).hexdigest()");
      assert.equal(seen.result.repr, `'${sha256(BIG)}'`);
      assert.ok(Buffer.from(await files.read("data/big.bin")).equals(BIG));
      const part = await files.read("data/big.bin", { offset: 100, length: 1000 });
      assert.ok(Buffer.from(part).equals(BIG.subarray(100, 1100)));
      const tail = await files.read("data/big.bin", { offset: BIG.length - 10 });
      assert.ok(Buffer.from(tail).equals(BIG.subarray(BIG.length - 10)));
      assert.equal((await files.read("data/big.bin", { offset: BIG.length + 5 })).length, 0);
      assert.equal(await files.write("notes.txt", "héllo\n"), 7);
      assert.equal(await files.write("notes.txt", "again\n", { append: true }), 13);
      assert.equal(Buffer.from(await files.read("notes.txt")).toString(), "héllo\nagain\n");
      await session.run("open('made.txt', 'w').write('by the session')");
      assert.equal(Buffer.from(await files.read("made.txt")).toString(), "by the session");
      const entries = await files.list();
      assert.deepEqual(entries.map((e) => [e.name, e.type]), [["data", "dir"], ["made.txt", "file"], ["notes.txt", "file"]]);
      assert.equal((await files.list("data"))[0].size, BIG.length);
      await files.remove("made.txt");
      assert.ok(!(await files.list()).some((e) => e.name === "made.txt"));
      const sid = encodeURIComponent(session.id);
      if (name === "http") {
        assert.ok(fileRequests.includes(`PUT /v1/sessions/${sid}/files/data/big.bin`), fileRequests.join("\n"));
        assert.ok(fileRequests.includes(`GET /v1/sessions/${sid}/files/data/big.bin`), fileRequests.join("\n"));
      } else {
        assert.deepEqual(fileRequests, [], "JSON-RPC carries the bytes");
      }
      await session.close();
    });

    test("upload and download stream a file piece by piece", async () => {
      const session = await client.createSession();
      const size = await session.files.upload("streamed.bin", piecesOf(BIG, (1 << 20) + 3));
      assert.equal(size, BIG.length);
      const pieces = [];
      for await (const piece of session.files.download("streamed.bin")) pieces.push(piece);
      assert.ok(pieces.length > 1, "the download came in pieces");
      assert.ok(Buffer.concat(pieces).equals(BIG));
      assert.equal(await session.files.upload("empty.bin", []), 0);
      assert.equal((await session.files.read("empty.bin")).length, 0);
      await session.close();
    });

    test("escapes, limits and unknown sessions are typed errors", async () => {
      const session = await client.createSession({ limits: { file_bytes: 10 } });
      await session.run("import os\nos.symlink('/etc', 'etc')");
      for (const path of ["../x", "/etc/passwd", "etc/passwd", "missing.txt"]) {
        await assert.rejects(session.files.read(path), InvalidParams, path);
      }
      for (const range of [{ offset: -1 }, { length: -5 }, { offset: 1.5 }]) {
        await assert.rejects(session.files.read("x", range), InvalidParams, JSON.stringify(range));
      }
      await assert.rejects(session.files.write("big", "x".repeat(11)), LimitExceeded);
      await assert.rejects(session.files.upload("big", piecesOf(Buffer.alloc(11), 4)), LimitExceeded);
      assert.deepEqual(await session.files.list(), [], "neither the symlink nor a refused file is listed");
      await session.close();
      await assert.rejects(session.files.read("anything"), UnknownSession);
    });
  });
}
