import { wakeOrTimeout } from '../../core/wake-or-timeout';
import type { LinePlace, ReleaseWatch } from '../lock-store.interface';
import { duplicateClient, isClusterClient, type RedisClient } from './redis-client';
import {
  type ChannelEvents,
  type ReleaseChannels,
  ShardedChannels,
  SingleConnectionChannels,
} from './release-channels';
import type { ReleaseEchoes } from './release-echoes';

/** How much later than the head's grant the waiter after it looks, in case the head is gone. */
const SECOND_LOOK_SLACK_MS = 20;

class Watch implements ReleaseWatch {
  listening = false;
  private pending = false;
  private wakeUp: (() => void) | undefined;
  /** The look the second waiter of the line takes once the head's grant has passed. */
  private secondLook: NodeJS.Timeout | undefined;

  constructor(
    readonly channel: string,
    /** This process's waiting line for the lock: its id and whether it has a place in Redis's line. */
    private readonly place: LinePlace | undefined,
    private readonly grantMs: number,
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
    this.cancelSecondLook();
    if (this.wakeUp) this.wakeUp();
    else this.pending = true;
  }

  /**
   * A release announced who heads the lock's line: wake if it is this waiter (or nobody waits in
   * the line, or this waiter has no place in it, so only an attempt can give it one); the waiter after the head looks once the head's
   * grant has passed, in case the head is gone; everyone else sleeps on.
   */
  heard(head: string, second: string): void {
    const place = this.place;
    if (!place?.inLine || head === '' || head === place.id) {
      this.wake();
      return;
    }
    if (second !== place.id || this.secondLook) return;
    this.secondLook = setTimeout(() => {
      this.secondLook = undefined;
      this.wake();
    }, this.grantMs + SECOND_LOOK_SLACK_MS);
    this.secondLook.unref();
  }

  /** The head took the lock: no need to look in its place. */
  taken(): void {
    this.cancelSecondLook();
  }

  close(): void {
    this.cancelSecondLook();
    this.wakeUp?.();
    this.onClose(this);
  }

  private cancelSecondLook(): void {
    clearTimeout(this.secondLook);
    this.secondLook = undefined;
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
      // `taken::<waiter>` (the head took the lock) or `<store>:<sequence>:<head>:<second>`.
      const [store, sequence, head = '', second = ''] = message.split(':');
      if (store === 'taken') {
        for (const watch of this.channels.get(channel)?.watches ?? []) watch.taken();
        return;
      }
      const id = `${store}:${sequence}`;
      if (this.echoes.isOwn(id) && !this.echoes.echoed(id)) return;
      this.heard(channel, head, second);
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
    /** How long the head of a line has to take a lock announced free (see the release script). */
    private readonly grantMs: number,
  ) {}

  /** Watch the releases of `key`; resolves once subscribed (or once subscribing has failed). */
  async watch(key: string, place?: LinePlace): Promise<ReleaseWatch> {
    const channelName = this.channelOf(key);
    const watch = new Watch(channelName, place, this.grantMs, (closing) => this.unwatch(closing));
    let channel = this.channels.get(channelName);
    if (!channel) {
      channel = { watches: new Set(), subscribed: this.subscribe(channelName) };
      this.channels.set(channelName, channel);
    }
    channel.watches.add(watch);
    watch.listening = await channel.subscribed;
    return watch;
  }

  /** A release announced on `channel`, naming the first two waiters of the lock's line. */
  heard(channel: string, head: string, second: string): void {
    for (const watch of this.channels.get(channel)?.watches ?? []) watch.heard(head, second);
  }

  /** A release of `key` this process knows has run, without knowing who is next: wake every local watch. */
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
  channelOf(key: string): string {
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
