import { Injectable } from '@nestjs/common';
import {
  concatWith,
  defer,
  finalize,
  from,
  ignoreElements,
  isObservable,
  lastValueFrom,
  mergeMap,
  Observable,
  of,
  throwError,
  catchError,
} from 'rxjs';
import type { DisLockOptions } from '../options/dislock.options';
import type { KeyResolver } from './key-template';
import { LockSet } from '../core/lock-set';
import { DisLockTelemetry, type MethodSpan } from '../integrations/opentelemetry';
import { type Held, LockService } from '../service/lock.service';
import { LockedResult } from './locked-result';
import { isPromiseLike } from '../core/promise-like';

/** What `@DisLock` computed once, when the class was defined. */
export interface LockedMethodSpec {
  /** `@DisLock on ClassName.method`, for messages. */
  readonly where: string;
  /** `ClassName.method`. */
  readonly method: string;
  /** The lock name from the arguments, or a multi-lock's names. */
  readonly resolveKey: KeyResolver | ((args: readonly unknown[]) => readonly string[]);
  /** Validated timing options; module defaults fill the rest at call time. */
  readonly options: Omit<DisLockOptions, 'key' | 'ifExpireWhenFinish' | 'onBusy'>;
  readonly releaseOnFinish: boolean;
  /** A busy lock: reject (`'throw'`) or resolve `undefined` without running the method (`'skip'`). */
  readonly onBusy: 'throw' | 'skip';
}

function toObservable(result: unknown): Observable<unknown> {
  if (isObservable(result)) return result;
  // Promise.resolve first: a bare thenable need not return anything from `then`, which rxjs's
  // `from` would call `.then` on.
  if (isPromiseLike(result)) return from(Promise.resolve(result));
  return of(result);
}

/** What a method declared to return a Promise returned, as something to await: an Observable's last value. */
function awaitable(result: unknown): unknown {
  return isObservable(result) ? lastValueFrom(result, { defaultValue: undefined }) : result;
}

/**
 * What runs a `@DisLock` method: resolve the key, acquire, run the method inside the lock's async
 * scope, then release the lock (or only stop renewing it); the result or error comes out only once
 * that last step has finished. `run` does it as one async function for methods declared to return a
 * Promise; `intercept` is the rxjs pipeline for methods declared to return an Observable (acquire
 * when subscribed, release in `finalize`, also on unsubscribe); `start` runs that pipeline at once
 * for methods that recorded no return type, and hands back a Promise that is also an Observable.
 */
@Injectable()
export class DisLockInterceptor {
  constructor(
    private readonly locks: LockService,
    private readonly telemetry: DisLockTelemetry,
  ) {}

  /**
   * The same steps for a method declared to return a Promise, as one async function: resolve the
   * key, acquire, run the method inside the lock's scope and wait for its result (a Promise or a
   * thenable, or a plain value or an Observable it returned after all), then release, or only stop
   * renewing. It resolves or rejects with the method's own result or error only once that step is
   * done. Half the CPU of going through the pipeline, which a Promise has no use for.
   */
  async run(spec: LockedMethodSpec, invoke: () => unknown, args: readonly unknown[]): Promise<unknown> {
    const name = spec.resolveKey(args); // throws KeyResolutionError before Redis is touched
    const handle = await this.locks.acquireFor(name, spec.options, !spec.releaseOnFinish, undefined, spec.method);
    if (!handle) return this.locks.busyFor(name, spec.options, spec.onBusy, undefined, spec.method); // throws, or skips
    const span = this.startSpan(spec, handle);
    let failure: unknown;
    try {
      const call = (): unknown => awaitable(invoke());
      return await this.locks.runInScope(handle, span ? () => span.run(call) : call);
    } catch (error) {
      failure = error;
      throw error;
    } finally {
      span?.end(failure);
      await this.locks.finish(handle, spec.releaseOnFinish);
    }
  }

  intercept(spec: LockedMethodSpec, invoke: () => unknown, args: readonly unknown[]): Observable<unknown> {
    return this.acquire(spec, args).pipe(mergeMap((handle) => this.runLocked(spec, handle, invoke)));
  }

  /**
   * For a method whose return type was not recorded (inferred, a union, an interface), so the
   * caller may have been told `Promise<T>` or `Observable<T>`: subscribes to `intercept` now, as a
   * Promise would start, and returns a {@link LockedResult} replaying it. The method runs once, and
   * whatever it returns (a Promise, an Observable, a value) is consumed inside the lock.
   */
  start(spec: LockedMethodSpec, invoke: () => unknown, args: readonly unknown[]): LockedResult<unknown> {
    return LockedResult.connect(this.intercept(spec, invoke, args));
  }

  /**
   * Emits the handle once the lock is taken (or completes without it: busy, with `onBusy: 'skip'`).
   * Unsubscribing before that stops a wait in progress, and a lock that is granted after the
   * subscriber left is released at once, never leaked.
   */
  private acquire(spec: LockedMethodSpec, args: readonly unknown[]): Observable<Held> {
    return new Observable<Held>((subscriber) => {
      let name: string | readonly string[];
      try {
        name = spec.resolveKey(args); // throws KeyResolutionError before Redis is touched
      } catch (error) {
        subscriber.error(error);
        return undefined;
      }
      const cancel = new AbortController();
      let settled = false;
      this.locks.acquireFor(name, spec.options, !spec.releaseOnFinish, cancel.signal, spec.method).then(
        (handle) => {
          settled = true;
          if (!handle) {
            try {
              this.locks.busyFor(name, spec.options, spec.onBusy, cancel.signal, spec.method);
            } catch (error) {
              subscriber.error(error);
              return;
            }
            subscriber.complete();
            return;
          }
          if (subscriber.closed) {
            void this.locks.abandon(handle); // the caller has gone: no code will run under it
            return;
          }
          subscriber.next(handle);
          subscriber.complete();
        },
        (error: unknown) => {
          settled = true;
          subscriber.error(error);
        },
      );
      // Only a wait still under way needs stopping (an abort builds a DOMException with a stack).
      return () => {
        if (!settled) cancel.abort();
      };
    });
  }

  private runLocked(spec: LockedMethodSpec, handle: Held, invoke: () => unknown): Observable<unknown> {
    const span = this.startSpan(spec, handle);
    let failure: unknown;
    let finished: Promise<void> | undefined;
    const finish = (): Promise<void> => {
      if (!finished) span?.end(failure);
      return (finished ??= this.locks.finish(handle, spec.releaseOnFinish));
    };
    const afterFinish = defer(finish).pipe(ignoreElements());
    const call = (): Observable<unknown> => toObservable(invoke());
    const method = new Observable<unknown>((subscriber) =>
      this.locks.runInScope(handle, () => defer(span ? () => span.run(call) : call).subscribe(subscriber)),
    );
    return method.pipe(
      concatWith(afterFinish),
      catchError((error: unknown) => {
        failure = error;
        return afterFinish.pipe(concatWith(throwError(() => error)));
      }),
      finalize(() => void finish()), // unsubscribed early: free the lock all the same
    );
  }

  /** The method's span, when OpenTelemetry traces. */
  private startSpan(spec: LockedMethodSpec, handle: Held): MethodSpan | undefined {
    if (!this.telemetry.traces) return undefined;
    const subject =
      handle instanceof LockSet
        ? { name: handle.name, key: handle.key, kind: 'exclusive' as const, label: spec.options.label }
        : handle.lock.eventBase;
    return this.telemetry.startMethod(spec.method, subject);
  }
}
