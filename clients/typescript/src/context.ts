// The `ctx` a step receives: ask, approve, sideEffect, observe/changed, cost, log, sleep, check.
import { createHash } from "node:crypto";

import { AttemptControl, HoldPointReached, SideEffectUnknown } from "./control.js";
import { approvalNote, notAppliedMessage, notAppliedReason, type OwedApproval, owedApproval } from "./approvals.js";
import { Problem, sleep } from "./http.js";
import { ActionFailed, OutcomeUnknown, type Tool } from "./tools.js";
import {
  type Approval,
  approval as makeApproval,
  ApprovalDenied,
  type Confirmed,
  CostBudgetExceeded,
  Done,
  type EditRefused,
  Next,
  SideEffectFailed,
} from "./types.js";

const MAX_KEY = 100;
const DIGEST = 20;
const OBSERVED_MAX = 2000;

/** JSON with keys sorted at every level (Python's `json.dumps(sort_keys=True)`, compact). */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== "object") return JSON.stringify(value ?? null);
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  const entries = Object.keys(value as object)
    .sort()
    .filter((k) => (value as any)[k] !== undefined)
    .map((k) => `${JSON.stringify(k)}:${canonicalJson((value as any)[k])}`);
  return `{${entries.join(",")}}`;
}

const toJson = (value: unknown): any => (value === undefined ? null : JSON.parse(JSON.stringify(value)));

export function holdPointKey(raw: string): string {
  if (raw.length <= MAX_KEY) return raw;
  const digest = createHash("sha256").update(raw, "utf8").digest("hex").slice(0, DIGEST);
  return `${raw.slice(0, MAX_KEY - DIGEST - 1)}~${digest}`;
}

export const fingerprint = (value: unknown): string =>
  createHash("sha256").update(canonicalJson(value), "utf8").digest("hex").slice(0, 16);

const PAIRS: [string, string][] = [
  ["from", "to"],
  ["before", "after"],
  ["old", "new"],
];

function pair(value: any): [unknown, unknown] | null {
  if (value && typeof value === "object" && !Array.isArray(value)) {
    const keys = Object.keys(value).sort();
    for (const [a, b] of PAIRS) if (keys.length === 2 && keys.includes(a) && keys.includes(b)) return [value[a], value[b]];
  }
  return null;
}

export function changeIsEmpty(detail: any): boolean {
  if (!detail || typeof detail !== "object" || Array.isArray(detail)) return false;
  const top = pair(detail);
  if (top) return canonicalJson(top[0]) === canonicalJson(top[1]);
  if ("before" in detail && "after" in detail) return canonicalJson(detail.before) === canonicalJson(detail.after);
  const pairs = Object.values(detail).map(pair).filter((p): p is [unknown, unknown] => p !== null);
  return pairs.length > 0 && pairs.every(([a, b]) => canonicalJson(a) === canonicalJson(b));
}

function covers(answer: any, tool: string, target: string, change: unknown): boolean {
  const action = answer?.action ?? {};
  return String(action.tool ?? "") === tool && String(action.target ?? "") === target && canonicalJson(action.change ?? null) === canonicalJson(change);
}

function approvalOf(answer: any): Approval {
  const value = answer?.answer && typeof answer.answer === "object" ? answer.answer : {};
  return makeApproval({
    approved: value.decision === "approve",
    comment: String(value.comment ?? ""),
    answeredBy: answer?.answered_by ?? null,
    requestId: String(answer?.request_id ?? ""),
    decision: String(value.decision ?? ""),
    edited: value.edited ?? null,
    approvers: Array.isArray(value.approvers) ? value.approvers.map(String) : [],
  });
}

// Secret header values are never stored by the server: an approver's edit shows them
// "[redacted]"; they are put back from the plan this process holds.
const REDACTED = "[redacted]";

const SECRET_HEADERS = new Set(["authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"]);
const SECRET_WORDS = ["token", "secret", "key", "password", "passwd", "auth", "session", "signature"];

/** `request` with secret header values replaced by "[redacted]" (the server's rule). */
function redactRequest(request: any): any {
  const headers = request?.headers;
  if (!headers || typeof headers !== "object") return request;
  const shown: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(headers)) {
    const lowered = name.toLowerCase();
    shown[name] = SECRET_HEADERS.has(lowered) || SECRET_WORDS.some((w) => lowered.includes(w)) ? REDACTED : value;
  }
  return { ...request, headers: shown };
}

function withSecrets(edited: any, planned: any): any {
  const headers = edited?.headers;
  const original = planned?.headers;
  if (!headers || typeof headers !== "object" || !original || typeof original !== "object") return edited;
  const restored: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(headers)) {
    restored[name] = value === REDACTED && name in original ? original[name] : value;
  }
  return { ...edited, headers: restored };
}

export interface AskOptions {
  expiresIn?: number;
  context?: Record<string, unknown>;
  reason?: string;
  key?: string;
}

export interface ApproveOptions extends AskOptions {
  tool?: string;
  reversibility?: string;
  prompt?: string;
  /** A JSON Schema (compact form allowed) of the arguments an approver may edit. */
  editable?: unknown;
  /** The planned arguments shown in the edit form (default: `detail`). */
  arguments?: unknown;
}

export class Context {
  private readonly counts = new Map<string, number>();
  private readonly observed: Record<string, any> = {};
  private readonly changedNames = new Set<string>();
  private readonly lease: any;
  // What people approved and this step run must use; what changed while it waited, the
  // approvals skipped as empty, and the last approval with an edit (what EditRefused refuses).
  private readonly changes = new Map<string, [unknown, unknown]>();
  private readonly skipped: string[] = [];
  private edited: { answer: any; asked: { prompt: string; opts: ApproveOptions } } | null = null;

  constructor(
    private readonly control: AttemptControl,
    private readonly tools: Map<string, Tool>,
    private readonly approvalPolicy: { ask_before?: string[] },
    readonly step: string,
    readonly checkpointId: string,
    private readonly answers: Map<string, any>,
    readonly resumed: boolean,
    private readonly costBefore: number,
    private readonly costBudget: number | null,
    private readonly owed: OwedApproval | null = null,
  ) {
    this.lease = control.lease;
  }

  get runId(): string {
    return this.lease.run_id;
  }
  get attemptId(): string {
    return this.lease.attempt_id;
  }
  get attemptNumber(): number {
    return this.lease.number;
  }
  /** Why this attempt exists: `initial`, `resume`, `retry`, `auto_retry`, `lease_expired`, … */
  get attemptReason(): string {
    return String(this.lease.reason ?? "");
  }
  get input(): any {
    return this.lease.input;
  }
  /** The declared version the run started with (its input matched that version's schema). */
  get agentVersion(): number | null {
    return this.lease.agent_version ?? null;
  }

  next(step: string, state: unknown = {}): Next {
    return new Next(step, state ?? {});
  }

  done(result: unknown = null): Done {
    return new Done(result);
  }

  /** A safe point: throws (unwinding the step) when the run was cancelled or the lease lost. */
  check(): void {
    this.control.check();
  }

  async sleep(seconds: number): Promise<void> {
    this.check();
    await sleep(Math.max(0, seconds * 1000), this.control.wake.signal);
    this.check();
  }

  private key(kind: string, key?: string): string {
    if (key !== undefined) {
      if (!key) throw new Error("key must not be empty");
      return holdPointKey(`${this.step}.${key}`);
    }
    const n = (this.counts.get(kind) ?? 0) + 1;
    this.counts.set(kind, n);
    return holdPointKey(n === 1 ? `${this.step}.${kind}` : `${this.step}.${kind}#${n}`);
  }

  /** Ask a person; resolves with the answer once given (the attempt ends at the hold point first). */
  async ask(prompt: string, schema: unknown, opts: AskOptions = {}): Promise<any> {
    this.check();
    const stepId = this.key("ask", opts.key);
    const answer = this.answers.get(stepId);
    if (answer && answer.kind === "input_required") return answer.answer;
    return this.hold("input_required", stepId, prompt, schema, opts, undefined);
  }

  /** Ask for approval of `action` on `target`; a denial is a value (`approval.denied`). */
  async approve(action: string, target: string, detail: unknown = null, opts: ApproveOptions = {}): Promise<Approval> {
    this.check();
    const stepId = this.key("approve", opts.key);
    const change = toJson(detail);
    const tool = opts.tool ?? action;
    const answer = this.answers.get(stepId);
    if (answer && answer.kind === "auth_required" && covers(answer, tool, target, change)) {
      const approval = approvalOf(answer);
      this.use(answer);
      if (approval.approved && approval.edited !== null) {
        this.edited = { answer, asked: { prompt: opts.prompt ?? `Approve ${action} on ${target}?`, opts } };
      }
      return approval;
    }
    if ((this.lease.approvals ?? []).includes(stepId)) {
      return makeApproval({ approved: true, comment: "Approved when the run was started." });
    }
    if (changeIsEmpty(change)) {
      await this.log(`Did not ask for approval of ${action} on ${target}: the planned change is empty (nothing would change).`, "info", {
        event: "approval_skipped",
        action,
        target,
      });
      this.skipped.push(`${action} on ${target}`);
      return makeApproval({ approved: true, unchanged: true });
    }
    const reversibility = opts.reversibility ?? (opts.tool ? this.tools.get(opts.tool)?.reversibility : undefined) ?? "";
    const editable =
      opts.editable === undefined ? {} : { editable: { schema: toJson(opts.editable), value: toJson(opts.arguments === undefined ? change : opts.arguments) } };
    return this.hold("auth_required", stepId, opts.prompt ?? `Approve ${action} on ${target}?`, null, opts, {
      tool,
      action,
      target,
      change,
      reversibility,
      ...editable,
    });
  }

  private async hold(kind: string, stepId: string, prompt: string, schema: unknown, opts: AskOptions, action?: Record<string, unknown>): Promise<never> {
    const shown: Record<string, unknown> = { ...(toJson(opts.context ?? {}) as object) };
    if (Object.keys(this.observed).length && !("observed" in shown)) shown.observed = this.observed;
    const owed = this.owed;
    if (owed && !owed.settled) {
      // Asked anew instead of using what people approved: the new card says why.
      owed.settled = true;
      if (!("superseded_approval" in shown)) {
        shown.superseded_approval = approvalNote(owed, notAppliedReason(owed, { changed: this.changedList(), asked: action, askedKind: kind, askedKey: stepId }));
      }
    }
    const body: Record<string, unknown> = {
      checkpoint_id: this.checkpointId,
      kind,
      prompt,
      accepted_schema: schema,
      context: shown,
      reason: opts.reason ?? "",
      step_id: stepId,
    };
    if (opts.expiresIn !== undefined) body.expires_in = opts.expiresIn;
    if (action) body.action = action;
    this.control.finishing = true;
    const request = await this.control.write("interrupt", body);
    throw new HoldPointReached(String(request.request_id));
  }

  /** Act on the world through the ledger: the intent first (fenced), then the tool, here. */
  async sideEffect(
    tool: string,
    target: string,
    request: Record<string, unknown>,
    opts: { compensate?: Record<string, unknown>; reversibility?: string; key?: string } = {},
  ): Promise<Confirmed> {
    this.check();
    const theTool = this.tools.get(tool);
    if (!theTool) throw new SideEffectFailed(`This agent has no tool named ${tool}.`, "");
    if ((this.approvalPolicy.ask_before ?? []).includes(tool)) {
      const granted = await this.approve(tool, target, request, { tool, key: `${opts.key ?? tool}.approve` });
      if (granted.denied) throw new ApprovalDenied(`${tool} on ${target} was denied.`, granted);
    }
    const stepId = this.key(tool, opts.key);
    let reversibility = opts.reversibility;
    if (reversibility === undefined && opts.compensate && theTool.reversibility === "irreversible") reversibility = "compensable";
    let payload = toJson(request);
    const answered = this.answers.get(stepId);
    if (answered && answered.kind === "auth_required" && covers(answered, tool, target, payload)) this.use(answered);
    let body: Record<string, unknown> = { step_id: stepId, tool, target, request: payload };
    if (reversibility !== undefined) body.reversibility = reversibility;
    if (opts.compensate) body.compensating_action = toJson(opts.compensate);
    let begin: any;
    try {
      try {
        begin = await this.control.write("side-effects", body, false);
      } catch (error) {
        if (!(error instanceof Problem && error.code === "approval_required" && error.body.edited && error.body.edited_idempotency_key)) throw error;
        // Approved with edits: the edited request runs, under its own key (the server says which).
        payload = withSecrets(error.body.edited, payload);
        body = { ...body, request: payload, idempotency_key: String(error.body.edited_idempotency_key) };
        begin = await this.control.write("side-effects", body, false);
      }
    } catch (error) {
      if (error instanceof Problem && error.code === "side_effect_unknown") {
        throw new SideEffectUnknown(error.detail, String(error.body.operation_id ?? ""));
      }
      if (error instanceof Problem && error.code === "approval_required" && !("idempotency_key" in body)) {
        return this.approvalForIrreversible(stepId, tool, target, payload, error);
      }
      throw error;
    }
    const operationId = String(begin.operation_id);
    if (begin.decision === "reuse") {
      return { operationId, externalReference: String(begin.external_reference ?? ""), result: begin.result, decision: "reuse" };
    }
    const key = String(begin.idempotency_key);
    if (begin.decision === "look_up") {
      let found;
      try {
        found = await theTool.lookup(key);
      } catch (error) {
        const message = (error as Error).message;
        await this.control.outcome(operationId, { status: "unknown", error: error instanceof OutcomeUnknown ? error.asError() : { type: "Error", message } });
        throw new SideEffectUnknown(`${tool} on ${target}: ${message}`, operationId);
      }
      if (found) {
        const effect = await this.control.outcome(operationId, {
          status: found.status,
          external_reference: found.externalReference || null,
          result: toJson(found.result),
          error: toJson(found.error),
        });
        return this.settled(effect, tool, target, "look_up");
      }
    }
    this.check(); // Never act on a lease that may be gone.
    let effect: any;
    try {
      const done = await theTool.execute(payload, key);
      effect = await this.control.outcome(operationId, {
        status: "confirmed",
        external_reference: done.externalReference,
        result: toJson(done.result),
      });
    } catch (error) {
      if (error instanceof ActionFailed) effect = await this.control.outcome(operationId, { status: "failed", error: error.asError() });
      else if (error instanceof OutcomeUnknown) effect = await this.control.outcome(operationId, { status: "unknown", error: error.asError() });
      else effect = await this.control.outcome(operationId, { status: "unknown", error: { type: (error as Error).name, message: String((error as Error).message).slice(0, 2000) } });
    }
    return this.settled(effect, tool, target, begin.decision);
  }

  private settled(effect: any, tool: string, target: string, decision: Confirmed["decision"]): Confirmed {
    this.check();
    if (effect.status === "confirmed" || effect.status === "compensation_failed") {
      return { operationId: effect.operation_id, externalReference: String(effect.external_reference ?? ""), result: effect.result, decision };
    }
    const message = effect.error?.message;
    if (effect.status === "failed") throw new SideEffectFailed(`${tool} on ${target} failed: ${message ?? "refused"}`, effect.operation_id, effect.error);
    throw new SideEffectUnknown(`${tool} on ${target}: ${message ?? "the outcome is unknown"}`, effect.operation_id);
  }

  private async approvalForIrreversible(stepId: string, tool: string, target: string, request: unknown, error: Problem): Promise<never> {
    if (error.body.request_id) {
      const answer = this.answers.get(stepId);
      const denied = answer ? approvalOf(answer) : makeApproval({ approved: false, answeredBy: error.body.denied_by ?? null });
      const who = denied.answeredBy ?? error.body.denied_by;
      if (denied.responded) throw new ApprovalDenied(`${tool} on ${target} was sent back${who ? ` by ${who}` : ""}: ${denied.comment}`, denied);
      throw new ApprovalDenied(`${tool} on ${target} was denied${who ? ` by ${who}` : ""}${denied.comment ? `: ${denied.comment}` : "."}`, denied);
    }
    const asked = this.answers.get(stepId);
    if (asked && covers(asked, tool, target, request)) throw error;
    const action: Record<string, unknown> = { tool, action: tool, target, change: request, reversibility: "irreversible" };
    const prompt = `Approve ${tool} on ${target}? It cannot be undone.`;
    const editSchema = this.tools.get(tool)?.editSchema;
    if (editSchema) {
      // The tool's form: the approver may edit the call before approving it.
      try {
        return await this.hold("auth_required", stepId, prompt, null, { reason: error.detail }, {
          ...action,
          editable: { schema: editSchema, value: redactRequest(request) },
        });
      } catch (refused) {
        const pointers = refused instanceof Problem && Array.isArray(refused.body.errors) ? refused.body.errors.map((e: any) => String(e?.pointer ?? "")) : [];
        const planDoesNotFit = refused instanceof Problem && refused.code === "invalid_input" && pointers.length > 0 && pointers.every((p: string) => p.startsWith("/action/editable"));
        if (!planDoesNotFit) throw refused; // Also HoldPointReached: the question was asked.
      }
    }
    return this.hold("auth_required", stepId, prompt, null, { reason: error.detail }, action);
  }

  private use(answer: any): void {
    if (this.owed && this.owed.requestId === String(answer?.request_id ?? "")) this.owed.settled = true;
  }

  private changedList(): [string, unknown, unknown][] {
    return [...this.changedNames].sort().map((name) => [name, ...(this.changes.get(name) ?? [null, null])] as [string, unknown, unknown]);
  }

  /** The runtime's: why the ended step did not use the approval its attempt resumed with. */
  approvalNotApplied(): string | null {
    const owed = this.owed;
    if (!owed || owed.settled) return null;
    return notAppliedMessage(owed, notAppliedReason(owed, { changed: this.changedList(), skipped: this.skipped }));
  }

  /** The runtime's: ask the approval whose edit the step refused again, saying why (throws
   * HoldPointReached); returns only when the step got no approved edit to refuse. */
  async askAgainRefused(refused: EditRefused): Promise<void> {
    if (!this.edited) return;
    const { answer, asked } = this.edited;
    const owed = owedApproval(answer);
    if (!owed) return;
    const context = { ...(toJson(asked.opts.context ?? {}) as object), refused_edit: approvalNote(owed, refused.reason) };
    await this.hold("auth_required", String(answer.step_id), asked.prompt, null, { ...asked.opts, context }, { ...(answer.action ?? {}) });
  }

  /** Read something volatile; remembered with any question, so `changed(name)` can tell later. */
  async observe<T>(name: string, read: () => T | Promise<T>): Promise<T> {
    this.check();
    const value = await read();
    const asJson = toJson(value);
    const summary: Record<string, unknown> = { fingerprint: fingerprint(asJson) };
    if (canonicalJson(asJson).length <= OBSERVED_MAX) summary.value = asJson;
    this.observed[name] = summary;
    let before: any = null;
    for (const answer of this.answers.values()) {
      const seen = answer?.context?.observed?.[name];
      if (seen && typeof seen === "object") before = seen;
    }
    if (before && before.fingerprint !== summary.fingerprint) {
      this.changedNames.add(name);
      this.changes.set(name, [before.value ?? null, summary.value ?? null]);
      await this.log(`${name} changed while the run was waiting`, "warning", { name, before: before.value ?? null, after: summary.value ?? null });
    }
    return value;
  }

  changed(name: string): boolean {
    return this.changedNames.has(name);
  }

  /** Add to the attempt's cost (sent with the next heartbeat and write). */
  cost(amount: number): number {
    this.check();
    if (!Number.isFinite(amount) || amount < 0) throw new Error("cost must be a non-negative number");
    const total = this.control.addCost(amount);
    if (this.costBudget !== null && this.costBefore + total > this.costBudget) {
      throw new CostBudgetExceeded(`The run has cost ${this.costBefore + total}, past its budget of ${this.costBudget}.`);
    }
    return total;
  }

  async log(message: string, level = "info", data?: Record<string, unknown>): Promise<void> {
    const body: Record<string, unknown> = { message: String(message).slice(0, 2000) || "(empty)", level, step: this.step };
    if (data && Object.keys(data).length) body.data = toJson(data);
    await this.control.write("log", body, false);
  }
}
