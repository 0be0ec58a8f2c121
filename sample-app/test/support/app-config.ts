import { type Provider } from '@nestjs/common';
import { APP_CONFIG, type AppConfigInput, resolveConfig } from '../../src/app.config';

/**
 * The app's config for a unit test. No `redisUrl` is ever dialled: `RedisService` is replaced by a
 * fake and the locks live in `DisLockTestingModule`'s in-memory store. The app's own work (a
 * payment, a report step) waits on `node:timers/promises`, which neither Vitest's nor Jest's fake
 * timers move as the app imports it: it takes real time, even under fake timers, so keep it short.
 */
export function appConfig(overrides: Partial<AppConfigInput> = {}): Provider {
  return {
    provide: APP_CONFIG,
    useValue: resolveConfig({
      redisUrl: 'redis://unused.invalid:6379',
      instance: 'test',
      payWorkMs: 0,
      reserveWorkMs: 0,
      priceStepMs: 0,
      reportSteps: 3,
      reportStepMs: 1,
      exportWorkMs: 10,
      // An override left undefined keeps the default above.
      ...Object.fromEntries(Object.entries(overrides).filter(([, value]) => value !== undefined)),
    }),
  };
}

/** The lock options AppModule gives DisLockModule, without the Redis: pass to `DisLockTestingModule.forRoot`. */
export const APP_LOCK_OPTIONS = { keyPrefix: 'sample:lock:', lockWatchdogTimeout: 1_500 } as const;
