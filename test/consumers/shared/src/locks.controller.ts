import { setTimeout as sleep } from 'node:timers/promises';
import { Controller, Get, Param, Query } from '@nestjs/common';
import { DisLock, LockService } from 'nestjs-dislock';
import { map, type Observable, timer } from 'rxjs';

@Controller()
export class LocksController {
  constructor(private readonly locks: LockService) {}

  /** Holds the lock `hold:<key>` for `?ms=` (1000 by default), or until the lock is lost or the app shuts down. */
  @Get('hold/:key')
  @DisLock('hold:{0}')
  async hold(@Param('key') key: string, @Query('ms') ms?: string): Promise<{ key: string; fencingToken?: number }> {
    const lock = this.locks.current();
    await sleep(Number(ms ?? 1000), undefined, { signal: lock?.signal });
    return { key, fencingToken: lock?.fencingToken };
  }

  /** The same as an Observable: the lock `stream:<key>` is held from subscribe to complete. */
  @Get('stream/:key')
  @DisLock('stream:{0}')
  stream(@Param('key') key: string, @Query('ms') ms?: string): Observable<{ key: string }> {
    return timer(Number(ms ?? 1000)).pipe(map(() => ({ key })));
  }

  /** Takes the lock `<name>` through LockService for the length of the request; busy: 409 at once. */
  @Get('service/:name')
  service(@Param('name') name: string): Promise<{ key: string; fencingToken: number }> {
    return this.locks.withLock(name, (lock) => ({ key: lock.key, fencingToken: lock.fencingToken }));
  }
}
