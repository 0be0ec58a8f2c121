import type { Logger } from '@nestjs/common';
import { describeError } from '../errors/describe-error';
import type { LockLostReason } from '../errors';

/** How a lock is held: exclusively (a plain lock, a writer), for reading, or as a semaphore's permit. */
export type LockHoldKind = 'exclusive' | 'read' | 'permit';

/** What every lock event says: which lock, and when (`Date.now()`). */
interface LockEventBase {
  /** The lock name, without the key prefix. */
  readonly name: string;
  /** The store key: prefix + name. */
  readonly key: string;
  readonly kind: LockHoldKind;
  /** The lock's `label` (a `@DisLock` key template, or what a `LockService` call passed). */
  readonly label: string | undefined;
  readonly at: number;
}

/** Which lock an event is about (every event's fields but its type, time and payload). */
export type LockEventSubject = Omit<LockEventBase, 'at'>;

/** What each lock event carries besides its `type` and the base. */
export interface LockEventPayloads {
  /** A lock was taken (or re-entered), after `waitedMs` (0: at once; the acquisition's whole time). */
  acquired: {
    readonly owner: string;
    readonly fencingToken: number;
    readonly reentrant: boolean;
    /** Whether it had to wait (a `waiting` event came first). */
    readonly waited: boolean;
    readonly waitedMs: number;
  };
  /** A caller found the lock busy and starts waiting for it (`waitTime` > 0). */
  waiting: { readonly waitTime: number };
  /** A caller did not get the lock: still busy after `waitedMs`, or its wait was cancelled. */
  busy: { readonly waited: boolean; readonly waitedMs: number };
  /** The watchdog renewed the lease, `lagMs` after the renewal was due. */
  renewed: { readonly owner: string; readonly lagMs: number };
  /** A renewal could not be made (Redis did not answer or failed); it is retried within the lease. */
  'renewal-failed': { readonly owner: string; readonly error: unknown };
  /** A held lock was lost (see `LockLostError`); also at shutdown (`reason: 'shutdown'`). */
  lost: { readonly owner: string; readonly reason: LockLostReason };
  /** The lock was released, freeing it, `heldMs` after it was taken. */
  released: { readonly owner: string; readonly heldMs: number };
}

export type LockEventType = keyof LockEventPayloads;

/** One lock event; `LockEvent<'acquired'>` for one type. */
export type LockEvent<T extends LockEventType = LockEventType> = {
  [K in T]: LockEventBase & { readonly type: K } & LockEventPayloads[K];
}[T];

export type LockEventListener<T extends LockEventType = LockEventType> = (event: LockEvent<T>) => void;

/**
 * The lock events of one `LockService` (never shared between applications). Listeners run
 * synchronously where the event happens; one that throws is logged and never disturbs the lock.
 * With no listener for a type, emitting it costs one lookup: callers check `listens` before
 * building an event.
 */
export class LockEvents {
  private readonly listeners = new Map<LockEventType, Set<LockEventListener>>();
  private readonly heldListeners = new Set<(delta: number, lock: LockEventSubject) => void>();

  constructor(private readonly logger: Logger) {}

  /** Whether anyone listens for `type`. */
  listens(type: LockEventType): boolean {
    return this.listeners.has(type);
  }

  on<T extends LockEventType>(type: T, listener: LockEventListener<T>): () => void {
    let set = this.listeners.get(type);
    if (!set) this.listeners.set(type, (set = new Set()));
    const entry = listener as LockEventListener;
    set.add(entry);
    return () => {
      const current = this.listeners.get(type);
      if (!current?.delete(entry)) return;
      if (current.size === 0) this.listeners.delete(type);
    };
  }

  /**
   * @internal Follow how many locks the application holds (+1 taken, -1 no longer kept: released,
   * lost, left to expire), for the held-locks metric; not one of the public events.
   */
  onHeldChange(listener: (delta: number, lock: LockEventSubject) => void): () => void {
    this.heldListeners.add(listener);
    return () => void this.heldListeners.delete(listener);
  }

  /** @internal Whether anyone follows the held count (see `onHeldChange`). */
  get followsHeld(): boolean {
    return this.heldListeners.size > 0;
  }

  /** @internal See `onHeldChange`. */
  heldChanged(delta: number, lock: LockEventSubject): void {
    for (const listener of this.heldListeners) listener(delta, lock);
  }

  emit<T extends LockEventType>(type: T, base: LockEventSubject, payload: LockEventPayloads[T]): void {
    const set = this.listeners.get(type);
    if (!set) return;
    const event = { type, ...base, at: Date.now(), ...payload } as LockEvent;
    for (const listener of set) {
      try {
        listener(event);
      } catch (error) {
        this.logger.error(`A listener of "${type}" lock events failed: ${describeError(error)}`);
      }
    }
  }
}
