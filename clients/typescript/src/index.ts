// Holdpoint agents in any Node process, over the worker protocol (docs/protocol.md).
export { Agent, type AgentOptions, type StepFunction } from "./agent.js";
export { Context, canonicalJson, holdPointKey } from "./context.js";
export { isUnwind, Unwind } from "./control.js";
export { Api, type Identity, identityHeaders, Problem, ServerAway } from "./http.js";
export { ActionFailed, type LookupOutcome, OutcomeUnknown, type Tool, type ToolResult, WebhookTool } from "./tools.js";
export {
  type Approval,
  ApprovalDenied,
  type Confirmed,
  CostBudgetExceeded,
  Deterministic,
  Done,
  EditRefused,
  Next,
  type RetryPolicy,
  SideEffectFailed,
  StepError,
  Transient,
} from "./types.js";
export { CLIENT, DeclarationRefused, Worker, type WorkerOptions } from "./worker.js";
