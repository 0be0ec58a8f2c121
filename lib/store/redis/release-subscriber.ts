import { Wakeable } from '../../core/wake-or-timeout';
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

/**
 * How long a channel stays subscribed after its last local waiter has gone. A contended lock is
 * waited for again and again: its next wait then needs no SUBSCRIBE, no UNSUBSCRIBE, and no
 * second attempt after subscribing (see `ReleaseWatch.listeningSince`).
 */
export const LINGER_MS = 1_000;

const now = (): number => performance.now();

/** An announcement as a watch hears it. */
interface Announcement {
  readonly at: number;
  readonly head: string;
  readonly second: string;
}

class Watch extends Wakeable implements ReleaseWatch {
  listening = false;
  listeningSince = Infinity;
  /** The look the second waiter of the line takes once the head's grant has passed. */
  private secondLook: NodeJS.Timeout | undefined;

  constructor(
    readonly channel: string,
    /** This process's waiting line for the lock: its id and whether it has a place in Redis's line. */
    private readonly place: LinePlace | undefined,
    private readonly grantMs: number,
    private readonly onClose: (watch: Watch) => void,
  ) {
    super();
  }

  override wake(): void {
    this.cancelSecondLook();
    super.wake();
  }

  /**
   * A release announced who heads the lock's line (and granted the lock to it, or named it to look
   * first): wake if it is this waiter's line, whose attempt then takes the grant up (or if nobody
   * waits in the line, or this waiter has no place in it, so only an attempt can give it one); the
   * waiter after the head looks once the head's turn has passed, in case the head is gone; everyone
   * else sleeps on.
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

  close(): void {
    this.cancelSecondLook();
    this.wakeWaiting();
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
  /** `performance.now()` once SUBSCRIBE was answered; Infinity until then, or when it failed. */
  listeningSince: number;
  /** The last announcement heard on the channel (or its connection coming back), for a watch that starts after it. */
  last: Announcement | undefined;
  /** Unsubscribes the channel once it has had no watch for LINGER_MS. */
  linger: NodeJS.Timeout | undefined;
}

/**
 * Hears lock releases over Redis pub/sub: the release script publishes on a channel named like the
 * lock key. The subscriber connections (one, or on a Cluster one per master that owns a watched
 * slot) are opened on the first wait and shared by every waiter; a key's channel is subscribed
 * while at least one local waiter watches it, and for LINGER_MS after the last one.
 */
export class ReleaseSubscriber {
  private connections: ReleaseChannels | undefined;
  private readonly channels = new Map<string, Channel>();
  private closed = false;
  private readonly events: ChannelEvents = {
    message: (channel, message) => {
      // `<store>:<sequence>:<head>:<second>:<token of the grant to the head>` (the token says a
      // grant was made; the head's attempt takes it up, so nothing here needs it)
      const [store, sequence, head = '', second = ''] = message.split(':');
      const id = `${store}:${sequence}`;
      if (this.echoes.isOwn(id) && !this.echoes.echoed(id)) return;
      this.heard(channel, head, second);
    },
    missed: (channels) => {
      // Every waiter re-checks now, so no announcement still on its way matters any more.
      this.echoes.reset();
      for (const channel of channels) this.heard(channel, '', '');
    },
    deaf: (channels, deaf) => {
      for (const name of channels) {
        const channel = this.channels.get(name);
        if (!channel) continue;
        // Deaf: its waiters poll. Listening again: releases are heard from now on (a wait started
        // later may skip its second attempt only for an attempt sent after this).
        channel.listeningSince = deaf ? Infinity : now();
        for (const watch of channel.watches) {
          watch.listening = !deaf;
          watch.listeningSince = channel.listeningSince;
        }
      }
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

  /**
   * Watch the releases of `key`; resolves once subscribed (or once subscribing has failed). An
   * announcement heard on a channel still subscribed since `since` is passed on to the new watch.
   */
  async watch(key: string, place?: LinePlace, since = Infinity): Promise<ReleaseWatch> {
    const channelName = this.channelOf(key);
    const watch = new Watch(channelName, place, this.grantMs, (closing) => this.unwatch(closing));
    let channel = this.channels.get(channelName);
    if (!channel) {
      const subscribing: Channel = {
        watches: new Set(),
        subscribed: this.subscribe(channelName).then((listening) => {
          if (listening) subscribing.listeningSince = now();
          return listening;
        }),
        listeningSince: Infinity,
        last: undefined,
        linger: undefined,
      };
      channel = subscribing;
      this.channels.set(channelName, channel);
    }
    clearTimeout(channel.linger);
    channel.linger = undefined;
    channel.watches.add(watch);
    const last = channel.last;
    if (last && last.at >= since) watch.heard(last.head, last.second);
    // Subscribed, and not deaf since (its slot moved, and the new owner has not confirmed it yet).
    watch.listening = (await channel.subscribed) && channel.listeningSince !== Infinity;
    watch.listeningSince = channel.listeningSince;
    return watch;
  }

  /** A release announced on `channel`, naming the first two waiters of the lock's line. */
  heard(channel: string, head: string, second: string): void {
    const listening = this.channels.get(channel);
    if (!listening) return;
    listening.last = { at: now(), head, second };
    for (const watch of listening.watches) watch.heard(head, second);
  }

  /** A release of `key` this process knows has run, without knowing who is next: wake every local watch. */
  wakeLocal(key: string): void {
    this.heard(this.channelOf(key), '', '');
  }

  /** Whether this subscriber listens on `key`'s channel (a local waiter watches it). */
  isWatching(key: string): boolean {
    return this.channels.has(this.channelOf(key));
  }

  /** Ends every wait and closes the subscriber connections. */
  close(): void {
    this.closed = true;
    for (const channel of this.channels.values()) {
      clearTimeout(channel.linger);
      for (const watch of channel.watches) watch.wake();
    }
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
    // Kept a while, unless subscribing failed: the next wait then tries to subscribe again.
    if (channel.listeningSince === Infinity || this.closed) return this.drop(watch.channel, channel);
    channel.linger = setTimeout(() => this.drop(watch.channel, channel), LINGER_MS);
    channel.linger.unref();
  }

  private drop(name: string, channel: Channel): void {
    if (channel.watches.size > 0 || this.channels.get(name) !== channel) return;
    clearTimeout(channel.linger);
    this.channels.delete(name);
    this.connections?.unsubscribe(name);
  }

  private open(): ReleaseChannels {
    if (this.connections) return this.connections;
    this.connections = isClusterClient(this.source)
      ? new ShardedChannels(this.source, this.bounded, this.events)
      : new SingleConnectionChannels(duplicateClient(this.source), this.bounded, this.events);
    return this.connections;
  }
}
