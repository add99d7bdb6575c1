/** The README's store-and-recall example runs as written (against the live server). */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { RecollectClient } from "../src/index.js";
import { KEY, LIVE_URL, skipLive } from "./helpers.js";

test("README store-and-recall example", { skip: skipLive }, async () => {
  const readme = readFileSync(new URL("../../README.md", import.meta.url), "utf8");
  const section = readme.slice(readme.indexOf("## Store and recall"));
  const code = /```ts\n([\s\S]*?)```/.exec(section)![1]!;
  assert.equal(code.split("\n").filter((l) => l.trim()).length, 5);
  const runnable = code
    .replace('"recollect-memory-client"', JSON.stringify(new URL("../src/index.js", import.meta.url).href))
    .replace('"http://127.0.0.1:8080"', JSON.stringify(LIVE_URL))
    .replace('"KEY"', JSON.stringify(KEY));
  const dir = mkdtempSync(join(tmpdir(), "recollect-readme-"));
  try {
    const file = join(dir, "example.mjs");
    writeFileSync(file, runnable);
    const out = execFileSync(process.execPath, [file], { encoding: "utf8" });
    assert.match(out.split("\n")[0]!, /I painted a sunrise over the lake last week\./);
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await new RecollectClient({ baseUrl: LIVE_URL, apiKey: KEY }).deleteConversation("chat-1").catch(() => undefined);
  }
});
