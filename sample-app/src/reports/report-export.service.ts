import { Inject, Injectable, ServiceUnavailableException } from '@nestjs/common';
import { setTimeout as sleep } from 'node:timers/promises';
import { DisLock, LockLostError, LockService } from 'nestjs-dislock';
import { APP_CONFIG, type AppConfig } from '../app.config';

/** Exports that may run at once, across every instance. */
export const EXPORT_PERMITS = 2;

export interface ReportExport {
  readonly name: string;
  /** Where the export was written (a stand-in: nothing is). */
  readonly file: string;
  readonly exportedBy: string;
  readonly durationMs: number;
}

@Injectable()
export class ReportExportService {
  constructor(
    private readonly locks: LockService,
    @Inject(APP_CONFIG) private readonly config: AppConfig,
  ) {}

  /**
   * Renders report `name` to a file: heavy on memory and on the reporting database, so at most
   * two exports run at a time cluster-wide, whatever the report and whichever instance is asked.
   * `permits: 2` makes `exports` a semaphore: each export holds one permit, with its own lease
   * renewed by the watchdog, and a crashed instance's permit comes back when its lease ends.
   *
   * A third export is refused at once (waitTime 0): `LockNotAcquiredError`, which Nest answers with
   * 409 Conflict, and the client retries later, instead of an HTTP request held open for as long
   * as two exports take. (With `waitTime`, it would wait its turn in arrival order instead.)
   */
  @DisLock({ key: 'exports', permits: EXPORT_PERMITS })
  async export(name: string): Promise<ReportExport> {
    const permit = this.locks.current('exports');
    if (!permit) throw new Error('unreachable: @DisLock runs this method while holding a permit');
    const started = performance.now();
    const chunks = 10;
    for (let chunk = 0; chunk < chunks; chunk += 1) {
      await sleep(this.config.exportWorkMs / chunks); // one page of the export
      // A lost permit (Redis unreachable for a whole lease, or the app shutting down) may let a
      // third export in: stop rather than run beyond the limit.
      if (permit.signal.aborted) {
        const reason: unknown = permit.signal.reason;
        const why = reason instanceof LockLostError ? reason.reason : String(reason);
        throw new ServiceUnavailableException(`The export of "${name}" stopped: its permit was lost (${why})`);
      }
    }
    return {
      name,
      file: `exports/${name}.pdf`,
      exportedBy: this.config.instance,
      durationMs: Math.round(performance.now() - started),
    };
  }
}
