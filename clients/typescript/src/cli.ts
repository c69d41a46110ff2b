#!/usr/bin/env node
// holdpoint-worker --url URL --token hpw_… ./module.js:agent [--concurrency N]
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import { pathToFileURL } from "node:url";

import { Agent } from "./agent.js";
import { DeclarationRefused, Worker } from "./worker.js";

const USAGE = `usage: holdpoint-worker --url URL [--token TOKEN] [options] MODULE:AGENT [MODULE:AGENT ...]

Serve Holdpoint agents over the worker protocol: declare them, claim their runs, run them.

MODULE is a file, as a path from the current directory (./agents/deploy.js) or an
absolute one, or a package name (resolved from this client's installation); AGENT is
the name of an exported Agent or array of Agents.

options:
  --url URL           the Holdpoint server, http://host:port (required)
  --token TOKEN       a worker token, hpw_... (default: $HOLDPOINT_TOKEN)
  --concurrency N     attempts at once (default: 1)
  --name NAME         this worker's name on the Workers page (default: host:pid)
  --lease-seconds S   lease per claim, renewed every S/3 (default: the server's)
  --wait S            long-poll seconds per claim (default: 20)
  --grace S           at SIGTERM, seconds the steps may finish before their leases
                      are released (default: 10)
  -h, --help          show this help and exit
`;

/** A mistake on the command line: the usage on stderr, exit status 2 (as Python's argparse). */
class UsageError extends Error {}

async function load(target: string): Promise<Agent[]> {
  const at = target.lastIndexOf(":");
  if (at <= 0) throw new UsageError(`${target}: expected MODULE:AGENT`);
  const spec = target.slice(0, at);
  const name = target.slice(at + 1);
  const url = spec.startsWith(".") || spec.startsWith("/") ? pathToFileURL(resolve(spec)).href : spec;
  const mod = await import(url);
  const value = mod[name];
  const agents = Array.isArray(value) ? value : [value];
  if (!agents.every((a) => a instanceof Agent || (a && a.steps instanceof Map))) throw new Error(`${target} is not an Agent`);
  return agents as Agent[];
}

function number(values: Record<string, unknown>, option: string, opts: { integer?: boolean; min: number }): number | undefined {
  const raw = values[option];
  if (raw === undefined) return undefined;
  const value = Number(raw);
  if (!Number.isFinite(value) || value < opts.min || (opts.integer && !Number.isInteger(value))) {
    throw new UsageError(`--${option}: expected ${opts.integer ? "an integer" : "a number"} of at least ${opts.min}, got ${JSON.stringify(raw)}`);
  }
  return value;
}

function parse(argv: string[]) {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      strict: true,
      options: {
        help: { type: "boolean", short: "h" },
        url: { type: "string" },
        token: { type: "string", default: process.env.HOLDPOINT_TOKEN ?? "" },
        concurrency: { type: "string", default: "1" },
        name: { type: "string" },
        "lease-seconds": { type: "string" },
        wait: { type: "string", default: "20" },
        grace: { type: "string", default: "10" },
      },
    });
  } catch (error) {
    // Node's parseArgs throws on an unknown option or a missing value.
    throw new UsageError((error as Error).message);
  }
  const { values, positionals } = parsed;
  if (values.help) return null;
  if (!values.url) throw new UsageError("--url is required");
  if (!values.token) throw new UsageError("--token (or HOLDPOINT_TOKEN) is required");
  if (!positionals.length) throw new UsageError("name at least one MODULE:AGENT");
  return {
    url: values.url,
    token: values.token,
    targets: positionals,
    name: values.name,
    concurrency: number(values, "concurrency", { integer: true, min: 1 })!,
    leaseSeconds: number(values, "lease-seconds", { min: 0.1 }),
    wait: number(values, "wait", { min: 0 })!,
    grace: number(values, "grace", { min: 0 })!,
  };
}

async function main(): Promise<void> {
  const args = parse(process.argv.slice(2));
  if (args === null) {
    process.stdout.write(USAGE);
    return;
  }
  const agents = (await Promise.all(args.targets.map(load))).flat();
  const worker = new Worker(args.url, args.token, agents, {
    concurrency: args.concurrency,
    name: args.name,
    leaseSeconds: args.leaseSeconds,
    wait: args.wait,
  });
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    await worker.stop(args.grace);
    console.log(`holdpoint-worker ${worker.name}: stopped`);
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  await worker.start();
  console.log(`holdpoint-worker ${worker.name}: serving ${agents.map((a) => a.name).join(", ")}`);
}

main().catch((error) => {
  if (error instanceof UsageError) {
    process.stderr.write(`holdpoint-worker: ${error.message}\n\n${USAGE}`);
    process.exit(2);
  }
  if (error instanceof DeclarationRefused) {
    console.error(`holdpoint-worker: ${error.message}`);
    process.exit(1);
  }
  console.error(error);
  process.exit(1);
});
