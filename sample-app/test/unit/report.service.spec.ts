/**
 * ReportService: a long job under a watchdog lock that checks `lock.signal` between its steps and
 * writes its progress with the lock's fencing token. ReportArchive (a fenced write in Redis) is
 * replaced by an in-memory one with the same rule.
 */
import { type INestApplicationContext, ServiceUnavailableException } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { DisLockTesting, DisLockTestingModule, LockNotAcquiredError } from 'nestjs-dislock';
import { ReportExportService } from '../../src/reports/report-export.service';
import { ReportService } from '../../src/reports/report.service';
import { APP_LOCK_OPTIONS, appConfig } from '../support/app-config';
import { fakeRedisService } from '../support/fake-redis';
import { InMemoryReportArchive, inMemoryReportArchive } from '../support/in-memory-report-archive';

describe('ReportService.generate', () => {
  let app: INestApplicationContext;
  let reports: ReportService;
  let testing: DisLockTesting;
  let archive: InMemoryReportArchive;

  /** The app with a report of `reportSteps` steps of 10 ms each (real time: the app sleeps with node:timers/promises). */
  async function start(reportSteps = 5): Promise<void> {
    archive = new InMemoryReportArchive();
    const moduleRef = await Test.createTestingModule({
      imports: [DisLockTestingModule.forRoot(APP_LOCK_OPTIONS)],
      providers: [
        appConfig({ reportSteps, reportStepMs: 10 }),
        fakeRedisService(),
        inMemoryReportArchive(archive),
        ReportService,
      ],
    }).compile();
    app = await moduleRef.init();
    reports = app.get(ReportService);
    testing = app.get(DisLockTesting);
  }

  afterEach(() => app.close());

  it('runs every step while it holds the lock, and frees it at the end', async () => {
    await start();
    const report = await reports.generate('daily');
    expect(report).toMatchObject({ name: 'daily', completed: true, steps: 5 });
    expect(report.lostReason).toBeUndefined();
    expect(await archive.read('daily')).toMatchObject({ fencingToken: report.fencingToken, steps: 5 });
    expect(testing.holders('report:daily')).toEqual([]);
  });

  it('answers 409 while the same report runs elsewhere', async () => {
    await start();
    testing.occupy('report:daily');
    await expect(reports.generate('daily')).rejects.toBeInstanceOf(LockNotAcquiredError);
    await expect(reports.generate('weekly')).resolves.toMatchObject({ completed: true });
  });

  it('stops at the next step when its lock is lost mid-run, and says why', async () => {
    await start(100); // a second at most
    const running = reports.generate('daily');
    await vi.waitFor(() => expect(archive.writes.length).toBeGreaterThanOrEqual(2), { interval: 5 });

    expect(testing.loseLock('report:daily')).toBe(1);
    const report = await running;

    expect(report).toMatchObject({ completed: false, lostReason: 'not-owner' });
    expect(report.steps).toBeGreaterThanOrEqual(2);
    expect(report.steps).toBeLessThan(100);
    // The step under way when the lock was lost still wrote (the archive's fencing is there for
    // that); no step started after the loss was seen.
    expect(archive.writes).toHaveLength(report.steps);
    expect(testing.holders('report:daily')).toEqual([]);
  });

  it('each run carries a larger fencing token; a stale one is fenced out of the archive', async () => {
    await start();
    const first = await reports.generate('daily');
    const second = await reports.generate('daily');
    expect(second.fencingToken).toBeGreaterThan(first.fencingToken);

    await archive.write('daily', second.fencingToken + 1_000, 1); // a newer holder has written meanwhile
    await expect(reports.generate('daily')).resolves.toMatchObject({
      completed: false,
      lostReason: 'fenced-out',
      steps: 0,
    });
  });
});

describe('ReportExportService.export', () => {
  let app: INestApplicationContext;

  afterEach(() => app.close());

  it('runs two exports at once; a third answers 409; a lost permit stops its export with 503', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [DisLockTestingModule.forRoot(APP_LOCK_OPTIONS)],
      providers: [appConfig({ exportWorkMs: 1_000 }), ReportExportService],
    }).compile();
    app = await moduleRef.init();
    const exports = app.get(ReportExportService);
    const testing = app.get(DisLockTesting);

    const running = [exports.export('a').catch((e: unknown) => e), exports.export('b').catch((e: unknown) => e)];
    await vi.waitFor(() => expect(testing.holders('exports')).toHaveLength(2), { interval: 5 });
    expect(testing.holders('exports').map((holder) => holder.exclusive)).toEqual([false, false]);
    await expect(exports.export('c')).rejects.toBeInstanceOf(LockNotAcquiredError);

    expect(testing.loseLock('exports')).toBe(2); // both permits
    for (const outcome of await Promise.all(running)) {
      expect(outcome).toBeInstanceOf(ServiceUnavailableException);
      expect((outcome as Error).message).toMatch(/its permit was lost \(not-owner\)/);
    }
  });
});
