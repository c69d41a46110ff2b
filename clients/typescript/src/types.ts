// The values steps return and the errors they raise: the names of Holdpoint's Python SDK.

export class Next {
  constructor(readonly step: string, readonly state: unknown = {}) {}
}

export class Done {
  constructor(readonly result: unknown = null) {}
}

export interface Approval {
  approved: boolean;
  denied: boolean;
  comment: string;
  answeredBy: string | null;
  requestId: string;
  unchanged: boolean;
  /** approve | deny | respond. A response ("send back with a comment") is not an approval. */
  decision: string;
  /** True when the approver sent the request back with a comment (`comment`). */
  responded: boolean;
  /** The arguments as the approvers edited them (`approve(..., { editable })`), or null. */
  edited: unknown;
  /** Everyone whose approval counted, when the policy needed more than one. */
  approvers: string[];
}

export function approval(fields: Partial<Approval> & { approved: boolean }): Approval {
  return {
    comment: "",
    answeredBy: null,
    requestId: "",
    unchanged: false,
    decision: "",
    edited: null,
    approvers: [],
    ...fields,
    denied: !fields.approved,
    responded: fields.decision === "respond",
  };
}

export interface Confirmed {
  operationId: string;
  externalReference: string;
  result: unknown;
  decision: "act" | "look_up" | "reuse";
}

/** Base of the errors that say how a step's failure is classified. */
export class StepError extends Error {
  failureClass: string | null = null;
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** Worth retrying later: back off and try again while the budget lasts. */
export class Transient extends StepError {
  override failureClass = "transient";
}

/** Retrying cannot help until something changes: stop. */
export class Deterministic extends StepError {
  override failureClass = "deterministic";
}

export class ApprovalDenied extends StepError {
  override failureClass = "denied";
  constructor(message: string, readonly approval: Approval) {
    super(message);
  }
}

/** Throw it when the step cannot use the edit the approvers approved: the same approval is
 * asked again (same hold point, same plan), saying the edit was refused and why. */
export class EditRefused extends StepError {
  override failureClass = "deterministic";
  constructor(readonly reason: string) {
    super(reason);
  }
}

/** The runtime's: the attempt resumed with an approval, and its step ended without using it. */
export class ApprovalNotApplied extends Deterministic {}

export class SideEffectFailed extends StepError {
  constructor(message: string, readonly operationId: string, readonly error: unknown = null) {
    super(message);
  }
}

export class CostBudgetExceeded extends Deterministic {}

export interface RetryPolicy {
  max_attempts?: number;
  backoff_initial?: number;
  backoff_multiplier?: number;
  backoff_max?: number;
  jitter?: number;
  non_retryable?: string[];
  repeated_error_threshold?: number;
  cost_budget?: number | null;
  max_lease_losses?: number | null;
}
