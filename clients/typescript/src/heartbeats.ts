// One renewal for all the attempts a worker process runs (`--concurrency N`): a single loop
// sends `POST /api/worker/heartbeat` with every attempt it holds, instead of a watch per
// attempt (docs/protocol.md §4). The server fences each attempt on its own and answers each
// in its place: a refused one is let go, the others go on. The same rules as the Python
// client's `HeartbeatPool` (holdpoint_client/remote.py): a call is held for half an
// interval; an attempt that starts while one is held is renewed at once on its own; an
// attempt whose cancel or pause is known is still renewed but does not cut the wait short;
// a server without the route (404, 405) gets a watch per attempt.
import { type AttemptControl, Heartbeater, monotonicMs } from "./control.js";
import { type Api, Problem, sleep } from "./http.js";

const WATCH_MAX_SECONDS = 25;
const LOST = ["stale_worker", "not_your_lease", "not_found"];

const everyMs = (c: AttemptControl): number =>
  Number(c.lease.heartbeat_seconds ?? c.lease.lease_seconds / 3) * 1000;

export class HeartbeatPool {
  private readonly held = new Map<string, AttemptControl>();
  private legacy: Map<string, Heartbeater> | null = null;
  private running: Promise<void> | null = null;
  private readonly stopper = new AbortController();
  private wake: (() => void) | null = null;

  constructor(private readonly api: Api) {}

  add(control: AttemptControl): void {
    if (this.legacy) {
      const beater = new Heartbeater(control);
      this.legacy.set(control.attemptId, beater);
      beater.start();
      return;
    }
    this.held.set(control.attemptId, control);
    if (!this.running) this.running = this.loop();
    else void this.renewNow(control);
    this.wake?.();
  }

  async remove(control: AttemptControl): Promise<void> {
    this.held.delete(control.attemptId);
    const beater = this.legacy?.get(control.attemptId);
    if (beater) {
      this.legacy!.delete(control.attemptId);
      await beater.stop();
    }
  }

  async stop(): Promise<void> {
    this.stopper.abort();
    this.wake?.();
    for (const beater of this.legacy?.values() ?? []) await beater.stop();
    await Promise.race([this.running, sleep(200)]);
  }

  private body(controls: AttemptControl[], wait: number): Record<string, unknown> {
    return {
      attempts: controls.map((c) => {
        const cost = c.costArg();
        return { attempt_id: c.attemptId, lease_epoch: c.lease.lease_epoch, ...(cost !== null ? { cost } : {}) };
      }),
      // One lease length for the batch: the shortest asked (all are renewed every interval).
      lease_seconds: Math.min(...controls.map((c) => Number(c.lease.lease_seconds))),
      wait,
    };
  }

  private async renewNow(control: AttemptControl): Promise<void> {
    const sentAt = monotonicMs();
    try {
      const [, data] = await this.api.call("POST", "/api/worker/heartbeat", this.body([control], 0), {
        retryForMs: everyMs(control),
        persist: true,
      });
      this.answered([control], data, sentAt, monotonicMs());
    } catch {
      // The loop renews it with the others.
    }
  }

  private answered(controls: AttemptControl[], data: any, sentAt: number, receivedAt: number): void {
    const byId = new Map(controls.map((c) => [c.attemptId, c]));
    for (const answer of (data?.attempts ?? []) as any[]) {
      const control = byId.get(String(answer?.attempt_id));
      if (!control || !this.held.has(control.attemptId)) continue; // ended while the call was out
      if (!answer.ok) {
        const code = String(answer?.problem?.code ?? "");
        if (control.finishing) continue;
        if (LOST.includes(code)) {
          control.markStale(`heartbeat refused (${code})`);
          this.held.delete(control.attemptId);
        }
        continue;
      }
      control.renewed(sentAt, receivedAt, answer.lease_seconds_left);
      if (answer.cancel_requested) control.requestCancel();
      if (answer.pause_requested) control.requestPause();
    }
  }

  private async loop(): Promise<void> {
    while (!this.stopper.signal.aborted) {
      const controls = [...this.held.values()];
      if (controls.length === 0) {
        await new Promise<void>((resolve) => {
          this.wake = resolve;
          setTimeout(resolve, 500);
        });
        this.wake = null;
        continue;
      }
      const every = Math.min(...controls.map(everyMs));
      const quiet = controls.filter((c) => !(c.cancelled || c.paused));
      if (quiet.length === 0) {
        await sleep(every, this.stopper.signal);
        if (this.stopper.signal.aborted) return;
      }
      const wait = quiet.length ? Math.min(every / 2000, WATCH_MAX_SECONDS) : 0;
      const sentAt = monotonicMs();
      try {
        const [, data] = await this.api.call("POST", "/api/worker/heartbeat", this.body(controls, wait), {
          retryForMs: every,
          persist: true,
          timeoutMs: (wait + 15) * 1000,
        });
        this.answered(controls, data, sentAt, monotonicMs());
      } catch (error) {
        if (this.stopper.signal.aborted) return;
        if (error instanceof Problem && (error.status === 404 || error.status === 405)) {
          this.fallBack();
          return;
        }
        for (const c of controls) {
          if (!c.leaseTrusted()) {
            c.markStale("the server was away for the lease's length");
            this.held.delete(c.attemptId);
          }
        }
        if (error instanceof Problem) await sleep(every, this.stopper.signal);
      }
    }
  }

  private fallBack(): void {
    this.legacy = new Map();
    const controls = [...this.held.values()];
    this.held.clear();
    for (const control of controls) this.add(control);
  }
}
