// Workers: long-poll claims, run attempts, back off while the server is away or fails (a
// connection error, a 5xx: bounded, with jitter), release at stop.
import { hostname } from "node:os";

import type { Agent } from "./agent.js";
import { AttemptControl } from "./control.js";
import { execute, type Outcome } from "./executor.js";
import { HeartbeatPool } from "./heartbeats.js";
import { Api, backoffMs, identityHeaders, Problem, ServerAway, sleep } from "./http.js";

/** What the Workers page shows as this client (kept equal to package.json's version by a test). */
export const CLIENT = "holdpoint-client-typescript/0.1.0";

/** The server refused to declare an agent (a 4xx: not retried); `problem` says why. */
export class DeclarationRefused extends Error {
  constructor(readonly agent: string, readonly problem: Problem) {
    super(`declaring agent ${agent} was refused: ${problem.message}`);
    this.name = "DeclarationRefused";
  }
}

export interface WorkerOptions {
  concurrency?: number;
  name?: string;
  leaseSeconds?: number;
  wait?: number;
  declare?: boolean;
  log?: (message: string) => void;
}

export class Worker {
  readonly api: Api;
  readonly agents = new Map<string, Agent>();
  readonly name: string;
  readonly outcomes: [string, Outcome][] = [];
  private readonly stopper = new AbortController();
  private readonly active = new Map<string, AttemptControl>();
  private loops: Promise<void>[] = [];
  private readonly heartbeats: HeartbeatPool;

  constructor(url: string, token: string, agents: Agent[], private readonly opts: WorkerOptions = {}) {
    for (const agent of agents) this.agents.set(agent.name, agent);
    if (!this.agents.size) throw new Error("a worker needs at least one agent");
    this.name = opts.name ?? `${hostname()}:${process.pid}`;
    const headers = identityHeaders({
      name: this.name,
      client: CLIENT,
      host: hostname(),
      pid: process.pid,
      concurrency: opts.concurrency ?? 1,
      agents: [...this.agents.keys()].sort(),
      leaseSeconds: opts.leaseSeconds,
      wait: opts.wait ?? 20,
    });
    this.api = new Api(url, token, { stop: this.stopper, timeoutMs: Math.max(30, (opts.wait ?? 20) + 15) * 1000, headers });
    // One renewal per interval for all the attempts of this process's loops.
    this.heartbeats = new HeartbeatPool(this.api);
  }

  private log(message: string): void {
    (this.opts.log ?? ((m: string) => console.error(m)))(message);
  }

  async start(): Promise<this> {
    if (this.opts.declare ?? true) await this.declareAll();
    for (let i = 1; i <= (this.opts.concurrency ?? 1); i++) this.loops.push(this.workLoop(`${this.name}/${i}`));
    return this;
  }

  /** Declare every agent, for as long as it takes while the server is away or fails (two
   * workers starting together may meet a 5xx); a 4xx rejects with `DeclarationRefused`. */
  private async declareAll(): Promise<void> {
    for (const agent of this.agents.values()) {
      let tries = 0;
      while (!this.stopper.signal.aborted) {
        try {
          const [, data] = await this.api.call("PUT", `/api/agents/${encodeURIComponent(agent.name)}`, agent.declaration());
          this.log(`declared agent ${agent.name} (version ${data.version})`);
          break;
        } catch (error) {
          if (error instanceof Problem) throw new DeclarationRefused(agent.name, error);
          if (!(error instanceof ServerAway)) throw error;
          tries += 1;
          const delay = backoffMs(tries);
          this.log(`declaring ${agent.name}: ${error.message}; again in ${(delay / 1000).toFixed(1)}s`);
          await sleep(delay, this.stopper.signal);
        }
      }
    }
  }

  get stopping(): boolean {
    return this.stopper.signal.aborted;
  }

  /**
   * Stop claiming; let steps (and their `ctx.sleep`) finish for `graceSeconds`, each
   * releasing its lease at the step boundary; then release every lease still held (its step
   * is abandoned: a sleep wakes, the next `ctx` call unwinds, its writes are refused).
   */
  async stop(graceSeconds = 10): Promise<void> {
    this.stopper.abort();
    await Promise.race([Promise.all(this.loops), sleep(graceSeconds * 1000)]);
    for (const control of this.active.values()) {
      control.markStale("worker stopping before the step finished");
      control.finishing = true;
      await control.release("shutdown");
    }
    await this.heartbeats.stop();
  }

  private async workLoop(workerId: string): Promise<void> {
    let tries = 0;
    while (!this.stopper.signal.aborted) {
      let lease: any = null;
      try {
        const body: Record<string, unknown> = { worker_id: workerId, agents: [...this.agents.keys()].sort(), wait: this.opts.wait ?? 20 };
        if (this.opts.leaseSeconds) body.lease_seconds = this.opts.leaseSeconds;
        const [status, data] = await this.api.call("POST", "/api/worker/claim", body, { retryForMs: 0 });
        lease = status === 200 ? data : null;
        tries = 0;
      } catch (error) {
        tries += 1;
        let delay = backoffMs(tries);
        if (error instanceof Problem) {
          // Not a retry of the same request: a new claim after a pause, in case what was
          // refused changes (a token scoped anew, an agent declared).
          this.log(`${workerId}: claim refused: ${error.message}`);
          delay = Math.max(delay, 1_000);
        } else if (!(error instanceof ServerAway)) throw error;
        await sleep(delay, this.stopper.signal);
        continue;
      }
      if (!lease) continue;
      const control = new AttemptControl(this.api, lease, this.stopper.signal);
      this.active.set(lease.attempt_id, control);
      try {
        const outcome = await execute(this.agents.get(lease.agent)!, control, this.heartbeats);
        this.outcomes.push([lease.attempt_id, outcome]);
        this.log(`attempt ${lease.attempt_id} (run ${lease.run_id}, ${lease.agent} #${lease.number}): ${outcome}`);
      } catch (error) {
        this.log(`${workerId}: attempt ${lease.attempt_id} crashed: ${(error as Error).stack}`);
      } finally {
        this.active.delete(lease.attempt_id);
      }
    }
  }
}
