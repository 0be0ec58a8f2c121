import { applyDecorators, type INestApplicationContext, SetMetadata, type Type } from '@nestjs/common';

/**
 * The metadata `@Interval(ms)` of @nestjs/schedule stores (same keys and shape, see its
 * `lib/decorators/interval.decorator.ts` and `lib/schedule.constants.ts`): three `SetMetadata`
 * calls on the method, nothing else. Used where the test must set each instance's phase itself (the real `@Interval` starts when its
 * application does).
 */
export const SCHEDULE_INTERVAL_OPTIONS = 'SCHEDULE_INTERVAL_OPTIONS';
export const SCHEDULER_NAME = 'SCHEDULER_NAME';
export const SCHEDULER_TYPE = 'SCHEDULER_TYPE';
/** `SchedulerType.INTERVAL` in @nestjs/schedule. */
export const INTERVAL_TYPE = 3;

export function FakeInterval(timeout: number): MethodDecorator {
  return applyDecorators(
    SetMetadata(SCHEDULE_INTERVAL_OPTIONS, { timeout }),
    SetMetadata(SCHEDULER_NAME, undefined),
    SetMetadata(SCHEDULER_TYPE, INTERVAL_TYPE),
  );
}

/**
 * What @nestjs/schedule's explorer and orchestrator do with that metadata, in brief: read it from
 * each method of the instance Nest built (`Reflector.get(SCHEDULER_TYPE, instance[method])`) and
 * call the method on `setInterval`, logging nothing and swallowing errors. Returns a stop function.
 */
export function startIntervals(app: INestApplicationContext, types: readonly Type<object>[]): () => void {
  const timers: NodeJS.Timeout[] = [];
  for (const type of types) {
    const instance = app.get<object, Record<string, unknown>>(type);
    const proto = Object.getPrototypeOf(instance) as object;
    for (const name of Object.getOwnPropertyNames(proto)) {
      const method = instance[name];
      if (name === 'constructor' || typeof method !== 'function') continue;
      if (Reflect.getMetadata(SCHEDULER_TYPE, method) !== INTERVAL_TYPE) continue;
      const { timeout } = Reflect.getMetadata(SCHEDULE_INTERVAL_OPTIONS, method) as { timeout: number };
      const run = (): void => {
        void Promise.resolve((method as () => unknown).call(instance)).catch(() => undefined);
      };
      timers.push(setInterval(run, timeout));
    }
  }
  return () => timers.forEach((timer) => clearInterval(timer));
}
