// Holdpoint agents in any Node process, over the worker protocol (docs/protocol.md).
export { Agent, type AgentOptions, type StepFunction } from "./agent.js";
export { Context, canonicalJson, holdPointKey } from "./context.js";
export { isUnwind, Unwind } from "./control.js";
export { Api, Problem, ServerAway } from "./http.js";
export { ActionFailed, type LookupOutcome, OutcomeUnknown, type Tool, type ToolResult, WebhookTool } from "./tools.js";
export {
  type Approval,
  ApprovalDenied,
  type Confirmed,
  CostBudgetExceeded,
  Deterministic,
  Done,
  Next,
  type RetryPolicy,
  SideEffectFailed,
  StepError,
  Transient,
} from "./types.js";
export { Worker, type WorkerOptions } from "./worker.js";
