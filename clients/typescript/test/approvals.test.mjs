// What people approved either happens or they are told (issue 24), in the TypeScript client,
// against a live server (started by tests/clients/test_approval_applied.py, which passes the
// URL and tokens and checks the database afterwards): the same agent and cases as the
// in-process and Python client tests.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, test } from "node:test";

import { Agent, EditRefused, Worker } from "../dist/index.js";

const URL_ = process.env.HOLDPOINT_URL;
const TOKEN = process.env.HOLDPOINT_TOKEN;
const PERSON = process.env.HOLDPOINT_USER_TOKEN;
const APPROVER = process.env.HOLDPOINT_APPROVER_TOKEN;
const TOOLS = process.env.HOLDPOINT_TEST_TOOL_DIR;
const VERSION = join(TOOLS, "config-version");

async function api(method, path, body, person = PERSON) {
  const response = await fetch(URL_ + path, {
    method,
    headers: { Authorization: `Token ${person}`, "Content-Type": "application/json", "Idempotency-Key": randomUUID() },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (response.status >= 400) throw new Error(`${method} ${path}: ${response.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

async function waitFor(what, predicate, seconds = 30) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const value = await predicate();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const run = (id) => api("GET", `/api/runs/${id}`);
const waitStatus = (id, ...wanted) =>
  waitFor(`${id} to be ${wanted.join("/")}`, async () => {
    const r = await run(id);
    return wanted.includes(r.status) ? r : null;
  }, 40);
const waitApproval = (id, notId = null) =>
  waitFor(`an approval on ${id}`, async () => {
    const r = (await run(id)).pending_request;
    return r?.kind === "auth_required" && r.request_id !== notId ? r : null;
  });
const answer = (id, request, value) =>
  api("POST", `/api/runs/${id}/resume`, { request_id: request.request_id, checkpoint_id: request.checkpoint_id, value }, APPROVER);

const configVersion = () => (existsSync(VERSION) ? Number(readFileSync(VERSION, "utf8")) : 1);

export const planner = new Agent({
  name: "ts-approval-applied",
  description: "Asks approval of a change planned on a versioned config, keyed by version",
  retry: { max_attempts: 2, backoff_initial: 0.1, backoff_max: 0.5 },
});

planner.step(
  "approve",
  async (ctx) => {
    const version = await ctx.observe("config", configVersion);
    // From version 3 on, the config already accepts exactly the plan: nothing to change.
    const before = version >= 3 ? ["v1", "v2"] : ["v1", "v2", "v3"];
    const approval = await ctx.approve("update_auth_config", "staging/auth/config", { accepted_versions: { from: before, to: ["v1", "v2"] } }, {
      key: `approve-v${version}`,
      editable: { accepted_versions: "string[]" },
      arguments: { accepted_versions: ["v1", "v2"] },
    });
    if (approval.unchanged) return ctx.done({ changed: false });
    if (approval.edited?.accepted_versions?.includes("v9")) throw new EditRefused("the config has no token version v9");
    return ctx.done({ changed: true, edited: approval.edited });
  },
  { start: true },
);

const EDITED = { decision: "approve", edited: { accepted_versions: ["v1"] } };
const worker = new Worker(URL_, TOKEN, [planner], { leaseSeconds: 3, wait: 2, log: () => {} });
after(async () => worker.stop(1));

let running = null;
async function started() {
  writeFileSync(VERSION, "1");
  running ??= worker.start();
  await running;
  return (await api("POST", "/api/runs", { agent: planner.name, input: {} })).run_id;
}

test("a moved target asks again, with a note naming the approval that was not applied", async () => {
  const id = await started();
  const first = await waitApproval(id);
  assert.equal(first.step_id, "approve.approve-v1");
  writeFileSync(VERSION, "2");
  await answer(id, first, EDITED);
  const again = await waitApproval(id, first.request_id);
  assert.equal(again.step_id, "approve.approve-v2");
  const note = again.context.superseded_approval;
  assert.equal(note.request_id, first.request_id);
  assert.deepEqual(note.edited, { accepted_versions: ["v1"] });
  assert.equal(note.reason, "config changed while the approval waited (1 → 2); the step asked again under a new key (approve.approve-v2)");
  await answer(id, again, { decision: "approve" });
  const done = await waitStatus(id, "succeeded");
  assert.deepEqual(done.result, { changed: true, edited: null });
});

test("a step that skips what people approved fails ApprovalNotApplied", async () => {
  const id = await started();
  const first = await waitApproval(id);
  writeFileSync(VERSION, "3");
  await answer(id, first, EDITED);
  const failed = await waitStatus(id, "failed");
  assert.equal(failed.failure_class, "deterministic");
  const attempts = await api("GET", `/api/runs/${id}/attempts`);
  const last = (attempts.results ?? attempts).at(-1);
  assert.equal(last.error.type, "ApprovalNotApplied");
  assert.ok(
    last.error.message.startsWith(
      "update_auth_config on staging/auth/config, approved by tsapprover with their edit (accepted_versions: v1), was not applied: " +
        "config changed while the approval waited (1 → 3); the planned change is empty now",
    ),
    last.error.message,
  );
});

test("an edit the agent refuses is asked again with the reason", async () => {
  const id = await started();
  const first = await waitApproval(id);
  await answer(id, first, { decision: "approve", edited: { accepted_versions: ["v9"] } });
  const again = await waitApproval(id, first.request_id);
  assert.equal(again.step_id, first.step_id);
  assert.deepEqual(again.action.change, first.action.change);
  assert.equal(again.context.refused_edit.reason, "the config has no token version v9");
  assert.deepEqual(again.context.refused_edit.approved_by, ["tsapprover"]);
  await answer(id, again, { decision: "approve" });
  const done = await waitStatus(id, "succeeded");
  assert.deepEqual(done.result, { changed: true, edited: null });
});
