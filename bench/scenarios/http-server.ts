/**
 * The HTTP cell's server, in its own process: a Nest (express) application with three endpoints
 * doing the same trivial work, without a lock, with `@DisLock` on a service method and with
 * `LockService.withLock` directly. Each request locks its own key (`h:<id>`), fixed 10 s lease.
 *
 * Talks to its parent over IPC: sends `{ type: 'listening', port }`, answers `cpu` with its CPU
 * time, and closes on `close` or when the parent goes away.
 */
import 'reflect-metadata';
import type { AddressInfo } from 'node:net';
import { Controller, type DynamicModule, Get, Injectable, Module, Query } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { DisLock, DisLockModule, LockService } from 'nestjs-dislock';
import { cpuMicros } from '../support/clock';
import { LEASE_MS } from '../contenders/locker';
import { CountingLogger } from '../contenders/nest-app';

interface Answer {
  readonly id: string;
  readonly ok: true;
}

@Injectable()
export class Work {
  async run(id: string): Promise<Answer> {
    return { id, ok: true };
  }
}

@Injectable()
export class LockedWork {
  constructor(private readonly work: Work) {}

  @DisLock({ key: 'h:{0}', expire: LEASE_MS })
  async run(id: string): Promise<Answer> {
    return this.work.run(id);
  }
}

@Controller()
export class BenchController {
  constructor(
    private readonly work: Work,
    private readonly locked: LockedWork,
    private readonly locks: LockService,
  ) {}

  @Get('no-lock')
  plain(@Query('id') id: string): Promise<Answer> {
    return this.work.run(id);
  }

  @Get('dislock-decorator')
  decorator(@Query('id') id: string): Promise<Answer> {
    return this.locked.run(id);
  }

  @Get('dislock-service')
  service(@Query('id') id: string): Promise<Answer> {
    return this.locks.withLock(`h:${id}`, () => this.work.run(id), { expire: LEASE_MS });
  }
}

@Module({})
class HttpBenchModule {
  static forRoot(redisUrl: string): DynamicModule {
    return {
      module: HttpBenchModule,
      imports: [DisLockModule.forRoot({ redis: redisUrl })],
      controllers: [BenchController],
      providers: [Work, LockedWork],
    };
  }
}

async function main(): Promise<void> {
  const redisUrl = process.env.BENCH_REDIS_URL;
  if (!redisUrl || !process.send) throw new Error('http-server.js is started by the HTTP cell, with IPC');
  const logger = new CountingLogger();
  const app = await NestFactory.create(HttpBenchModule.forRoot(redisUrl), { logger });
  await app.listen(0, '127.0.0.1');
  const { port } = app.getHttpServer().address() as AddressInfo;
  let closing = false;
  const close = async (): Promise<void> => {
    if (closing) return;
    closing = true;
    await app.close().catch(() => undefined);
    process.exit(0);
  };
  process.on('disconnect', () => void close());
  process.on('message', (message: { type: string }) => {
    if (message.type === 'cpu') process.send?.({ type: 'cpu', cpuUs: cpuMicros(), warnings: logger.warnings });
    if (message.type === 'close') void close();
  });
  process.send({ type: 'listening', port });
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
