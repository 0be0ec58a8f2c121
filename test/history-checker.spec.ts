/**
 * The history checker on hand-made histories: each rule passes a history that keeps it and fails
 * one that breaks it, so that a clean run of test/fault-history.e2e-spec.ts means something.
 */
import {
  checkHistory,
  type FaultRecord,
  type HistoryEvent,
  type HoldRecord,
  WAKE_MARGIN_MS,
} from './support/history/history';

const OPTIONS = { operationTimeoutMs: 400 };

function hold(overrides: Partial<HoldRecord> & Pick<HoldRecord, 'owner' | 'start' | 'end' | 'token'>): HoldRecord {
  return {
    calledAt: overrides.waitedFrom ?? overrides.start,
    kind: 'hold',
    worker: 0,
    name: 'n',
    path: 'lock',
    nested: false,
    write: 'accepted',
    toldBeforeWrite: false,
    ...overrides,
  };
}

const rules = (events: HistoryEvent[], faults: FaultRecord[] = []): string[] =>
  checkHistory(events, faults, OPTIONS).map((v) => v.rule);

describe('history checker', () => {
  describe('overlaps', () => {
    it('accepts holds one after the other, and re-entries of the same owner inside a hold', () => {
      expect(
        rules([
          hold({ owner: 'a', start: 0, end: 10, token: 1 }),
          hold({ owner: 'a', start: 2, end: 5, token: 1, nested: true }),
          hold({ owner: 'b', worker: 1, start: 11, end: 20, token: 2 }),
        ]),
      ).toEqual([]);
    });

    it('flags a second owner inside the critical section of a first that was never told', () => {
      expect(
        rules([hold({ owner: 'a', start: 0, end: 10, token: 1 }), hold({ owner: 'b', start: 5, end: 12, token: 2 })]),
      ).toEqual(['overlap']);
    });

    it('accepts the overlap when the first was told before the second got in, and not when told after', () => {
      const second = hold({ owner: 'b', worker: 1, start: 5, end: 12, token: 2 });
      expect(rules([hold({ owner: 'a', start: 0, end: 10, token: 1, lostAt: 4 }), second])).toEqual([]);
      expect(rules([hold({ owner: 'a', start: 0, end: 10, token: 1, lostAt: 6 }), second])).toEqual(['overlap']);
    });

    it('excuses a late report only by as long as the first holder’s event loop stood still', () => {
      const late = hold({ owner: 'a', start: 0, end: 20, token: 1, lostAt: 9 }); // 4 ms after the second got in
      const second = hold({ owner: 'b', worker: 1, start: 5, end: 22, token: 2 });
      expect(rules([late, second, { kind: 'pause', worker: 0, from: 3, to: 8 }])).toEqual([]);
      expect(rules([late, second, { kind: 'pause', worker: 0, from: 3, to: 5 }])).toEqual(['overlap']);
      expect(rules([late, second, { kind: 'pause', worker: 1, from: 3, to: 8 }])).toEqual(['overlap']);
    });
  });

  describe('fencing', () => {
    it('flags a token that does not grow with the order owners got the lock', () => {
      expect(
        rules([hold({ owner: 'a', start: 0, end: 1, token: 5 }), hold({ owner: 'b', start: 2, end: 3, token: 5 })]),
      ).toEqual(['fencing']);
    });

    it('flags a write refused as stale while its writer had not been told, and accepts it once told', () => {
      const refused = { owner: 'a', start: 0, end: 1, token: 1, write: 'refused' as const };
      expect(rules([hold(refused)])).toEqual(['fencing']);
      expect(rules([hold({ ...refused, toldBeforeWrite: true, lostAt: 0 })])).toEqual([]);
    });
  });

  describe('lost wake-ups', () => {
    const waiter = (until: number): HoldRecord =>
      hold({ owner: 'w', worker: 1, start: until, end: until + 1, token: 9, waitedFrom: 0 });
    const release: HistoryEvent = { kind: 'release', worker: 0, name: 'n', owner: 'a', at: 50 };
    const first = hold({ owner: 'a', start: 1, end: 49, token: 1 });

    it('accepts a waiter that got the lock soon after the release', () => {
      expect(rules([first, release, waiter(50 + WAKE_MARGIN_MS / 2)])).toEqual([]);
    });

    it('flags a waiter still waiting well after a release nobody else took', () => {
      expect(rules([first, release, waiter(50 + WAKE_MARGIN_MS * 3)])).toEqual(['lost-wake-up']);
      const gaveUp: HistoryEvent = { kind: 'give-up', worker: 1, name: 'n', waitedFrom: 0, at: 800 };
      expect(rules([first, release, gaveUp])).toEqual(['lost-wake-up']);
    });

    it('does not count a release while a re-entry of the same owner still runs', () => {
      const nestedRunning = hold({ owner: 'a', start: 30, end: 300, token: 1, nested: true });
      expect(rules([first, nestedRunning, release, waiter(301)])).toEqual([]);
    });

    it('accepts it when a call under way at the release got the lock first, or one of unknown outcome may hold it', () => {
      const slowReply = hold({ owner: 'c', worker: 2, start: 250, end: 260, token: 2, calledAt: 60 });
      expect(rules([first, release, slowReply, waiter(400)])).toEqual([]);
      const lateCaller = hold({ owner: 'c', worker: 2, start: 250, end: 260, token: 2, calledAt: 240 });
      expect(rules([first, release, lateCaller, waiter(400)])).toEqual(['lost-wake-up']);
      const unknown: HistoryEvent = { kind: 'unknown', worker: 2, name: 'n', from: 55, to: 360 };
      expect(rules([first, release, unknown, waiter(400)])).toEqual([]);
    });

    it('accepts it when another owner took the lock in between, or a fault hit any process nearby', () => {
      const taker = hold({ owner: 'c', worker: 2, start: 60, end: 400, token: 2 });
      expect(rules([first, release, taker, waiter(401)])).toEqual([]);
      const fault: FaultRecord = { worker: 3, kind: 'delay acquire', from: 40, to: 45 }; // a process neither side is in
      expect(rules([first, release, waiter(50 + WAKE_MARGIN_MS * 3)], [fault])).toEqual([]);
    });
  });

  it('reports an unexpected error of a worker', () => {
    expect(rules([{ kind: 'error', worker: 0, at: 1, error: 'TypeError: boom' }])).toEqual(['error']);
  });
});
