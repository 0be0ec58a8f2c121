import { wakeOrTimeout } from '../../core/wake-or-timeout';
import type { ReleaseWatch } from '../lock-store.interface';
import { duplicateClient, isClusterClient, type RedisClient } from './redis-client';
import {
  type ChannelEvents,
  type ReleaseChannels,
  ShardedChannels,
  SingleConnectionChannels,
} from './release-channels';
import type { ReleaseEchoes } from './release-echoes';

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
 * lock key. The subscriber connections (one, or on a Cluster one per master that owns a watched
 * slot) are opened on the first wait and shared by every waiter; a key's channel is subscribed
 * while at least one local waiter watches it.
 */
export class ReleaseSubscriber {
  private connections: ReleaseChannels | undefined;
  private readonly channels = new Map<string, Channel>();
  private closed = false;
  private readonly events: ChannelEvents = {
    message: (channel, message) => {
      if (this.echoes.isOwn(message) && !this.echoes.echoed(message)) return;
      this.wakeChannel(channel);
    },
    missed: (channels) => {
      // Every waiter re-checks now, so no announcement still on its way matters any more.
      this.echoes.reset();
      for (const channel of channels) this.wakeChannel(channel);
    },
  };

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

  /** Ends every wait and closes the subscriber connections. */
  close(): void {
    this.closed = true;
    for (const channel of this.channels.values()) for (const watch of channel.watches) watch.wake();
    this.channels.clear();
    this.connections?.close();
    this.connections = undefined;
  }

  /** A client with an ioredis keyPrefix prefixes the script's keys, and so the published channel. */
  private channelOf(key: string): string {
    return ((this.source as { options?: { keyPrefix?: string } }).options?.keyPrefix ?? '') + key;
  }

  private async subscribe(channel: string): Promise<boolean> {
    if (this.closed) return false;
    try {
      await this.open().subscribe(channel);
      return true;
    } catch {
      return false; // waiters poll instead; the channel is subscribed again once the connection is back
    }
  }

  private unwatch(watch: Watch): void {
    const channel = this.channels.get(watch.channel);
    if (!channel?.watches.delete(watch) || channel.watches.size > 0) return;
    this.channels.delete(watch.channel);
    this.connections?.unsubscribe(watch.channel);
  }

  private wakeChannel(channel: string): void {
    const watches = this.channels.get(channel)?.watches;
    if (watches) for (const watch of watches) watch.wake();
  }

  private open(): ReleaseChannels {
    if (this.connections) return this.connections;
    this.connections = isClusterClient(this.source)
      ? new ShardedChannels(this.source, this.bounded, this.events)
      : new SingleConnectionChannels(duplicateClient(this.source), this.bounded, this.events);
    return this.connections;
  }
}
