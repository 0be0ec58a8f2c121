/**
 * What family-churn.worker.ts and test/lock-family-processes.e2e-spec.ts say to each other over IPC,
 * the records the worker keeps on Redis, and the Lua that checks them. (A module of its own:
 * importing the worker would run it.)
 *
 * A worker is one Nest application with DisLockModule on the suite's own redis-server. It serves
 * several tests in turn: each test uses lock names and a data prefix of its own.
 *
 * Records, under the test's data prefix (never under the lock key prefix):
 * - `gauge:<name>`: a hash of how many hold the lock `<name>` inside the critical section now
 *   (`shared`, `exclusive`) and the most ever (`maxShared`, `maxExclusive`), and `entered`.
 *   Raised after the lock is taken and lowered before it is released, so it never counts more
 *   holders than the lock has: a count above the bound is a real overlap.
 * - `fence:<name>`: the largest fencing token entered (`maxAll`, `maxExclusive`) and exited
 *   (`maxExited`) for the lock `<name>` (a multi-lock's parts count for their own names).
 * - `tokens:<name>`: every token of `<name>` entered, in the order entered.
 * - `violations`: one line per broken rule, with what the lock hash held at that moment.
 */

/** The worker's command-line configuration. */
export interface FamilyWorkerConfig {
  redis: string;
  keyPrefix: string;
  deadlineMs: number;
}

/** The kinds of hold. 'mutex' is a plain `lock(name)`. */
export type FamilyKind = 'permit' | 'read' | 'write' | 'mutex' | 'multi';

/** One acquisition to make. */
export interface FamilyLock {
  kind: FamilyKind;
  /** The lock name; for 'multi', the names in the order they are passed. */
  names: string[];
  /** 'permit': the semaphore's permits. */
  permits?: number;
  /** `lockWatchdogTimeout` of the hold, in ms. */
  lease: number;
  waitTime: number;
}

/**
 * What `@DisLock` methods of the worker are declared with (decorator options are fixed at class
 * definition): a churn loop with `via: 'decorator'` must ask for exactly these.
 */
export const DECORATED = { permits: 3, waitTime: 3_000, lease: 2_000 } as const;

/** One loop of a churn: take the lock, hold it `holdMs`, release, wait `gapMs`, again. */
export interface ChurnLoop extends FamilyLock {
  /**
   * How the lock is taken: `lock()` + `release()`, `withLock`, a `@DisLock` method, or `tryLock`
   * (with the loop's `waitTime`; a `null` counts as not acquired).
   */
  via: 'lock' | 'withLock' | 'decorator' | 'tryLock';
  /** ms, drawn uniformly from [min, max] for each hold and each gap. */
  holdMs: [number, number];
  gapMs: [number, number];
  /** ms after the churn starts that the loop starts (default 0) and stops starting attempts (default: the churn's end). */
  startAfterMs?: number;
  stopAfterMs?: number;
}

/** What one loop of a churn did. */
export interface LoopReport {
  acquired: number;
  /** `LockNotAcquiredError`, or `null` from `tryLock`. */
  notAcquired: number;
  /** When each refusal came, ms after its attempt started (at most 20 kept). */
  refusedAfterMs: number[];
  /** Errors other than "not acquired" (at most 20 kept). */
  errors: string[];
  /** Holds whose signal had aborted by the time they ended. */
  lost: number;
  /** `release()` answering `false` (only for `via: 'lock'`). */
  releasedFalse: number;
  /** ms from the start of each successful attempt to the hold. */
  waitsMs: number[];
}

/** A hold as the worker reports it. */
export interface HeldInfo {
  at: number;
  /** The handle's fencing token (a multi-lock's: the largest of its parts'). */
  token: number;
  owner: string;
  /** Each part (one for a single lock): its Redis key, owner and token, in the order taken. */
  parts: { key: string; owner: string; token: number }[];
}

export type FamilyParentMessage =
  /**
   * Run `loops` at once for `durationMs` (each loop stops starting attempts then; attempts under
   * way finish), then answer 'churned'. `seed` makes the hold and gap lengths repeatable.
   */
  | { type: 'churn'; id: string; dataPrefix: string; durationMs: number; seed: number; loops: ChurnLoop[] }
  /**
   * Take `lock` (`lock()`, or `tryLock()` with `via: 'tryLock'`) and hold it until 'release':
   * answers 'held', or 'gave-up' when it is not taken.
   */
  | { type: 'hold'; id: string; lock: FamilyLock; via: 'lock' | 'tryLock' }
  | { type: 'release'; id: string }
  /** Release every hold still held; answers 'idle'. */
  | { type: 'release-all' };

export type FamilyChildMessage =
  | { type: 'ready'; pid: number }
  | { type: 'churned'; id: string; loops: LoopReport[] }
  | ({ type: 'held'; id: string } & HeldInfo)
  | { type: 'released'; id: string; at: number; ok: boolean }
  | {
      type: 'gave-up';
      id: string;
      at: number;
      startedAt: number;
      how: 'null' | 'not-acquired' | 'error';
      error?: string;
    }
  | { type: 'idle' }
  | { type: 'failed'; error: string };

/** The record keys of one test, under its data prefix. */
export function familyDataKeys(dataPrefix: string) {
  return {
    gauge: (name: string) => `${dataPrefix}gauge:${name}`,
    fence: (name: string) => `${dataPrefix}fence:${name}`,
    tokens: (name: string) => `${dataPrefix}tokens:${name}`,
    violations: `${dataPrefix}violations`,
  };
}

/** Whether the hold excludes everyone else ('shared': a reader or a permit). */
export const holdKind = (kind: FamilyKind): 'shared' | 'exclusive' =>
  kind === 'read' || kind === 'permit' ? 'shared' : 'exclusive';

/**
 * Enter the critical section of one lock, atomically: raise its gauge and check it, and check
 * what the lock's hash holds against the layout (an exclusive hold: one field, our owner's, `1`
 * or `0` for a grant not taken up yet; shared holds: fields valued with the end of their own
 * lease in Redis ms, ours among them and not over, at most `limit` of them live, and the key
 * lasting at least as long as the latest). A broken rule is pushed to the violations list.
 * Only holder fields count: fields starting with `=` describe a holder (test/support/lock-hash.ts).
 *
 * KEYS[1] the lock hash, KEYS[2] its gauge, KEYS[3] the violations list
 * ARGV[1] 'shared' | 'exclusive', ARGV[2] the most shared holders allowed (0: no bound),
 * ARGV[3] our owner field ('' not to check it), ARGV[4] a label for the report
 * Returns {shared, exclusive, problems}.
 */
export const ENTER_LUA = `
local key, gauge, violations = KEYS[1], KEYS[2], KEYS[3]
local kind, limit, owner, label = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local shared = redis.call('hincrby', gauge, 'shared', kind == 'shared' and 1 or 0)
local exclusive = redis.call('hincrby', gauge, 'exclusive', kind == 'exclusive' and 1 or 0)
local function raise(field, value)
  if value > tonumber(redis.call('hget', gauge, field) or '0') then redis.call('hset', gauge, field, value) end
end
raise('maxShared', shared)
raise('maxExclusive', exclusive)
redis.call('hincrby', gauge, 'entered', 1)
local problems = {}
local function problem(text) problems[#problems + 1] = text end
if exclusive > 1 then problem(exclusive .. ' exclusive holders at once') end
if exclusive > 0 and shared > 0 then problem('an exclusive holder with ' .. shared .. ' shared holders') end
if limit > 0 and shared > limit then problem(shared .. ' shared holders, at most ' .. limit .. ' allowed') end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hash = {}
local fields = redis.call('hgetall', key)
for i = 1, #fields, 2 do
  if string.sub(fields[i], 1, 1) ~= '=' then
    hash[#hash + 1] = fields[i]
    hash[#hash + 1] = fields[i + 1]
  end
end
local pttl = redis.call('pttl', key)
if kind == 'exclusive' then
  if #hash ~= 2 then problem('exclusive hold: the hash has ' .. (#hash / 2) .. ' fields')
  elseif owner ~= '' and hash[1] ~= owner then problem('exclusive hold: the field is not ours')
  elseif hash[2] ~= '1' and hash[2] ~= '0' then problem('exclusive hold: the value is not 1 (or 0)') end
  if pttl <= 0 then problem('exclusive hold: the key has no lease') end
else
  local live, mine, latest = 0, nil, 0
  for i = 1, #hash, 2 do
    local ends = tonumber(hash[i + 1])
    if not ends or ends <= 1 then problem('shared hold: an exclusive field ' .. hash[i] .. ' beside it')
    else
      if ends > now then live = live + 1 end
      if ends > latest then latest = ends end
    end
    if hash[i] == owner then mine = ends end
  end
  if owner ~= '' and not mine then problem('shared hold: our field is missing') end
  if owner ~= '' and mine and mine <= now then problem('shared hold: our lease is over') end
  if limit > 0 and live > limit then problem('shared hold: ' .. live .. ' live fields, at most ' .. limit) end
  -- The fields' ends come from TIME, the key's expiry from the script's own clock, a millisecond
  -- or a few apart under load; what matters is that the key outlasts every holder's belief that
  -- it holds: its lease less the margin it keeps (2 ms + 1 % of the lease, leaseValidUntil).
  if pttl < 0 or now + pttl + 2 + (latest - now) / 100 < latest then
    problem('shared hold: the key expires before a lease ends')
  end
end
if #problems > 0 then
  redis.call('rpush', violations, label .. ': ' .. table.concat(problems, '; ') .. ' | now=' .. now .. ' pttl=' .. pttl ..
    ' hash=' .. cjson.encode(hash) .. ' gauge=' .. cjson.encode(redis.call('hgetall', gauge)))
end
return {shared, exclusive, #problems}
`;

/** Leave the critical section of one lock: KEYS[1] its gauge; ARGV[1] 'shared' | 'exclusive'. */
export const EXIT_LUA = `return redis.call('hincrby', KEYS[1], ARGV[1], -1)`;

/**
 * Check and record a hold's fencing token on entering, atomically. Every token must be larger
 * than the token of any hold that had ended before the hold was asked for (ARGV[3], read then);
 * an exclusive one larger than every token entered before it (all those holds have ended); a
 * shared one larger than every exclusive token entered before it. The token is appended to the
 * list in the order entered.
 *
 * KEYS[1] the fence hash, KEYS[2] the token list, KEYS[3] the violations list
 * ARGV[1] 'shared' | 'exclusive', ARGV[2] the token, ARGV[3] the largest token exited when the
 * hold was asked for, ARGV[4] a label
 */
export const TOKEN_ENTER_LUA = `
local fence, list, violations = KEYS[1], KEYS[2], KEYS[3]
local kind, token, before, label = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local maxAll = tonumber(redis.call('hget', fence, 'maxAll') or '0')
local maxExclusive = tonumber(redis.call('hget', fence, 'maxExclusive') or '0')
local problems = {}
if token <= before then problems[#problems + 1] = 'token ' .. token .. ' not above ' .. before .. ', of a hold that had ended before this one was asked for' end
if kind == 'exclusive' and token <= maxAll then problems[#problems + 1] = 'exclusive token ' .. token .. ' not above ' .. maxAll .. ', entered before it' end
if kind == 'shared' and token <= maxExclusive then problems[#problems + 1] = 'shared token ' .. token .. ' not above the exclusive ' .. maxExclusive .. ' entered before it' end
if #problems > 0 then redis.call('rpush', violations, label .. ': ' .. table.concat(problems, '; ')) end
if token > maxAll then redis.call('hset', fence, 'maxAll', token) end
if kind == 'exclusive' and token > maxExclusive then redis.call('hset', fence, 'maxExclusive', token) end
redis.call('rpush', list, token)
return #problems
`;

/** On leaving: KEYS[1] the fence hash; ARGV[1] the token. Raises `maxExited`. */
export const TOKEN_EXIT_LUA = `
if tonumber(ARGV[1]) > tonumber(redis.call('hget', KEYS[1], 'maxExited') or '0') then
  redis.call('hset', KEYS[1], 'maxExited', ARGV[1])
end
return 1
`;

/** A small seeded PRNG (mulberry32): the same seed gives the same hold and gap lengths. */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
