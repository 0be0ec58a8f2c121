/**
 * `DisLockModule.forRootAsync` next to `@nestjs/config`, as docs/configuration.md shows it: the
 * snippet as written boots and locks, and the common mistake (no `imports: [ConfigModule]`) fails at
 * startup with an error about DisLockModule and its fix.
 */
import { Injectable, Module, Optional } from '@nestjs/common';
import { ConfigModule, ConfigService } from '@nestjs/config';
import { Test } from '@nestjs/testing';
import { DisLockModule, InvalidLockOptionsError, LockService } from 'nestjs-dislock';
import { sharedClient, sharedRedisUrl, uniquePrefix } from './support/shared-redis';

const compile = (imports: Parameters<typeof Test.createTestingModule>[0]['imports']) =>
  Test.createTestingModule({ imports }).compile();

const failure = (promise: Promise<unknown>): Promise<unknown> =>
  promise.then(
    () => {
      throw new Error('expected the application to fail at startup');
    },
    (reason: unknown) => reason,
  );

describe('DisLockModule.forRootAsync with @nestjs/config', () => {
  const env = () => ({ REDIS_URL: sharedRedisUrl(), LOCK_PREFIX: uniquePrefix('async') });

  it('the documented snippet (imports: [ConfigModule]) boots, reads the configuration and locks', async () => {
    const values = env();
    const moduleRef = await compile([
      ConfigModule.forRoot({ ignoreEnvFile: true, load: [() => values] }),
      DisLockModule.forRootAsync({
        imports: [ConfigModule],
        inject: [ConfigService],
        useFactory: (config: ConfigService) => ({
          redis: config.getOrThrow<string>('REDIS_URL'),
          keyPrefix: config.getOrThrow<string>('LOCK_PREFIX'),
        }),
      }),
    ]);
    const app = await moduleRef.init();
    const redis = sharedClient();
    try {
      const handle = await app.get(LockService).tryLock('order:1');
      expect(handle).toBeDefined();
      expect(await redis.exists(`${values.LOCK_PREFIX}order:1`)).toBe(1);
      await handle?.release();
      expect(await redis.exists(`${values.LOCK_PREFIX}order:1`)).toBe(0);
    } finally {
      await app.close();
      redis.disconnect();
    }
  });

  it('without imports: [ConfigModule] it fails at startup naming DisLockModule, the token and the fix', async () => {
    const error = await failure(
      compile([
        ConfigModule.forRoot({ ignoreEnvFile: true, load: [env] }),
        DisLockModule.forRootAsync({
          inject: [ConfigService],
          useFactory: (config: ConfigService) => ({ redis: config.getOrThrow<string>('REDIS_URL') }),
        }),
      ]),
    );
    expect(error).toBeInstanceOf(InvalidLockOptionsError);
    const invalid = error as InvalidLockOptionsError;
    expect(invalid.option).toBe('inject');
    expect(invalid.message).toContain('DisLockModule.forRootAsync');
    expect(invalid.message).toContain('ConfigService (inject[0])');
    expect(invalid.message).toContain('imports: [ConfigModule]');
    expect(invalid.message).not.toContain('CONFIGURABLE_MODULE_OPTIONS');
  });

  it('a global ConfigModule needs no imports; a token the app marked optional may be missing', async () => {
    @Injectable()
    class Unregistered {}
    const values = env();
    let seen: unknown = 'not called';
    const moduleRef = await compile([
      ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true, load: [() => values] }),
      DisLockModule.forRootAsync({
        inject: [ConfigService, { token: Unregistered, optional: true }],
        useFactory: (config: ConfigService, maybe?: Unregistered) => {
          seen = maybe;
          return { redis: config.getOrThrow<string>('REDIS_URL'), keyPrefix: values.LOCK_PREFIX };
        },
      }),
    ]);
    const app = await moduleRef.init();
    try {
      expect(seen).toBeUndefined();
      expect(await app.get(LockService).withLock('x', () => 'ran')).toBe('ran');
    } finally {
      await app.close();
    }
  });

  it('useClass whose dependency is missing still fails with Nest naming the class and DisLockModule', async () => {
    @Injectable()
    class Options {
      constructor(
        @Optional() readonly unused: string | undefined,
        readonly config: ConfigService,
      ) {}
      create() {
        return { redis: sharedRedisUrl() };
      }
    }
    @Module({})
    class Empty {}
    const error = await failure(
      compile([
        ConfigModule.forRoot({ ignoreEnvFile: true }),
        Empty,
        DisLockModule.forRootAsync({ useClass: Options }),
      ]),
    );
    expect(String((error as Error).message)).toMatch(/Options[\s\S]*DisLockModule/);
  });
});
