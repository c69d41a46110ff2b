// The TypeScript script agent of the conformance suite (conformance/scenarios,
// docs/conformance.md): its steps interpret the operations of the run's input
// (`input.script`) through the public ctx API. Its Python twin is
// tests/conformance/script.py; tests/conformance/test_conformance.py drives both.
//
// The scenario's folder (HOLDPOINT_CONFORMANCE_DIR) is shared with the driver: the journal
// of marks (journal.log, one `name@attempt` a line), the files `busy` waits for, and the
// folder tool's "external system" (one file per idempotency key; executions.log, one line
// per act).
import { appendFileSync, existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { Agent } from "../dist/index.js";

const STEPS = ["one", "two", "three", "four"];
const TOOL = "conf-folder";
const folder = () => process.env.HOLDPOINT_CONFORMANCE_DIR;
const note = (mark) => appendFileSync(join(folder(), "journal.log"), `${mark}\n`);
const effect = (key) => join(folder(), `effect-${key.replaceAll("/", "_")}.json`);
const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export const folderTool = {
  name: TOOL,
  reversibility: "reversible",
  async execute(request, key) {
    writeFileSync(effect(key), JSON.stringify(request));
    appendFileSync(join(folder(), "executions.log"), `${key} ${process.pid}\n`);
    const hang = Number(request?.hang_after_act ?? 0);
    if (hang) {
      note("acted");
      await pause(hang * 1000); // the window between the act and its recorded outcome
    }
    return { externalReference: `folder:${key}`, result: { written: true } };
  },
  async lookup(key) {
    return existsSync(effect(key)) ? { status: "confirmed", externalReference: `folder:${key}`, result: { written: true } } : null;
  },
};

const keyOf = (op) => ("key" in op ? { key: op.key } : {});

const OPS = {
  ask: (ctx, op) => ctx.ask(op.prompt, op.schema, keyOf(op)),
  async approve(ctx, op) {
    const opts = { ...keyOf(op) };
    if ("editable" in op) opts.editable = op.editable;
    if ("arguments" in op) opts.arguments = op.arguments;
    const approval = await ctx.approve(op.action, op.target, op.change, opts);
    return { approved: approval.approved, decision: approval.decision, comment: approval.comment, edited: approval.edited };
  },
  async side_effect(ctx, op) {
    const done = await ctx.sideEffect(TOOL, op.target, op.request, keyOf(op));
    return { decision: done.decision, external_reference: done.externalReference };
  },
  async sleep(ctx, op) {
    const began = performance.now();
    await ctx.sleep(op.seconds);
    return Math.round(performance.now() - began) / 1000;
  },
  log: (ctx, op) => ctx.log(op.message),
  mark: (ctx, op) => note(`${op.name}@${ctx.attemptNumber}`),
  async busy(ctx, op) {
    // Not a ctx call, so not a safe point: the step is busy with its own work.
    const deadline = performance.now() + (op.limit ?? 60) * 1000;
    while (!existsSync(join(folder(), op.until)) && performance.now() < deadline) await pause(20);
  },
};

async function runStep(name, ctx, state) {
  const script = ctx.input.script;
  const next = { ...(state ?? {}) };
  for (const op of script[name]) {
    const value = await OPS[op.op](ctx, op);
    if ("save" in op) next[op.save] = value ?? null;
  }
  const later = STEPS.slice(STEPS.indexOf(name) + 1).filter((step) => step in script);
  return later.length ? ctx.next(later[0], next) : ctx.done(next);
}

export const agent = new Agent({
  name: "conf-typescript",
  description: "The conformance script agent (conformance/scenarios)",
  tools: [folderTool],
  retry: { max_attempts: 2, backoff_initial: 0.1, backoff_max: 0.2, max_lease_losses: 3 },
});
for (const name of STEPS) agent.step(name, (ctx, state) => runStep(name, ctx, state), { start: name === "one" });

/** The operations this agent knows (the driver checks them against the schema). */
export const OPERATIONS = Object.keys(OPS);
