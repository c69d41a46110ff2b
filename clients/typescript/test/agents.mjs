// Remote agents for the TypeScript client's tests. The "external system" is a folder
// (HOLDPOINT_TEST_TOOL_DIR): one file per idempotency key, one line per execution.
import { appendFileSync, existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { Agent } from "../dist/index.js";

const root = () => process.env.HOLDPOINT_TEST_TOOL_DIR;
const file = (key) => join(root(), `${key.replaceAll("/", "_")}.json`);

export const folderTool = {
  name: "folder",
  reversibility: "compensable",
  async execute(request, key) {
    writeFileSync(file(key), JSON.stringify(request));
    appendFileSync(join(root(), "executions.log"), `${key} ${process.pid}\n`);
    return { externalReference: `folder:${key}`, result: { written: true } };
  },
  async lookup(key) {
    return existsSync(file(key)) ? { status: "confirmed", externalReference: `folder:${key}` } : null;
  },
};

export const deploy = new Agent({
  name: "ts-deploy",
  inputSchema: { service: "string" },
  label: "Deploy {service}",
  description: "A TypeScript agent: asks, approves, writes once",
  tools: [folderTool],
  retry: { max_attempts: 5, backoff_initial: 0.1, backoff_max: 0.5 },
});

deploy.step(
  "plan",
  async (ctx, state) => {
    const answer = await ctx.ask("Which versions?", { versions: "string[]" });
    await ctx.log("planned", "info", { versions: answer.versions });
    ctx.cost(0.25);
    return ctx.next("apply", { versions: answer.versions });
  },
  { start: true },
);

deploy.step("apply", async (ctx, state) => {
  const approval = await ctx.approve("deploy", ctx.input.service, { versions: { from: [], to: state.versions } });
  if (approval.denied) return ctx.done({ deployed: false, by: approval.answeredBy });
  const done = await ctx.sideEffect("folder", ctx.input.service, { versions: state.versions });
  if (process.env.HOLDPOINT_TEST_LINGER) await ctx.sleep(Number(process.env.HOLDPOINT_TEST_LINGER));
  return ctx.next("report", { ...state, reference: done.externalReference });
});

deploy.step("report", async (ctx, state) => ctx.done({ deployed: true, ...state }));

export const looper = new Agent({ name: "ts-loop", description: "Loops in small steps" });
looper.step("spin", async (ctx, state) => {
  const n = state.n ?? 0;
  if (n >= (ctx.input.steps ?? 1000)) return ctx.done({ n });
  await ctx.sleep(ctx.input.pause ?? 0.2);
  return ctx.next("spin", { n: n + 1 });
});

// An irreversible tool whose calls an approver may edit first.
export const sendOnceTool = { ...folderTool, name: "folder-once", reversibility: "irreversible", editSchema: { to: "string", body: "string" } };

export const tuner = new Agent({
  name: "ts-tune",
  inputSchema: { service: "string" },
  description: "Approves an editable change (or is sent back), then sends one irreversible note",
  tools: [sendOnceTool],
  retry: { max_attempts: 3, backoff_initial: 0.1, backoff_max: 0.5 },
});

tuner.step(
  "tune",
  async (ctx) => {
    const plan = { timeout: 30, retries: 2 };
    const approval = await ctx.approve("tune", ctx.input.service, { timeout: { from: 10, to: 30 } }, {
      editable: { timeout: "integer", retries: "integer" },
      arguments: plan,
    });
    if (approval.responded) return ctx.done({ responded: approval.comment, approved: approval.approved });
    if (approval.denied) return ctx.done({ denied: true });
    return ctx.next("notify", { settings: approval.edited ?? plan, edited: approval.edited !== null });
  },
  { start: true },
);

tuner.step("notify", async (ctx, state) => {
  const done = await ctx.sideEffect("folder-once", ctx.input.service, { to: "ops", body: `timeout=${state.settings.timeout}` });
  return ctx.done({ ...state, sent: true, reference: done.externalReference });
});

export const AGENTS = [deploy, looper, tuner];

// Sleeps in a step, then checkpoints (tests/clients/test_sigterm_grace.py): naps.log says
// when each attempt began its nap and how long the sleep lasted (tests/clients/nap_agents.py
// is its Python twin; the first attempt sleeps `seconds`, later ones `again`).
const note = (line) => appendFileSync(join(root(), "naps.log"), `${line}\n`);

export const napper = new Agent({ name: "ts-nap", description: "Sleeps in a step, then checkpoints" });
napper.step("nap", async (ctx) => {
  note(`start ${ctx.attemptNumber}`);
  const began = performance.now();
  const seconds = ctx.input.seconds ?? 6;
  await ctx.sleep(ctx.attemptNumber === 1 ? seconds : (ctx.input.again ?? seconds));
  const slept = (performance.now() - began) / 1000;
  note(`end ${ctx.attemptNumber} ${slept.toFixed(3)} ${(Date.now() / 1000).toFixed(3)}`);
  return ctx.next("wake", { slept });
});
napper.step("wake", async (ctx, state) => ctx.done(state));
