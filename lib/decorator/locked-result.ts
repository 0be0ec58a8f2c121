import {
  Observable,
  type Observer,
  observable as interopKey,
  type Operator,
  type OperatorFunction,
  ReplaySubject,
  type Subscribable,
  type Subscriber,
  type Subscription,
  type TeardownLogic,
} from 'rxjs';

type Settle<T> = { resolve(value: T): void; reject(reason: unknown): void };

const ignore = (): void => undefined;

/**
 * The result of a locked call whose method did not record its return type (inferred, a union, an
 * interface): TypeScript may have told the caller `Promise<T>` or `Observable<T>`, so it is both. A
 * real Promise (`instanceof Promise`, `await`) of the method's last value (`undefined` if none), and
 * an Observable (`subscribe`, `pipe`, `isObservable`, rxjs `from` and the interop symbol) that replays
 * every value and then the completion or the error.
 *
 * The call runs once, from the start, whoever listens: it is `connect`ed to the locked pipeline at
 * once, like a Promise. An error rejects the Promise; subscribing counts as handling it, so a caller
 * that only subscribes (and handles the error there) leaves no unhandled rejection. When every
 * subscriber has unsubscribed and nobody has used the Promise side, the call is cancelled as an
 * Observable's would be: a wait for the lock stops, the method's Observable is torn down and the
 * lock released; the Promise then resolves with the last value seen so far.
 */
export class LockedResult<T> extends Promise<T | undefined> implements Subscribable<T> {
  // ES private fields: this object is handed to callers, who should see (and log) a Promise, not this state.

  /** `then`, `catch` and `finally` make plain Promises. */
  static override get [Symbol.species](): PromiseConstructor {
    return Promise;
  }

  readonly #replay = new ReplaySubject<T>();
  readonly #stream = new Observable<T>((subscriber) => this.#join(subscriber));
  #settle: Settle<T | undefined> | undefined;
  #connection: Subscription | undefined;
  #subscribers = 0;
  /** The Promise side is in use: `then` (so `await`, `catch`, `finally`) was called. */
  #awaited = false;
  #handled = false;
  #last: T | undefined;

  private constructor(executor: (resolve: (value: T | undefined) => void, reject: (reason: unknown) => void) => void) {
    super(executor);
  }

  /** Subscribes to `source` now, and returns the result that replays it. */
  static connect<T>(source: Observable<T>): LockedResult<T> {
    let settle: Settle<T | undefined> | undefined;
    const result = new LockedResult<T>((resolve, reject) => {
      settle = { resolve, reject };
    });
    result.#settle = settle;
    result.#connection = source.subscribe({
      next: (value) => result.#emit(value),
      error: (error: unknown) => result.#end(error),
      complete: () => result.#end(),
    });
    return result;
  }

  override then<A = T | undefined, B = never>(
    onFulfilled?: ((value: T | undefined) => A | PromiseLike<A>) | null,
    onRejected?: ((reason: unknown) => B | PromiseLike<B>) | null,
  ): Promise<A | B> {
    this.#awaited = true;
    return super.then(onFulfilled, onRejected);
  }

  subscribe(observerOrNext?: Partial<Observer<T>> | ((value: T) => void) | null): Subscription;
  /** @deprecated as on rxjs's `Observable`: pass an observer instead. */
  subscribe(
    next?: ((value: T) => void) | null,
    error?: ((error: unknown) => void) | null,
    complete?: (() => void) | null,
  ): Subscription;
  subscribe(
    observerOrNext?: Partial<Observer<T>> | ((value: T) => void) | null,
    error?: ((error: unknown) => void) | null,
    complete?: (() => void) | null,
  ): Subscription {
    if (typeof observerOrNext === 'function' || error || complete) {
      return this.#stream.subscribe({
        next: observerOrNext as ((value: T) => void) | undefined,
        error: error ?? undefined,
        complete: complete ?? undefined,
      });
    }
    return this.#stream.subscribe(observerOrNext ?? undefined);
  }

  pipe(...operations: OperatorFunction<unknown, unknown>[]): Observable<unknown> {
    return operations.reduce<Observable<unknown>>((source, operation) => operation(source), this.#stream);
  }

  forEach(next: (value: T) => void): Promise<void> {
    return this.#stream.forEach(next);
  }

  /** What `isObservable()` looks for, and what rxjs operators call on their source. */
  lift<R>(operator?: Operator<T, R>): Observable<R> {
    return this.#stream.lift(operator);
  }

  toPromise(): Promise<T | undefined> {
    return this.then((value) => value);
  }

  /** The interop Observable, under `Symbol.observable` (or `'@@observable'`): what rxjs `from` subscribes to. */
  [interopKey](): Subscribable<T> {
    return this.#stream;
  }

  #emit(value: T): void {
    this.#last = value;
    this.#replay.next(value);
  }

  /** Settles both sides, once: with the error, or with the last value (completed, or stopped by its subscribers). */
  #end(...outcome: [] | [error: unknown]): void {
    const settle = this.#settle;
    if (!settle) return;
    this.#settle = undefined;
    if (outcome.length === 0) {
      settle.resolve(this.#last);
      this.#replay.complete();
    } else {
      settle.reject(outcome[0]);
      this.#replay.error(outcome[0]);
    }
  }

  #join(subscriber: Subscriber<T>): TeardownLogic {
    if (!this.#handled) {
      this.#handled = true;
      super.then(undefined, ignore); // the subscriber handles the error
    }
    this.#subscribers += 1;
    const subscription = this.#replay.subscribe(subscriber);
    return () => {
      subscription.unsubscribe();
      this.#subscribers -= 1;
      if (this.#subscribers === 0 && !this.#awaited && this.#settle) {
        // Everyone left and nobody awaits: stop the call as an Observable's unsubscribe would.
        this.#end();
        this.#connection?.unsubscribe();
      }
    };
  }
}
