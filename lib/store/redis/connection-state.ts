import { StoreDisconnectedError } from '../store-errors';
import type { RedisClient } from './redis-client';

const CONNECTED_OR_SETTLED: ReadonlySet<string> = new Set(['ready', 'end', 'wait', 'monitoring']);

/**
 * Whether a client is known to be cut off from Redis, so that an operation can fail at once
 * instead of waiting in ioredis's offline queue for `operationTimeout` (see `whenDisconnected`).
 *
 * Known down: the client is not `ready` (a Cluster client: the Cluster as a whole, not one of its
 * nodes), and since it last was, a connection attempt has failed. Two ways to tell, by what the
 * client lets the store listen to:
 *
 * - A client the store created, or the application's own client that already has an `'error'`
 *   listener: an `'error'` event (a refused connection, a wrong password, a certificate that does
 *   not verify, every Cluster node or Sentinel unreachable). A drop without one (the server closed
 *   the connection) is not enough: the reconnection, 50 ms later, may well succeed, and the
 *   operations queued meanwhile then go through.
 * - The application's own client without an `'error'` listener (one added by the library would
 *   silence ioredis's "Unhandled error event" print, which the application may rely on): a
 *   connection that closed without having become ready since the previous close (an attempt that
 *   failed, also one that connected to a replica where a master was expected, behind Sentinel).
 */
export class ConnectionState {
  /** Set by an error (or a failed attempt) since the client was last ready. */
  private failure: Error | undefined;
  /** Whether the client became ready since its connection last closed. */
  private readySinceClose: boolean;
  private readonly downListeners = new Set<(error: StoreDisconnectedError) => void>();
  private readonly listensToErrors: boolean;

  private readonly onError = (error: Error): void => {
    this.failure = error;
    this.notify();
  };

  private readonly onReady = (): void => {
    this.failure = undefined;
    this.readySinceClose = true;
  };

  private readonly onClose = (): void => {
    if (!this.listensToErrors && !this.readySinceClose) {
      this.failure = new Error('a connection attempt failed (the client has no error listener to say why)');
    }
    this.readySinceClose = false;
    this.notify(); // an error while ready (a reset connection) counts from the close on
  };

  constructor(
    private readonly client: RedisClient,
    /** Whether the store created the client: it then listens to its errors in any case. */
    owned: boolean,
  ) {
    this.listensToErrors = owned || client.listenerCount('error') > 0;
    this.readySinceClose = client.status === 'ready';
    // Handed over while reconnecting: an attempt has failed, or the connection has just dropped
    // (the next attempt then clears this in a moment).
    if (client.status === 'reconnecting' || client.status === 'close') {
      this.failure = new Error(`the client was ${client.status} when the lock module started`);
    }
    if (this.listensToErrors) client.on('error', this.onError);
    client.on('ready', this.onReady).on('close', this.onClose);
  }

  /**
   * Why the client is known to be cut off from Redis (a `StoreDisconnectedError` whose `cause` is
   * the connection error), or `undefined` while it is connected or may connect any moment.
   */
  get down(): StoreDisconnectedError | undefined {
    if (this.failure === undefined || !this.disconnected()) return undefined;
    return new StoreDisconnectedError(this.failure);
  }

  /** The connection error last seen while not ready (for a timeout to say why), if any. */
  get lastError(): Error | undefined {
    return this.failure;
  }

  /** An AbortSignal that aborts (with the `StoreDisconnectedError`) once the client is known down; `stop` when done. */
  downSignal(): { signal: AbortSignal; stop: () => void } {
    const controller = new AbortController();
    const down = this.down;
    if (down) {
      controller.abort(down);
      return { signal: controller.signal, stop: () => undefined };
    }
    const listener = (error: StoreDisconnectedError): void => controller.abort(error);
    this.downListeners.add(listener);
    return { signal: controller.signal, stop: () => void this.downListeners.delete(listener) };
  }

  close(): void {
    this.downListeners.clear();
    if (this.listensToErrors) this.client.off('error', this.onError);
    this.client.off('ready', this.onReady).off('close', this.onClose);
  }

  /**
   * Not connected, and not in a state where ioredis answers by itself: `end` (closed for good) and
   * `monitoring` reject every command at once, `wait` (lazyConnect) connects on the first one.
   */
  private disconnected(): boolean {
    return !CONNECTED_OR_SETTLED.has(this.client.status);
  }

  private notify(): void {
    const down = this.down;
    if (!down) return;
    for (const listener of [...this.downListeners]) listener(down);
  }
}
