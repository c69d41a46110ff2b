// An agent: a name, an input schema, a retry policy, tools and async steps.
import type { Context } from "./context.js";
import { type Tool, WebhookTool } from "./tools.js";
import type { Done, Next, RetryPolicy } from "./types.js";

export type StepFunction = (ctx: Context, state: any) => Promise<Next | Done> | Next | Done;

export interface AgentOptions {
  name: string;
  inputSchema?: Record<string, unknown>;
  retry?: RetryPolicy;
  description?: string;
  label?: string;
  tools?: Tool[];
  approvalPolicy?: { ask_before?: string[] };
}

export class Agent {
  readonly name: string;
  readonly inputSchema: Record<string, unknown>;
  readonly retry: RetryPolicy;
  readonly description: string;
  readonly label: string;
  readonly approvalPolicy: { ask_before?: string[] };
  readonly tools = new Map<string, Tool>();
  readonly steps = new Map<string, StepFunction>();
  start: string | null = null;

  constructor(opts: AgentOptions) {
    if (!opts.name || opts.name.length > 100) throw new Error("An agent name must be 1 to 100 characters.");
    this.name = opts.name;
    this.inputSchema = opts.inputSchema ?? {};
    this.retry = opts.retry ?? {};
    this.description = opts.description ?? "";
    this.label = opts.label ?? "";
    this.approvalPolicy = opts.approvalPolicy ?? {};
    this.tools.set("webhook", new WebhookTool());
    for (const tool of opts.tools ?? []) this.tools.set(tool.name, tool);
  }

  /** Register a step; the first registered (or the one with `start: true`) starts a run. */
  step(name: string, fn: StepFunction, opts: { start?: boolean } = {}): this {
    if (!name || name.length > 100) throw new Error("A step name must be 1 to 100 characters.");
    if (this.steps.has(name) && this.steps.get(name) !== fn) {
      throw new Error(`Agent ${this.name} already has a step named ${name}.`);
    }
    this.steps.set(name, fn);
    if (opts.start || this.start === null) this.start = name;
    return this;
  }

  /** The body of `PUT /api/agents/{name}`. */
  declaration(): Record<string, unknown> {
    return {
      input_schema: this.inputSchema,
      retry_policy: this.retry,
      label: this.label,
      description: this.description,
      tools: [...this.tools.values()]
        .filter((tool) => tool.name !== "webhook")
        .map((tool) => ({ name: tool.name, reversibility: tool.reversibility })),
      approval_policy: this.approvalPolicy,
    };
  }
}
