import type { INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { AppModule } from './app.module.js';

/** PLATFORM=fastify runs the same app on Fastify; Express otherwise, as `nest new` makes it. */
async function create(): Promise<INestApplication> {
  if (process.env.PLATFORM === 'fastify') {
    const { FastifyAdapter } = await import('@nestjs/platform-fastify');
    return NestFactory.create(AppModule, new FastifyAdapter());
  }
  return NestFactory.create(AppModule);
}

async function bootstrap() {
  const app = await create();
  app.enableShutdownHooks();
  await app.listen(process.env.PORT ?? 3000, '127.0.0.1');
}
await bootstrap();
