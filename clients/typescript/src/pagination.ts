/**
 * Cursor pagination.
 *
 * The listings of the HTTP API page with opaque cursors: `GET /v1/conversations` and
 * `GET /v1/conversations/{id}/turns` take `?limit=&cursor=` and answer their items and a
 * `next_cursor` (absent on the last page). The client's `iterConversations` and `iterTurns` walk
 * them with {@link paginateItems}; use {@link paginate} directly for fetchers of your own. A
 * repeated cursor throws instead of looping. {@link chunked} splits writes (`storeTurnsBatched`).
 */

export interface Page<T> {
  items: T[];
  /** The cursor of the next page; undefined/null: this was the last. */
  nextCursor?: string | null;
}

export interface PaginateOptions {
  /** Start here (default: the first page). */
  cursor?: string;
  /** Stop after this many pages. */
  maxPages?: number;
}

/** Pages from `fetchPage(cursor)` until one has no `nextCursor`; a repeated cursor throws. */
export async function* paginate<T>(
  fetchPage: (cursor: string | undefined) => Promise<Page<T>>,
  options: PaginateOptions = {},
): AsyncGenerator<Page<T>> {
  const seen = new Set<string>();
  let cursor = options.cursor;
  for (let n = 0; options.maxPages === undefined || n < options.maxPages; n++) {
    const page = await fetchPage(cursor);
    yield page;
    const next = page.nextCursor;
    if (!next) return;
    if (seen.has(next)) throw new Error(`pagination loop: the server returned cursor ${JSON.stringify(next)} twice`);
    seen.add(next);
    cursor = next;
  }
}

/** The items of {@link paginate}, one by one. */
export async function* paginateItems<T>(
  fetchPage: (cursor: string | undefined) => Promise<Page<T>>,
  options: PaginateOptions = {},
): AsyncGenerator<T> {
  for await (const page of paginate(fetchPage, options)) yield* page.items;
}

/** Splits an iterable into arrays of at most `size` items. */
export function* chunked<T>(items: Iterable<T>, size: number): Generator<T[]> {
  if (!Number.isInteger(size) || size < 1) throw new RangeError(`batch size must be a positive integer, got ${size}`);
  let batch: T[] = [];
  for (const item of items) {
    batch.push(item);
    if (batch.length === size) {
      yield batch;
      batch = [];
    }
  }
  if (batch.length > 0) yield batch;
}
