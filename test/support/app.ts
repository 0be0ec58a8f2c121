import { type DynamicModule, type INestApplicationContext, type Provider, type Type } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { DisLockModule, type DisLockModuleOptions, LockService } from 'nestjs-dislock';
import { sharedRedisUrl, uniquePrefix } from './shared-redis';

export interface TestApp {
  readonly app: INestApplicationContext;
  readonly locks: LockService;
  readonly prefix: string;
  get<T>(type: Type<T>): T;
  close(): Promise<void>;
}

/** A Nest application context with DisLockModule on the shared Redis (or `options.redis`) and `providers`. */
export async function createTestApp(
  providers: Provider[] = [],
  options: Partial<DisLockModuleOptions> = {},
  imports: DynamicModule[] = [],
): Promise<TestApp> {
  const prefix = options.keyPrefix ?? uniquePrefix();
  const moduleRef = await Test.createTestingModule({
    imports: [DisLockModule.forRoot({ redis: sharedRedisUrl(), ...options, keyPrefix: prefix }), ...imports],
    providers,
  }).compile();
  const app = await moduleRef.init();
  return {
    app,
    locks: app.get(LockService),
    prefix,
    get: <T>(type: Type<T>) => app.get(type),
    close: () => app.close(),
  };
}
