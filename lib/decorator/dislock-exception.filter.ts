import { STATUS_CODES } from 'node:http';
import { inspect } from 'node:util';
import { type ArgumentsHost, Catch, HttpException, Logger } from '@nestjs/common';
import { BaseExceptionFilter } from '@nestjs/core';
import { type Observable, throwError } from 'rxjs';
import { LockNotAcquiredError, RedisUnavailableError } from '../errors';

/** What a WebSocket client is sent, and an RPC caller receives: the shape of Nest's own error payloads. */
interface ErrorPayload {
  readonly status: 'error';
  readonly message: string;
}

/**
 * Optional: answers the two lock errors a request can meet, without Nest logging a busy lock as an
 * error. Nest's default filter already answers both over HTTP (409 and 503); this filter adds:
 *
 * - `LockNotAcquiredError`: 409 `{ statusCode: 409, message }`, not logged (a busy lock is an
 *   answer, not a fault).
 * - `RedisUnavailableError`: 503 `{ statusCode: 503, message: 'Service Unavailable' }` (nothing
 *   about Redis reaches the client), logged once as an error with its cause.
 *
 * Outside HTTP: an RPC caller receives `{ status: 'error', message }` (an error Observable, as an
 * RPC filter returns), a WebSocket client is emitted an `exception` event with the same payload
 * (Nest's WebSocket handler counts a matched filter as the answer), with the lock's message when busy
 * and `Service Unavailable` when Redis is down. Any other context gets Nest's own handling.
 *
 * ```ts
 * providers: [{ provide: APP_FILTER, useClass: DisLockExceptionFilter }]
 * // or: app.useGlobalFilters(new DisLockExceptionFilter(app.get(HttpAdapterHost).httpAdapter))
 * ```
 */
@Catch(LockNotAcquiredError, RedisUnavailableError)
export class DisLockExceptionFilter extends BaseExceptionFilter {
  private static readonly log = new Logger('DisLockExceptionFilter');

  override catch(
    exception: LockNotAcquiredError | RedisUnavailableError,
    host: ArgumentsHost,
  ): Observable<never> | undefined {
    const type = host.getType<string>();
    if (type !== 'http' && type !== 'rpc' && type !== 'ws') return undefined; // Nest's default handling
    const busy = exception instanceof LockNotAcquiredError;
    // Busy: the lock's own message. Redis down: the status text only; the error and its cause go to the log.
    const message = busy ? exception.message : (STATUS_CODES[exception.statusCode] ?? 'Service Unavailable');
    if (!busy) DisLockExceptionFilter.log.error(exception.message, inspect(exception));
    if (type === 'http') {
      const body = { statusCode: exception.statusCode, message };
      super.catch(new HttpException(body, exception.statusCode, { cause: exception }), host);
      return undefined;
    }
    const payload: ErrorPayload = { status: 'error', message };
    if (type === 'rpc') return throwError(() => payload);
    const client = host.switchToWs().getClient<{ emit?: (event: string, data: unknown) => unknown } | undefined>();
    if (typeof client?.emit === 'function') client.emit('exception', payload);
    return undefined;
  }
}
