import type { Observable } from 'rxjs';

/**
 * What a locked method may return, as a type. A locked call can only hand back a Promise or an
 * Observable (the lock is taken asynchronously), so the method must be declared to return one of them:
 * `Promise<T>` (any `async` method), `PromiseLike<T>`, `Observable<T>`, or a union of those. A
 * synchronous method (`T`, `void`, `unknown`, `any`, `never`, `Promise<T> | undefined`) is refused,
 * and so is a narrower promise or observable type (a `Subject<T>`, a Bluebird promise) that the call
 * would not return.
 */
type Returnable<R> =
  R extends PromiseLike<infer V>
    ? Promise<V> extends R
      ? true
      : false
    : R extends Observable<infer V>
      ? Observable<V> extends R
        ? true
        : false
      : false;

type IsAny<R> = 0 extends 1 & R ? true : false;

/**
 * The error a refused method gets: its descriptor lacks this property, and TypeScript says so, with
 * the key below as the explanation and the method's declared return type as the argument.
 */
export interface DisLockMethodMustReturnPromiseOrObservable<Returns> {
  readonly '@DisLock: a locked call returns a Promise (or an Observable): make the method async, or declare it to return Promise<T> or Observable<T>': Returns;
}

/** `unknown` (no constraint) for a method that may be locked, the explanation above otherwise. */
export type LockableMethodCheck<M> = M extends (...args: never[]) => infer R
  ? IsAny<R> extends true
    ? DisLockMethodMustReturnPromiseOrObservable<R>
    : [R] extends [never]
      ? DisLockMethodMustReturnPromiseOrObservable<R>
      : [Returnable<R>] extends [true]
        ? unknown
        : DisLockMethodMustReturnPromiseOrObservable<R>
  : DisLockMethodMustReturnPromiseOrObservable<M>;

declare const plainMethodDecorator: unique symbol;

/**
 * The `this` of the second signature of {@link DisLockDecorator}. TypeScript applies a decorator
 * with no `this`, so that signature never matches a decorated method; it only makes the decorator
 * assignable to `MethodDecorator` (for `applyDecorators`, which cannot check the return type).
 */
export interface DisLockAsPlainMethodDecorator {
  readonly [plainMethodDecorator]: true;
}

/**
 * What `DisLock(...)` returns: a method decorator that accepts only methods declared to return a
 * Promise or an Observable. On a synchronous method the compiler reports
 * {@link DisLockMethodMustReturnPromiseOrObservable}.
 */
export type DisLockDecorator = (<M>(
  target: object,
  propertyKey: string | symbol,
  descriptor: TypedPropertyDescriptor<M> & LockableMethodCheck<M>,
) => void) &
  ((
    this: DisLockAsPlainMethodDecorator,
    target: object,
    propertyKey: string | symbol,
    descriptor: PropertyDescriptor,
  ) => void);

/**
 * How the wrapper hands back a call, decided once when the class is defined:
 * - `promise`: declared to return a Promise (every `async` method is): run now, return a Promise;
 * - `observable`: declared to return an Observable: an Observable that takes the lock at subscribe;
 * - `either`: nothing usable recorded (an inferred return type, a union, an interface, a
 *   type-only import): run now and return a Promise that is also an Observable.
 */
export type ReturnKind = 'promise' | 'observable' | 'either';

/**
 * Reads the return type the compiler recorded (`design:returntype`). tsc, SWC and Oxc (Vite 8) record the same
 * thing: the class for a written `Promise<T>`/`Observable<T>` (and `Promise` for any `async`
 * method), `Object` or `Function` for unions, interfaces, aliases and type-only imports, and
 * `undefined` for an inferred return type of a non-async method. Only a class that is itself a
 * Promise or an Observable decides; an `async` function is a Promise even with no metadata at all.
 */
export function returnKindOf(target: object, propertyKey: string | symbol, method: unknown): ReturnKind {
  const type: unknown = Reflect.getMetadata('design:returntype', target, propertyKey);
  const proto = typeof type === 'function' ? (type.prototype as Record<string, unknown> | undefined) : undefined;
  if (typeof proto?.subscribe === 'function') return 'observable';
  if (typeof proto?.then === 'function' || Object.prototype.toString.call(method) === '[object AsyncFunction]') {
    return 'promise';
  }
  return 'either';
}
