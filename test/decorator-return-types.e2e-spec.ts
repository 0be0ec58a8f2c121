import { Body, Controller, Get, type INestApplication, Injectable, Param, Post } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import type { Redis } from 'ioredis';
import { DisLock, DisLockModule, DisLockSetupError, LockService } from 'nestjs-dislock';
import {
  concatMap,
  finalize,
  from,
  interval,
  isObservable,
  lastValueFrom,
  map,
  mergeMap,
  Observable,
  of,
  take,
  throwError,
  timer,
  toArray,
} from 'rxjs';
import request from 'supertest';
import { createTestApp, type TestApp } from './support/app';
import { gate } from './support/async';
import { eventually, sharedClient, sharedRedisUrl, sleep, uniquePrefix } from './support/shared-redis';

// What a caller of a @DisLock method gets must be what TypeScript told it. A method that writes its
// return type gets exactly that (a Promise, or a lazy Observable); one whose Observable return type is
// inferred records none, and gets a Promise that is also an Observable. (The compile-time half, sync
// methods refused, is test/types/dislock-decorator.types.ts.)

let redis: Redis;
const unhandled: unknown[] = [];
const onUnhandled = (reason: unknown): void => {
  unhandled.push(reason);
};

beforeAll(() => {
  redis = sharedClient();
  process.on('unhandledRejection', onUnhandled);
});

afterAll(() => {
  process.off('unhandledRejection', onUnhandled);
  redis.disconnect();
});

afterEach(async () => {
  await sleep(20); // Node reports an unhandled rejection once the microtasks of its turn have run
  expect(unhandled.splice(0)).toEqual([]);
});

/** The rejection reason of `promise` (fails the test if it resolves). */
async function rejection(promise: PromiseLike<unknown>): Promise<unknown> {
  return Promise.resolve(promise).then(
    (value) => {
      throw new Error(`expected a rejection, got ${JSON.stringify(value)}`);
    },
    (reason: unknown) => reason,
  );
}

/** The error an Observable ends with, through `subscribe` only (never its Promise side). */
function observedError(source: { subscribe(observer: { error(error: unknown): void }): unknown }): Promise<unknown> {
  return new Promise((resolve) => {
    source.subscribe({ error: resolve });
  });
}

const asObservable = <T>(value: Observable<T>): Observable<T> => value;

@Injectable()
class Streams {
  calls = 0;

  constructor(readonly locks: LockService) {}

  // ---- no return type written: nothing recorded ----------------------------------------------

  @DisLock('plain:{0}')
  plain(_id: number, count: number, probe: () => Promise<number>) {
    this.calls += 1;
    return interval(20).pipe(
      take(count),
      concatMap(() => probe()),
    );
  }

  @DisLock('plain-gated:{0}')
  gated(_id: number, until: Promise<void>) {
    return new Observable<string>((subscriber) => {
      subscriber.next('started');
      void until.then(() => {
        subscriber.next('ending');
        subscriber.complete();
      });
    });
  }

  @DisLock('plain-ticks:{0}')
  ticks(_id: number, onFinalize: () => void) {
    return interval(20).pipe(finalize(onFinalize));
  }

  @DisLock('plain-fail:{0}')
  failing(_id: number, error: unknown) {
    return timer(20).pipe(mergeMap(() => throwError(() => error)));
  }

  @DisLock('plain-throw:{0}')
  throwing(_id: number, error: Error | undefined) {
    if (error) throw error;
    return of('unreached');
  }

  @DisLock('plain-promise:{0}')
  promised(_id: number, done: () => void) {
    return sleep(20).then(() => {
      done();
      return 'done';
    });
  }

  @DisLock('plain-promise-fail:{0}')
  promisedFail(_id: number, error: unknown) {
    return sleep(20).then(() => {
      throw error;
    });
  }

  @DisLock('either:{0}')
  either(_id: number, stream: boolean): Promise<string> | Observable<string> {
    return stream ? of('a', 'b') : Promise.resolve('p');
  }

  // ---- return type written (or async): unchanged ---------------------------------------------

  @DisLock('annotated:{0}')
  annotated(_id: number, probe: () => Promise<number>): Observable<number> {
    this.calls += 1;
    return timer(20).pipe(concatMap(() => probe()));
  }

  @DisLock('annotated-promise:{0}')
  async annotatedPromise(_id: number): Promise<string> {
    return 'annotated';
  }

  @DisLock('async-inferred:{0}')
  async asyncInferred(_id: number) {
    return 'inferred';
  }
}

/** Never registered with Nest: built with `new`. */
class Manual {
  @DisLock('manual:{0}')
  plain(_id: number) {
    return of(1);
  }
}

describe('@DisLock return types', () => {
  let t: TestApp;
  const key = (name: string): string => `${t.prefix}${name}`;
  const exists = (name: string): Promise<number> => redis.exists(key(name));

  beforeAll(async () => {
    t = await createTestApp([Streams]);
  });

  afterAll(async () => {
    await t.close();
  });

  describe('what the decision reads (design:returntype, as the compiler of this run recorded it)', () => {
    const returnType = (name: keyof Streams): unknown =>
      Reflect.getMetadata('design:returntype', Streams.prototype, name);

    it('nothing for an inferred return type of a method that is not async, as tsc', () => {
      expect(returnType('plain')).toBeUndefined();
      expect(returnType('promised')).toBeUndefined();
    });

    it('Object for a union; the class for a written Promise or Observable; Promise for any async method', () => {
      expect(returnType('either')).toBe(Object);
      expect(returnType('annotated')).toBe(Observable);
      expect(returnType('annotatedPromise')).toBe(Promise);
      expect(returnType('asyncInferred')).toBe(Promise);
    });
  });

  describe('an Observable return type that is inferred', () => {
    it('gives a real Observable: pipe() works and every value arrives, while the lock is held', async () => {
      const svc = t.get(Streams);
      const before = svc.calls;
      const stream = svc.plain(1, 3, () => exists('plain:1'));
      expect(isObservable(stream)).toBe(true);
      expect(stream).toBeInstanceOf(Promise);
      // Each value is the EXISTS of the key, read inside the method's Observable.
      expect(
        await lastValueFrom(
          stream.pipe(
            map((held) => `held:${held}`),
            toArray(),
          ),
        ),
      ).toEqual(['held:1', 'held:1', 'held:1']);
      expect(await exists('plain:1')).toBe(0); // completion comes after the release
      expect(svc.calls).toBe(before + 1);
    });

    it('holds the lock until the Observable completes, then releases it', async () => {
      const until = gate();
      const seen: string[] = [];
      const completed = new Promise<void>((resolve) => {
        t.get(Streams)
          .gated(1, until.promise)
          .subscribe({ next: (value) => seen.push(value), complete: resolve });
      });
      expect(await eventually(() => seen.length === 1)).toBe(true);
      expect(seen).toEqual(['started']);
      expect(await exists('plain-gated:1')).toBe(1);
      await sleep(50);
      expect(await exists('plain-gated:1')).toBe(1);
      until.open();
      await completed;
      expect(seen).toEqual(['started', 'ending']);
      expect(await exists('plain-gated:1')).toBe(0);
    });

    it('runs once, at the call: every subscriber, early or late, sees every value', async () => {
      const svc = t.get(Streams);
      const before = svc.calls;
      const stream = svc.plain(2, 3, async () => 7);
      const early = lastValueFrom(stream.pipe(toArray()));
      const viaFrom = lastValueFrom(from(stream).pipe(toArray())); // rxjs interop, as Nest's interceptors use
      expect(await early).toEqual([7, 7, 7]);
      expect(await viaFrom).toEqual([7, 7, 7]);
      expect(await lastValueFrom(stream.pipe(toArray()))).toEqual([7, 7, 7]); // after completion: replayed
      expect(svc.calls).toBe(before + 1);
      expect(await exists('plain:2')).toBe(0);
    });

    it('awaited, gives the last value', async () => {
      const stream: unknown = t.get(Streams).plain(3, 2, async () => 5);
      expect(await stream).toBe(5);
      expect(await exists('plain:3')).toBe(0);
    });

    it('unsubscribed early (take(1)), tears the method down and frees the lock', async () => {
      const onFinalize = vi.fn();
      const first = await lastValueFrom(t.get(Streams).ticks(1, onFinalize).pipe(take(1)));
      expect(first).toBe(0);
      expect(await eventually(() => onFinalize.mock.calls.length === 1)).toBe(true);
      expect(await eventually(async () => (await exists('plain-ticks:1')) === 0)).toBe(true);
    });

    it('unsubscribed before its lock is taken, never runs the method and leaves no lock', async () => {
      const svc = t.get(Streams);
      const before = svc.calls;
      svc
        .plain(9, 3, async () => 1)
        .subscribe()
        .unsubscribe();
      await sleep(100);
      expect(svc.calls).toBe(before);
      expect(await exists('plain:9')).toBe(0);
    });

    it('passes an error on untouched to subscribers and to awaiters, and frees the lock', async () => {
      const error = new Error('stream failed');
      expect(await observedError(t.get(Streams).failing(1, error))).toBe(error);
      expect(await exists('plain-fail:1')).toBe(0);
      expect(await rejection(lastValueFrom(t.get(Streams).failing(2, error)))).toBe(error);
      expect(await rejection(t.get(Streams).failing(3, error) as unknown as Promise<never>)).toBe(error);
      const notAnError = { code: 42 };
      expect(await observedError(t.get(Streams).failing(4, notAnError))).toBe(notAnError);
      expect(await exists('plain-fail:4')).toBe(0);
    });

    it('passes on the error of a method that throws instead of returning', async () => {
      const error = new RangeError('bad input');
      expect(await observedError(t.get(Streams).throwing(1, error))).toBe(error);
      expect(await rejection(t.get(Streams).throwing(2, error) as unknown as Promise<never>)).toBe(error);
      expect(await exists('plain-throw:1')).toBe(0);
      expect(await exists('plain-throw:2')).toBe(0);
    });

    it('fails with DisLockSetupError on both sides for an instance not built by Nest', async () => {
      const manual = new Manual();
      expect(await observedError(manual.plain(1))).toBeInstanceOf(DisLockSetupError);
      expect(await rejection(manual.plain(2) as unknown as Promise<never>)).toBeInstanceOf(DisLockSetupError);
    });
  });

  describe('a Promise return type that is inferred', () => {
    it('still runs, inside the lock, when the caller neither awaits nor subscribes', async () => {
      const done = vi.fn();
      void t.get(Streams).promised(1, done);
      expect(await eventually(async () => (await exists('plain-promise:1')) === 1)).toBe(true);
      expect(await eventually(() => done.mock.calls.length === 1)).toBe(true);
      expect(await eventually(async () => (await exists('plain-promise:1')) === 0)).toBe(true);
    });

    it('resolves to its value, and is also an Observable of it', async () => {
      const result = t.get(Streams).promised(2, () => undefined);
      expect(await result).toBe('done');
      expect(await exists('plain-promise:2')).toBe(0);
      const observed = t.get(Streams).promised(3, () => undefined) as unknown as Observable<string>;
      expect(await lastValueFrom(asObservable(observed).pipe(toArray()))).toEqual(['done']);
    });

    it('passes a rejection on untouched, to awaiters and to subscribers only', async () => {
      const error = new TypeError('declined');
      expect(await rejection(t.get(Streams).promisedFail(1, error))).toBe(error);
      expect(await exists('plain-promise-fail:1')).toBe(0);
      const observed = t.get(Streams).promisedFail(2, error) as unknown as Observable<never>;
      expect(await observedError(observed)).toBe(error);
      expect(await exists('plain-promise-fail:2')).toBe(0);
    });
  });

  describe('a union Promise<T> | Observable<T>', () => {
    it('is whichever the caller checks for', async () => {
      const svc = t.get(Streams);
      const stream = svc.either(1, true);
      expect(isObservable(stream)).toBe(true);
      if (!isObservable(stream)) throw new Error('unreachable');
      expect(await lastValueFrom(stream.pipe(toArray()))).toEqual(['a', 'b']);
      const promised = svc.either(2, false);
      expect(promised).toBeInstanceOf(Promise);
      expect(await promised).toBe('p');
      expect(await exists('either:1')).toBe(0);
      expect(await exists('either:2')).toBe(0);
    });
  });

  describe('a written return type (unchanged)', () => {
    it('Observable: a plain lazy Observable, nothing runs before subscribe', async () => {
      const svc = t.get(Streams);
      const before = svc.calls;
      const stream = svc.annotated(1, () => exists('annotated:1'));
      expect(stream).toBeInstanceOf(Observable);
      expect(stream).not.toBeInstanceOf(Promise);
      await sleep(50);
      expect(svc.calls).toBe(before);
      expect(await exists('annotated:1')).toBe(0);
      expect(await lastValueFrom(stream)).toBe(1);
      expect(svc.calls).toBe(before + 1);
      expect(await exists('annotated:1')).toBe(0);
    });

    it('Promise, written or from async: a plain native Promise', async () => {
      const svc = t.get(Streams);
      for (const result of [svc.annotatedPromise(1), svc.asyncInferred(1)]) {
        expect(Object.getPrototypeOf(result)).toBe(Promise.prototype);
        expect(isObservable(result)).toBe(false);
      }
      expect(await svc.annotatedPromise(2)).toBe('annotated');
      expect(await svc.asyncInferred(2)).toBe('inferred');
    });
  });
});

@Controller('orders')
class OrdersController {
  @Get(':id/history')
  @DisLock('history:{0}')
  history(@Param('id') id: string) {
    return of(`${id}:created`, `${id}:paid`);
  }

  @Post()
  @DisLock((order: { id: string }) => `order:${order.id}`)
  create(@Body() order: { id: string }) {
    return sleep(10).then(() => ({ created: order.id }));
  }
}

describe('@DisLock return types through Nest HTTP', () => {
  let app: INestApplication;
  const prefix = uniquePrefix('return-types');

  beforeAll(async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [DisLockModule.forRoot({ redis: sharedRedisUrl(), keyPrefix: prefix })],
      controllers: [OrdersController],
    }).compile();
    app = moduleRef.createNestApplication({ logger: false });
    await app.init();
  });

  afterAll(async () => {
    await app.close();
  });

  it('an inferred Observable answers with its last value, as Nest does for an Observable', async () => {
    const response = await request(app.getHttpServer()).get('/orders/7/history').expect(200);
    expect(response.text).toBe('7:paid');
    expect(await redis.exists(`${prefix}history:7`)).toBe(0);
  });

  it('an inferred Promise with @Body() answers with its value', async () => {
    const response = await request(app.getHttpServer()).post('/orders').send({ id: 'o-1' }).expect(201);
    expect(response.body).toEqual({ created: 'o-1' });
    expect(await redis.exists(`${prefix}order:o-1`)).toBe(0);
  });
});
