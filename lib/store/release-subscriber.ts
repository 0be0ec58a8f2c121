import { wakeOrTimeout } from '../core/wake-or-timeout';
import { duplicateClient, type RedisClient } from './redis-client';
import type { ReleaseEchoes } from './release-echoes';

/** One waiter's interest in the releases of one lock key. */
export interface ReleaseWatch {
  /**
   * Whether releases of the key are heard. `false` when subscribing failed (Redis unreachable):
   * the waiter must then poll instead of relying on a wake-up.
   */
  readonly listening: boolean;
  /**
   * Resolves at the next release heard since the previous call (at once if one came in between),
   * after `maxWaitMs`, or when `signal` aborts. Never rejects.
   */
  wait(maxWaitMs: number, signal: AbortSignal): Promise<void>;
  /** A release seen locally (this process freed the lock): wake the wait as a message would. */
  wake(): void;
  /** Stop listening; the channel is unsubscribed when the last watch of the key closes. */
  close(): void;
}

class Watch implements ReleaseWatch {
  listening = false;
  private pending = false;
  private wakeUp: (() => void) | undefined;

  constructor(
    readonly channel: string,
    private readonly onClose: (watch: Watch) => void,
  ) {}

  async wait(maxWaitMs: number, signal: AbortSignal): Promise<void> {
    if (this.pending || signal.aborted) {
      this.pending = false;
      return;
    }
    await wakeOrTimeout(Math.max(1, maxWaitMs), signal, (wake) => {
      this.wakeUp = wake;
      return () => (this.wakeUp = undefined); // a wake from now on is kept as pending
    });
  }

  wake(): void {
    if (this.wakeUp) this.wakeUp();
    else this.pending = true;
  }

  close(): void {
    this.wakeUp?.();
    this.onClose(this);
  }
}

interface Channel {
  readonly watches: Set<Watch>;
  /** Settles once SUBSCRIBE was answered: `true` when listening. */
  readonly subscribed: Promise<boolean>;
}

/**
 * Hears lock releases over Redis pub/sub: the release script publishes on a channel named like the
 * lock key. One subscriber connection per store, opened on the first wait and shared by every
 * waiter; a key's channel is subscribed while at least one local waiter watches it.
 */
export class ReleaseSubscriber {
  private connection: RedisClient | undefined;
  private readonly channels = new Map<string, Channel>();
  private closed = false;

  constructor(
    private readonly source: RedisClient,
    /** The store's bound on a Redis round trip: rejects once it takes longer than `operationTimeout`. */
    private readonly bounded: (operation: Promise<unknown>) => Promise<unknown>,
    /** Tells which of this store's own announcements still need to wake anyone. */
    private readonly echoes: ReleaseEchoes,
  ) {}

  /** Watch the releases of `key`; resolves once subscribed (or once subscribing has failed). */
  async watch(key: string): Promise<ReleaseWatch> {
    const channelName = this.channelOf(key);
    const watch = new Watch(channelName, (closing) => this.unwatch(closing));
    let channel = this.channels.get(channelName);
    if (!channel) {
      channel = { watches: new Set(), subscribed: this.subscribe(channelName) };
      this.channels.set(channelName, channel);
    }
    channel.watches.add(watch);
    watch.listening = await channel.subscribed;
    return watch;
  }

  /** A release of `key` this process knows has run: wake its local watches as a message would. */
  wakeLocal(key: string): void {
    this.wakeChannel(this.channelOf(key));
  }

  /** Whether this subscriber listens on `key`'s channel (a local waiter watches it). */
  isWatching(key: string): boolean {
    return this.channels.has(this.channelOf(key));
  }

  /** Ends every wait and closes the subscriber connection. */
  close(): void {
    this.closed = true;
    for (const channel of this.channels.values()) for (const watch of channel.watches) watch.wake();
    this.channels.clear();
    this.connection?.disconnect();
    this.connection = undefined;
  }

  /** A client with an ioredis keyPrefix prefixes the script's keys, and so the published channel. */
  private channelOf(key: string): string {
    return ((this.source as { options?: { keyPrefix?: string } }).options?.keyPrefix ?? '') + key;
  }

  private async subscribe(channel: string): Promise<boolean> {
    if (this.closed) return false;
    try {
      await this.bounded(this.open().subscribe(channel));
      return true;
    } catch {
      return false; // waiters poll instead; ioredis resubscribes once it reconnects
    }
  }

  private unwatch(watch: Watch): void {
    const channel = this.channels.get(watch.channel);
    if (!channel?.watches.delete(watch) || channel.watches.size > 0) return;
    this.channels.delete(watch.channel);
    this.connection?.unsubscribe(watch.channel).catch(() => undefined);
  }

  private wakeChannel(channel: string): void {
    const watches = this.channels.get(channel)?.watches;
    if (watches) for (const watch of watches) watch.wake();
  }

  private open(): RedisClient {
    if (this.connection) return this.connection;
    const connection = duplicateClient(this.source);
    // Connection errors are reported by the main client; a lost subscription only slows waiters
    // down to their lease-bounded timers until ioredis reconnects and resubscribes.
    connection.on('error', () => undefined);
    connection.on('message', (channel: string, message: string) => {
      if (this.echoes.isOwn(message) && !this.echoes.echoed(message)) return;
      this.wakeChannel(channel);
    });
    let connectedBefore = false;
    connection.on('ready', () => {
      if (connectedBefore) void this.resubscribed(connection);
      connectedBefore = true;
    });
    this.connection = connection;
    return connection;
  }

  /**
   * The connection came back after a drop. ioredis subscribes again by itself, but releases
   * announced while it was away were not heard: once subscribed again (so that none after this is
   * missed either), wake every watch, so that each waiting line asks Redis at once.
   */
  private async resubscribed(connection: RedisClient): Promise<void> {
    const channels = [...this.channels.keys()];
    if (channels.length > 0) await this.bounded(connection.subscribe(...channels)).catch(() => undefined);
    if (this.connection !== connection) return;
    this.echoes.reset();
    for (const channel of this.channels.keys()) this.wakeChannel(channel);
  }
}
