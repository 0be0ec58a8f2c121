import { AsyncResource } from 'node:async_hooks';
import { randomBytes } from 'node:crypto';
import type { ChainableCommander, Cluster, Redis } from 'ioredis';
import { SHARED_OWNER_PREFIX } from '../../core/owner-ids';
import { describeError } from '../../errors/describe-error';
import { Logger } from '@nestjs/common';
import { checkRedisAccess } from './access.check';
import { refusal } from './access.refusal';
import { evictionWarnings } from './eviction-check';
import { ACQUIRE_SHARED_SCRIPT } from './scripts/acquire-shared.script';
import { ACQUIRE_SCRIPT } from './scripts/acquire.script';
import { foreignKeyOf, isNoScript, type LuaScript, refusalOf } from './scripts/lua-script';
import { CHECK_SCRIPT } from './scripts/check.script';
import { LEAVE_SCRIPT } from './scripts/leave.script';
import { RELEASE_SCRIPT } from './scripts/release.script';
import { RENEW_SCRIPT } from './scripts/renew.script';
import { FENCE_MARKER, fenceKeyFor, keySlot, LINE_MARKER, lineKeysFor, slotGuardFor, slotTag } from './fence-key';
import { EPOCH_SCRIPT } from './scripts/epoch.script';
import { FORCE_UNLOCK_SCRIPT } from './scripts/force-unlock.script';
import { INSPECT_SCRIPT } from './scripts/inspect.script';
import { DESCRIPTION_MARK, HANDED_OVER_MARK } from './scripts/line.lua';
import type {
  AcquireOptions,
  AcquireResult,
  CheckResult,
  LockStore,
  ReleaseResult,
  LinePlace,
  ReleaseWatch,
  RenewOutcome,
  RenewRequest,
  StoreHealth,
  StoredHold,
  StoredLock,
} from '../lock-store.interface';
import { clientKeyPrefix, closeRedis, isClusterClient, type RedisClient, scrubCredentials } from './redis-client';
import { ReleaseEchoes } from './release-echoes';
import type { ReplicaAck } from './replica-ack';
import { ReleaseSubscriber } from './release-subscriber';
import { giveBackHold } from '../give-back';
import {
  ForeignKeyError,
  markHandedOver,
  SlotMigratingError,
  StoreDisconnectedError,
  StoreTimeoutError,
} from '../store-errors';
import { ConnectionState } from './connection-state';
import { healthProblem } from './connection-problem';

const RELEASE_RESULTS: Readonly<Record<number, ReleaseResult>> = {
  0: 'not-owner',
  1: 'released',
};

/**
 * How long a waiter's place in a lock's line lasts without another attempt from it. A waiter
 * attempts (and so renews its place) at least every third of this; one that died leaves the line
 * by itself within it.
 */
export const PLACE_MS = 3_000;

/**
 * How long the head of a line has to take a lock announced free before its place lapses and the
 * next waiter's turn comes: a round trip and a busy event loop, with room to spare.
 */
export const GRANT_MS = 250;

/** Most locks renewed by one script call: keeps each call to about a millisecond of Redis time. */
const MAX_RENEW_BATCH = 500;

/** A flat HGETALL reply as a map. */
function pairs(flat: readonly string[]): Map<string, string> {
  const map = new Map<string, string>();
  for (let i = 0; i + 1 < flat.length; i += 2) map.set(flat[i], flat[i + 1]);
  return map;
}

/** A holder's description (`<since>|<token>|<description>`, see DESCRIPTION_MARK) as `StoredHold.recorded`. */
function parseRecord(entry: string | undefined): StoredHold['recorded'] {
  if (!entry) return undefined;
  // (a hold that came by a local hand-over says so first: HANDED_OVER_MARK)
  const [since, token, ...rest] = (entry.startsWith(HANDED_OVER_MARK) ? entry.slice(1) : entry).split('|');
  return {
    since: Number(since),
    ...(token !== '' && token !== undefined && { fencingToken: Number(token) }),
    description: rest.join('|'),
  };
}

const asError = (error: unknown): Error => (error instanceof Error ? error : new Error(describeError(error)));

/** Redis answered MOVED or ASK: the command belongs on another node (and did not run). */
const isRedirection = (reply: unknown): boolean => {
  const refused = refusalOf(reply);
  return refused?.redirected === false && (refused.code === 'MOVED' || refused.code === 'ASK');
};

/**
 * A Cluster's refusal of a command whose slot is migrating, or ioredis giving up after following
 * its redirections (16 by default, 100 ms apart on TRYAGAIN): either way the command did not run.
 */
const isSlotMigrating = (reply: unknown): boolean => {
  const refused = refusalOf(reply);
  return refused?.code === 'TRYAGAIN' || (refused?.redirected === true && /^(ASK|MOVED)$/.test(refused.code));
};

/**
 * Whether the Cluster client holds a command back right now to send it again after Redis answered
 * TRYAGAIN (a slot migrating): ioredis retries that by itself, `retryDelayOnTryAgain` apart, up to
 * `maxRedirections` times (1.6 s by default), before it tells its caller anything. Read from its
 * delay queue, which is not public API (ioredis 5 and 6 have it): a client without it reads as no,
 * and an operation that times out meanwhile is then reported as Redis not answering.
 */
function retryingTryAgain(client: Cluster): boolean {
  const internals = client as unknown as { delayQueue?: { timeouts?: Record<string, unknown> } };
  return Boolean(internals.delayQueue?.timeouts?.tryagain);
}

/** A script refused because its slot is migrating goes again after this long, doubling up to MIGRATING_RETRY_MAX_MS. */
const MIGRATING_RETRY_MS = 50;
const MIGRATING_RETRY_MAX_MS = 400;

/**
 * `group` cut into batches of at most MAX_RENEW_BATCH, none naming a key twice (two shared holds of
 * one process on the same lock go in two calls): a renewal that drops a lapsed hold may delete its
 * key, and a script that reached that key again would fail halfway while the slot migrates.
 */
function distinctBatches(group: readonly number[], keyOf: (index: number) => string): number[][] {
  const batches: { indexes: number[]; keys: Set<string> }[] = [];
  for (const index of group) {
    const key = keyOf(index);
    let batch = batches.find((open) => open.indexes.length < MAX_RENEW_BATCH && !open.keys.has(key));
    if (!batch) batches.push((batch = { indexes: [], keys: new Set() }));
    batch.indexes.push(index);
    batch.keys.add(key);
  }
  return batches.map((batch) => batch.indexes);
}

/** One script call: the keys and arguments, and the indexes of the requests they serve. */
interface ScriptCall {
  readonly indexes: readonly number[];
  readonly keys: readonly string[];
  readonly args: readonly (string | number)[];
}

/** An operation under way and when it times out. */
interface Deadline {
  readonly at: number;
  readonly reject: (error: Error) => void;
  /** Why it is late, when the operation knows better than "Redis did not answer" (see `send`). */
  readonly late?: () => Error | undefined;
}

/** What an operation sent again while its slot was migrating last heard (see `send`). */
interface Migration {
  error?: SlotMigratingError;
}

/**
 * The lock store on one Redis (a standalone server, a Sentinel-managed master, or a Cluster, where
 * every script call stays within one hash slot). Every call is bounded by `operationTimeout`.
 */
export class RedisLockStore implements LockStore {
  /** Published by this store's releases, so that their pub/sub echo can be told apart. */
  private readonly id = randomBytes(8).toString('hex');
  private readonly releases: ReleaseSubscriber;
  private readonly cluster: boolean;
  /** What an acquisition announces a grant to the head of a line with: this store's id (see the acquire script). */
  private readonly lineNotice = `${this.id}:0`;
  /** A waiter attempts at least this often, renewing its place in the lock's line. */
  readonly lineRefreshMs = Math.floor(PLACE_MS / 3);
  /** A single server (or a hash slot's master) counts every shared hold of a key. */
  readonly boundsShares = true;
  /** The acquire scripts hand a hold from one owner to the next in one step (see their ARGV[10]). */
  readonly handsOver = true;
  /** Fencing counters and lines of waiters live under the module's key prefix too. */
  readonly reservedPrefixes = [FENCE_MARKER, LINE_MARKER];
  /** The release script's flag for announcing releases that nobody waits for (see the constructor). */
  private readonly announceAlways: number;
  /** The scripts' flag for announcing with SPUBLISH (1, on a Cluster) or PUBLISH (0). */
  private readonly sharded: number;
  /** The client's own ioredis keyPrefix: part of every key's name as Redis sees it, slot included. */
  private readonly clientPrefix: string;
  /** The async context the store was made in (outside every caller's): its shared timer runs there. */
  private readonly home = new AsyncResource('DisLockStore');
  /** Operations under way, and the one timer that times them out (see `bounded`). */
  private readonly deadlines = new Set<Deadline>();
  private sweepTimer: NodeJS.Timeout | undefined;
  /** Set by close(): operations still under way (a waiter's leave at shutdown) settle, then nothing is left. */
  private closed = false;
  /** Whether the client is known to be cut off from Redis, and why (see `whenDisconnected`). */
  private readonly connection: ConnectionState;
  /** How many times the client's connection has closed: a command in flight across one may have run twice. */
  private connections = 0;
  private readonly countConnection = (): void => {
    this.connections += 1;
  };
  /** Told when the connection is back after a drop (see `onReconnect`). */
  private readonly reconnectListeners = new Set<() => void>();
  /** The closes `reconnected` has seen; a 'ready' with more behind it is a reconnection. */
  private connectionsSeenReady = 0;
  private readonly reconnected = (): void => {
    if (this.connections === this.connectionsSeenReady) return; // the first connection, not a comeback
    this.connectionsSeenReady = this.connections;
    for (const listener of [...this.reconnectListeners]) listener();
  };
  /** Each data-set marker this store has read (see EPOCH_SCRIPT), by key: its value then. */
  private readonly epochs = new Map<string, string>();
  /** This store's own release announcements, until it knows whether each has woken the local waiters. */
  private readonly echoes: ReleaseEchoes;

  constructor(
    private readonly client: RedisClient,
    private readonly owned: boolean,
    private readonly operationTimeout: number,
    /** The module's key prefix: fencing counters live beside the locks, as `${keyPrefix}#fence:{tag}`. */
    private readonly keyPrefix: string,
    /** Replica acknowledgement of each acquisition, when the module asks for it. */
    private readonly replicaAck?: ReplicaAck,
    /**
     * While the client is known to be cut off from Redis: `'fail'` sends nothing and fails at once
     * (`StoreDisconnectedError`); `'wait'` lets the command wait in the client's offline queue,
     * up to `operationTimeout`, for a reconnection.
     */
    private readonly whenDisconnected: 'fail' | 'wait' = 'fail',
    /**
     * Announce every release, even with nobody in the lock's line (which the scripts otherwise skip):
     * for a Redlock node, whose waiters keep no place in a line and listen for every release.
     */
    announceEveryRelease = false,
  ) {
    this.announceAlways = announceEveryRelease ? 1 : 0;
    slotTag(0); // build the slot table now rather than on the first acquisition
    this.echoes = new ReleaseEchoes(this.id);
    this.releases = new ReleaseSubscriber(client, (operation) => this.bounded(operation), this.echoes, GRANT_MS);
    this.cluster = isClusterClient(client);
    this.clientPrefix = clientKeyPrefix(client);
    this.sharded = this.cluster ? 1 : 0;
    this.watchConnections(true);
    // Also lets a timed-out operation say why (a wrong password, a bad certificate) instead of only
    // that nothing answered.
    this.connection = new ConnectionState(client, owned);
  }

  async acquire(key: string, owner: string, leaseMs: number, options: AcquireOptions = {}): Promise<AcquireResult> {
    const { waiter, share, describe, from } = options;
    // The release script reads the hold's kind from its owner id (see `OwnerIds`).
    if (owner.startsWith(SHARED_OWNER_PREFIX) !== (share !== undefined)) {
      throw new Error(
        `Owner id "${owner}" does not say its hold's kind: a shared hold's id starts with "${SHARED_OWNER_PREFIX}", an exclusive one's never does`,
      );
    }
    const migration: Migration = {};
    const args: (string | number)[] = [
      owner,
      leaseMs,
      waiter ?? '',
      PLACE_MS,
      this.sharded,
      this.lineNotice,
      share ?? GRANT_MS,
      describe ?? '',
      GRANT_MS,
    ];
    // Sent only for a local hand-over: the uncontended path's command stays as short as it was.
    if (from !== undefined) args.push(from);
    const pending = this.send(
      share === undefined ? ACQUIRE_SCRIPT : ACQUIRE_SHARED_SCRIPT,
      this.lineScriptKeys(key),
      args,
      migration,
      options.retryUntil,
    );
    let reply: unknown;
    try {
      reply = await this.bounded(pending, () => this.migrating(migration, key));
    } catch (error) {
      // Someone else's key at the lock's name: the script refused it and wrote nothing.
      const foreign = foreignKeyOf(error);
      if (foreign) throw foreign;
      // No answer in time, the client's own commandTimeout, a connection closed in flight: the
      // script may have run, or may still run. Whatever the error, give the hold back; unless it
      // was never sent (the client was known to be cut off from Redis).
      if (!(error instanceof StoreDisconnectedError)) this.abandon(key, owner, leaseMs, pending);
      throw error;
    }
    const [taken, value, third] = reply as [number, number, number?];
    if (taken !== 1)
      return third === undefined ? { acquired: false, ttl: value } : { acquired: false, ttl: value, turnMs: third };
    // A hand-over answers 1 (handed over), 2 (a re-sent copy of one that handed over) or 3 (a
    // re-sent copy of one that found `from` holding nothing); nothing, when `from` held nothing.
    const handedOver = third === 1 || third === 2;
    if (this.replicaAck) {
      try {
        await this.confirmed(key, owner, leaseMs);
      } catch (error) {
        // The script ran: `from`'s hold went over before the new one fell short of its replicas.
        if (handedOver) markHandedOver(error);
        throw error;
      }
    }
    return from === undefined ? { acquired: true, token: value } : { acquired: true, token: value, handedOver };
  }

  /** The replicas have the hold just taken; otherwise it is given back and the acquisition fails. */
  private async confirmed(key: string, owner: string, leaseMs: number): Promise<void> {
    try {
      this.assertConnected();
      await this.bounded((this.replicaAck as ReplicaAck).confirm(this.client, key));
    } catch (error) {
      await this.giveBack(key, owner, leaseMs);
      throw error;
    }
  }

  async check(key: string, owner: string): Promise<CheckResult> {
    const [held, ttl] = (await this.run(CHECK_SCRIPT, [key], [owner])) as [number, number];
    return { held: held === 1, ttl };
  }

  async renew(requests: readonly RenewRequest[]): Promise<RenewOutcome[]> {
    const outcomes: RenewOutcome[] = new Array<RenewOutcome>(requests.length);
    const settle = (indexes: readonly number[], reply: unknown): void => {
      if (reply instanceof Error) for (const requestIndex of indexes) outcomes[requestIndex] = { error: reply };
      else indexes.forEach((requestIndex, i) => (outcomes[requestIndex] = (reply as number[])[i] === 1));
    };
    await Promise.all(
      this.renewalRequests(requests).map(async (calls) => {
        const replies = await this.runOnNode(RENEW_SCRIPT, calls);
        calls.forEach((call, i) => settle(call.indexes, replies[i]));
      }),
    );
    return outcomes;
  }

  async release(key: string, owner: string): Promise<ReleaseResult> {
    const message = this.echoes.expect(this.releases.isWatching(key));
    const connection = this.connections;
    let reply: unknown;
    try {
      reply = await this.run(RELEASE_SCRIPT, this.lineScriptKeys(key), [
        owner,
        message,
        this.sharded,
        GRANT_MS,
        this.announceAlways,
      ]);
    } catch (error) {
      // It may have run (the reply was lost or is late): its announcement, if it comes back, wakes
      // the local waiters then.
      if (this.echoes.failed(message)) this.releases.wakeLocal(key);
      throw foreignKeyOf(error) ?? error;
    }
    const [code, head, second] = Array.isArray(reply) ? (reply as [number, string, string, string]) : [reply, '', ''];
    const result = RELEASE_RESULTS[code as number];
    if (result === undefined) throw new Error(`Unexpected reply from the release script: ${String(reply)}`);
    if (result === 'not-owner' && connection !== this.connections) {
      // The connection dropped while this release was on its way, and the client re-sent it: this
      // is the answer of the second copy, which found the hold that the first one had dropped
      // already. (A lock lost in that same window is reported as released: either way it is no
      // longer this owner's, and the code it protected has finished.) Who is next is not known:
      // every local waiter looks.
      this.echoes.handled(message);
      this.releases.wakeLocal(key);
      return 'released';
    }
    if (result === 'not-owner') {
      this.echoes.forget(message);
      return result;
    }
    this.echoes.handled(message);
    // The lock went to the head of its line: if that is this process's line, its waiter looks at
    // once (and takes the grant up); if nobody waits in the line, every local waiter looks;
    // otherwise the announcement has told the head's process.
    this.releases.heard(this.releases.channelOf(key), head, second);
    return result;
  }

  onReconnect(listener: () => void): () => void {
    this.reconnectListeners.add(listener);
    return () => void this.reconnectListeners.delete(listener);
  }

  async suspect(held: readonly string[]): Promise<readonly string[]> {
    if (held.length === 0) return [];
    const suspects: string[] = [];
    await Promise.all(
      [...this.markersOf(held)].map(async ([marker, keys]) => {
        let value: string;
        try {
          value = (await this.run(EPOCH_SCRIPT, [marker], [randomBytes(8).toString('hex')])) as string;
        } catch {
          return; // no answer, no news
        }
        // A marker read for the first time vouches for nothing yet (Redis may have lost these locks
        // before it was first read, and another process then set it): check them once.
        const seen = this.epochs.get(marker);
        this.epochs.set(marker, value);
        if (seen !== value) suspects.push(...keys);
      }),
    );
    return suspects;
  }

  /**
   * The data-set markers that vouch for `held`: one on a single server; on a Cluster one per
   * master, in the lowest slot of a held key there (so that it stays put while that lock is held).
   */
  private markersOf(held: readonly string[]): Map<string, readonly string[]> {
    if (!this.cluster) return new Map([[`${this.keyPrefix}${FENCE_MARKER}epoch`, held]]);
    const byNode = new Map<string, { slot: number; keys: string[] }>();
    for (const key of held) {
      const slot = keySlot(this.clientPrefix + key);
      const node = (this.client as Cluster).slots[slot]?.[0] ?? '';
      const entry = byNode.get(node);
      if (!entry) byNode.set(node, { slot, keys: [key] });
      else {
        entry.keys.push(key);
        entry.slot = Math.min(entry.slot, slot);
      }
    }
    const markers = new Map<string, readonly string[]>();
    for (const { slot, keys } of byNode.values()) {
      markers.set(`${this.keyPrefix}${FENCE_MARKER}epoch{${slotTag(slot)}}`, keys);
    }
    return markers;
  }

  giveBack(key: string, owner: string, leaseMs: number): Promise<void> {
    return giveBackHold(
      () => this.release(key, owner),
      leaseMs,
      () => this.closed,
    );
  }

  async leave(key: string, waiter: string): Promise<void> {
    await this.run(LEAVE_SCRIPT, this.lineScriptKeys(key), [waiter, this.echoes.expect(false), this.sharded, GRANT_MS]);
  }

  async inspect(key: string): Promise<StoredLock> {
    const [, , line] = this.lineScriptKeys(key);
    const [type, pttl, fields, waiting, serverMs] = (await this.run(INSPECT_SCRIPT, [key, line], [])) as [
      string,
      number,
      string[],
      number,
      string,
    ];
    // Someone else's key at the lock's name: no lock of ours, held or free.
    if (type !== 'none' && type !== 'hash') throw new ForeignKeyError(key, 'lock', type, undefined);
    const now = Number(serverMs);
    const descriptions = new Map<string, string>();
    const holdFields: [string, string][] = [];
    for (const [field, value] of pairs(fields)) {
      if (field.startsWith(DESCRIPTION_MARK)) descriptions.set(field.slice(DESCRIPTION_MARK.length), value);
      else holdFields.push([field, value]);
    }
    const holds = holdFields.map(([owner, value]): StoredHold => {
      const ends = Number(value);
      const exclusive = ends <= 1;
      return {
        owner,
        exclusive,
        ttl: exclusive ? pttl : ends - now,
        granted: value === '0',
        recorded: parseRecord(descriptions.get(owner)),
      };
    });
    const live = holds.filter((hold) => hold.exclusive || hold.ttl > 0);
    return { held: live.length > 0, holds: live, waiting };
  }

  async forceUnlock(key: string): Promise<StoredHold[]> {
    // Read first, then drop exactly the holds read: a script that dropped whatever it found would,
    // re-sent after a lost reply, drop the hold its first run had handed the lock to.
    const { holds } = await this.inspect(key);
    if (holds.length === 0) return [];
    const connection = this.connections;
    const dropped = (await this.run(FORCE_UNLOCK_SCRIPT, this.lineScriptKeys(key), [
      this.echoes.expect(false),
      this.sharded,
      GRANT_MS,
      ...holds.map((hold) => hold.owner),
    ])) as string[];
    this.releases.wakeLocal(key);
    // The holds the script dropped: a hold its holder released between the read and the drop is
    // not among them. A copy the client re-sent after its connection dropped finds every hold gone,
    // its first copy's work or not: then each hold read may have been dropped.
    const gone = connection !== this.connections ? holds : holds.filter((hold) => dropped.includes(hold.owner));
    return gone.map((hold) => ({ ...hold, ttl: 0 }));
  }

  async health(): Promise<StoreHealth> {
    const probe = `${this.keyPrefix}#probe:health`;
    const sentAt = performance.now();
    try {
      this.assertConnected();
      // EVAL, not EVALSHA: what runs after a restart or SCRIPT FLUSH must work too.
      await this.bounded(this.client.eval(CHECK_SCRIPT.source, 1, probe, 'health'));
      const latencyMs = performance.now() - sentAt;
      // Without the servers' addresses: a health check's body may reach any HTTP client.
      const warnings = await evictionWarnings(this.client, (operation) => this.bounded(operation), false);
      return warnings.length > 0 ? { up: true, latencyMs, warnings } : { up: true, latencyMs };
    } catch (error) {
      // What may reach an HTTP client says what failed, never the server's address or a password.
      const refused = refusal(error, this.clientPrefix + probe, this.clientPrefix + probe);
      return { up: false, problem: refused ? `Redis refuses ${refused}` : healthProblem(error) };
    }
  }

  async verify(): Promise<void> {
    // With 'fail', the check ends (with a warning, as when Redis does not answer) as soon as the
    // client is known to be cut off from Redis: at startup, once its first connection has failed.
    const down = this.whenDisconnected === 'fail' ? this.connection.downSignal() : undefined;
    try {
      await checkRedisAccess(this.client, this.keyPrefix, this.operationTimeout, undefined, down?.signal);
    } finally {
      down?.stop();
    }
    if (this.whenDisconnected === 'fail' && this.connection.down) return; // INFO would only wait
    for (const warning of await evictionWarnings(this.client, (operation) => this.bounded(operation))) {
      new Logger('DisLock').warn(warning);
    }
  }

  watch(key: string, place?: LinePlace, since?: number): Promise<ReleaseWatch> {
    return this.releases.watch(key, place, since);
  }

  async close(): Promise<void> {
    this.closed = true;
    this.watchConnections(false);
    this.connection.close();
    this.reconnectListeners.clear();
    this.releases.close();
    // Operations still under way keep their deadlines: the sweep stops by itself once they settle.
    if (this.deadlines.size === 0) this.sweep();
    if (this.owned) await closeRedis(this.client, this.operationTimeout);
  }

  /**
   * The lock key, its slot's fencing counter and its line's two keys, for the scripts that take,
   * hand on or give up a lock; on a Cluster also its slot's guard (see
   * `slotGuardFor`), so that they never run while the slot migrates.
   */
  private lineScriptKeys(key: string): string[] {
    const slotKey = this.clientPrefix + key;
    return [
      key,
      fenceKeyFor(this.keyPrefix, slotKey),
      ...lineKeysFor(this.keyPrefix, slotKey, key),
      ...(this.cluster ? [slotGuardFor(this.keyPrefix, slotKey)] : []),
    ];
  }

  /**
   * Count the closes of the connections lock commands travel on: the client's own, or on a
   * Cluster each node's (a Cluster client re-sends a command whose node connection closed).
   */
  private watchConnections(on: boolean): void {
    const connections = this.cluster ? (this.client as Cluster).nodes() : [this.client as Redis];
    for (const connection of connections) {
      if (on) this.watchNode(connection);
      else connection.off('close', this.countConnection).off('ready', this.reconnected);
    }
    if (!this.cluster) return;
    if (on) this.client.on('+node', this.watchNode);
    else this.client.off('+node', this.watchNode);
  }

  private readonly watchNode = (node: Redis): void =>
    void node.on('close', this.countConnection).on('ready', this.reconnected);

  /**
   * An acquisition whose outcome is unknown may have run, or may still run (the command waits in
   * the client while it reconnects, and is then re-sent): give its hold back now (the release
   * mostly queues behind it on the same connection), retried while Redis does not answer, and
   * again once it settles (see below). All owner-checked, so none can touch a lock someone else
   * took in between.
   */
  private abandon(key: string, owner: string, leaseMs: number, pending: Promise<unknown>): void {
    void this.giveBack(key, owner, leaseMs);
    // Once the acquire itself has settled, again, unless it said busy: "queued behind it" does not
    // always hold (a script the server had not loaded is answered NOSCRIPT and sent again, after the
    // release), and a rejection may hide a run whose answer was lost.
    pending.then(
      (late) => Array.isArray(late) && late[0] === 1 && void this.giveBack(key, owner, leaseMs),
      () => {
        void this.giveBack(key, owner, leaseMs);
        this.afterClientGivesUp(() => void this.giveBack(key, owner, leaseMs), leaseMs);
      },
    );
  }

  /**
   * A command the client rejected may still be sent by it: ioredis's own `commandTimeout` rejects
   * the caller's promise but leaves the command where it waits, in the offline queue (sent once the
   * connection is ready again) or, on a Cluster, in the queue of commands it sends again after a
   * TRYAGAIN, MOVED, CLUSTERDOWN or a closed connection (up to `maxRedirections` times, each after
   * its delay). Runs `then` once more after each of those could have happened: after the next
   * 'ready' of a client that is not ready now (its queue goes first on the connection), and on a
   * Cluster a quarter, a half and all of the longest the redirections can take, and once after.
   * Never past `leaseMs` from now plus that span; every timer unref'd.
   */
  private afterClientGivesUp(then: () => void, leaseMs: number): void {
    const later = (ms: number): void => void setTimeout(() => !this.closed && then(), ms).unref();
    if (this.client.status !== 'ready') {
      const ready = (): void => {
        clearTimeout(expiry);
        later(0);
      };
      const expiry = setTimeout(() => this.client.off('ready', ready), leaseMs);
      expiry.unref();
      this.client.once('ready', ready);
    }
    if (!this.cluster) return;
    const {
      maxRedirections = 16,
      retryDelayOnTryAgain,
      retryDelayOnMoved,
      retryDelayOnClusterDown,
      retryDelayOnFailover,
    } = (this.client as Cluster).options;
    const delays = [retryDelayOnTryAgain, retryDelayOnMoved, retryDelayOnClusterDown, retryDelayOnFailover];
    const spanMs = maxRedirections * Math.max(100, ...delays.map((delay) => (typeof delay === 'number' ? delay : 0)));
    for (const share of [0.25, 0.5, 1]) later(spanMs * share);
    later(spanMs + 250);
  }

  /**
   * Renewal requests grouped into script calls, and the calls into requests per node: one script
   * call per hash slot on a Cluster (a script may only touch one slot), sent to each master as
   * one pipeline; all in one call on a single server. At most MAX_RENEW_BATCH locks per call.
   */
  private renewalRequests(requests: readonly RenewRequest[]): ScriptCall[][] {
    const slots = new Map<number, number[]>();
    requests.forEach((request, i) => {
      const slot = this.cluster ? keySlot(this.clientPrefix + request.key) : 0;
      const group = slots.get(slot);
      if (group) group.push(i);
      else slots.set(slot, [i]);
    });
    const nodes = new Map<string, ScriptCall[]>();
    for (const [slot, group] of slots) {
      const node = this.cluster ? ((this.client as Cluster).slots[slot]?.[0] ?? '') : '';
      let calls = nodes.get(node);
      if (!calls) nodes.set(node, (calls = []));
      for (const indexes of distinctBatches(group, (i) => requests[i].key)) {
        calls.push({
          indexes,
          keys: indexes.map((i) => requests[i].key),
          args: indexes.flatMap((i) => {
            const { owner, leaseMs, exact, check } = requests[i];
            return [owner, check ? 0 : exact ? -leaseMs : leaseMs];
          }),
        });
      }
    }
    return [...nodes.values()];
  }

  /**
   * Run `calls` of one script on one node: a single call as it is, several as one pipeline (one
   * round trip). One reply per call, an `Error` for a call that failed; never rejects. Calls the
   * node answers NOSCRIPT (restarted, flushed, or new to the cluster) go again, with the script's
   * source, as one more pipeline; calls redirected elsewhere go again one by one.
   */
  private async runOnNode(script: LuaScript, calls: readonly ScriptCall[]): Promise<unknown[]> {
    if (calls.length === 1 || !this.cluster) {
      return Promise.all(calls.map((call) => this.run(script, call.keys, call.args).catch(asError)));
    }
    const replies = await this.pipelined(calls, (pipeline, call) =>
      pipeline.evalsha(script.sha, call.keys.length, ...call.keys, ...call.args),
    );
    const unknown = calls.flatMap((_, i) => (isNoScript(replies[i]) ? [i] : []));
    if (unknown.length > 0) {
      const again = await this.pipelined(
        unknown.map((i) => calls[i]),
        (pipeline, call) => pipeline.eval(script.source, call.keys.length, ...call.keys, ...call.args),
      );
      unknown.forEach((callIndex, i) => (replies[callIndex] = again[i]));
    }
    // A pipeline over several slots does not follow redirections (ioredis 6): after a failover or
    // a resharding its calls come back MOVED until the slot map is refreshed. Refresh it, and send
    // those calls on their own, which the client redirects.
    // A call refused while its slot migrates goes again on its own too, waiting for the slot.
    const moved = calls.flatMap((_, i) => (isRedirection(replies[i]) || isSlotMigrating(replies[i]) ? [i] : []));
    if (moved.length === 0) return replies;
    if (moved.some((i) => isRedirection(replies[i]))) (this.client as Cluster).refreshSlotsCache();
    await Promise.all(
      moved.map(async (i) => {
        replies[i] = await this.run(script, calls[i].keys, calls[i].args).catch(asError);
      }),
    );
    return replies;
  }

  /** One pipeline on the Cluster: one reply per call, an `Error` for each that failed; never rejects. */
  private async pipelined(
    calls: readonly ScriptCall[],
    add: (pipeline: ChainableCommander, call: ScriptCall) => void,
  ): Promise<unknown[]> {
    try {
      this.assertConnected();
      const pipeline = (this.client as Cluster).pipeline();
      for (const call of calls) add(pipeline, call);
      const results = await this.bounded(pipeline.exec());
      return calls.map((_, i) => {
        const [error, reply] = results?.[i] ?? [new Error('The pipeline was not run'), undefined];
        return error ?? reply;
      });
    } catch (error) {
      return calls.map(() => asError(error));
    }
  }

  private run(script: LuaScript, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    const migration: Migration = {};
    return this.bounded(this.send(script, keys, args, migration), () => this.migrating(migration, keys[0]));
  }

  /**
   * Why an operation on `key` that timed out was late, when its slot was migrating: it met
   * TRYAGAIN itself (`migration`), or ioredis is holding a command back after one.
   */
  private migrating(migration: Migration, key: string): SlotMigratingError | undefined {
    if (migration.error || !this.cluster || !retryingTryAgain(this.client as Cluster)) return migration.error;
    return this.migratingError(key, undefined);
  }

  /** The slot of `key` (as Redis sees it) was migrating for as long as an operation could wait. */
  private migratingError(key: string, cause: unknown): SlotMigratingError {
    return new SlotMigratingError(keySlot(this.clientPrefix + key), cause);
  }

  /**
   * `script` on the client; on a Cluster, sent again while Redis refuses it because its slot is
   * migrating (TRYAGAIN: the script did not run, see `slotGuardFor`), 50 ms later, then doubling up
   * to 400 ms, until `until` (a `performance.now()` time) or `operationTimeout` from now, whichever
   * comes first; then it fails with `SlotMigratingError` (also noted in `migration`, for a timeout
   * meanwhile to say so). Not bounded itself: see `bounded`.
   */
  private send(
    script: LuaScript,
    keys: readonly string[],
    args: readonly (string | number)[],
    migration: Migration,
    until = Infinity,
  ): Promise<unknown> {
    const down = this.whenDisconnected === 'fail' ? this.connection.down : undefined; // see assertConnected
    if (down) return Promise.reject(down);
    // On a single server the script's own promise, not an async function's around it: every
    // acquisition and release goes through here.
    if (!this.cluster) return script.run(this.client, keys, args);
    return this.sendToCluster(script, keys, args, migration, until);
  }

  /** `send` on a Cluster: sent again while the slot migrates, up to `until`. */
  private async sendToCluster(
    script: LuaScript,
    keys: readonly string[],
    args: readonly (string | number)[],
    migration: Migration,
    until: number,
  ): Promise<unknown> {
    const end = Math.min(until, performance.now() + this.operationTimeout);
    for (let delay = MIGRATING_RETRY_MS; ; delay = Math.min(delay * 2, MIGRATING_RETRY_MAX_MS)) {
      try {
        return await this.runUntil(script, keys, args, until);
      } catch (error) {
        if (!isSlotMigrating(error)) throw error;
        migration.error = this.migratingError(keys[0], error);
        if (this.closed || performance.now() + delay >= end) throw migration.error;
        await new Promise((resolve) => setTimeout(resolve, delay));
      }
    }
  }

  /**
   * `script` on the Cluster client, given up at `until` if ioredis is then still holding commands
   * back after TRYAGAIN (its own retries take up to 1.6 s, which a waiter's deadline may not
   * have): a `SlotMigratingError`. The command may still run later; an acquisition is given back
   * then (see `abandon`). Redis merely slow is waited for, as ever, within `operationTimeout`.
   */
  private runUntil(
    script: LuaScript,
    keys: readonly string[],
    args: readonly (string | number)[],
    until: number,
  ): Promise<unknown> {
    const run = script.run(this.client, keys, args);
    if (!Number.isFinite(until)) return run;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => {
          if (!retryingTryAgain(this.client as Cluster)) return;
          reject(this.migratingError(keys[0], undefined));
        },
        Math.max(0, until - performance.now()),
      );
      timer.unref();
      run.then(
        (reply) => {
          clearTimeout(timer);
          resolve(reply);
        },
        (error: unknown) => {
          clearTimeout(timer);
          reject(asError(error));
        },
      );
    });
  }

  /**
   * `operation`, or a `StoreTimeoutError` once it has taken longer than `operationTimeout`. One
   * sweeping timer serves every operation under way (it runs only while there are some), instead
   * of a timer set and cleared per command on the hot path; a timeout is noticed at most a tenth
   * of `operationTimeout` late.
   */
  private bounded<T>(operation: Promise<T>, late?: () => Error | undefined): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const entry: Deadline = { at: performance.now() + this.operationTimeout, reject, late };
      this.deadlines.add(entry);
      if (!this.sweepTimer) {
        // Made in the store's own async context, not in that of the call that happens to start it.
        this.sweepTimer = this.home.runInAsyncScope(() =>
          setInterval(() => this.sweep(), Math.max(1, Math.ceil(this.operationTimeout / 10))),
        );
        this.sweepTimer.unref(); // a caller awaiting the operation is what matters, not the process
      }
      operation.then(
        (value) => {
          this.settled(entry);
          resolve(value);
        },
        (error: unknown) => {
          this.settled(entry);
          scrubCredentials(error); // ioredis keeps a failed AUTH/HELLO's arguments, password included
          reject(error instanceof Error ? error : new Error(describeError(error)));
        },
      );
    });
  }

  /** An operation settled; once the store is closed, the last one to settle stops the sweep at once. */
  private settled(entry: Deadline): void {
    this.deadlines.delete(entry);
    if (this.closed && this.deadlines.size === 0) this.sweep();
  }

  private sweep(): void {
    if (this.deadlines.size === 0) {
      clearInterval(this.sweepTimer);
      this.sweepTimer = undefined;
      return;
    }
    const at = performance.now();
    for (const entry of this.deadlines) {
      if (entry.at > at) continue;
      this.deadlines.delete(entry);
      entry.reject(entry.late?.() ?? new StoreTimeoutError(this.operationTimeout, this.connection.lastError));
    }
  }

  /**
   * Throws `StoreDisconnectedError` when the client is known to be cut off from Redis and
   * `whenDisconnected` is `'fail'`: what would be sent now would only wait in the client's offline
   * queue. Called before sending, never about an operation already sent (that one keeps its
   * `operationTimeout`, and an acquisition of unknown outcome is given back as always).
   */
  private assertConnected(): void {
    if (this.whenDisconnected !== 'fail') return;
    const down = this.connection.down;
    if (down) throw down;
  }
}
