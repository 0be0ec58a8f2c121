/** Commands the Lua scripts call (Redis 7 checks each against the ACL, as if sent directly). */
const SCRIPT_COMMANDS = [
  'exists',
  'hexists',
  'hget',
  'hgetall',
  'hset',
  'hdel',
  'type',
  'pttl',
  'pexpire',
  'get',
  'set',
  'del',
  'time',
  // the line of waiters (a fair hand-over across processes)
  'zadd',
  'zrem',
  'zscore',
  'zrange',
  'zrangebyscore',
  'zremrangebyscore',
];

/**
 * The ACL rule that lets the library do everything it does under `keyPrefix`, and nothing else:
 * append it to `ACL SETUSER <user> on >password` (on every node of a Cluster), or use it as a
 * managed service's access string. `keyPrefix` is the module's, after any ioredis `keyPrefix`.
 *
 * - `+evalsha +eval`: every lock operation is a Lua script (EVAL after a restart or SCRIPT FLUSH);
 *   the commands the scripts call need granting too.
 * - `+publish +subscribe +unsubscribe`: release announcements and the waiters listening for them.
 * - `+info`: ioredis's ready check on connect (without it ioredis warns on every connection;
 *   `enableReadyCheck: false` in your RedisOptions also avoids it).
 * - Cluster: sharded pub/sub (`+spublish +ssubscribe +sunsubscribe`, Redis >= 7), the slot map
 *   (`+cluster|slots`), the client's ready check (`+cluster|info`), ASK redirections (`+asking`)
 *   during a resharding, and two commands ioredis sends on its own connections and whose refusal
 *   it ignores, but which Redis records in ACL LOG each time: READONLY (to replicas) and CLIENT
 *   SETNAME (its subscriber and slot-refresh connections). Both act on the connection only.
 * - `replicas` (acknowledged acquisitions): `+wait`.
 *
 * AUTH, HELLO and QUIT need no grant (Redis allows them to every user).
 */
export function dislockAclRule(keyPrefix: string, options: { cluster?: boolean; replicas?: boolean } = {}): string {
  const pattern = `${escapeGlob(keyPrefix)}*`;
  const commands = [
    'evalsha',
    'eval',
    ...SCRIPT_COMMANDS,
    'publish',
    'subscribe',
    'unsubscribe',
    'info',
    ...(options.cluster
      ? [
          'spublish',
          'ssubscribe',
          'sunsubscribe',
          'cluster|slots',
          'cluster|info',
          'asking',
          'readonly',
          'client|setname',
        ]
      : []),
    ...(options.replicas ? ['wait'] : []),
  ];
  return `resetkeys ~${pattern} resetchannels &${pattern} -@all ${commands.map((c) => `+${c}`).join(' ')}`;
}

/** A key prefix as a literal in an ACL glob pattern. */
export function escapeGlob(text: string): string {
  return text.replace(/[*?[\]\\]/g, (c) => `\\${c}`);
}
