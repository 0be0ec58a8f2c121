import { Logger } from '@nestjs/common';
import { describeError } from '../../errors/describe-error';
import { RedisAccessError } from '../../errors/redis-access.error';
import { AccessProbe } from './access.probe';
import type { RedisClient } from './redis-client';

/**
 * Checks once that Redis lets the library do everything it needs under `keyPrefix`: runs each
 * lock script (acquire by EVALSHA, the reentrant check by EVAL, renew, release with its
 * announcement) on a probe lock `${keyPrefix}#probe:{<random>}` while listening on its release
 * channel, then deletes what it made. Nothing else is touched: the probe has its own fencing
 * counter beside it (`…#probe:{<random>}:fence`), in the same Cluster hash slot.
 *
 * - Redis refuses something (ACL `NOPERM` for a command, the key prefix or the channels; scripting
 *   disabled or EVAL/EVALSHA renamed away): rejects with a `RedisAccessError` that names every
 *   refusal (it asks Redis about each command on its own to find them all, since a refusal inside
 *   a script may not name the command) and the ACL rule to grant.
 * - Redis is unreachable, slow, or answers another error (a wrong password, LOADING, OOM, a read-only
 *   replica): logs a warning through `logger` and resolves. The whole check, cleanup included,
 *   takes at most `operationTimeout`; a cleanup still pending then is left to run in the background.
 *   `unreachable` ends it sooner, the same way: aborted once the client is known to be cut off from
 *   Redis (with the reason), it ends every step still waiting at once.
 *
 * Never resolves or rejects with anything carrying the client's password.
 */
export async function checkRedisAccess(
  client: RedisClient,
  keyPrefix: string,
  operationTimeout: number,
  logger: Pick<Logger, 'warn'> = new Logger('DisLock'),
  unreachable?: AbortSignal,
): Promise<void> {
  const probe = new AccessProbe(client, keyPrefix, operationTimeout, unreachable);
  try {
    await probe.run();
  } catch (error) {
    if (error instanceof RedisAccessError) throw error;
    logger.warn(
      probe.redact(
        `Skipped the Redis access check: ${describeError(error)}. Lock operations fail with ` +
          `RedisUnavailableError until Redis answers; a missing ACL permission then shows as their cause.`,
      ),
    );
  } finally {
    probe.close();
  }
}
