// The HTTP side: fetch, problem+json errors, and retries with the same Idempotency-Key:
// a connection error (the connection dropped under the request too: ECONNRESET, "other
// side closed"), any 5xx (503 `overloaded` included), a 429 or a 409
// `idempotency_in_progress` is sent again after a backoff (bounded, with jitter; past
// Retry-After when the server gave one, plus up to half of it again, so that workers
// refused together do not come back together); any other 4xx is the server's word, never
// sent again.
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

// Besides every 5xx (the server failed, or a proxy could not reach it): worth another try.
const RETRY_STATUSES = new Set([429]);

/** Whether an answer with `status` is worth sending again (with the same key). */
export function retryable(status: number, data: any): boolean {
  return status >= 500 || RETRY_STATUSES.has(status) || (status === 409 && data?.code === "idempotency_in_progress");
}

const BACKOFF_FIRST_MS = 100;
const BACKOFF_MAX_MS = 5_000;

/**
 * The pause after `tries` failed tries in a row (1, 2, …): 0.1 s doubling up to 5 s, each
 * drawn between half and all of that (jitter), so workers that failed together (two started
 * at once, a server restarting under all of them) do not come back together.
 */
export function backoffMs(tries: number): number {
  const ceiling = Math.min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * 2 ** Math.min(Math.max(tries, 1) - 1, 30));
  return ceiling / 2 + Math.random() * (ceiling / 2);
}

/** The pause before the next try: the backoff, or past Retry-After by up to half of it. */
export function retryDelayMs(tries: number, retryAfterMs: number): number {
  if (retryAfterMs > 0) return Math.max(backoffMs(tries), retryAfterMs * (1 + Math.random() / 2));
  return backoffMs(tries);
}

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
  private readonly headers: Record<string, string>;

  constructor(
    url: string,
    token: string,
    opts: { timeoutMs?: number; stop?: AbortController; headers?: Record<string, string> } = {},
  ) {
    this.url = url.replace(/\/+$/, "");
    this.token = token;
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.stop = opts.stop ?? new AbortController();
    // Who this worker is, on every call (`identityHeaders`).
    this.headers = opts.headers ?? {};
  }

  /** Send; resolve `[status, json]`. Rejects with `Problem` or `ServerAway`. */
  async call(method: string, path: string, body?: unknown, opts: CallOptions = {}): Promise<[number, any]> {
    const key = opts.key ?? randomUUID();
    const deadline = performance.now() + (opts.retryForMs ?? 30_000);
    let tries = 0;
    for (;;) {
      tries += 1;
      let reason: string;
      let afterMs = 0;
      try {
        const response = await fetch(this.url + path, {
          method,
          headers: {
            Authorization: `Bearer ${this.token}`,
            "Content-Type": "application/json",
            Accept: "application/json",
            "Idempotency-Key": key,
            "User-Agent": "holdpoint-client-typescript/0.1",
            ...this.headers,
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
        if (response.status < 400) return [response.status, data];
        if (!retryable(response.status, data)) throw new Problem(response.status, data ?? {});
        reason = `${method} ${path}: ${response.status}`;
        const after = Number(response.headers.get("retry-after"));
        if (after > 0) afterMs = Math.min(after * 1000, 30_000);
      } catch (error) {
        if (error instanceof Problem) throw error;
        reason = `${method} ${path}: ${(error as Error).message}`;
      }
      if (this.stop.signal.aborted && !opts.persist) throw new ServerAway(`${reason} (stopping)`);
      const delay = retryDelayMs(tries, afterMs);
      if (performance.now() + delay > deadline) throw new ServerAway(reason);
      await sleep(delay, opts.persist ? undefined : this.stop.signal);
    }
  }
}

/** A header value: printable ASCII (anything else becomes `?`), at most `limit` characters. */
function headerText(value: unknown, limit: number): string {
  return String(value).replace(/[^\x20-\x7e]/g, "?").slice(0, limit).trim();
}

export interface Identity {
  name: string;
  client: string;
  host: string;
  pid: number;
  concurrency: number;
  agents: string[];
  leaseSeconds?: number;
  wait: number;
}

/**
 * The `Holdpoint-Worker-*` headers that tell the server who this worker is (the Workers
 * page; docs/protocol.md, identity), each within the server's limits.
 */
export function identityHeaders(identity: Identity): Record<string, string> {
  const headers: Record<string, string> = {
    "Holdpoint-Worker-Name": headerText(identity.name, 100) || "worker",
    "Holdpoint-Worker-Client": headerText(identity.client, 141),
    "Holdpoint-Worker-Host": headerText(identity.host, 200),
    "Holdpoint-Worker-Pid": String(Math.trunc(identity.pid)),
    "Holdpoint-Worker-Concurrency": String(Math.trunc(identity.concurrency)),
    "Holdpoint-Worker-Agents": identity.agents
      .slice(0, 100)
      .map((a) => headerText(a, 100).replace(/,/g, "?"))
      .join(","),
    "Holdpoint-Worker-Wait-Seconds": String(identity.wait),
  };
  if (identity.leaseSeconds) headers["Holdpoint-Worker-Lease-Seconds"] = String(identity.leaseSeconds);
  return headers;
}
