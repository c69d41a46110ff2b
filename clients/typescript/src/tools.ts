// Tools run in the agent's process; the server's ledger decides whether they act.

export interface ToolResult {
  externalReference: string;
  result?: unknown;
}

export interface LookupOutcome {
  status: "confirmed" | "failed";
  externalReference?: string;
  result?: unknown;
  error?: unknown;
}

export type Reversibility = "reversible" | "compensable" | "irreversible";

export class ToolError extends Error {
  constructor(message: string, readonly details: Record<string, unknown> = {}) {
    super(message);
    this.name = new.target.name;
  }
  asError(): Record<string, unknown> {
    const error: Record<string, unknown> = { type: this.name, message: this.message.slice(0, 2000) };
    if (Object.keys(this.details).length) error.details = this.details;
    return error;
  }
}

/** The action may or may not have happened. */
export class OutcomeUnknown extends ToolError {}

/** The action certainly did not happen. */
export class ActionFailed extends ToolError {}

/** A tool: `execute` acts with the ledger's key; `lookup` asks what became of a key (null: it never happened). */
export interface Tool {
  name: string;
  reversibility: Reversibility;
  execute(request: any, idempotencyKey: string): Promise<ToolResult>;
  lookup(idempotencyKey: string): Promise<LookupOutcome | null>;
  compensate?(effect: unknown): Promise<ToolResult>;
  /** A JSON Schema of the request: an approver of an irreversible call may edit it first. */
  editSchema?: Record<string, unknown>;
}

const AMBIGUOUS = new Set([408, 409, 425, 500, 502, 504]);

/** POST `request.body` to `request.url` with the ledger's idempotency key (built in). */
export class WebhookTool implements Tool {
  name = "webhook";
  reversibility: Reversibility = "irreversible";
  constructor(readonly opts: { lookupUrl?: string; timeoutMs?: number; referenceField?: string } = {}) {}

  async execute(request: any, key: string): Promise<ToolResult> {
    if (!request || typeof request !== "object" || !request.url) {
      throw new ActionFailed("A webhook request is an object with a url and a body.");
    }
    const headers: Record<string, string> = { ...(request.headers ?? {}), "Idempotency-Key": key };
    return this.result(await this.send("POST", String(request.url), request.body ?? {}, headers), key);
  }

  async lookup(key: string): Promise<LookupOutcome | null> {
    if (!this.opts.lookupUrl) throw new OutcomeUnknown("This webhook has no lookupUrl; it cannot tell.");
    const url = this.opts.lookupUrl.replace("{idempotency_key}", encodeURIComponent(key));
    let reply: { status: number; body: any; headers: Headers };
    try {
      reply = await this.send("GET", url, undefined, { "Idempotency-Key": key });
    } catch (error) {
      if (error instanceof ActionFailed && error.details.status === 404) return null;
      throw new OutcomeUnknown(`The lookup was refused: ${(error as Error).message}`);
    }
    if (reply.body && reply.body.status === "failed") return { status: "failed", result: reply.body, error: reply.body.error };
    const done = this.result(reply, key);
    return { status: "confirmed", externalReference: done.externalReference, result: done.result };
  }

  private async send(method: string, url: string, body: unknown, headers: Record<string, string>) {
    let response: Response;
    try {
      response = await fetch(url, {
        method,
        headers: { ...headers, ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(this.opts.timeoutMs ?? 10_000),
      });
    } catch (error) {
      const cause = (error as any)?.cause?.code;
      if (cause === "ECONNREFUSED") throw new ActionFailed(`${method} ${url}: could not connect`);
      throw new OutcomeUnknown(`${method} ${url}: ${(error as Error).message}; it may have acted.`);
    }
    const text = (await response.text()).slice(0, 100_000);
    let parsed: any = text;
    try {
      parsed = JSON.parse(text);
    } catch {
      // not JSON: keep the text
    }
    if (response.status >= 200 && response.status < 300) return { status: response.status, body: parsed, headers: response.headers };
    const details = { status: response.status, body: parsed, url };
    if (AMBIGUOUS.has(response.status) || (response.status >= 300 && response.status < 400)) {
      throw new OutcomeUnknown(`${method} ${url} answered ${response.status}; it may have acted.`, details);
    }
    throw new ActionFailed(`${method} ${url} was refused with ${response.status}.`, details);
  }

  private result(reply: { status: number; body: any; headers: Headers }, key: string): ToolResult {
    const field = this.opts.referenceField ?? "id";
    let reference = "";
    if (reply.body && typeof reply.body === "object" && reply.body[field] != null && reply.body[field] !== "") {
      reference = String(reply.body[field]);
    }
    reference = reference || reply.headers.get("location") || key;
    return { externalReference: reference.slice(0, 500), result: { status_code: reply.status, body: reply.body } };
  }
}
