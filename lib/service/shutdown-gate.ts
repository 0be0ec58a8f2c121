import { DisLockError } from '../errors';

/**
 * Refuses new acquisitions once the application is shutting down, and counts those under way, so
 * that shutdown lets them land while the client is still open.
 */
export class ShutdownGate {
  private closed = false;
  /** Acquisitions under way. */
  private acquiring = 0;
  /** Set by shutdown while acquisitions are under way; called when the last one has settled. */
  private acquisitionsDone: (() => void) | undefined;

  /** Whether shutdown has begun. */
  get closing(): boolean {
    return this.closed;
  }

  /** Shutdown begins: every acquisition from now on, and every wait, ends with an error. */
  close(): void {
    this.closed = true;
  }

  /** Throws when shutdown has begun. */
  assertOpen(name: string): void {
    if (this.closed) throw new DisLockError(`Cannot acquire lock "${name}": the application is shutting down`);
  }

  /** An acquisition starts; each `enter` is paired with one `leave`. */
  enter(): void {
    this.acquiring += 1;
  }

  /** An acquisition has settled (taken, busy or failed). */
  leave(): void {
    this.acquiring -= 1;
    if (this.acquiring === 0) this.acquisitionsDone?.();
  }

  /** Whether acquisitions are under way. */
  get busy(): boolean {
    return this.acquiring > 0;
  }

  /** Resolves when the last acquisition under way has settled (call only while `busy`). */
  settled(): Promise<void> {
    return new Promise<void>((resolve) => (this.acquisitionsDone = resolve));
  }
}
