import { wakeOrTimeout } from '../../core/wake-or-timeout';
import type { ReleaseWatch } from '../lock-store.interface';

const now = (): number => performance.now();

/** One `wait` of the composite: the nodes' waits it runs, and how it is woken. */
interface Round {
  readonly signal: AbortSignal;
  readonly until: number;
  readonly wake: () => void;
}

/**
 * The releases of one lock key heard on every node of a Redlock set, as one `ReleaseWatch`: a
 * `wait` ends at the first release heard on any node (or announced locally by any node's store).
 *
 * Node watches join as their subscriptions settle, also after the composite was handed out: one
 * that is late (a slow or down node) joins the wait in progress and every later one. Each node
 * watch keeps a release heard between two waits as pending, so the next wait ends at once, as a
 * single watch does. A release announced by several nodes (a holder releases on all of them) can
 * end one wait and leave the next one to end at once too: a spare look at the lock, never a miss.
 */
export class QuorumWatch implements ReleaseWatch {
  listening = false;
  private readonly nodes: ReleaseWatch[] = [];
  private round: Round | undefined;
  private pending = false;
  private closed = false;

  /** A node's watch is ready: it takes part from the wait in progress on. */
  add(watch: ReleaseWatch): void {
    if (this.closed) {
      watch.close();
      return;
    }
    this.nodes.push(watch);
    if (this.round) this.listen(watch, this.round);
  }

  async wait(maxWaitMs: number, signal: AbortSignal): Promise<void> {
    if (this.pending || signal.aborted) {
      this.pending = false;
      return;
    }
    const stop = new AbortController();
    const until = now() + maxWaitMs;
    await wakeOrTimeout(Math.max(1, maxWaitMs), signal, (wake) => {
      const round: Round = { signal: stop.signal, until, wake };
      this.round = round;
      for (const watch of this.nodes) this.listen(watch, round);
      return () => {
        // From here on a node's release is kept pending in its own watch, for the next wait.
        if (this.round === round) this.round = undefined;
        stop.abort();
      };
    });
  }

  wake(): void {
    if (this.round) this.round.wake();
    else this.pending = true;
  }

  /** Each node's subscription starts anew with each wait: a wait always tries once more after subscribing. */
  readonly listeningSince = Infinity;

  close(): void {
    this.closed = true;
    this.round?.wake();
    for (const watch of this.nodes) watch.close();
    this.nodes.length = 0;
  }

  private listen(watch: ReleaseWatch, round: Round): void {
    // Never with an aborted signal: a node watch would then drop a release it keeps pending.
    if (round.signal.aborted) return;
    void watch.wait(Math.max(1, round.until - now()), round.signal).then(() => {
      if (!round.signal.aborted) round.wake();
    });
  }
}
