// Run one claimed attempt: steps, checkpoints at step boundaries, and the attempt's end
// (the loop of docs/protocol.md, §4).
import type { Agent } from "./agent.js";
import { noEditToRefuse, owedApproval } from "./approvals.js";
import { Context } from "./context.js";
import { AttemptControl, CancelRequested, Heartbeater, HoldPointReached, LeaseLost, SideEffectUnknown } from "./control.js";
import type { HeartbeatPool } from "./heartbeats.js";
import { Problem, ServerAway } from "./http.js";
import { ApprovalNotApplied, Done, EditRefused, Next, StepError } from "./types.js";

export type Outcome = "succeeded" | "failed" | "interrupted" | "cancelled" | "paused" | "released" | "abandoned";

/** Run the claimed attempt, renewing its lease: with `heartbeats`, in its worker process's
 * one batch (`HeartbeatPool`); else with a watch of its own. */
export async function execute(agent: Agent, control: AttemptControl, heartbeats?: HeartbeatPool): Promise<Outcome> {
  const beater = heartbeats ? null : new Heartbeater(control);
  if (beater) beater.start();
  else heartbeats!.add(control);
  try {
    return await new Attempt(agent, control).run();
  } finally {
    if (beater) await beater.stop();
    else await heartbeats!.remove(control);
  }
}

class Attempt {
  private step = "";
  constructor(private readonly agent: Agent, private readonly control: AttemptControl) {}

  async run(): Promise<Outcome> {
    try {
      return await this.loop();
    } catch (error) {
      if (error instanceof HoldPointReached) return "interrupted";
      if (error instanceof CancelRequested) return this.release("cancelled");
      if (error instanceof LeaseLost) return "abandoned";
      if (error instanceof Problem || error instanceof ServerAway) return "abandoned";
      throw error;
    }
  }

  private async loop(): Promise<Outcome> {
    const { agent, control } = this;
    const lease = control.lease;
    if (agent.start === null) return this.fail("deterministic", "UnknownAgent", `Agent ${agent.name} has no steps.`);
    let step: string;
    let state: unknown;
    let checkpointId: string;
    let answers = new Map<string, any>();
    let resumed: boolean;
    if (lease.resume_from) {
      ({ step, state, checkpoint_id: checkpointId } = lease.resume_from);
      for (const answer of lease.answers ?? []) answers.set(answer.step_id, answer);
      resumed = true;
    } else {
      step = agent.start;
      state = {};
      const first = await control.write("checkpoint", { step, state });
      checkpointId = first.checkpoint_id;
      if (first.pause_requested) control.requestPause();
      resumed = false;
    }
    let continued = [...answers.values()].some((a) => a.kind === "pause");
    // What people approved, which the step run from the resumed checkpoint must use.
    let owed = lease.resume_from ? owedApproval(lease.resume_request) : null;
    const costBefore = Number(lease.run_cost ?? 0);
    for (;;) {
      this.step = step;
      const fn = agent.steps.get(step);
      if (!fn) return this.fail("deterministic", "UnknownStep", `Checkpoint ${checkpointId} names step ${step}, which agent ${agent.name} does not have.`);
      if (control.shutdown.aborted) return this.release("shutdown");
      control.check();
      if (control.paused) return this.release("paused");
      if ((lease.pause_before ?? []).includes(step) && !continued) {
        control.finishing = true;
        await control.write("interrupt", {
          checkpoint_id: checkpointId,
          kind: "pause",
          prompt: `breakpoint before ${step}`,
          context: { breakpoint: step },
        });
        return "paused";
      }
      continued = false;
      const ctx = new Context(control, agent.tools, agent.approvalPolicy, step, checkpointId, answers, resumed, costBefore, agent.retry.cost_budget ?? null, owed);
      let result: Next | Done;
      try {
        result = await fn(ctx, JSON.parse(JSON.stringify(state ?? {})));
      } catch (error) {
        if (error instanceof EditRefused) {
          await ctx.askAgainRefused(error); // asks again (HoldPointReached) when it can
          return this.fail("deterministic", "EditRefused", noEditToRefuse(error));
        }
        if (error instanceof SideEffectUnknown) return this.fail("side_effect_unknown", "SideEffectUnknown", error.message);
        if (error instanceof HoldPointReached || error instanceof CancelRequested || error instanceof LeaseLost) throw error;
        if (error instanceof StepError) return this.fail(error.failureClass, error.name, error.message);
        if (error instanceof Problem) return this.fail("deterministic", "Refused", `${error.code}: ${error.detail}`);
        const e = error as Error;
        return this.fail(null, e?.name ?? "Error", String(e?.message ?? e) || "Error");
      }
      control.check();
      const notApplied = ctx.approvalNotApplied();
      if (notApplied !== null) return this.fail("deterministic", ApprovalNotApplied.name, notApplied);
      if (result instanceof Done) {
        control.finishing = true;
        await control.write("complete", { result: result.result ?? null });
        return "succeeded";
      }
      if (!(result instanceof Next)) return this.fail("deterministic", "BadStepResult", `Step ${step} returned neither ctx.next() nor ctx.done().`);
      if (!agent.steps.has(result.step)) return this.fail("deterministic", "UnknownStep", `Step ${step} asked for step ${result.step}, which agent ${agent.name} does not have.`);
      state = JSON.parse(JSON.stringify(result.state ?? {}));
      const saved = await control.write("checkpoint", { step: result.step, state });
      checkpointId = saved.checkpoint_id;
      if (saved.pause_requested) control.requestPause();
      step = result.step;
      answers = new Map();
      resumed = false;
      owed = null;
    }
  }

  private async fail(failureClass: string | null, type: string, message: string): Promise<Outcome> {
    const error: Record<string, unknown> = { type: type.slice(0, 200), message: message.slice(0, 10_000), step: this.step.slice(0, 100) };
    if (failureClass) error.class = failureClass;
    this.control.finishing = true;
    await this.control.write("fail", { error });
    return "failed";
  }

  private async release(reason: string): Promise<Outcome> {
    this.control.finishing = true;
    if ((await this.control.release(reason)) === null) return "abandoned";
    return reason === "paused" ? "paused" : reason === "cancelled" ? "cancelled" : "released";
  }
}
