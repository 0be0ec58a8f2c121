// The same from a CommonJS file (node16 only): `import ... from` compiles to `require()` here.
import { DisLock, DisLockModule, LockService } from 'nestjs-dislock';

export const used = [DisLock, DisLockModule, LockService];
declare const locks: LockService;
// @ts-expect-error withLock takes a callback
void locks.withLock('x');
// @ts-expect-error an unknown option is a type error
DisLockModule.forRoot({ redis: 'redis://127.0.0.1:6379', notAnOption: true });
