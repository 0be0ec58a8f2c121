import type { INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { AppModule } from './app.module';

/** PLATFORM=fastify runs the same app on Fastify; Express otherwise, as `nest new` makes it. */
function create(): Promise<INestApplication> {
  return process.env.PLATFORM === 'fastify'
    ? NestFactory.create(AppModule, new FastifyAdapter())
    : NestFactory.create(AppModule);
}

async function bootstrap() {
  const app = await create();
  app.enableShutdownHooks();
  await app.listen(process.env.PORT ?? 3000, '127.0.0.1');
}
void bootstrap();
