import type { ReleaseWatch } from '../store/lock-store.interface';
import { type HandOver, type HandOverOutcome, WaitQueue } from './wait-queue';

/** A watch that counts its wake-ups (the queue's own logic needs no store). */
function countingWatch(): { watch: ReleaseWatch; woken: () => number } {
  let woken = 0;
  const watch: ReleaseWatch = {
    listening: true,
    listeningSince: 0,
    wait: () => Promise.resolve(),
    wake: () => void (woken += 1),
    close: () => undefined,
  };
  return { watch, woken: () => woken };
}

function offerOf(outcomes: HandOverOutcome[]): HandOver {
  return { from: 'holder', share: 2, handOversLeft: 1, settle: (outcome) => void outcomes.push(outcome) };
}

const place = { id: 'line', inLine: false, missedAt: -Infinity };

describe('WaitQueue offers', () => {
  it('an offer made to a head that leaves passes to the next head, which takes it', async () => {
    const { watch, woken } = countingWatch();
    const queue = new WaitQueue({ ...place }, Promise.resolve(watch));
    const head = queue.join();
    const next = queue.join();
    const outcomes: HandOverOutcome[] = [];
    const offer = offerOf(outcomes);
    expect(queue.offer(offer, 1_000)).toBe(true);
    await Promise.resolve();
    expect(woken()).toBe(1);
    // The head's attempt already on its way took a permit: it leaves, and the offer stays.
    queue.leave(head);
    expect(outcomes).toEqual([]);
    let started = false;
    void next.turn.then(() => (started = true));
    await Promise.resolve();
    expect(started).toBe(true);
    expect(queue.take()).toBe(offer);
    expect(queue.take()).toBeUndefined();
  });

  it('an offer made to a head that leaves with nobody behind it is declined at once', () => {
    const { watch } = countingWatch();
    const queue = new WaitQueue({ ...place }, Promise.resolve(watch));
    const head = queue.join();
    const outcomes: HandOverOutcome[] = [];
    expect(queue.offer(offerOf(outcomes), 1_000)).toBe(true);
    queue.leave(head);
    expect(outcomes).toEqual(['declined']);
    expect(queue.take()).toBeUndefined();
  });

  it('a waiter behind the head that leaves changes nothing; an offer not taken in time is declined', async () => {
    vi.useFakeTimers();
    try {
      const { watch } = countingWatch();
      const queue = new WaitQueue({ ...place }, Promise.resolve(watch));
      queue.join();
      const behind = queue.join();
      const outcomes: HandOverOutcome[] = [];
      expect(queue.offer(offerOf(outcomes), 20)).toBe(true);
      // A second offer while one is pending is refused: its holder releases as usual.
      expect(queue.offer(offerOf(outcomes), 20)).toBe(false);
      queue.leave(behind);
      expect(outcomes).toEqual([]);
      await vi.advanceTimersByTimeAsync(20);
      expect(outcomes).toEqual(['declined']);
    } finally {
      vi.useRealTimers();
    }
  });
});
