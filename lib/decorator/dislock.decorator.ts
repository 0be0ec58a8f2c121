import { Inject } from '@nestjs/common';
import { type Observable, throwError } from 'rxjs';
import { DISLOCK_INTERCEPTOR_PROPERTY, DISLOCK_METADATA } from './dislock.constants';
import { DisLockInterceptor, type LockedMethodSpec } from './dislock.interceptor';
import type { DisLockOptions, LockKey } from '../options/dislock.options';
import { DisLockSetupError, InvalidLockOptionsError } from '../errors';
import { compileKey } from './key-template';
import { type DisLockDecorator, returnKindOf } from './lockable-method';
import { LockedResult } from './locked-result';
import { validateDecoratorOptions } from '../options/options.validation';

type AnyMethod = (this: object, ...args: unknown[]) => unknown;

/** Marks a class whose interceptor property injection is declared (own metadata: a subclass declares its own). */
const INTERCEPTOR_INJECTED = Symbol('dislock:interceptor-injected');

/**
 * Adds the interceptor as an injected property of the class, once however many methods are locked.
 * Only public Nest API is used (`@Inject` on a property); whether it was added already is kept in
 * a marker of our own rather than read from Nest's internal metadata.
 */
function injectInterceptor(target: object): void {
  if (Reflect.hasOwnMetadata(INTERCEPTOR_INJECTED, target.constructor)) return;
  Inject(DisLockInterceptor)(target, DISLOCK_INTERCEPTOR_PROPERTY);
  Reflect.defineMetadata(INTERCEPTOR_INJECTED, true, target.constructor);
}

/** Keeps the wrapped method's identity: name, length and every metadata key set on it so far. */
function copyIdentity(from: AnyMethod, to: AnyMethod): void {
  Object.defineProperty(to, 'name', { value: from.name, configurable: true });
  Object.defineProperty(to, 'length', { value: from.length, configurable: true });
  for (const key of Reflect.getOwnMetadataKeys(from)) {
    Reflect.defineMetadata(key, Reflect.getOwnMetadata(key, from), to);
  }
}

/**
 * Runs the method while holding a distributed lock on Redis.
 *
 * ```ts
 * @DisLock('order:{0}')                                  // key template over the arguments
 * @DisLock((order: Order) => `order:${order.id}`)        // or a key function
 * @DisLock({ key: 'user:{0.id}', expire: 5_000 })       // fixed 5 s lease, never renewed
 * @DisLock({ key: (job: Job) => `job:${job.id}`, waitTime: 2_000 })
 * @DisLock({ key: 'report', onBusy: 'skip', lockAtLeastFor: 10_000 }) // a scheduled job: once per tick
 * @DisLock({ key: 'catalog', mode: 'read' })            // a read-write lock: readers share it
 * @DisLock({ key: 'export', permits: 3 })               // a semaphore: at most 3 at once
 * @DisLock({ key: ['account:{0}', 'account:{1}'] })     // a multi-lock: both or neither
 * ```
 *
 * Works on any method of a class built by Nest (controllers and plain providers alike). Options are
 * validated here, when the class is defined.
 *
 * Return types: taking the lock is asynchronous, so a locked call returns a Promise or an
 * Observable, and the method must say so.
 * - `async` or declared `Promise<T>`: a Promise, settled once the lock is released.
 * - Declared `Observable<T>`: an Observable that takes the lock at subscribe and frees it on
 *   complete, error or unsubscribe.
 * - A synchronous method (`T`, `void`, `any`) does not compile: make it `async`.
 * - Inferred or union return types (`return of(x)` with no annotation, `Promise<T> | Observable<T>`)
 *   record nothing usable at run time: the call starts at once and returns a Promise (of the last
 *   value) that is also an Observable (replaying every value), so either type holds. Write the
 *   return type to get the lazy, per-subscription Observable.
 *
 * The method's own results and errors pass through untouched.
 *
 * Order relative to other method decorators (`@Cron`, `@Interval`, `@Timeout` from
 * `@nestjs/schedule`, guards, Swagger) does not matter: the wrapper keeps the method's name, length
 * and every metadata key set on it before, and those set after land on the wrapper itself.
 */
export function DisLock(optionsOrKey: DisLockOptions | LockKey): DisLockDecorator {
  const decorate = (
    target: object,
    propertyKey: string | symbol,
    descriptor: PropertyDescriptor,
  ): PropertyDescriptor => {
    if (typeof target === 'function') {
      throw new InvalidLockOptionsError(
        'target',
        `@DisLock on ${target.name}.${String(propertyKey)}: static methods cannot be locked (they are not built by Nest's dependency injection); lock an instance method of a provider`,
      );
    }
    const where = `@DisLock on ${(target as { constructor: { name: string } }).constructor.name}.${String(propertyKey)}`;
    const options = validateDecoratorOptions(
      where,
      typeof optionsOrKey === 'string' || typeof optionsOrKey === 'function' ? { key: optionsOrKey } : optionsOrKey,
    );
    const original = descriptor.value as unknown;
    if (typeof original !== 'function') {
      throw new InvalidLockOptionsError('target', `${where}: @DisLock applies to methods only`);
    }
    const { key, ifExpireWhenFinish, onBusy, ...timing } = options;
    const className = (target as { constructor: { name: string } }).constructor.name;
    const spec: LockedMethodSpec = {
      where,
      method: `${className}.${String(propertyKey)}`,
      resolveKey: compileWithContext(where, key),
      options: { ...timing, label: timing.label ?? labelOf(key, `${className}.${String(propertyKey)}`) },
      releaseOnFinish: ifExpireWhenFinish ?? true,
      onBusy: onBusy ?? 'throw',
    };
    const returns = returnKindOf(target, propertyKey, original);
    injectInterceptor(target);

    const method = original as AnyMethod;
    const locked = function (this: object, ...args: unknown[]): Observable<unknown> | Promise<unknown> {
      const interceptor = (this as Record<symbol, unknown> | undefined)?.[DISLOCK_INTERCEPTOR_PROPERTY];
      if (!(interceptor instanceof DisLockInterceptor)) {
        const error = new DisLockSetupError(
          `${where}: this instance was not created by Nest's dependency injection (or the method was called ` +
            'without its instance as `this`), so it has no lock service. ' +
            'Register the class as a provider or controller of a module that can see DisLockModule, and get it from Nest ' +
            '(not with `new`, `useValue` or `useFactory`).',
        );
        if (returns === 'promise') return Promise.reject(error);
        return returns === 'observable' ? throwError(() => error) : LockedResult.connect(throwError(() => error));
      }
      const invoke = (): unknown => method.apply(this, args);
      if (returns === 'promise') return interceptor.run(spec, invoke, args);
      return returns === 'observable'
        ? interceptor.intercept(spec, invoke, args)
        : interceptor.start(spec, invoke, args);
    };
    copyIdentity(method, locked);
    const previous = (Reflect.getOwnMetadata(DISLOCK_METADATA, method) ?? []) as DisLockOptions[];
    Reflect.defineMetadata(DISLOCK_METADATA, [...previous, options], locked);
    descriptor.value = locked;
    return descriptor;
  };
  return decorate;
}

function compileWithContext(where: string, key: LockKey | readonly LockKey[]): LockedMethodSpec['resolveKey'] {
  try {
    if (typeof key === 'string' || typeof key === 'function') return compileKey(key);
    const parts = key.map((part) => compileKey(part));
    return (args) => parts.map((resolve) => resolve(args));
  } catch (error) {
    if (error instanceof InvalidLockOptionsError) {
      throw new InvalidLockOptionsError('key', error.message.replace(/^@DisLock/, where));
    }
    throw error;
  }
}

/** The bounded name of a decorated lock for metrics and events: its template(s), or the method for a key function. */
function labelOf(key: LockKey | readonly LockKey[], method: string): string {
  const one = (part: LockKey): string => (typeof part === 'string' ? part : method);
  return typeof key === 'string' || typeof key === 'function' ? one(key) : [...new Set(key.map(one))].join(', ');
}
