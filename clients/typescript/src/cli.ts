#!/usr/bin/env node
// holdpoint-worker --url URL --token hpw_… ./module.js:agent [--concurrency N]
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import { pathToFileURL } from "node:url";

import { Agent } from "./agent.js";
import { Worker } from "./worker.js";

async function load(target: string): Promise<Agent[]> {
  const at = target.lastIndexOf(":");
  if (at <= 0) throw new Error(`${target}: expected module:agent`);
  const spec = target.slice(0, at);
  const name = target.slice(at + 1);
  const url = spec.startsWith(".") || spec.startsWith("/") ? pathToFileURL(resolve(spec)).href : spec;
  const mod = await import(url);
  const value = mod[name];
  const agents = Array.isArray(value) ? value : [value];
  if (!agents.every((a) => a instanceof Agent || (a && a.steps instanceof Map))) throw new Error(`${target} is not an Agent`);
  return agents as Agent[];
}

async function main(): Promise<void> {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      url: { type: "string" },
      token: { type: "string", default: process.env.HOLDPOINT_TOKEN ?? "" },
      concurrency: { type: "string", default: "1" },
      name: { type: "string" },
      "lease-seconds": { type: "string" },
      wait: { type: "string", default: "20" },
      grace: { type: "string", default: "10" },
    },
  });
  if (!values.url || !values.token || !positionals.length) {
    console.error("usage: holdpoint-worker --url URL --token hpw_… module:agent [--concurrency N]");
    process.exit(2);
  }
  const agents = (await Promise.all(positionals.map(load))).flat();
  const worker = new Worker(values.url, values.token, agents, {
    concurrency: Number(values.concurrency),
    name: values.name,
    leaseSeconds: values["lease-seconds"] ? Number(values["lease-seconds"]) : undefined,
    wait: Number(values.wait),
  });
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    await worker.stop(Number(values.grace));
    console.log(`holdpoint-worker ${worker.name}: stopped`);
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  await worker.start();
  console.log(`holdpoint-worker ${worker.name}: serving ${agents.map((a) => a.name).join(", ")}`);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
