// What a running attempt shares with its heartbeat: the lease, the stop signals, the cost,
// and the one path by which it writes to the server (the fence: docs/protocol.md, §3).
import { Api, Problem, ServerAway, sleep } from "./http.js";

/** Unwinds a step. Code that catches errors must rethrow these (`isUnwind`). */
export class Unwind extends Error {}
export class HoldPointReached extends Unwind {}
export class CancelRequested extends Unwind {}
export class LeaseLost extends Unwind {}
export class SideEffectUnknown extends Unwind {
  constructor(message: string, readonly operationId: string) {
    super(message);
  }
}
export const isUnwind = (error: unknown): error is Unwind => error instanceof Unwind;

// The share of the lease the client trusts: a renewal is trusted until the seconds the
// server said were left (`lease_seconds_left`, on its clock), less (1 - LEASE_TRUST) of the
// lease, counted on this process's monotonic clock from when the answer arrived. Never the
// wall clock, never two machines' clocks compared, never dated by when the request was sent
// (the server holds a watch for a third of the lease, and a loaded machine adds more).
export const LEASE_TRUST = 0.8;

/** This process's monotonic clock, in milliseconds. */
export const monotonicMs = (): number => performance.now();

export class AttemptControl {
  cancelled = false;
  stale = false;
  paused = false;
  finishing = false;
  staleReason = "";
  readonly wake = new AbortController();
  readonly leaseMs: number;
  /** Until when (`monotonicMs()`) the lease is trusted. */
  trustedUntil: number;
  private cost = 0;

  constructor(readonly api: Api, readonly lease: any, readonly shutdown: AbortSignal) {
    this.leaseMs = Number(lease.lease_seconds) * 1000;
    // The claim's answer, with a whole lease, arrived just now.
    this.trustedUntil = monotonicMs() + this.leaseMs * LEASE_TRUST;
  }

  get attemptId(): string {
    return String(this.lease.attempt_id);
  }

  requestCancel(): void {
    this.cancelled = true;
    this.wake.abort();
  }

  requestPause(): void {
    this.paused = true;
  }

  markStale(reason: string): void {
    if (!this.stale) this.staleReason = reason;
    this.stale = true;
    this.wake.abort();
  }

  /**
   * A renewal succeeded: its request left at `sentAt` and its answer, saying the lease has
   * `secondsLeft` on the server's clock, arrived at `receivedAt` (both `monotonicMs()`). A
   * server that does not say renewed no earlier than the request was sent.
   */
  renewed(sentAt: number, receivedAt: number, secondsLeft: unknown): void {
    const left = typeof secondsLeft === "number" ? secondsLeft : Number.NaN;
    const until = Number.isFinite(left)
      ? receivedAt + left * 1000 - this.leaseMs * (1 - LEASE_TRUST)
      : sentAt + this.leaseMs * LEASE_TRUST;
    this.trustedUntil = Math.max(this.trustedUntil, until);
  }

  leaseTrusted(): boolean {
    return monotonicMs() < this.trustedUntil;
  }

  check(): void {
    if (!this.stale && !this.leaseTrusted()) this.markStale("no renewal of the lease succeeded for its length");
    if (this.stale) throw new LeaseLost(this.staleReason);
    if (this.cancelled) throw new CancelRequested("cancelled");
  }

  addCost(amount: number): number {
    this.cost += amount;
    return this.cost;
  }

  costArg(): string | null {
    return this.cost ? String(Number(this.cost.toFixed(6))) : null;
  }

  epochs(): { lease_epoch: number; cancel_epoch: number } {
    return { lease_epoch: this.lease.lease_epoch, cancel_epoch: this.lease.cancel_epoch };
  }

  /** POST a fenced write about this attempt; the fence's refusals unwind the step. */
  async write(action: string, body: Record<string, unknown>, withCost = true): Promise<any> {
    this.check();
    const payload: Record<string, unknown> = { ...this.epochs(), ...body };
    const cost = this.costArg();
    if (withCost && cost !== null) payload.cost = cost;
    try {
      const [, data] = await this.api.call("POST", `/api/worker/attempts/${this.attemptId}/${action}`, payload, {
        retryForMs: this.leaseMs * LEASE_TRUST,
      });
      return data;
    } catch (error) {
      if (error instanceof Problem && (error.code === "stale_worker" || error.code === "not_your_lease")) {
        this.markStale(`${action} refused (${error.code})`);
        throw new LeaseLost(error.detail);
      }
      if (error instanceof Problem && error.code === "stale_after_cancel") {
        this.requestCancel();
        throw new CancelRequested(error.detail);
      }
      if (error instanceof ServerAway) {
        this.markStale(`${action}: ${error.message}`);
        throw new LeaseLost(error.message);
      }
      throw error;
    }
  }

  /** Record what a tool did: never fenced, retried until the server takes it. */
  async outcome(operationId: string, body: Record<string, unknown>): Promise<any> {
    const [, data] = await this.api.call(
      "POST",
      `/api/worker/side-effects/${operationId}/outcome`,
      { ...body, ...this.epochs() },
      { retryForMs: 300_000, persist: true },
    );
    return data;
  }

  async release(reason: string): Promise<any | null> {
    try {
      const [, data] = await this.api.call(
        "POST",
        `/api/worker/attempts/${this.attemptId}/release`,
        { lease_epoch: this.lease.lease_epoch, reason },
        { retryForMs: 10_000, persist: true },
      );
      return data ?? {};
    } catch {
      return null;
    }
  }
}

// The longest a watch waits for a cancel or pause (under the HTTP timeout).
const WATCH_MAX_SECONDS = 25;

/**
 * Renews the lease every `heartbeat_seconds` and hears cancel and pause at once: each
 * renewal is a watch (`POST …/watch`) that the server holds until the run is cancelled
 * or paused, or the interval is over. Once a cancel or pause is known, plain renewals follow.
 */
export class Heartbeater {
  private readonly stopper = new AbortController();
  private running: Promise<void> | null = null;

  constructor(readonly control: AttemptControl) {}

  start(): void {
    this.running = this.loop();
  }

  async stop(): Promise<void> {
    this.stopper.abort();
    // A watch in flight is answered when the attempt ends (the server wakes it).
    await Promise.race([this.running, sleep(200)]);
  }

  private async loop(): Promise<void> {
    const control = this.control;
    const every = Number(control.lease.heartbeat_seconds ?? control.lease.lease_seconds / 3) * 1000;
    while (!this.stopper.signal.aborted) {
      const known = control.cancelled || control.paused;
      if (known) {
        await sleep(every, this.stopper.signal);
        if (this.stopper.signal.aborted) return;
      }
      const wait = known ? 0 : Math.min(every / 1000, WATCH_MAX_SECONDS);
      const sentAt = monotonicMs();
      try {
        const [, data] = await control.api.call(
          "POST",
          `/api/worker/attempts/${control.attemptId}/watch`,
          { lease_epoch: control.lease.lease_epoch, lease_seconds: control.lease.lease_seconds, cost: control.costArg(), wait },
          { retryForMs: every, persist: true, timeoutMs: (wait + 15) * 1000 },
        );
        control.renewed(sentAt, monotonicMs(), data?.lease_seconds_left);
        if (data?.cancel_requested) control.requestCancel();
        if (data?.pause_requested) control.requestPause();
      } catch (error) {
        if (control.finishing || this.stopper.signal.aborted) return;
        if (error instanceof Problem && ["stale_worker", "not_your_lease", "not_found"].includes(error.code)) {
          control.markStale(`heartbeat refused (${error.code})`);
          return;
        }
        if (!control.leaseTrusted()) {
          control.markStale("the server was away for the lease's length");
          return;
        }
        // A refusal waits for the next interval; a server away was retried already.
        if (error instanceof Problem) await sleep(every, this.stopper.signal);
      }
    }
  }
}
