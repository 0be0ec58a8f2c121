import type { Handle, LockHandle } from './lock-handle';

/**
 * Several locks held together (a multi-lock): taken all or nothing, in one canonical order (their
 * keys sorted), so that two callers locking the same names in opposite orders never wait for each
 * other. One handle for all of them: one signal, one release.
 */
export interface LockSetHandle extends LockHandle {
  /** The parts, one per distinct name, in the order they were taken (their keys sorted). */
  readonly locks: readonly LockHandle[];
}

/** What a `LockSet` calls back into; implemented by `HeldLocks` (lib/service/held-locks.ts). */
export interface SetKeeper {
  finish(handle: Handle, release: boolean): Promise<void>;
  abandon(handle: Handle): Promise<void>;
}

/**
 * The handle of a multi-lock. Every part is an ordinary exclusive lock with its own owner, lease
 * and fencing token, kept by the same watchdog (whose batching renews parts due together in one
 * round trip); a part the call chain already held is re-entered, like any reentrant acquisition.
 *
 * - `name` and `key` list the parts', comma-separated; `owner` is the first part's.
 * - `fencingToken` is the largest of the parts' tokens; each part's own is on `locks`.
 * - `signal` aborts as soon as any part is lost (its reason is that part's `LockLostError`).
 * - `release()` releases every part, `true` when each of them was freed by it.
 */
export class LockSet implements LockSetHandle {
  private released = false;
  private lostSignal: AbortSignal | undefined;

  constructor(
    readonly parts: readonly Handle[],
    private readonly keeper: SetKeeper,
  ) {}

  get locks(): readonly LockHandle[] {
    return this.parts;
  }

  get name(): string {
    return this.parts.map((part) => part.name).join(', ');
  }

  get key(): string {
    return this.parts.map((part) => part.key).join(', ');
  }

  get owner(): string {
    return this.parts[0].owner;
  }

  get fencingToken(): number {
    return Math.max(...this.parts.map((part) => part.fencingToken));
  }

  get signal(): AbortSignal {
    return (this.lostSignal ??= AbortSignal.any(this.parts.map((part) => part.signal)));
  }

  async release(): Promise<boolean> {
    if (this.released) return false;
    this.released = true;
    const freed = await Promise.all(this.parts.map((part) => part.release()));
    return freed.every(Boolean);
  }

  stopRenewal(): void {
    for (const part of this.parts) part.stopRenewal();
  }

  /** @internal End every part, as `LockService.finish` ends one (never rejects). */
  async finish(release: boolean): Promise<void> {
    this.released = true;
    await Promise.all(this.parts.map((part) => this.keeper.finish(part, release)));
  }

  /** @internal Give every part back at once, no code having run under the set (never rejects). */
  async abandon(): Promise<void> {
    this.released = true;
    await Promise.all(this.parts.map((part) => this.keeper.abandon(part)));
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.finish(true);
  }
}
