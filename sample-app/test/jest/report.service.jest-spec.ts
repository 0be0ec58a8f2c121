/**
 * ReportService under Jest: a long job that stops between steps once `lock.signal` aborts. The same
 * kind of test as test/unit/report.service.spec.ts.
 */
import { Test } from '@nestjs/testing';
import { DisLockTesting, DisLockTestingModule } from 'nestjs-dislock';
import { ReportService } from '../../src/reports/report.service';
import { APP_LOCK_OPTIONS, appConfig } from '../support/app-config';
import { fakeRedisService } from '../support/fake-redis';
import { InMemoryReportArchive, inMemoryReportArchive } from '../support/in-memory-report-archive';
import { until } from '../support/until';

describe('ReportService.generate (Jest)', () => {
  it('stops at the next step when its lock is lost mid-run, and says why', async () => {
    const archive = new InMemoryReportArchive();
    const moduleRef = await Test.createTestingModule({
      imports: [DisLockTestingModule.forRoot(APP_LOCK_OPTIONS)],
      providers: [
        appConfig({ reportSteps: 100, reportStepMs: 10 }), // a second at most
        fakeRedisService(),
        inMemoryReportArchive(archive),
        ReportService,
      ],
    }).compile();
    const app = await moduleRef.init();
    const testing = app.get(DisLockTesting);

    const running = app.get(ReportService).generate('daily');
    await until(() => archive.writes.length >= 2);
    expect(testing.loseLock('report:daily')).toBe(1);
    const report = await running;

    expect(report).toMatchObject({ completed: false, lostReason: 'not-owner' });
    expect(report.steps).toBeLessThan(100);
    expect(archive.writes).toHaveLength(report.steps); // no step started after the loss was seen
    expect(testing.holders('report:daily')).toEqual([]);
    await app.close();
  });
});
