import { Logger } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { AppModule } from './app.module';

function envNumber(name: string): number | undefined {
  const value = process.env[name];
  return value ? Number(value) : undefined;
}

async function bootstrap(): Promise<void> {
  const port = envNumber('PORT') ?? 3000;
  const instance = process.env.INSTANCE_NAME ?? `app-${process.pid}`;
  const app = await NestFactory.create(
    AppModule.forRoot({
      redisUrl: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379',
      instance,
      keyPrefix: process.env.KEY_PREFIX || undefined,
      lockWatchdogTimeout: envNumber('LOCK_WATCHDOG_MS'),
    }),
  );
  // On SIGTERM/SIGINT, app.close() runs: held locks are released and the Redis connections closed.
  app.enableShutdownHooks();
  await app.listen(port);
  new Logger('Sample').log(`Instance ${instance} listening on http://localhost:${port}`);
}

bootstrap().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
