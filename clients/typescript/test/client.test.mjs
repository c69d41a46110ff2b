// The TypeScript client against a live Holdpoint server (started by
// tests/clients/test_typescript_client.py, which passes the URL and tokens and sweeps
// expired leases while these tests run): ask, approve, exactly once through SIGKILL,
// cancel, pause, SIGTERM.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { after, test } from "node:test";

import { Worker } from "../dist/index.js";
import { AGENTS } from "./agents.mjs";

const URL_ = process.env.HOLDPOINT_URL;
const TOKEN = process.env.HOLDPOINT_TOKEN;
const PERSON = process.env.HOLDPOINT_USER_TOKEN;
// A second person: an irreversible call needs someone other than who started the run.
const APPROVER = process.env.HOLDPOINT_APPROVER_TOKEN;
const TOOLS = process.env.HOLDPOINT_TEST_TOOL_DIR;
const LEASE = 3;

async function api(method, path, body, person = PERSON) {
  const response = await fetch(URL_ + path, {
    method,
    headers: { Authorization: `Token ${person}`, "Content-Type": "application/json", "Idempotency-Key": randomUUID() },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (response.status >= 400) throw new Error(`${method} ${path}: ${response.status} ${text}`);
  return data;
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
const waitPending = (id, kind) =>
  waitFor(`a ${kind} request on ${id}`, async () => {
    const r = await run(id);
    return r.pending_request?.kind === kind ? r.pending_request : null;
  });
const answer = (id, request, value, person = PERSON) =>
  api("POST", `/api/runs/${id}/resume`, { request_id: request.request_id, checkpoint_id: request.checkpoint_id, value }, person);
const executions = () => {
  const log = join(TOOLS, "executions.log");
  return existsSync(log) ? readFileSync(log, "utf8").split("\n").filter(Boolean) : [];
};

const workers = [];
const procs = [];
after(async () => {
  for (const w of workers) await w.stop(1);
  for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
});

async function inProcessWorker() {
  const worker = new Worker(URL_, TOKEN, AGENTS, { leaseSeconds: LEASE, wait: 2, log: () => {} });
  workers.push(worker);
  return worker.start();
}

function cliWorker(name, env = {}) {
  const proc = spawn(
    process.execPath,
    ["dist/cli.js", "--url", URL_, "--lease-seconds", String(LEASE), "--wait", "2", "--grace", "1", "--name", name, "./test/agents.mjs:AGENTS"],
    { env: { ...process.env, HOLDPOINT_TOKEN: TOKEN, ...env }, stdio: ["ignore", "pipe", "pipe"] },
  );
  procs.push(proc);
  let out = "";
  proc.stdout.on("data", (d) => (out += d));
  proc.stderr.on("data", (d) => (out += d));
  return waitFor(`${name} to start`, () => (out.includes("serving") ? { proc, log: () => out } : null));
}

test("a TypeScript agent asks, is approved, acts once and ends with its report", async () => {
  const worker = await inProcessWorker();
  const started = await api("POST", "/api/runs", { agent: "ts-deploy", input: { service: "billing" } });
  await answer(started.run_id, await waitPending(started.run_id, "input_required"), { versions: ["v7"] });
  const approval = await waitPending(started.run_id, "auth_required");
  assert.deepEqual(approval.action.change, { versions: { from: [], to: ["v7"] } });
  await answer(started.run_id, approval, { decision: "approve", comment: "go" });
  const done = await waitStatus(started.run_id, "succeeded");
  assert.equal(done.result.deployed, true);
  assert.deepEqual(done.result.versions, ["v7"]);
  assert.equal(Number(done.cost), 0.25);
  assert.equal(executions().length, 1);
  const report = await api("GET", `/api/runs/${started.run_id}/report`);
  assert.ok(JSON.stringify(report).includes("folder"), "the report names the side effect");
  await waitFor("the worker to say so", () => worker.outcomes.some(([, o]) => o === "succeeded"));
  await worker.stop(1);
});

test("an approver edits the plan; the irreversible call runs as edited, under its own key", async () => {
  const worker = await inProcessWorker();
  const before = executions().length;
  const started = await api("POST", "/api/runs", { agent: "ts-tune", input: { service: "gateway" } });
  const card = await waitPending(started.run_id, "auth_required");
  assert.deepEqual(card.action.editable.value, { timeout: 30, retries: 2 });
  await answer(started.run_id, card, { decision: "approve", edited: { timeout: 45, retries: 2 } });
  const send = await waitFor("the irreversible call's card", async () => {
    const r = await waitPending(started.run_id, "auth_required");
    return r.request_id !== card.request_id ? r : null;
  });
  assert.deepEqual(send.action.editable.value, { to: "ops", body: "timeout=45" });
  const edited = { to: "ops", body: "timeout=45, at night" };
  await answer(started.run_id, send, { decision: "approve", edited }, APPROVER);
  const done = await waitStatus(started.run_id, "succeeded");
  assert.deepEqual(done.result.settings, { timeout: 45, retries: 2 });
  assert.equal(done.result.edited, true);
  const lines = executions().slice(before);
  assert.equal(lines.length, 1);
  const key = lines[0].split(" ")[0];
  assert.match(key, /\.e[0-9a-f]+$/, "the edited call's own key");
  assert.deepEqual(JSON.parse(readFileSync(join(TOOLS, `${key}.json`), "utf8")), edited);
  await worker.stop(1);
});

test("send back with a comment reaches the step as responded", async () => {
  const worker = await inProcessWorker();
  const started = await api("POST", "/api/runs", { agent: "ts-tune", input: { service: "gateway" } });
  await answer(started.run_id, await waitPending(started.run_id, "auth_required"), { decision: "respond", comment: "raise retries" });
  const done = await waitStatus(started.run_id, "succeeded");
  assert.deepEqual(done.result, { responded: "raise retries", approved: false });
  await worker.stop(1);
});

test("a worker killed after its side effect does not repeat it", async () => {
  const before = executions().length;
  const first = await cliWorker("ts-lingering", { HOLDPOINT_TEST_LINGER: "60" });
  const started = await api("POST", "/api/runs", { agent: "ts-deploy", input: { service: "search" } });
  await answer(started.run_id, await waitPending(started.run_id, "input_required"), { versions: ["v8"] });
  await answer(started.run_id, await waitPending(started.run_id, "auth_required"), { decision: "approve" });
  await waitFor("the act", () => executions().length === before + 1);
  await new Promise((r) => setTimeout(r, 500)); // The outcome is recorded; the step lingers.
  first.proc.kill("SIGKILL");
  await cliWorker("ts-second");
  const done = await waitStatus(started.run_id, "succeeded");
  assert.equal(done.result.deployed, true);
  assert.equal(executions().length, before + 1);
});

test("cancel and pause reach a TypeScript worker", async () => {
  await inProcessWorker();
  const cancelled = await api("POST", "/api/runs", { agent: "ts-loop", input: { pause: 0.2 } });
  await waitStatus(cancelled.run_id, "running");
  await api("POST", `/api/runs/${cancelled.run_id}/cancel`, { reason: "wrong target" });
  await waitStatus(cancelled.run_id, "cancelled");

  const paused = await api("POST", "/api/runs", { agent: "ts-loop", input: { pause: 0.1, steps: 30 } });
  await waitStatus(paused.run_id, "running");
  await api("POST", `/api/runs/${paused.run_id}/pause`, { reason: "look first" });
  const held = await waitStatus(paused.run_id, "paused");
  await api("POST", `/api/runs/${paused.run_id}/resume`, {
    request_id: held.pending_request.request_id,
    checkpoint_id: held.pending_request.checkpoint_id,
  });
  const done = await waitStatus(paused.run_id, "succeeded");
  assert.deepEqual(done.result, { n: 30 });
});

test("SIGTERM releases the lease", async () => {
  for (const w of workers.splice(0)) await w.stop(1);
  for (const p of procs.splice(0)) {
    const gone = new Promise((r) => (p.exitCode === null && p.signalCode === null ? p.on("exit", r) : r()));
    p.kill("SIGTERM");
    await gone;
  }
  const { proc } = await cliWorker("ts-leaving");
  const started = await api("POST", "/api/runs", { agent: "ts-loop", input: { pause: 5, steps: 2 } });
  await waitStatus(started.run_id, "running");
  const exited = new Promise((r) => proc.on("exit", r));
  proc.kill("SIGTERM");
  assert.equal(await exited, 0);
  const events = await api("GET", `/api/runs/${started.run_id}/events`);
  assert.ok(events.some((e) => e.type === "attempt.released"));
  assert.equal((await run(started.run_id)).status, "queued");
});
