/**
 * Test fixtures: the live servers started by scripts/test-clients.sh and a scripted mock server.
 *
 *   RECOLLECT_TEST_URL          keys ts-key:ts, ts-other:ts-other, ts-erase:ts-erase
 *   RECOLLECT_TEST_LIMITED_URL  rate_limit_per_sec=1, burst=1, max_body_bytes=4096;
 *                               keys ts-limited:ts-limited, ts-big:ts-big
 */
import http from "node:http";
import type { AddressInfo } from "node:net";
import { randomUUID } from "node:crypto";

export const LIVE_URL = process.env["RECOLLECT_TEST_URL"];
export const LIMITED_URL = process.env["RECOLLECT_TEST_LIMITED_URL"];
export const skipLive = LIVE_URL ? false : "RECOLLECT_TEST_URL not set: run scripts/test-clients.sh";
export const skipLimited = LIMITED_URL ? false : "RECOLLECT_TEST_LIMITED_URL not set: run scripts/test-clients.sh";

export const KEY = "ts-key";
export const TENANT = "ts";
export const OTHER_KEY = "ts-other";
export const ERASE_KEY = "ts-erase";
export const LIMITED_KEY = "ts-limited";
export const BIG_KEY = "ts-big";

export function conv(): string {
  return `ts-${randomUUID().replace(/-/g, "").slice(0, 16)}`;
}

export const README_TURNS = [
  {
    user: "I went to the LGBTQ support group yesterday, it was so powerful.",
    assistant: "That sounds inspiring! What happened there?",
    user_speaker: "Caroline",
    assistant_speaker: "Melanie",
    timestamp: "2023-05-08T13:56:00Z",
  },
  {
    user: "I painted a sunrise over the lake last week.",
    assistant: "Lovely! Painting by the lake must be calming.",
    user_speaker: "Melanie",
    assistant_speaker: "Caroline",
    timestamp: "2023-05-08T14:01:00Z",
  },
];

export interface Reply {
  status?: number;
  body?: unknown;
  raw?: string;
  headers?: Record<string, string>;
  delayMs?: number;
}

export interface Seen {
  method: string;
  path: string;
  headers: http.IncomingHttpHeaders;
  body: string;
  at: number;
}

export function error(code: string, message: string) {
  return { error: { code, message } };
}

export const INFO_OK = { conversation_id: "c", turns: 1, pending: 0, recallable: 1 };
export const STORE_OK = { memory_ids: ["9ad96c05-5fd4-43fe-a707-07b985b77fb1"] };

/** Answers each request with the next scripted reply (the last one repeats); records requests. */
export class MockServer {
  readonly seen: Seen[] = [];
  private readonly queue: Reply[] = [];
  private last: Reply = { status: 200, body: {} };
  private constructor(
    private readonly server: http.Server,
    readonly url: string,
  ) {}

  static async start(): Promise<MockServer> {
    let mock: MockServer | undefined;
    const server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        mock!.seen.push({
          method: req.method ?? "",
          path: req.url ?? "",
          headers: req.headers,
          body: Buffer.concat(chunks).toString("utf8"),
          at: performance.now(),
        });
        const reply = mock!.queue.shift() ?? mock!.last;
        mock!.last = reply;
        const data = reply.raw ?? JSON.stringify(reply.body ?? {});
        setTimeout(() => {
          if (res.destroyed) return;
          res.writeHead(reply.status ?? 200, {
            "content-type": reply.raw === undefined ? "application/json" : "text/plain",
            ...reply.headers,
          });
          res.end(data);
        }, reply.delayMs ?? 0);
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const port = (server.address() as AddressInfo).port;
    mock = new MockServer(server, `http://127.0.0.1:${port}`);
    return mock;
  }

  script(...replies: Reply[]): void {
    this.queue.push(...replies);
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

/** A loopback port nothing listens on. */
export async function closedPort(): Promise<number> {
  const s = http.createServer();
  await new Promise<void>((resolve) => s.listen(0, "127.0.0.1", resolve));
  const port = (s.address() as AddressInfo).port;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}
