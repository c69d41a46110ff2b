// What people approved either happens or they are told: the same rule and words as the
// server's runtime (runtime/questions.py) and the Python client (holdpoint_client/approvals.py).
//
// An attempt resumed with an answered approval that said approve (the lease's
// `resume_request`) owes the approvers that approval: an `approve` or `sideEffect` the
// answer covers uses it; a new hold point instead carries a note saying why it was not
// applied (`superseded_approval`); a step that ends or skips it without using it fails the
// attempt `ApprovalNotApplied`. `EditRefused` asks the same approval again (`refused_edit`).
import type { EditRefused } from "./types.js";

export interface OwedApproval {
  requestId: string;
  stepId: string;
  action: Record<string, any>;
  approvedBy: string[];
  edited: unknown;
  /** A ctx call used it, or a new hold point told the approvers why it was not applied. */
  settled: boolean;
}

/** The approval an attempt resumed with (`lease.resume_request`) when it said approve. */
export function owedApproval(resumeRequest: any): OwedApproval | null {
  if (!resumeRequest || typeof resumeRequest !== "object" || resumeRequest.kind !== "auth_required") return null;
  const answer = resumeRequest.answer;
  if (!answer || typeof answer !== "object" || answer.decision !== "approve") return null;
  const by = resumeRequest.answered_by;
  const approvers = Array.isArray(answer.approvers) && answer.approvers.length ? answer.approvers.map(String) : by ? [String(by)] : [];
  const action = resumeRequest.action && typeof resumeRequest.action === "object" ? { ...resumeRequest.action } : {};
  return {
    requestId: String(resumeRequest.request_id ?? ""),
    stepId: String(resumeRequest.step_id ?? ""),
    action,
    approvedBy: approvers,
    edited: answer.edited ?? null,
    settled: false,
  };
}

/** "alice", "alice and bob", "alice, bob and carol". */
export function peopleWords(names: string[]): string {
  if (!names.length) return "a person";
  if (names.length === 1) return names[0];
  return `${names.slice(0, -1).join(", ")} and ${names[names.length - 1]}`;
}

// Python's str() of a short JSON scalar, so that the words match the other runtimes'.
const py = (v: unknown): string => (v === true ? "True" : v === false ? "False" : String(v));
const isShort = (v: unknown): boolean => ["string", "number", "boolean"].includes(typeof v) && py(v).length <= 60;

/** A short value as people read it: "v1, v3" for a list, "key: value; …" for an object. */
export function valueWords(value: unknown): string {
  let text: string;
  if (Array.isArray(value) && value.every(isShort)) text = value.map(py).join(", ") || "(none)";
  else if (value && typeof value === "object" && !Array.isArray(value))
    text = Object.entries(value).map(([k, v]) => `${k}: ${valueWords(v)}`).join("; ");
  else if (isShort(value)) text = py(value);
  else text = JSON.stringify(value);
  return text.length <= 300 ? text : `${text.slice(0, 299)}…`;
}

/** "config changed while the approval waited (version: 5 → 6)". */
export function changedWords(name: string, before: any, after: any): string {
  let text = `${name} changed while the approval waited`;
  const isObject = (v: unknown) => v && typeof v === "object" && !Array.isArray(v);
  if (isObject(before) && isObject(after)) {
    const diffs = Object.keys(before)
      .filter((k) => k in after)
      .sort()
      .filter((k) => isShort(before[k]) && isShort(after[k]) && before[k] !== after[k])
      .slice(0, 3)
      .map((k) => `${k}: ${py(before[k])} → ${py(after[k])}`);
    if (diffs.length) text += ` (${diffs.join(", ")})`;
  } else if (isShort(before) && isShort(after)) {
    text += ` (${py(before)} → ${py(after)})`;
  }
  return text;
}

const canonical = (v: unknown): string => {
  if (v === null || typeof v !== "object") return JSON.stringify(v ?? null);
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical((v as any)[k])}`).join(",")}}`;
};

export interface NotAppliedWhy {
  changed: [string, unknown, unknown][];
  asked?: Record<string, any>;
  askedKind?: string;
  askedKey?: string;
  skipped?: string[];
}

/** Why the step did not use `owed`: what changed while it waited, then what it did instead. */
export function notAppliedReason(owed: OwedApproval, why: NotAppliedWhy): string {
  const parts = why.changed.map(([name, before, after]) => changedWords(name, before, after));
  const old = owed.action;
  const asked = why.asked;
  if (why.askedKind === "auth_required" && asked) {
    if (String(asked.target ?? "") !== String(old.target ?? "")) parts.push(`the target is now ${asked.target} (it was ${old.target})`);
    else if (String(asked.tool ?? "") !== String(old.tool ?? "") || String(asked.action ?? "") !== String(old.action ?? ""))
      parts.push(`the step now asks about ${asked.action || asked.tool}`);
    else if (canonical(asked.change ?? null) !== canonical(old.change ?? null)) parts.push("the planned change is different now");
    else parts.push(`the step asked again under a new key (${why.askedKey || "unnamed"})`);
  } else if (why.askedKind) {
    parts.push("the step asked a new question instead");
  } else if (why.skipped?.length) {
    parts.push("the planned change is empty now (nothing is left to change), so the step skipped the approval");
  } else {
    parts.push("the step went on without using it");
  }
  return parts.join("; ");
}

/** The `superseded_approval` / `refused_edit` note of a new hold point's context. */
export function approvalNote(owed: OwedApproval, reason: string): Record<string, unknown> {
  return {
    request_id: owed.requestId,
    action: String(owed.action.action || owed.action.tool || ""),
    target: String(owed.action.target || ""),
    approved_by: [...owed.approvedBy],
    edited: owed.edited ?? null,
    reason,
  };
}

/** The failure of an attempt that ended without using `owed` (`ApprovalNotApplied`). */
export function notAppliedMessage(owed: OwedApproval, reason: string): string {
  const what = owed.action.action || owed.action.tool || "the action";
  const target = owed.action.target;
  const edit = owed.edited !== null && owed.edited !== undefined ? ` with their edit (${valueWords(owed.edited)})` : "";
  return (
    `${what}${target ? ` on ${target}` : ""}, approved by ${peopleWords(owed.approvedBy)}${edit}, was not applied: ${reason}. ` +
    `Nothing was done for that approval; retry to plan again (request ${owed.requestId}).`
  );
}

/** The failure of `EditRefused` thrown in a step that got no approved edit. */
export function noEditToRefuse(refused: EditRefused): string {
  return (
    `The step refused an edit (${refused.reason}), but no approval with an edit was given to it in this run of the step: ` +
    "there is no approved edit to refuse. Raise EditRefused after reading approval.edited."
  );
}
