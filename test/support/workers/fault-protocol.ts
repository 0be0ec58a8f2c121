/**
 * Shared by test/fault-injection.e2e-spec.ts and its worker (fault-stalled-holder.ts): a fenced
 * resource on Redis, and what the stalled-holder worker and its parent say to each other.
 */
import type { Redis } from 'ioredis';

/**
 * A fenced resource: the hash KEYS[1] = { value, token }. A write (ARGV[1] token, ARGV[2] value)
 * is accepted when its token is >= the stored one and rejected when it is smaller.
 *
 * Why `>=` and not `>`: a fencing token is issued once per acquisition and grows strictly with
 * every acquisition of the lock name, so an equal token can only come from the acquisition that
 * wrote last (or one of its reentrant holds, which share its token) writing again; refusing it
 * would stop a holder from writing twice. A smaller token belongs to an earlier holder, one that
 * lost the lock (maybe without knowing yet): that is the write fencing exists to refuse.
 *
 * Tokens are microseconds since the epoch (16 digits), exact in a Lua number (a double) and
 * compared as numbers, not strings. Returns { 1 | 0, stored token after the call }.
 */
export const FENCED_WRITE_SCRIPT = `
local stored = tonumber(redis.call('hget', KEYS[1], 'token'))
local token = tonumber(ARGV[1])
if stored ~= nil and token < stored then
  return {0, redis.call('hget', KEYS[1], 'token')}
end
redis.call('hset', KEYS[1], 'value', ARGV[2], 'token', ARGV[1])
return {1, ARGV[1]}
`;

/** Write `value` to the fenced resource `key` with `token`; `true` when the resource accepted it. */
export async function fencedWrite(redis: Redis, key: string, token: number, value: string): Promise<boolean> {
  const [accepted] = (await redis.eval(FENCED_WRITE_SCRIPT, 1, key, String(token), value)) as [number, string];
  return accepted === 1;
}

/** What the fenced resource holds: `{}` when nothing was written, else `{ value, token }`. */
export function readResource(redis: Redis, key: string): Promise<Record<string, string>> {
  return redis.hgetall(key);
}

/** Configuration of fault-stalled-holder.ts (its JSON argument). */
export interface StalledHolderConfig {
  redis: string;
  keyPrefix: string;
  /** The lock, taken with `LockService.lock(name, { lockWatchdogTimeout })`. */
  name: string;
  lockWatchdogTimeout: number;
  /** Key of the fenced resource. */
  resource: string;
  /** The worker's event loop stays blocked at least this long after 'stall'... */
  minStallMs: number;
  /** ...and until this file exists (the parent creates it when it is done), at most `maxStallMs`. */
  resumeFile: string;
  maxStallMs: number;
  /** How long, after the stall, the worker waits for its lock's signal to abort. */
  noticeWithinMs: number;
  /** The worker exits with code 3 if it is still running after this many ms. */
  deadlineMs: number;
}

/** A `LockLostEvent` as it crosses the IPC channel (without the error object). */
export interface LostEventSummary {
  name: string;
  key: string;
  owner: string;
  fencingToken: number;
  reason: string;
  /** `event.error === signal.reason` in the worker. */
  errorIsSignalReason: boolean;
}

/** What the stalled holder saw, sent once it is done. */
export interface StalledHolderReport {
  /** How long the event loop was blocked. */
  stalledMs: number;
  /** `signal.aborted` right after the stall, before anything else ran (the holder could not know). */
  abortedWhenWriting: boolean;
  /** Whether the resource accepted the write the holder sent right after the stall, with its old token. */
  staleWriteAccepted: boolean;
  /** `signal.reason.reason` once the signal aborted, or `null` if it did not within `noticeWithinMs`. */
  lostReason: string | null;
  /** ms from the end of the stall to the abort. */
  noticedAfterMs: number | null;
  /** Every `onLockLost` event (module hook) the worker received. */
  events: LostEventSummary[];
  /** What `release()` resolved to afterwards. */
  released: boolean;
}

export type StalledHolderMessage =
  | { type: 'locked'; key: string; owner: string; token: number; firstWriteAccepted: boolean }
  | { type: 'report'; report: StalledHolderReport }
  | { type: 'failed'; error: string };

export type StalledHolderCommand = { type: 'stall' };
