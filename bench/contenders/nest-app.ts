import 'reflect-metadata';
import {
  type DynamicModule,
  Injectable,
  type INestApplicationContext,
  type LoggerService,
  Module,
} from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { DisLock, DisLockModule, type DisLockModuleOptions, LockService } from 'nestjs-dislock';
import { type Body, LEASE_MS, WAIT_MS } from './locker';

/** A provider with `@DisLock` methods, as an application would write them. */
@Injectable()
export class LockedTarget {
  /** One attempt (waitTime 0, the default). */
  @DisLock({ key: 'k:{0}', expire: LEASE_MS })
  async once(_key: string, body: Body): Promise<void> {
    await body();
  }

  /** Waits up to 10 s for a busy lock. */
  @DisLock({ key: 'k:{0}', expire: LEASE_MS, waitTime: WAIT_MS })
  async waiting(_key: string, body: Body): Promise<void> {
    await body();
  }
}

@Module({})
class BenchLockModule {
  static forRoot(options: DisLockModuleOptions): DynamicModule {
    return { module: BenchLockModule, imports: [DisLockModule.forRoot(options)], providers: [LockedTarget] };
  }
}

/** Nest's logger for the benchmark: counts warnings and errors, keeps the first few, prints nothing. */
export class CountingLogger implements LoggerService {
  warnings = 0;
  errors = 0;
  readonly first: string[] = [];

  log(): void {}

  warn(message: unknown): void {
    this.warnings += 1;
    this.keep('warn', message);
  }

  error(message: unknown): void {
    this.errors += 1;
    this.keep('error', message);
  }

  private keep(level: string, message: unknown): void {
    if (this.first.length < 5) this.first.push(`${level}: ${String(message)}`);
  }

  snapshot(): { warnings: number; errors: number; first: string[] } {
    return { warnings: this.warnings, errors: this.errors, first: [...this.first] };
  }
}

export interface DislockApp {
  readonly app: INestApplicationContext;
  readonly locks: LockService;
  readonly target: LockedTarget;
  readonly logger: CountingLogger;
}

/** A Nest application context with DisLockModule, as a worker or a cron process would have. */
export async function startDislockApp(options: DisLockModuleOptions): Promise<DislockApp> {
  const logger = new CountingLogger();
  const app = await NestFactory.createApplicationContext(BenchLockModule.forRoot(options), { logger });
  return { app, locks: app.get(LockService), target: app.get(LockedTarget), logger };
}
