// Compile-time checks of what @DisLock accepts, run by `npm run typecheck` (tsc --noEmit) and never
// executed: every class is built inside a function that nothing calls. A refused method must stay
// refused: each `@ts-expect-error` below fails the type check if its decorator ever compiles.
//
// What a refused method reads like (the first overload is the one that explains):
//   error TS1241: Unable to resolve signature of method decorator when called as an expression.
//     Overload 1 of 2, '(target: object, propertyKey: string | symbol, descriptor:
//       TypedPropertyDescriptor<(id: number) => string> & DisLockMethodMustReturnPromiseOrObservable<string>): void' ...
//       Property ''@DisLock: a locked call returns a Promise (or an Observable): make the method async, or declare it
//       to return Promise<T> or Observable<T>'' is missing in type 'TypedPropertyDescriptor<(id: number) => string>' ...
import { applyDecorators, Body, Controller, Get, Injectable, Param, Post } from '@nestjs/common';
import { DisLock, type DisLockDecorator } from 'nestjs-dislock';
import { Observable, of, Subject } from 'rxjs';

interface Order {
  readonly id: string;
}

/** Stands for `@Cron()`, `@OnEvent()` and the like: a plain `MethodDecorator`. */
const CronLike = (): MethodDecorator => () => undefined;

/** A promise type with more than a Promise: the locked call would not return one. */
class RichPromise<T> extends Promise<T> {
  cancel(): void {}
}

export function acceptedMethods(): unknown[] {
  @Injectable()
  class Provider {
    @DisLock('a:{0}')
    async inferred(id: string) {
      return id;
    }

    @DisLock('a:{0}')
    async annotated(id: string): Promise<string> {
      return id;
    }

    @DisLock('a:{0}')
    async nothing(_id: string): Promise<void> {}

    @DisLock('a:{0}')
    notAsync(id: string): Promise<string> {
      return Promise.resolve(id);
    }

    @DisLock('a:{0}')
    promiseInferred(id: string) {
      return Promise.resolve(id);
    }

    @DisLock('a:{0}')
    promiseLike(id: string): PromiseLike<string> {
      return Promise.resolve(id);
    }

    @DisLock('a:{0}')
    async fails(_id: string): Promise<never> {
      throw new Error('no');
    }

    @DisLock('a:{0}')
    generic<T>(_id: string, value: T): Promise<T> {
      return Promise.resolve(value);
    }

    @DisLock('o:{0}')
    observableAnnotated(id: string): Observable<string> {
      return of(id);
    }

    @DisLock('o:{0}')
    observableInferred(id: string) {
      return of(id, id);
    }

    @DisLock('o:{0}')
    either(id: string): Promise<string> | Observable<string> {
      return id ? of(id) : Promise.resolve(id);
    }

    @DisLock('a:{0}')
    withThis(this: Provider, id: string): Promise<string> {
      return Promise.resolve(`${this.constructor.name}:${id}`);
    }

    @CronLike()
    @DisLock('nightly')
    @CronLike()
    async nightly(): Promise<void> {}
  }

  @Controller('orders')
  class OrdersController {
    @Get(':id')
    @DisLock('order:{0}')
    async get(@Param('id') id: string) {
      return { id };
    }

    @Post()
    @DisLock((order: Order) => `order:${order.id}`)
    async create(@Body() order: Order): Promise<Order> {
      return order;
    }

    @Get(':id/events')
    @DisLock('order:{0}')
    events(@Param('id') id: string): Observable<string> {
      return of(id);
    }

    @Get(':id/stream')
    @DisLock('order:{0}')
    stream(@Param('id') id: string) {
      return of(id);
    }
  }

  abstract class Job {
    abstract run(id: string): Promise<string>;

    @DisLock('job:{0}')
    async base(id: string): Promise<string> {
      return id;
    }
  }

  class NightlyJob extends Job {
    @DisLock('job:{0}')
    override async run(id: string) {
      return id;
    }

    // An override without the decorator is not locked, and is not checked either.
    override base(id: string): Promise<string> {
      return super.base(id);
    }
  }

  class AuditedJob extends NightlyJob {
    @DisLock('audit:{0}')
    override async run(id: string): Promise<string> {
      return super.run(id);
    }
  }

  // Still a MethodDecorator, for applyDecorators (which cannot see the method, so checks nothing).
  const asMethodDecorator: MethodDecorator = DisLock('k');
  const typed: DisLockDecorator = DisLock({ key: 'k', waitTime: 100 });
  const Composed = (key: string): MethodDecorator => applyDecorators(CronLike(), DisLock(key));

  class Composition {
    @Composed('c')
    async run(): Promise<void> {}
  }

  return [Provider, OrdersController, NightlyJob, AuditedJob, Composition, asMethodDecorator, typed];
}

export function refusedMethods(): unknown[] {
  abstract class Base {
    abstract compute(id: string): number;
  }

  @Injectable()
  class Provider extends Base {
    // @ts-expect-error a synchronous method: its caller would be told `number` and get a Promise
    @DisLock('s:{0}')
    override compute(id: string): number {
      return id.length;
    }

    // @ts-expect-error an inferred synchronous return type
    @DisLock('s:{0}')
    inferred(id: string) {
      return id.length;
    }

    // @ts-expect-error void
    @DisLock('s:{0}')
    nothing(_id: string): void {}

    // @ts-expect-error unknown
    @DisLock('s:{0}')
    anything(id: string): unknown {
      return id;
    }

    // @ts-expect-error any hides whether the method is synchronous: annotate Promise<T> or Observable<T>
    @DisLock('s:{0}')
    // eslint-disable-next-line @typescript-eslint/no-explicit-any -- the case under test
    untyped(id: string): any {
      return id;
    }

    // @ts-expect-error never: it throws synchronously, but the locked call would reject instead
    @DisLock('s:{0}')
    throws(_id: string): never {
      throw new Error('no');
    }

    // @ts-expect-error sometimes synchronous
    @DisLock('s:{0}')
    maybe(id: string): Promise<string> | undefined {
      return id ? Promise.resolve(id) : undefined;
    }

    // @ts-expect-error a Subject: the locked call returns an Observable, which has no `next`
    @DisLock('s:{0}')
    subject(_id: string): Subject<string> {
      return new Subject<string>();
    }

    // @ts-expect-error a Promise subclass: the locked call returns a plain Promise, which has no `cancel`
    @DisLock('s:{0}')
    rich(id: string): RichPromise<string> {
      return new RichPromise<string>((resolve) => resolve(id));
    }

    // @ts-expect-error a getter is not a method
    @DisLock('s')
    get value(): Promise<number> {
      return Promise.resolve(1);
    }
  }

  @Controller('sync')
  class SyncController {
    @Get(':id')
    // @ts-expect-error stacked with Nest's decorators and parameter decorators, still refused
    @DisLock('order:{0}')
    get(@Param('id') id: string) {
      return { id };
    }

    @Post()
    @CronLike()
    // @ts-expect-error the same with a body
    @DisLock((order: Order) => `order:${order.id}`)
    create(@Body() order: Order): Order {
      return order;
    }
  }

  return [Provider, SyncController];
}

export function scheduledJobOptions(): unknown[] {
  class Jobs {
    @DisLock({ key: 'tick', onBusy: 'skip', lockAtLeastFor: 150, expire: 1_000 })
    async tick(): Promise<void> {}

    @DisLock({ key: 'tick', onBusy: 'throw' })
    async strict(): Promise<void> {}

    // @ts-expect-error onBusy is 'throw' or 'skip'
    @DisLock({ key: 'tick', onBusy: 'ignore' })
    async other(): Promise<void> {}
  }
  return [Jobs];
}
