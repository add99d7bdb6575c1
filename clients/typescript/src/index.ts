/**
 * TypeScript client for Recollect, long-term memory for LLM agents.
 *
 * ```ts
 * import { RecollectClient } from "recollect-memory-client";
 * const rc = new RecollectClient({ baseUrl: "http://127.0.0.1:8080", apiKey: "KEY" });
 * await rc.storeTurn("chat-1", { user: "I painted a sunrise over the lake.", assistant: "Lovely!" }, { wait: true });
 * const { memories } = await rc.recall({ query: "What did I paint?", conversation_ids: ["chat-1"], k: 5 });
 * ```
 */
export * from "./client.js";
export * from "./errors.js";
export * from "./pagination.js";
export { DEFAULT_RETRY, parseRetryAfter, type RetryPolicy } from "./retry.js";
