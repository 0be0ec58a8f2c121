import { randomBytes } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';
import { describeError } from '../../errors/describe-error';
import { RedisAccessError } from '../../errors/redis-access.error';
import { refusal } from './access.refusal';
import { dislockAclRule } from './acl.rule';
import { keySlot } from './fence-key';
import { duplicateClient, isClusterClient, type RedisClient } from './redis-client';
import { ACQUIRE_SHARED_SCRIPT } from './scripts/acquire-shared.script';
import { ACQUIRE_SCRIPT } from './scripts/acquire.script';
import { CHECK_SCRIPT } from './scripts/check.script';
import { EPOCH_SCRIPT } from './scripts/epoch.script';
import { RELEASE_SCRIPT } from './scripts/release.script';
import { RENEW_SCRIPT } from './scripts/renew.script';

/** The reason a check step stopped that is not a refusal: Redis did not answer in time. */
class CheckTimeout extends Error {}

/**
 * One run of the access check (`checkRedisAccess`, access.check.ts): the lock scripts on a probe
 * lock of its own, then, if Redis refused something, each command on its own to name every refusal;
 * and cleanup of the probe keys, within `operationTimeout`.
 */
export class AccessProbe {
  private readonly deadline: number;
  private readonly tag = randomBytes(8).toString('hex');
  /** Probe keys, without the client's own ioredis `keyPrefix` (which the client adds). */
  private readonly key: string;
  private readonly fence: string;
  /** The release channel as Redis sees it: the probe key with the client's ioredis `keyPrefix`. */
  private readonly channel: string;
  private readonly owner = randomBytes(16).toString('hex');
  private readonly cluster: boolean;
  /** The probe's line of waiters: its order and its deadlines. */
  private readonly line: [string, string];
  private subscriber: RedisClient | undefined;
  private sharded = false;
  private delProven = false;
  /** Commands sent and not answered yet. */
  private readonly inFlight = new Set<Promise<unknown>>();

  constructor(
    private readonly client: RedisClient,
    private readonly keyPrefix: string,
    private readonly operationTimeout: number,
    /** Aborted (with the reason) once the client is known to be cut off from Redis: every step then fails at once. */
    private readonly unreachable?: AbortSignal,
  ) {
    this.deadline = performance.now() + operationTimeout;
    // A `{` in the prefix opens its own hash tag, which then decides the slot of both keys.
    this.key = `${keyPrefix}#probe:{${this.tag}}`;
    this.fence = `${this.key}:fence`;
    this.line = [`${this.key}:line`, `${this.key}:line-deadlines`];
    this.cluster = isClusterClient(client);
    this.channel = this.clientPrefix() + this.key;
  }

  async run(): Promise<void> {
    let refused: { item: string; error: unknown };
    try {
      await this.steps();
      await this.cleanup();
      return;
    } catch (error) {
      const item = refusal(error, this.clientPrefix() + this.key, this.channel);
      if (item === undefined) {
        await this.cleanup();
        throw error;
      }
      refused = { item, error };
    }
    // Ask about each thing on its own: a refusal inside a script may not say what was refused,
    // and the application had better learn about every missing permission at once.
    const found = await this.diagnose().catch(() => []);
    await this.cleanup();
    const items = [...new Set([...found, refused.item])];
    const specific = items.filter((item) => item !== 'a command a script calls');
    throw this.accessError(specific.length > 0 ? specific : items, refused.error);
  }

  close(): void {
    this.subscriber?.disconnect();
    this.subscriber = undefined;
  }

  /** `text` without the client's password, should Redis or a connection error ever echo it. */
  redact(text: string): string {
    const password = this.options().password;
    return password ? text.split(password).join('***') : text;
  }

  private async steps(): Promise<void> {
    if (this.unreachable?.aborted) throw this.unreachable.reason as Error; // send nothing to wait in the offline queue
    // DEL first, on nothing: nothing is made until it is known that it can be deleted again.
    await this.bounded(this.client.del(this.key, this.fence, ...this.line));
    this.delProven = true;
    await this.subscribe();

    const lease = 10_000;
    const sharded = this.cluster ? 1 : 0;
    const acquire = (owner: string, waiter: string, placeMs = lease): Promise<[number, number]> =>
      this.bounded(
        ACQUIRE_SCRIPT.run(
          this.client,
          [this.key, this.fence, ...this.line],
          [owner, lease, waiter, placeMs, sharded, 'access-check', 250],
        ),
      ) as Promise<[number, number]>;
    const release = (owner: string): Promise<unknown> =>
      this.bounded(
        RELEASE_SCRIPT.run(this.client, [this.key, this.fence, ...this.line], [owner, 'access-check', sharded, 250]),
      );
    const acquired = await acquire(this.owner, '');
    // The fencing counter of a real lock lives forever; the probe's should not outlive the lease.
    await this.bounded(this.client.pexpire(this.fence, lease));
    expectReply('acquire', acquired[0] === 1, acquired);

    // EVAL explicitly (everything else tries EVALSHA first): it is what runs after a SCRIPT FLUSH.
    const held = (await this.bounded(this.client.eval(CHECK_SCRIPT.source, 1, this.key, this.owner))) as [
      number,
      number,
    ];
    expectReply('check', held[0] === 1, held);

    const renewed = (await this.bounded(RENEW_SCRIPT.run(this.client, [this.key], [this.owner, lease]))) as number[];
    expectReply('renew', renewed[0] === 1, renewed);

    // Two more owners wait (places in the line), the first of them with a place that lapses at
    // once; the holder releases (dropping the lapsed place, granting the lock to the head), the
    // second takes the grant up and releases.
    // The lasting place first: the line's keys then outlive the lapsing one's 1 ms (a place never
    // shortens them), so that the release has a lapsed place to drop however slow the round trips.
    const waiter = `${this.owner}w`;
    const busy = await acquire(`${this.owner}2`, waiter);
    expectReply('acquire (waiting)', busy[0] === 0, busy);
    const lapsing = await acquire(`${this.owner}3`, `${this.owner}v`, 1);
    expectReply('acquire (waiting)', lapsing[0] === 0, lapsing);
    await new Promise((resolve) => setTimeout(resolve, 5)); // past the first place's 1 ms
    const released = await release(this.owner);
    expectReply('release', Array.isArray(released) && released[0] === 1, released);
    const next = await acquire(`${this.owner}2`, waiter);
    expectReply('acquire (head of the line)', next[0] === 1, next);
    const releasedNext = await release(`${this.owner}2`);
    expectReply('release', Array.isArray(releasedNext), releasedNext);
    // Shared holds (readers, permits): two of at most two, renewed, checked and released.
    for (const shared of [`s${this.owner}1`, `s${this.owner}2`]) {
      const taken = (await this.bounded(
        ACQUIRE_SHARED_SCRIPT.run(
          this.client,
          [this.key, this.fence, ...this.line],
          [shared, lease, '', lease, sharded, 'access-check', 2],
        ),
      )) as [number, number];
      expectReply('acquire-shared', taken[0] === 1, taken);
    }
    const sharedRenewed = (await this.bounded(
      RENEW_SCRIPT.run(this.client, [this.key], [`s${this.owner}1`, -lease]),
    )) as number[];
    expectReply('renew (shared)', sharedRenewed[0] === 1, sharedRenewed);
    for (const shared of [`s${this.owner}1`, `s${this.owner}2`]) {
      const freed = await release(shared);
      expectReply('release (shared)', Array.isArray(freed) && freed[0] === 1, freed);
    }
    // The data-set marker that lets holders hear at once when Redis lost their locks (see
    // RedisLockStore.suspect): run on the probe's fencing counter, which exists, so it only reads.
    const marker = await this.bounded(EPOCH_SCRIPT.run(this.client, [this.fence], ['access-check']));
    expectReply('epoch', typeof marker === 'string', marker);
    // On a Cluster the release script falls back to PUBLISH when SPUBLISH fails, refused or not:
    // waiters elsewhere would then only poll. Ask for SPUBLISH itself (unknown before Redis 7).
    if (this.cluster) {
      // ioredis takes SPUBLISH's channel for a key, and puts the client's keyPrefix before it itself.
      await this.bounded((this.client as Cluster).spublish(this.key, 'access-check')).catch((error: unknown) => {
        if (!/unknown command/i.test(describeError(error))) throw error;
      });
    }

    await this.unsubscribe();
  }

  /** Listens on the probe's channel as the library does: on a Cluster, SSUBSCRIBE on the master of its slot. */
  private async subscribe(): Promise<void> {
    this.close();
    if (this.cluster) {
      const cluster = this.client as Cluster;
      const owner = cluster.slots[keySlot(this.channel)]?.[0];
      const node = cluster.nodes('master').find((n) => `${n.options.host}:${n.options.port}` === owner);
      if (node) {
        const connection = this.own(node.duplicate({ retryStrategy: () => null, lazyConnect: false, readOnly: false }));
        try {
          await this.bounded(connection.ssubscribe(this.channel));
          this.sharded = true;
          return;
        } catch (error) {
          // A Cluster of servers older than sharded pub/sub: the library listens with SUBSCRIBE.
          if (!/unknown command/i.test(describeError(error))) throw error;
          this.close();
        }
      }
    }
    this.sharded = false;
    await this.bounded(this.own(duplicateClient(this.client)).subscribe(this.channel));
  }

  private async unsubscribe(): Promise<void> {
    const connection = this.subscriber;
    if (!connection) return;
    if (this.sharded) await this.bounded((connection as Redis).sunsubscribe(this.channel));
    else await this.bounded(connection.unsubscribe(this.channel));
  }

  private own<T extends RedisClient>(connection: T): T {
    connection.on('error', () => undefined);
    this.subscriber = connection;
    return connection;
  }

  /**
   * Each command the library needs, on its own, on the probe keys: every refusal among them. Writes
   * only once DEL is known to work, and then only to keys it deletes again.
   */
  private async diagnose(): Promise<string[]> {
    const c = this.client;
    const owner = this.owner;
    const probes: (() => Promise<unknown>)[] = [
      () => c.evalsha('0000000000000000000000000000000000000000', 0),
      () => c.eval('return 1', 0),
      () => c.exists(this.key),
      () => c.hexists(this.key, owner),
      () => c.hget(this.key, owner),
      () => c.hgetall(this.key),
      () => c.hdel(this.key, owner), // on a key that does not exist: changes nothing
      () => c.type(this.key),
      () => c.pttl(this.key),
      () => c.pexpire(this.key, 1),
      () => c.get(this.fence),
      () => c.set(this.fence, '1', 'XX'), // only if it exists: makes nothing
      () => c.del(this.key, this.fence),
      () => c.time(),
      () => c.publish(this.channel, 'access-check'),
      () => c.zscore(this.line[0], owner),
      () => c.zrange(this.line[0], '0', '1'),
      () => c.zrangebyscore(this.line[1], '-inf', '0'),
      () => c.zremrangebyscore(this.line[1], '-inf', '0'),
      () => c.zrem(this.line[0], owner),
    ];
    if (this.cluster) probes.push(() => (c as Cluster).spublish(this.key, 'access-check'));
    if (this.delProven) {
      probes.push(async () => {
        await c.hset(this.key, owner, '1');
        await c.pexpire(this.key, 10_000);
      });
      probes.push(async () => {
        await c.zadd(this.line[0], 1, owner);
        await c.pexpire(this.line[0], 10_000);
      });
    }
    const results = await Promise.allSettled(probes.map((probe) => this.bounded(probe())));
    const found: string[] = [];
    for (const result of results) {
      if (result.status !== 'rejected') continue;
      const item = refusal(result.reason, this.clientPrefix() + this.key, this.channel);
      if (item !== undefined) found.push(item);
    }
    try {
      await this.subscribe();
      await this.unsubscribe();
    } catch (error) {
      const item = refusal(error, this.clientPrefix() + this.key, this.channel);
      if (item !== undefined) found.push(item);
    }
    // A script on a key it may not touch names no command; the keys it named are the probe's.
    if (found.some((item) => item.startsWith('key '))) found.push(`key "${this.clientPrefix() + this.fence}"`);
    return found;
  }

  /**
   * Deletes the probe keys once every command of the check has settled (a script that timed out may
   * still run, and its EVAL fallback go out, after a DEL sent now): awaited within the check's
   * time, and left to finish in the background after it.
   */
  private async cleanup(): Promise<void> {
    this.close(); // its pending SUBSCRIBE, if any, settles now
    if (!this.delProven) return;
    const deleting = Promise.allSettled([...this.inFlight]).then(() =>
      this.client.del(this.key, this.fence, ...this.line),
    );
    deleting.catch(() => undefined);
    if (this.remaining() <= 0) return;
    await this.bounded(deleting).catch(() => undefined);
  }

  private accessError(denied: readonly string[], cause: unknown): RedisAccessError {
    const rule = dislockAclRule(this.clientPrefix() + this.keyPrefix, { cluster: this.cluster });
    const user = this.options().username ?? 'default';
    const scripting = denied.includes('scripting (EVAL/EVALSHA)');
    const message = this.redact(
      `Redis refuses what nestjs-dislock needs under the key prefix "${this.clientPrefix() + this.keyPrefix}": ` +
        `${denied.join(', ')}. ` +
        (scripting
          ? 'Every lock operation is a Lua script: the server must allow EVAL and EVALSHA (not rename or disable them). '
          : '') +
        `Grant the library's Redis user this ACL rule` +
        (this.cluster ? ' on every node' : '') +
        `: ACL SETUSER ${user} ${rule}`,
    );
    return new RedisAccessError(denied, rule, message, { cause });
  }

  private options(): { password?: string | null; username?: string; keyPrefix?: string } {
    if (!isClusterClient(this.client)) {
      const { password, username, keyPrefix } = this.client.options;
      return { password, username, keyPrefix };
    }
    const { redisOptions, keyPrefix } = this.client.options;
    return { password: redisOptions?.password, username: redisOptions?.username, keyPrefix };
  }

  /** The client's own ioredis `keyPrefix`, which it puts before every key (and so every channel the scripts publish on). */
  private clientPrefix(): string {
    return this.options().keyPrefix ?? '';
  }

  private remaining(): number {
    return this.deadline - performance.now();
  }

  private bounded<T>(operation: Promise<T>): Promise<T> {
    this.inFlight.add(operation);
    const settled = (): void => void this.inFlight.delete(operation);
    operation.then(settled, settled);
    const remaining = this.remaining();
    const unreachable = this.unreachable;
    if (remaining <= 0 || unreachable?.aborted) {
      operation.catch(() => undefined);
      return Promise.reject(
        unreachable?.aborted
          ? (unreachable.reason as Error)
          : new CheckTimeout(`Redis did not answer within ${this.operationTimeout} ms`),
      );
    }
    let timer: NodeJS.Timeout | undefined;
    let stop: (() => void) | undefined;
    return Promise.race([
      operation,
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new CheckTimeout(`Redis did not answer within ${this.operationTimeout} ms`)),
          Math.ceil(remaining),
        );
        if (unreachable) {
          const abort = (): void => reject(unreachable.reason as Error);
          unreachable.addEventListener('abort', abort, { once: true });
          stop = () => unreachable.removeEventListener('abort', abort);
        }
      }),
    ]).finally(() => {
      clearTimeout(timer);
      stop?.();
    });
  }
}

function expectReply(script: string, ok: boolean, reply: unknown): void {
  if (!ok) throw new Error(`the ${script} script answered ${JSON.stringify(reply)} for the probe lock`);
}
