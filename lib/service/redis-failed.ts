import {
  LockKeyConflictError,
  RedisOutOfMemoryError,
  RedisUnavailableError,
  RedlockQuorumError,
  ReplicationNotConfirmedError,
} from '../errors';
import {
  ForeignKeyError,
  ReplicaShortfallError,
  SlotMigratingError,
  StoreDisconnectedError,
  StoreTimeoutError,
} from '../store/store-errors';

/**
 * A store failure as the caller sees it. The message may reach an HTTP client (the default filter of
 * Nest 11 before 11.2.8 sends it as the body), so it says only what failed: the store's own error, which can name
 * the server's address or the connection error, stays in `cause`, for logs.
 */
export function redisFailed(
  operation: 'acquire' | 'release' | 'inspect',
  name: string,
  error: unknown,
): RedisUnavailableError {
  // Redlock's own typed error already says this (without connection detail) and names each node.
  if (error instanceof RedlockQuorumError) return error;
  if (error instanceof ReplicaShortfallError) {
    return new ReplicationNotConfirmedError(name, error.confirmed, error.required, error.timeoutMs);
  }
  if (error instanceof ForeignKeyError) {
    return new LockKeyConflictError(operation, name, error.key, error.type, { cause: error });
  }
  if (error instanceof Error && error.message.startsWith('OOM ')) {
    const why = "Redis is out of memory (used memory is over its 'maxmemory', and it refuses new writes)";
    return new RedisOutOfMemoryError(operation, name, `Could not ${operation} lock "${name}": ${why}`, {
      cause: error,
    });
  }
  const why =
    error instanceof StoreTimeoutError
      ? `Redis did not answer within ${error.timeoutMs} ms`
      : error instanceof StoreDisconnectedError
        ? 'Redis is unreachable; nothing was sent'
        : error instanceof SlotMigratingError
          ? 'its Redis Cluster hash slot was migrating to another master for as long as the call could wait (Redis answered TRYAGAIN)'
          : 'Redis is unavailable';
  return new RedisUnavailableError(operation, name, `Could not ${operation} lock "${name}": ${why}`, { cause: error });
}
