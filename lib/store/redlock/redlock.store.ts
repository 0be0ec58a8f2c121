import type { Logger } from '@nestjs/common';
import { type RedlockNodeFailure, RedlockQuorumError } from '../../errors';
import type { RedlockOptions, ResolvedModuleOptions } from '../../options/dislock.options';
import type {
  AcquireOptions,
  AcquireResult,
  CheckResult,
  LockStore,
  ReleaseResult,
  ReleaseWatch,
  RenewOutcome,
  RenewRequest,
  StoreHealth,
  StoredHold,
  StoredLock,
} from '../lock-store.interface';
import { FENCE_MARKER, LINE_MARKER } from '../redis/fence-key';
import { QuorumWatch } from './quorum-watch';
import { RedlockNodeConnection } from './redlock-node';

const now = (): number => performance.now();
const ignore = (): undefined => undefined;
const pause = (ms: number): Promise<void> =>
  new Promise((resolve) => {
    setTimeout(resolve, ms).unref();
  });

/** Nodes that make a majority of `count`: ⌊count / 2⌋ + 1. */
export function quorumOf(count: number): number {
  return Math.floor(count / 2) + 1;
}

/** The answers of the nodes to one operation so far. */
interface Tally<T> {
  readonly answers: { readonly node: RedlockNodeConnection; readonly value: T }[];
  readonly failures: RedlockNodeFailure[];
}

/** An acquisition whose nodes have not all answered yet: a grant that comes after it was given up is given back. */
interface InFlight {
  givenUp: boolean;
  unanswered: number;
}

type AcquireDecision =
  | { readonly kind: 'taken'; readonly token: number }
  | { readonly kind: 'busy'; readonly ttl: number; readonly split: boolean }
  | { readonly kind: 'failed' };

/**
 * Redlock over independent Redis masters (no replication between them, no Cluster): a lock is held
 * while a majority (the quorum, ⌊N/2⌋ + 1) of the nodes hold it. Each node is a `RedisLockStore` on
 * its own client, so every node keeps the single-server data model, scripts, timeouts and
 * exactly-once behaviour; this store only sends each operation to every node in parallel and
 * decides by majority, as soon as the answers in hand settle it (a slow or down node never holds
 * up a decision the others have made).
 *
 * - **acquire**: the same owner id on every node at once. Taken when a quorum granted it and the
 *   validity, `lease - elapsed - drift` (drift = `lease × driftFactor + 2 ms`, elapsed from the send
 *   to the quorum's last answer), is still positive; the result's `validMs` (`lease - drift`) is how
 *   long after the send the lock counts as held. Otherwise the hold is given back on every node
 *   (owner-checked, and again on any node whose grant arrives later) and the attempt is busy, with
 *   `ttl` the smallest remaining lease the holders' nodes reported (-2 when the quorum came too
 *   late: look again at once); or, when so many nodes failed (error, `operationTimeout`, connection
 *   down) that no quorum is possible, it rejects with a `RedlockQuorumError` naming each failed
 *   node and its error. A node whose connection is down counts as failed at once, and so does one
 *   that goes down while it is asked: a majority down fails without waiting for `operationTimeout`.
 *   Nodes that answer after the quorum join the lock (they are renewed and released with it).
 * - **fencing token**: the largest of the tokens issued by the nodes of the quorum (each node
 *   issues its own, strictly increasing per name on that node). Ordered across acquisitions only as
 *   far as the nodes' clocks agree: see docs/topologies.md, Redlock.
 * - **renew**: every node, each with the whole batch. Per lock: `true` once a quorum renewed it;
 *   `false` once more than N - quorum nodes answered that they no longer hold it (renewal never
 *   re-creates a key, so the quorum is gone for good: the lock is lost, `not-owner`); an `{ error }`
 *   (a `RedlockQuorumError`) when failed nodes make a quorum impossible this time: the watchdog
 *   retries, and declares the lock lost (`lease-expired`) if no quorum confirms it within its lease.
 * - **release**: every node (a down node too: its client sends the release when it reconnects).
 *   `released` once a quorum released it, `not-owner` once more than N - quorum nodes did not hold it (the lock had been lost),
 *   otherwise (failures) a `RedlockQuorumError`.
 * - **check**: held once a quorum holds it (`ttl`: the smallest remaining lease among them), not held
 *   once more than N - quorum do not, otherwise a `RedlockQuorumError`.
 * - **watch**: every node's release channel; a wait ends at the first release heard on any of them.
 *   `listening` once N - quorum + 1 nodes listen (every quorum, and so every holder's release,
 *   includes one of them); not listening once that is impossible.
 * - **close**: closes every node's store, and the clients it created.
 */
export class RedlockStore implements LockStore {
  private readonly quorum: number;
  private readonly inFlight = new Map<string, InFlight>();

  constructor(
    private readonly nodes: readonly RedlockNodeConnection[],
    private readonly driftFactor: number,
    private readonly keyPrefix: string,
  ) {
    this.quorum = quorumOf(nodes.length);
  }

  /**
   * Readers and writers are safe over a quorum (any two majorities share a node, which refuses one
   * of them), but a bound on shared holds is not: each node counts its own, so more holders than
   * the bound could each win a majority.
   */
  readonly boundsShares = false;
  /** A hand-over on each node would be a second quorum to win: holds are released and taken anew. */
  readonly handsOver = false;

  async acquire(key: string, owner: string, leaseMs: number, options: AcquireOptions = {}): Promise<AcquireResult> {
    // No line: every node is asked as a newcomer.
    const nodeOptions: AcquireOptions = {
      share: options.share,
      describe: options.describe,
    };
    const startedAt = now();
    const drift = leaseMs * this.driftFactor + 2;
    const sent = this.nodes.map((node) =>
      node.down ? undefined : node.store.acquire(key, owner, leaseMs, nodeOptions),
    );
    const flight: InFlight = { givenUp: false, unanswered: 0 };
    sent.forEach((pending, i) => {
      if (!pending) return;
      flight.unanswered += 1;
      // A grant that arrives once the attempt was given up (or the lock released) is given back.
      pending
        .then((late) => {
          if (late.acquired && flight.givenUp) void this.nodes[i].store.giveBack(key, owner, leaseMs);
        }, ignore)
        .finally(() => {
          flight.unanswered -= 1;
          if (flight.unanswered === 0) this.inFlight.delete(owner);
        });
    });
    if (flight.unanswered > 0) this.inFlight.set(owner, flight);

    const tally = await this.gather(
      (node, i) => {
        const pending = sent[i];
        // Not sent: the node was down.
        return pending ? node.watchDown(pending) : Promise.reject(node.down ?? new Error('not connected'));
      },
      (current): AcquireDecision | undefined => this.decideAcquire(current),
    );
    const giveUp = (): void => {
      flight.givenUp = true;
      sent.forEach((pending, i) => pending && void this.nodes[i].store.giveBack(key, owner, leaseMs));
    };
    const decision = tally.decision;
    if (decision.kind === 'failed') {
      giveUp();
      throw this.quorumError('acquire', key, tally.failures);
    }
    if (decision.kind === 'busy') {
      giveUp();
      // A split vote (this attempt got some nodes, others got the rest): every contender gives
      // back and hears the others do so, and retrying all at once would split again. Answer after
      // a random pause of about a round trip, so that one of them goes first next time.
      if (decision.split) await pause(Math.random() * (2 * (now() - startedAt) + 3));
      return { acquired: false, ttl: decision.ttl };
    }
    const validMs = leaseMs - drift;
    if (validMs - (now() - startedAt) <= 0) {
      giveUp(); // the quorum came too late: the lease may have ended on some of its nodes
      return { acquired: false, ttl: -2 };
    }
    return { acquired: true, token: decision.token, validMs };
  }

  async check(key: string, owner: string): Promise<CheckResult> {
    const { decision, failures } = await this.gather(
      (node) => node.ask(() => node.store.check(key, owner)),
      ({ answers, failures: failed }): CheckResult | 'failed' | undefined => {
        const held = answers.filter((answer) => answer.value.held);
        if (held.length >= this.quorum) return { held: true, ttl: Math.min(...held.map((a) => a.value.ttl)) };
        const notHeld = answers.length - held.length;
        if (notHeld > this.nodes.length - this.quorum) return { held: false, ttl: -2 };
        return notHeld + failed.length > this.nodes.length - this.quorum ? 'failed' : undefined;
      },
    );
    if (decision === 'failed') throw this.quorumError('acquire', key, failures);
    return decision;
  }

  async renew(requests: readonly RenewRequest[]): Promise<RenewOutcome[]> {
    if (requests.length === 0) return [];
    const { decision } = await this.gather(
      (node) => node.ask(() => node.store.renew(requests)),
      (tally) => this.decideRenewals(requests, tally),
    );
    return decision;
  }

  async release(key: string, owner: string): Promise<ReleaseResult> {
    const flight = this.inFlight.get(owner);
    if (flight) flight.givenUp = true; // a grant still on its way is given back when it arrives
    const { decision, failures } = await this.gather(
      // Sent to a down node too: its client sends it if it reconnects in time (within its retries).
      (node) => {
        const down = node.down;
        const pending = node.store.release(key, owner);
        if (!down) return node.watchDown(pending);
        pending.catch(ignore);
        return Promise.reject(down);
      },
      ({ answers, failures: failed }): ReleaseResult | 'failed' | undefined => {
        const released = answers.filter((answer) => answer.value !== 'not-owner');
        if (released.length >= this.quorum) {
          return 'released';
        }
        const notOwner = answers.length - released.length;
        if (notOwner > this.nodes.length - this.quorum) return 'not-owner';
        return notOwner + failed.length > this.nodes.length - this.quorum ? 'failed' : undefined;
      },
    );
    if (decision === 'failed') throw this.quorumError('release', key, failures);
    return decision;
  }

  /** Every node gives the hold back on its own (each retries while it does not answer). */
  async giveBack(key: string, owner: string, leaseMs: number): Promise<void> {
    const flight = this.inFlight.get(owner);
    if (flight) flight.givenUp = true;
    await Promise.all(this.nodes.map((node) => node.store.giveBack(key, owner, leaseMs)));
  }

  watch(key: string): Promise<ReleaseWatch> {
    const composite = new QuorumWatch();
    const needed = this.nodes.length - this.quorum + 1;
    return new Promise<ReleaseWatch>((resolve) => {
      let listening = 0;
      let deaf = 0;
      const settle = (heard: boolean): void => {
        if (heard) listening += 1;
        else deaf += 1;
        if (listening === needed) {
          composite.listening = true;
          resolve(composite);
        } else if (deaf === this.nodes.length - needed + 1) {
          resolve(composite); // not listening: the waiter polls
        }
      };
      for (const node of this.nodes) {
        // A down node counts as deaf now; its watch still joins once it settles (on reconnect).
        const down = node.down !== undefined;
        if (down) settle(false);
        void node.store.watch(key).then((watch) => {
          composite.add(watch);
          if (!down) settle(watch.listening);
        });
      }
    });
  }

  /** Keys any node may have lost: a lock a node forgot may still hold on a quorum, which the check decides. */
  async suspect(held: readonly string[]): Promise<readonly string[]> {
    const named = await Promise.all(this.nodes.map((node) => node.store.suspect(held)));
    return [...new Set(named.flat())];
  }

  onReconnect(listener: () => void): () => void {
    const stops = this.nodes.map((node) => node.store.onReconnect(listener));
    return () => stops.forEach((stop) => stop());
  }

  /** Redlock keeps no line of waiters (its nodes could order them differently): waiters race, as they did before lines. */
  readonly lineRefreshMs = Infinity;
  /** Each node is a Redis store, with its own keys beside the locks. */
  readonly reservedPrefixes = [FENCE_MARKER, LINE_MARKER];

  /**
   * The holds a majority of the nodes report (a hold on fewer is not a Redlock hold), each with the
   * shortest lease left among them; rejects when too few nodes answer.
   */
  async inspect(key: string): Promise<StoredLock> {
    const settled = await Promise.allSettled(this.nodes.map((node) => node.ask(() => node.store.inspect(key))));
    const answers = settled.flatMap((result) => (result.status === 'fulfilled' ? [result.value] : []));
    if (answers.length < this.quorum) {
      const failures = settled.flatMap((result, i) =>
        result.status === 'rejected' ? [{ node: this.nodes[i].label, error: result.reason as unknown }] : [],
      );
      throw this.quorumError('acquire', key, failures);
    }
    const seen = new Map<string, StoredHold[]>();
    for (const answer of answers) {
      for (const hold of answer.holds) seen.set(hold.owner, [...(seen.get(hold.owner) ?? []), hold]);
    }
    const holds = [...seen.values()]
      .filter((copies) => copies.length >= this.quorum)
      .map((copies) => ({ ...copies[0], ttl: Math.min(...copies.map((copy) => copy.ttl)) }));
    return { held: holds.length > 0, holds, waiting: 0 };
  }

  /** Every node drops every hold of `key`; the holds any node had. */
  async forceUnlock(key: string): Promise<StoredHold[]> {
    const settled = await Promise.allSettled(this.nodes.map((node) => node.ask(() => node.store.forceUnlock(key))));
    const removed = new Map<string, StoredHold>();
    for (const result of settled) {
      if (result.status === 'fulfilled') for (const hold of result.value) removed.set(hold.owner, hold);
    }
    return [...removed.values()];
  }

  async leave(): Promise<void> {
    // No line, no place to give up.
  }

  /** Up while a majority of the nodes is; the latency is the quorum's (its slowest member's). */
  async health(): Promise<StoreHealth> {
    const results = await Promise.all(this.nodes.map((node) => node.store.health()));
    const up = results.flatMap((result) => (result.up ? [result.latencyMs] : [])).sort((x, y) => x - y);
    if (up.length >= this.quorum) return { up: true, latencyMs: up[this.quorum - 1] };
    // Nodes by their place in `redlock.nodes`, not their address: a health check's body may reach any HTTP client.
    const problems = results.flatMap((result, i) => (result.up ? [] : [`node ${i + 1}: ${result.problem}`]));
    return {
      up: false,
      problem: `${up.length} of ${this.nodes.length} nodes answer, ${this.quorum} needed (${problems.join('; ')})`,
    };
  }

  /** Every node must allow what the library does: a refusal on any one fails startup (see `checkRedisAccess`). */
  async verify(): Promise<void> {
    await Promise.all(this.nodes.map((node) => node.store.verify()));
  }

  async close(): Promise<void> {
    await Promise.all(this.nodes.map((node) => node.close()));
  }

  /** Acquire: taken by a quorum, busy or failed beyond a quorum, or not known yet. */
  private decideAcquire({ answers, failures }: Tally<AcquireResult>): AcquireDecision | undefined {
    const spare = this.nodes.length - this.quorum;
    let token = -Infinity;
    let granted = 0;
    const ttls: number[] = [];
    for (const { value } of answers) {
      if (value.acquired) {
        granted += 1;
        token = Math.max(token, value.token);
      } else ttls.push(value.ttl);
    }
    if (granted >= this.quorum) return { kind: 'taken', token };
    if (failures.length > spare) return { kind: 'failed' };
    if (failures.length + ttls.length <= spare) return undefined;
    // The holders' nodes answered their remaining leases: the smallest is when a look is worth it
    // again (-1: a key without expiry, only a release frees it; -2: gone meanwhile, look at once).
    const leases = ttls.filter((ttl) => ttl >= 0);
    const ttl = leases.length > 0 ? Math.min(...leases) : ttls.includes(-1) ? -1 : -2;
    return { kind: 'busy', ttl, split: granted > 0 };
  }

  /** Renew: one outcome per request once each is settled by a quorum, or `undefined` while one is not. */
  private decideRenewals(requests: readonly RenewRequest[], tally: Tally<RenewOutcome[]>): RenewOutcome[] | undefined {
    const spare = this.nodes.length - this.quorum;
    const outcomes: RenewOutcome[] = [];
    for (let i = 0; i < requests.length; i += 1) {
      let renewed = 0;
      let notOwner = 0;
      const failures = [...tally.failures];
      for (const { node, value } of tally.answers) {
        const outcome = value[i];
        if (outcome === true) renewed += 1;
        else if (outcome === false) notOwner += 1;
        else failures.push({ node: node.label, error: outcome.error });
      }
      if (renewed >= this.quorum) outcomes.push(true);
      else if (notOwner > spare) outcomes.push(false);
      else if (notOwner + failures.length > spare) {
        outcomes.push({ error: this.quorumError('renew', requests[i].key, failures) });
      } else return undefined;
    }
    return outcomes;
  }

  /**
   * Send one operation to every node and settle as soon as `decide` can tell from the answers in
   * hand (it must decide once every node has answered or failed). The tally is a snapshot at that
   * moment; later answers are not waited for.
   */
  private gather<T, D>(
    send: (node: RedlockNodeConnection, index: number) => Promise<T>,
    decide: (tally: Tally<T>) => D | undefined,
  ): Promise<Tally<T> & { readonly decision: D }> {
    return new Promise((resolve, reject) => {
      const tally: Tally<T> = { answers: [], failures: [] };
      let settled = 0;
      let done = false;
      const next = (): void => {
        if (done) return;
        settled += 1;
        const decision = decide(tally);
        if (decision !== undefined) {
          done = true;
          resolve({ answers: [...tally.answers], failures: [...tally.failures], decision });
        } else if (settled === this.nodes.length) {
          done = true;
          reject(new Error('Redlock: every node answered, yet no majority decision was reached'));
        }
      };
      this.nodes.forEach((node, i) => {
        let pending: Promise<T>;
        try {
          pending = send(node, i);
        } catch (error) {
          pending = Promise.reject(error instanceof Error ? error : new Error(String(error)));
        }
        pending.then(
          (value) => {
            if (!done) tally.answers.push({ node, value });
            next();
          },
          (error: unknown) => {
            if (!done) tally.failures.push({ node: node.label, error });
            next();
          },
        );
      });
    });
  }

  private quorumError(operation: string, key: string, failures: readonly RedlockNodeFailure[]): RedlockQuorumError {
    const name = key.startsWith(this.keyPrefix) ? key.slice(this.keyPrefix.length) : key;
    return new RedlockQuorumError(operation, name, failures, this.nodes.length, this.quorum);
  }
}

/**
 * The module's Redlock store: one client per node (created from options or a URL and closed with
 * the store, or the application's own, left open), each wrapped in a `RedisLockStore`.
 */
export function createRedlockStore(
  redlock: Required<RedlockOptions>,
  options: ResolvedModuleOptions,
  logger: Logger,
): LockStore {
  const nodes = redlock.nodes.map(
    (node) =>
      new RedlockNodeConnection(node, options.operationTimeout, options.keyPrefix, logger, options.whenDisconnected),
  );
  return new RedlockStore(nodes, redlock.driftFactor, options.keyPrefix);
}
