import { type ArgumentsHost, Catch, HttpException } from '@nestjs/common';
import { BaseExceptionFilter } from '@nestjs/core';
import { LockNotAcquiredError } from './errors';

/**
 * Optional, for HTTP applications only (in a hybrid app, bind it to HTTP controllers with
 * `@UseFilters` rather than globally): answers a busy lock with 409 Conflict (the same body Nest's
 * default filter sends, `{ statusCode: 409, message }`) without logging it as an error. Without it
 * the answer is the same, but Nest logs every `LockNotAcquiredError` with its stack trace.
 *
 * ```ts
 * providers: [{ provide: APP_FILTER, useClass: DisLockExceptionFilter }]
 * // or: app.useGlobalFilters(new DisLockExceptionFilter(app.get(HttpAdapterHost).httpAdapter))
 * ```
 */
@Catch(LockNotAcquiredError)
export class DisLockExceptionFilter extends BaseExceptionFilter {
  override catch(exception: LockNotAcquiredError, host: ArgumentsHost): void {
    if (host.getType() !== 'http') {
      super.catch(exception, host);
      return;
    }
    const answer = new HttpException(
      { statusCode: exception.statusCode, message: exception.message },
      exception.statusCode,
      {
        cause: exception,
      },
    );
    super.catch(answer, host);
  }
}
