/**
 * What a store's own release announcements mean when they come back over pub/sub.
 *
 * A release wakes this process's waiters itself, as soon as its reply says the lock is free, so
 * the echo of its announcement would only wake them a second time (one wasted attempt per
 * hand-over). But when the reply is lost or late (a timeout, a dropped connection), the echo is
 * the only sign that the release ran: then it must wake them. Each release publishes a message of
 * its own (`${storeId}:${sequence}`) and this book says, when its echo arrives, whether it is
 * still needed; whichever of reply and echo comes second decides.
 */
type EchoState =
  /** Sent, neither answered nor echoed yet. */
  | 'sent'
  /** Echoed before its reply came: the reply (or its failure) decides. */
  | 'echoed'
  /** Its reply said released and woke the waiters: the echo is not needed. */
  | 'handled'
  /** Its reply was lost: the echo, if it comes, wakes the waiters. */
  | 'unknown';

/** Entries kept at most: the echo of a release nobody listened for never comes, so old ones are dropped. */
const MAX_ENTRIES = 1_024;

export class ReleaseEchoes {
  private readonly entries = new Map<string, EchoState>();
  private sequence = 0;

  constructor(private readonly storeId: string) {}

  /**
   * The message a release publishes. Tracked only while this store listens on the key (`watching`):
   * otherwise no echo comes back to it.
   */
  expect(watching: boolean): string {
    this.sequence += 1;
    const message = `${this.storeId}:${this.sequence.toString(36)}`;
    if (watching) {
      if (this.entries.size >= MAX_ENTRIES) this.entries.delete(this.entries.keys().next().value as string);
      this.entries.set(message, 'sent');
    }
    return message;
  }

  /** Whether a message on a channel is one of this store's own announcements. */
  isOwn(message: string): boolean {
    return message.startsWith(this.storeId) && message.charCodeAt(this.storeId.length) === 58; // ':'
  }

  /** The reply said the lock is free and the waiters were woken: its echo is not needed. */
  handled(message: string): void {
    if (this.entries.get(message) === 'echoed') this.entries.delete(message);
    else if (this.entries.has(message)) this.entries.set(message, 'handled');
  }

  /** The reply said nothing was freed: no echo will come. */
  forget(message: string): void {
    this.entries.delete(message);
  }

  /**
   * The release failed or timed out, so it may or may not run. `true` when its echo already came
   * (it ran: wake the waiters now); otherwise its echo, if it comes later, will.
   */
  failed(message: string): boolean {
    const state = this.entries.get(message);
    if (state === 'echoed') {
      this.entries.delete(message);
      return true;
    }
    if (state !== undefined) this.entries.set(message, 'unknown');
    return false;
  }

  /** An own announcement came back: whether it should wake the key's waiters. */
  echoed(message: string): boolean {
    const state = this.entries.get(message);
    switch (state) {
      case 'sent':
        this.entries.set(message, 'echoed');
        return false;
      case 'echoed':
        return false;
      case 'handled':
        this.entries.delete(message);
        return false;
      case 'unknown':
        this.entries.delete(message);
        return true;
      default:
        return true; // a release sent before anyone here listened: a spare wake costs one attempt
    }
  }

  /** The listening connection came back: every waiter re-checks anyway, so nothing pending matters. */
  reset(): void {
    this.entries.clear();
  }
}
