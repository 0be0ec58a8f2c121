import { type Cluster, Redis } from 'ioredis';
import { keySlot } from './fence-key';
import { duplicateClient, reconnectDelay, type RedisClient } from './redis-client';

/** What a set of subscriber connections reports to the `ReleaseSubscriber` that owns it. */
export interface ChannelEvents {
  /** An announcement on a subscribed channel. */
  message(channel: string, message: string): void;
  /**
   * Channels whose announcements may have been missed (their connection dropped, or their slot
   * moved to another node); they are subscribed again by the time this is called.
   */
  missed(channels: readonly string[]): void;
  /**
   * Channels that are not listened to for now (Redis refused or did not confirm their subscription
   * on the node that owns them: their waiters must poll), or listened to again (once Redis has
   * confirmed it; `missed` follows).
   */
  deaf(channels: readonly string[], deaf: boolean): void;
}

/** `channels` by hash slot: one SSUBSCRIBE may name the channels of one slot only (CROSSSLOT). */
function bySlot(channels: readonly string[]): string[][] {
  const slots = new Map<number, string[]>();
  for (const channel of channels) {
    const slot = keySlot(channel);
    const group = slots.get(slot);
    if (group) group.push(channel);
    else slots.set(slot, [channel]);
  }
  return [...slots.values()];
}

/** The first retry of a subscription Redis refused comes this long after; later ones double, up to a second. */
const FIRST_RETRY_MS = 50;
const LAST_RETRY_MS = 1_000;

/** Where the release channels are listened to: one connection, or one per Cluster node. */
export interface ReleaseChannels {
  /** Subscribe; resolves once Redis has confirmed, rejects when it refused or did not answer in time. */
  subscribe(channel: string): Promise<void>;
  unsubscribe(channel: string): void;
  close(): void;
}

type Bounded = (operation: Promise<unknown>) => Promise<unknown>;

/**
 * How a subscriber connection made from one of a Cluster's nodes differs from that node: it
 * connects now and reconnects by itself (the Cluster's node connections leave both to the
 * Cluster), talks to a master, and adds no keyPrefix (channels arrive with the client's keyPrefix
 * already in them, as the release script's key does).
 */
const SUBSCRIBER_OPTIONS = { retryStrategy: reconnectDelay, lazyConnect: false, readOnly: false, keyPrefix: '' };

/**
 * Classic pub/sub on one connection (SUBSCRIBE): a single server, a Sentinel-managed master, or a
 * Cluster whose servers predate sharded pub/sub (PUBLISH reaches every node there).
 */
export class SingleConnectionChannels implements ReleaseChannels {
  private readonly channels = new Set<string>();

  constructor(
    private readonly connection: RedisClient,
    private readonly bounded: Bounded,
    private readonly events: ChannelEvents,
  ) {
    // Connection errors are reported by the store's own client; a lost subscription only slows
    // waiters down to their lease-bounded timers until ioredis reconnects.
    connection.on('error', () => undefined);
    connection.on('message', (channel: string, message: string) => events.message(channel, message));
    let connectedBefore = false;
    connection.on('ready', () => {
      if (connectedBefore) void this.resubscribed();
      connectedBefore = true;
    });
  }

  async subscribe(channel: string): Promise<void> {
    this.channels.add(channel);
    await this.bounded(this.connection.subscribe(channel));
  }

  unsubscribe(channel: string): void {
    this.channels.delete(channel);
    this.connection.unsubscribe(channel).catch(() => undefined);
  }

  close(): void {
    this.channels.clear();
    this.connection.disconnect();
  }

  /**
   * The connection came back after a drop. ioredis subscribes again by itself, but releases
   * announced while it was away were not heard: once subscribed again (so that none after this is
   * missed either), report every channel.
   */
  private async resubscribed(): Promise<void> {
    const channels = [...this.channels];
    if (channels.length === 0) return;
    await this.bounded(this.connection.subscribe(...channels)).catch(() => undefined);
    this.events.missed(channels);
  }
}

/** One subscriber connection to one Cluster master, and the channels it listens to. */
interface NodeSubscriber {
  readonly connection: Redis;
  readonly channels: Set<string>;
}

/**
 * Sharded pub/sub on a Redis Cluster (SSUBSCRIBE, Redis >= 7): each channel is listened to on the
 * master that owns its slot, where the release script's SPUBLISH runs, so an announcement stays in
 * its shard and SPUBLISH's count tells the releasing process whether anyone, in any process, waits.
 *
 * The connections are made from the nodes the Cluster client knows now (not from its seed list,
 * which may be long gone), and move with the slots: when the client refreshes its slot map (after
 * a failover, a MOVED, a resharding), every channel whose owner changed is subscribed on the new
 * owner and reported as missed. A server without SSUBSCRIBE switches the whole set to classic
 * pub/sub on one node (the release script falls back to PUBLISH there too).
 */
export class ShardedChannels implements ReleaseChannels {
  private readonly nodes = new Map<string, NodeSubscriber>();
  /** The node each channel is subscribed on. */
  private readonly placed = new Map<string, string>();
  private classic: SingleConnectionChannels | undefined;
  private closed = false;

  constructor(
    private readonly cluster: Cluster,
    private readonly bounded: Bounded,
    private readonly events: ChannelEvents,
  ) {
    cluster.on('refresh', this.reroute);
  }

  async subscribe(channel: string): Promise<void> {
    if (this.classic) return this.classic.subscribe(channel);
    const nodeKey = this.ownerOf(channel) ?? (await this.slotMap(channel));
    const node = this.place(channel, nodeKey);
    try {
      await this.bounded(node.connection.ssubscribe(channel));
    } catch (error) {
      if (!(error instanceof Error) || !/unknown command/i.test(error.message)) throw error;
      this.toClassic();
      return this.subscribe(channel);
    }
  }

  unsubscribe(channel: string): void {
    if (this.classic) return this.classic.unsubscribe(channel);
    const nodeKey = this.placed.get(channel);
    this.placed.delete(channel);
    const node = nodeKey === undefined ? undefined : this.nodes.get(nodeKey);
    if (!node || nodeKey === undefined) return;
    node.channels.delete(channel);
    if (node.channels.size === 0) this.drop(nodeKey);
    else node.connection.sunsubscribe(channel).catch(() => undefined);
  }

  close(): void {
    this.closed = true;
    this.cluster.off('refresh', this.reroute);
    for (const nodeKey of [...this.nodes.keys()]) this.drop(nodeKey);
    this.placed.clear();
    this.classic?.close();
  }

  /** The master serving `channel`'s slot, as the client's slot map says (`host:port`). */
  private ownerOf(channel: string): string | undefined {
    return this.cluster.slots[keySlot(channel)]?.[0];
  }

  /** The slot map is not loaded yet (the client is still connecting): wait for it, within the bound. */
  private async slotMap(channel: string): Promise<string> {
    await this.bounded(
      new Promise<void>((resolve) => {
        const loaded = (): void => {
          this.cluster.off('refresh', loaded);
          resolve();
        };
        this.cluster.on('refresh', loaded);
        if (this.ownerOf(channel) !== undefined) loaded();
      }),
    );
    const nodeKey = this.ownerOf(channel);
    if (nodeKey === undefined) throw new Error(`The Cluster has no node for the slot of "${channel}"`);
    return nodeKey;
  }

  private place(channel: string, nodeKey: string): NodeSubscriber {
    const previous = this.placed.get(channel);
    if (previous !== undefined && previous !== nodeKey) {
      const old = this.nodes.get(previous);
      old?.channels.delete(channel);
      if (old && old.channels.size === 0) this.drop(previous);
      else old?.connection.sunsubscribe(channel).catch(() => undefined);
    }
    const node = this.nodes.get(nodeKey) ?? this.open(nodeKey);
    node.channels.add(channel);
    this.placed.set(channel, nodeKey);
    return node;
  }

  private open(nodeKey: string): NodeSubscriber {
    const [host, port] = splitNodeKey(nodeKey);
    // The Cluster's own node connections leave reconnecting to the Cluster (no retryStrategy);
    // this one reconnects by itself, until the slot map moves its channels elsewhere. It does not
    // re-subscribe by itself (`resubscribed` does, slot by slot, each answer checked): ioredis would
    // send SSUBSCRIBE for every channel it had, unawaited, and one whose slot moved meanwhile is
    // answered MOVED, an unhandled rejection in the application (seen in the randomized history).
    const override = { ...SUBSCRIBER_OPTIONS, autoResubscribe: false, host, port };
    const template =
      this.cluster.nodes().find((known) => `${known.options.host}:${known.options.port}` === nodeKey) ??
      this.cluster.nodes()[0];
    const connection = template
      ? template.duplicate(override)
      : new Redis({ ...this.cluster.options.redisOptions, ...override });
    const node: NodeSubscriber = { connection, channels: new Set() };
    connection.on('error', () => undefined);
    connection.on('smessage', (channel: string, message: string) => this.events.message(channel, message));
    let connectedBefore = false;
    connection.on('ready', () => {
      if (connectedBefore) this.resubscribed(nodeKey, node);
      connectedBefore = true;
    });
    // A dropped node connection may mean a failover: have the client look at the slot map again.
    connection.on('close', () => {
      if (!this.closed && this.nodes.get(nodeKey) === node) this.cluster.refreshSlotsCache();
    });
    this.nodes.set(nodeKey, node);
    return node;
  }

  private drop(nodeKey: string): void {
    const node = this.nodes.get(nodeKey);
    this.nodes.delete(nodeKey);
    node?.connection.disconnect();
  }

  /** A node connection came back: subscribe its channels again, slot by slot, then report them. */
  private resubscribed(nodeKey: string, node: NodeSubscriber): void {
    for (const channels of bySlot([...node.channels])) void this.listen(nodeKey, node, channels);
  }

  /** The client's slot map changed: move each channel whose slot has a new owner, and listen there. */
  private readonly reroute = (): void => {
    if (this.closed || this.classic) return;
    const moved = new Map<string, string[]>();
    for (const [channel, nodeKey] of this.placed) {
      const owner = this.ownerOf(channel);
      if (owner === undefined || owner === nodeKey) continue;
      this.place(channel, owner);
      moved.set(owner, [...(moved.get(owner) ?? []), channel]);
    }
    for (const [nodeKey, channels] of moved) {
      const node = this.nodes.get(nodeKey);
      if (node) for (const group of bySlot(channels)) void this.listen(nodeKey, node, group);
    }
  };

  /**
   * Subscribe `channels` (of one slot) on `node`, which has just become theirs (a reconnection,
   * a slot moved), and report them missed once Redis has confirmed it. Until then they count as
   * deaf (their waiters poll); a refusal or no answer is retried while they are still placed on
   * that node.
   */
  private async listen(nodeKey: string, node: NodeSubscriber, channels: readonly string[], delay = 0): Promise<void> {
    const current = (): string[] =>
      this.closed || this.nodes.get(nodeKey) !== node
        ? []
        : channels.filter((channel) => this.placed.get(channel) === nodeKey);
    if (delay > 0) await pause(delay);
    const wanted = current();
    if (wanted.length === 0) return;
    this.events.deaf(wanted, true);
    try {
      await this.bounded(node.connection.ssubscribe(...wanted));
    } catch {
      void this.listen(nodeKey, node, wanted, Math.min(Math.max(delay * 2, FIRST_RETRY_MS), LAST_RETRY_MS));
      return;
    }
    const confirmed = current();
    if (confirmed.length === 0) return;
    this.events.deaf(confirmed, false);
    this.events.missed(confirmed);
  }

  /** The servers predate sharded pub/sub: one classic subscriber on a node the client knows. */
  private toClassic(): void {
    for (const nodeKey of [...this.nodes.keys()]) this.drop(nodeKey);
    const channels = [...this.placed.keys()];
    this.placed.clear();
    const node = this.cluster.nodes('master')[0];
    const connection = node ? node.duplicate(SUBSCRIBER_OPTIONS) : duplicateClient(this.cluster);
    this.classic = new SingleConnectionChannels(connection, this.bounded, this.events);
    for (const channel of channels) void this.classic.subscribe(channel).catch(() => undefined);
  }
}

const pause = (ms: number): Promise<void> =>
  new Promise((resolve) => {
    setTimeout(resolve, ms).unref();
  });

function splitNodeKey(nodeKey: string): [string, number] {
  const colon = nodeKey.lastIndexOf(':');
  return [nodeKey.slice(0, colon), Number(nodeKey.slice(colon + 1))];
}
