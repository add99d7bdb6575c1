/** The cursor helpers (no endpoint pages yet: exercised with fetchers of our own) and chunking. */
import { test } from "node:test";
import assert from "node:assert/strict";

import { chunked, paginate, paginateItems, type Page } from "../src/index.js";

function fetcher(pages: Record<string, Page<number>>) {
  const calls: (string | undefined)[] = [];
  const fetchPage = async (cursor: string | undefined) => {
    calls.push(cursor);
    return pages[cursor ?? "<first>"]!;
  };
  return { fetchPage, calls };
}

test("paginateItems follows cursors to the end", async () => {
  const { fetchPage, calls } = fetcher({ "<first>": { items: [1, 2], nextCursor: "b" }, b: { items: [3], nextCursor: "c" }, c: { items: [] } });
  const items: number[] = [];
  for await (const x of paginateItems(fetchPage)) items.push(x);
  assert.deepEqual(items, [1, 2, 3]);
  assert.deepEqual(calls, [undefined, "b", "c"]);
});

test("start cursor and maxPages", async () => {
  const { fetchPage, calls } = fetcher({ b: { items: [2], nextCursor: "c" }, c: { items: [3], nextCursor: "d" }, d: { items: [4] } });
  const pages: number[][] = [];
  for await (const p of paginate(fetchPage, { cursor: "b", maxPages: 2 })) pages.push(p.items);
  assert.deepEqual(pages, [[2], [3]]);
  assert.deepEqual(calls, ["b", "c"]);
});

test("a repeated cursor is an error, not a loop", async () => {
  const { fetchPage } = fetcher({ "<first>": { items: [1], nextCursor: "x" }, x: { items: [2], nextCursor: "x" } });
  await assert.rejects(async () => {
    for await (const _ of paginateItems(fetchPage)) void _;
  }, /cursor "x" twice/);
});

test("chunked", () => {
  assert.deepEqual([...chunked([0, 1, 2, 3, 4, 5, 6], 3)], [[0, 1, 2], [3, 4, 5], [6]]);
  assert.deepEqual([...chunked([], 3)], []);
  assert.throws(() => [...chunked([1], 0)], RangeError);
});
