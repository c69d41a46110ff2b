// Workers: long-poll claims, run attempts, back off while the server is away, release at stop.
import { hostname } from "node:os";

import type { Agent } from "./agent.js";
import { AttemptControl } from "./control.js";
import { execute, type Outcome } from "./executor.js";
import { Api, Problem, ServerAway, sleep } from "./http.js";

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

  constructor(url: string, token: string, agents: Agent[], private readonly opts: WorkerOptions = {}) {
    for (const agent of agents) this.agents.set(agent.name, agent);
    if (!this.agents.size) throw new Error("a worker needs at least one agent");
    this.api = new Api(url, token, { stop: this.stopper, timeoutMs: Math.max(30, (opts.wait ?? 20) + 15) * 1000 });
    this.name = opts.name ?? `${hostname()}:${process.pid}`;
  }

  private log(message: string): void {
    (this.opts.log ?? ((m: string) => console.error(m)))(message);
  }

  async start(): Promise<this> {
    if (this.opts.declare ?? true) await this.declareAll();
    for (let i = 1; i <= (this.opts.concurrency ?? 1); i++) this.loops.push(this.workLoop(`${this.name}/${i}`));
    return this;
  }

  private async declareAll(): Promise<void> {
    let delay = 200;
    for (const agent of this.agents.values()) {
      while (!this.stopper.signal.aborted) {
        try {
          const [, data] = await this.api.call("PUT", `/api/agents/${encodeURIComponent(agent.name)}`, agent.declaration());
          this.log(`declared agent ${agent.name} (version ${data.version})`);
          break;
        } catch (error) {
          if (!(error instanceof ServerAway)) throw error;
          await sleep(delay, this.stopper.signal);
          delay = Math.min(delay * 2, 5_000);
        }
      }
    }
  }

  get stopping(): boolean {
    return this.stopper.signal.aborted;
  }

  /** Stop claiming; let steps finish for `graceSeconds`, then release every lease still held. */
  async stop(graceSeconds = 10): Promise<void> {
    this.stopper.abort();
    await Promise.race([Promise.all(this.loops), sleep(graceSeconds * 1000)]);
    for (const control of this.active.values()) {
      control.markStale("worker stopping before the step finished");
      control.finishing = true;
      await control.release("shutdown");
    }
  }

  private async workLoop(workerId: string): Promise<void> {
    let delay = 200;
    while (!this.stopper.signal.aborted) {
      let lease: any = null;
      try {
        const body: Record<string, unknown> = { worker_id: workerId, agents: [...this.agents.keys()].sort(), wait: this.opts.wait ?? 20 };
        if (this.opts.leaseSeconds) body.lease_seconds = this.opts.leaseSeconds;
        const [status, data] = await this.api.call("POST", "/api/worker/claim", body, { retryForMs: 0 });
        lease = status === 200 ? data : null;
        delay = 200;
      } catch (error) {
        if (error instanceof Problem) this.log(`${workerId}: claim refused: ${error.message}`);
        else if (!(error instanceof ServerAway)) throw error;
        await sleep(delay, this.stopper.signal);
        delay = Math.min(delay * 2, 5_000);
        continue;
      }
      if (!lease) continue;
      const control = new AttemptControl(this.api, lease, this.stopper.signal);
      this.active.set(lease.attempt_id, control);
      try {
        const outcome = await execute(this.agents.get(lease.agent)!, control);
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
