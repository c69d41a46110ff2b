// The HTTP side: fetch, problem+json errors, and retries with the same Idempotency-Key.
import { randomUUID } from "node:crypto";

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type JsonObject = { [key: string]: any };

/** The server refused: its HTTP status, stable `code`, `detail` and extra members. */
export class Problem extends Error {
  readonly status: number;
  readonly code: string;
  readonly detail: string;
  readonly body: JsonObject;
  constructor(status: number, body: JsonObject) {
    const code = String(body?.code ?? `http_${status}`);
    const detail = String(body?.detail ?? body?.title ?? "");
    super(`${status} ${code}: ${detail}`);
    this.status = status;
    this.code = code;
    this.detail = detail;
    this.body = body ?? {};
  }
}

/** No answer from the server within the retry budget. */
export class ServerAway extends Error {}

const RETRY_STATUSES = new Set([429, 502, 503, 504]);

export interface CallOptions {
  key?: string;
  timeoutMs?: number;
  retryForMs?: number;
  persist?: boolean;
}

export const sleep = (ms: number, signal?: AbortSignal): Promise<void> =>
  new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });

export class Api {
  readonly url: string;
  private readonly token: string;
  readonly stop: AbortController;
  private readonly timeoutMs: number;

  constructor(url: string, token: string, opts: { timeoutMs?: number; stop?: AbortController } = {}) {
    this.url = url.replace(/\/+$/, "");
    this.token = token;
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.stop = opts.stop ?? new AbortController();
  }

  /** Send; resolve `[status, json]`. Rejects with `Problem` or `ServerAway`. */
  async call(method: string, path: string, body?: unknown, opts: CallOptions = {}): Promise<[number, any]> {
    const key = opts.key ?? randomUUID();
    const deadline = Date.now() + (opts.retryForMs ?? 30_000);
    let delay = 100;
    for (;;) {
      let reason: string;
      try {
        const response = await fetch(this.url + path, {
          method,
          headers: {
            Authorization: `Bearer ${this.token}`,
            "Content-Type": "application/json",
            Accept: "application/json",
            "Idempotency-Key": key,
            "User-Agent": "holdpoint-client-typescript/0.1",
          },
          body: body === undefined ? undefined : JSON.stringify(body),
          signal: AbortSignal.timeout(opts.timeoutMs ?? this.timeoutMs),
        });
        const text = await response.text();
        let data: any = null;
        if (text) {
          try {
            data = JSON.parse(text);
          } catch {
            data = { detail: text.slice(0, 500) };
          }
        }
        const inProgress = response.status === 409 && data?.code === "idempotency_in_progress";
        if (response.status < 400) return [response.status, data];
        if (!RETRY_STATUSES.has(response.status) && !inProgress) throw new Problem(response.status, data ?? {});
        reason = `${method} ${path}: ${response.status}`;
        const after = Number(response.headers.get("retry-after"));
        if (after > 0) delay = Math.max(delay, Math.min(after * 1000, 30_000));
      } catch (error) {
        if (error instanceof Problem) throw error;
        reason = `${method} ${path}: ${(error as Error).message}`;
      }
      if (this.stop.signal.aborted && !opts.persist) throw new ServerAway(`${reason} (stopping)`);
      if (Date.now() + delay > deadline) throw new ServerAway(reason);
      await sleep(delay, opts.persist ? undefined : this.stop.signal);
      delay = Math.min(delay * 2, 5_000);
    }
  }
}
