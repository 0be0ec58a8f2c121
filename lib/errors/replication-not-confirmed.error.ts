import { RedisUnavailableError } from './redis-unavailable.error';

/**
 * With `replicas` set, fewer replicas than `replicas.min` confirmed an acquisition within
 * `replicas.timeout` (replication is cut or lagging). The lock was given back: a failover now
 * could have handed it to a second holder. A `RedisUnavailableError`, so it answers 503.
 */
export class ReplicationNotConfirmedError extends RedisUnavailableError {
  constructor(
    lockName: string,
    /** Replicas that confirmed in time. */
    readonly confirmed: number,
    /** Replicas required (`replicas.min`). */
    readonly required: number,
    /** How long they were waited for (`replicas.timeout`), in ms. */
    readonly timeoutMs: number,
  ) {
    super(
      'acquire',
      lockName,
      `Could not acquire lock "${lockName}": ${confirmed} of ${required} replica(s) confirmed it within ${timeoutMs} ms`,
    );
  }
}
