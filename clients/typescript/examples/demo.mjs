// The TypeScript demo agent `make run` starts: route an incident, notify the team once
// through the ledger (the demo webhook receiver, HOLDPOINT_DEMO_RECEIVER).
import { Agent, WebhookTool } from "../dist/index.js";

const receiver = (process.env.HOLDPOINT_DEMO_RECEIVER ?? "http://127.0.0.1:8765").replace(/\/+$/, "");

export const incident = new Agent({
  name: "ts-incident",
  inputSchema: { incident: "string" },
  label: "Incident {incident}",
  description: "Remote agent (TypeScript client): page the on-call team once",
  tools: [new WebhookTool({ lookupUrl: `${receiver}/deliveries/{idempotency_key}` })],
  retry: { max_attempts: 3 },
});

incident.step(
  "assess",
  async (ctx) => {
    const answer = await ctx.ask(`Who is on call for ${ctx.input.incident}?`, { person: "string" });
    return ctx.next("page", { person: answer.person });
  },
  { start: true },
);

incident.step("page", async (ctx, state) => {
  const approval = await ctx.approve("page", state.person, { incident: ctx.input.incident });
  if (approval.denied) return ctx.done({ paged: false });
  const sent = await ctx.sideEffect("webhook", state.person, {
    url: `${receiver}/hooks/page`,
    body: { incident: ctx.input.incident, person: state.person },
  });
  return ctx.done({ paged: true, delivery: sent.externalReference });
});

export const AGENTS = [incident];
