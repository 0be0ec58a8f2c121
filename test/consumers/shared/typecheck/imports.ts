// Type-checked (never run) by run.mjs in each app: under bundler and node16 (nest12-esm) and under
// node10 (nest11-cjs, `"module": "commonjs"`, Nest 10's tsconfig, kept by many projects since). The
// package's types must resolve, and resolve to real types, not `any` (each @ts-expect-error needs
// an error).
import type { DynamicModule } from '@nestjs/common';
import { DisLock, DisLockModule, LockService } from 'nestjs-dislock';

export const module: DynamicModule = DisLockModule.forRoot({ redis: 'redis://127.0.0.1:6379' });

export class Orders {
  constructor(private readonly locks: LockService) {}

  @DisLock('order:{0}')
  async pay(id: number): Promise<string> {
    return this.locks.withLock(`audit:${id}`, (lock) => lock.key);
  }
}

declare const locks: LockService;
// @ts-expect-error withLock takes a callback
void locks.withLock('x');
// @ts-expect-error an unknown option is a type error
DisLockModule.forRoot({ redis: 'redis://127.0.0.1:6379', notAnOption: true });
// @ts-expect-error a key is a string, a function or options
DisLock(42);
