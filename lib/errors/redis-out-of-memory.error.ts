import { RedisUnavailableError } from './redis-unavailable.error';

/**
 * Redis refused a lock operation because it is out of memory: `maxmemory` is reached and its
 * `noeviction` policy refuses new writes (Redis's own `OOM command not allowed when used memory >
 * 'maxmemory'`, kept in `cause`). New locks fail until memory is freed; releases, and the renewals
 * of locks already held, still go through. A `RedisUnavailableError` (503 over HTTP) whose message
 * says why, so that an alert can tell a full Redis from an unreachable one.
 */
export class RedisOutOfMemoryError extends RedisUnavailableError {}
