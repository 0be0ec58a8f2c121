import type { Logger } from '@nestjs/common';
import type { Redis } from 'ioredis';
import type { RedlockNode as RedlockNodeOption } from '../../options/dislock.options';
import { connectRedis } from '../redis/redis-client';
import { RedisLockStore } from '../redis/redis-lock.store';

/** `host:port` of a client (or its socket path), for messages and logs: never its credentials. */
export function nodeLabel(client: Redis): string {
  const options = client.options;
  if (options.path) return options.path;
  return `${options.host ?? 'localhost'}:${options.port ?? 6379}`;
}

/** The connection of a node is down: why, as its client last reported it. */
export class NodeDownError extends Error {
  constructor(readonly why: Error) {
    super(`not connected (${why.message})`);
    this.name = 'NodeDownError';
  }
}

/**
 * One independent master of a Redlock set: a `RedisLockStore` on its own client, and whether that
 * client is known to be down. A node is down from its client's first connection error until it is
 * ready again; operations skip it then (it counts as failed at once, so that a majority down fails
 * fast instead of after `operationTimeout`), and an operation already waiting for it is counted
 * as failed the moment it goes down.
 */
export class RedlockNodeConnection {
  readonly store: RedisLockStore;
  readonly label: string;
  private readonly client: Redis;
  private downError: NodeDownError | undefined;
  private readonly downListeners = new Set<(error: NodeDownError) => void>();
  private readonly onError = (error: Error): void => {
    this.downError = new NodeDownError(error);
    for (const listener of [...this.downListeners]) listener(this.downError);
  };
  private readonly onReady = (): void => void (this.downError = undefined);

  constructor(
    node: RedlockNodeOption,
    operationTimeout: number,
    keyPrefix: string,
    logger: Logger,
    whenDisconnected: 'fail' | 'wait' = 'fail',
  ) {
    const { client, owned } = connectRedis(node, logger);
    // checkRedlock refuses a Cluster for a node: every node is a plain Redis client.
    this.client = client as Redis;
    this.label = nodeLabel(this.client);
    // Redlock's waiters keep no place in a line: every release is announced for them.
    this.store = new RedisLockStore(client, owned, operationTimeout, keyPrefix, undefined, whenDisconnected, true);
    this.client.on('error', this.onError);
    this.client.on('ready', this.onReady);
  }

  /** Why the node is down, or `undefined` while it is (or may be) up. */
  get down(): NodeDownError | undefined {
    return this.downError;
  }

  /**
   * `pending`, an operation sent to this node, as a promise that also fails as soon as the node
   * goes down while it waits (the operation itself may still run later, once the client has
   * reconnected and re-sent it). Check `down` before sending: a node known to be down is skipped.
   */
  watchDown<T>(pending: Promise<T>): Promise<T> {
    if (this.downError) return Promise.reject(this.downError);
    return new Promise<T>((resolve, reject) => {
      const fail = (error: NodeDownError): void => {
        this.downListeners.delete(fail);
        reject(error);
      };
      this.downListeners.add(fail);
      pending.then(
        (value) => {
          this.downListeners.delete(fail);
          resolve(value);
        },
        (error: unknown) => {
          this.downListeners.delete(fail);
          reject(error instanceof Error ? error : new Error(String(error)));
        },
      );
    });
  }

  /** `operation` sent to this node unless it is down (then it fails at once), and `watchDown` on it. */
  ask<T>(operation: () => Promise<T>): Promise<T> {
    return this.downError ? Promise.reject(this.downError) : this.watchDown(operation());
  }

  async close(): Promise<void> {
    this.client.off('error', this.onError);
    this.client.off('ready', this.onReady);
    for (const listener of [...this.downListeners]) listener(new NodeDownError(new Error('the store is closing')));
    await this.store.close();
  }
}
