import { Inject, Injectable } from '@nestjs/common';
import { setTimeout as sleep } from 'node:timers/promises';
import { DisLock, LockLostError, LockService } from 'nestjs-dislock';
import { APP_CONFIG, type AppConfig } from '../app.config';
import { RedisService } from '../redis.service';
import { ReportArchive } from './report-archive';

export interface Report {
  readonly name: string;
  readonly generatedBy: string;
  /** All steps done while the lock was held. */
  readonly completed: boolean;
  readonly steps: number;
  readonly stepsPlanned: number;
  readonly durationMs: number;
  readonly lockWatchdogTimeout: number;
  /** PTTL of the lock key after each step: it goes back up each time the watchdog renews it. */
  readonly pttlMs: number[];
  /** The fencing token this run held; every progress write to the archive carried it. */
  readonly fencingToken: number;
  /**
   * Why the job stopped early: its lock was lost (`LockLostError.reason`), or `fenced-out` when
   * the archive refused its token because a newer holder had already written there.
   */
  readonly lostReason?: string;
}

@Injectable()
export class ReportService {
  constructor(
    private readonly locks: LockService,
    private readonly redis: RedisService,
    private readonly archive: ReportArchive,
    @Inject(APP_CONFIG) private readonly config: AppConfig,
  ) {}

  /**
   * A long job that must not run twice at once for the same report, on any instance.
   *
   * How long it takes is not known in advance, so there is no `expire`: the watchdog keeps a
   * lease of `lockWatchdogTimeout` (set module-wide in AppModule) alive for as long as the job
   * runs, renewing it every third of it. If this process dies, renewal stops and the lock frees
   * itself within one lease instead of blocking the report for good.
   *
   * The lock alone cannot stop a holder that was frozen past its lease from writing late, so each
   * step's progress goes to the archive with the lock's fencing token, which refuses a token
   * older than the newest it has seen.
   */
  @DisLock({ key: 'report:{0}' })
  async generate(name: string): Promise<Report> {
    const lock = this.locks.current(`report:${name}`);
    if (!lock) throw new Error('unreachable: @DisLock runs this method while holding the lock');
    const started = performance.now();
    const pttlMs: number[] = [];
    let steps = 0;
    let fencedOut = false;
    // Between steps, stop if the lock was lost (renewal found another owner, Redis was unreachable
    // for a whole lease, or the app is shutting down): another instance may be running it now.
    while (steps < this.config.reportSteps && !lock.signal.aborted) {
      await sleep(this.config.reportStepMs); // one chunk of the report
      if (!(await this.archive.write(name, lock.fencingToken, steps + 1))) {
        fencedOut = true; // a newer holder wrote first: this run is stale, whatever the lock says
        break;
      }
      steps += 1;
      pttlMs.push(await this.redis.client.pttl(lock.key));
    }
    const reason: unknown = lock.signal.reason;
    const lostReason = lock.signal.aborted
      ? reason instanceof LockLostError
        ? reason.reason
        : String(reason)
      : fencedOut
        ? 'fenced-out'
        : undefined;
    return {
      name,
      generatedBy: this.config.instance,
      completed: lostReason === undefined,
      steps,
      stepsPlanned: this.config.reportSteps,
      durationMs: Math.round(performance.now() - started),
      lockWatchdogTimeout: this.config.lockWatchdogTimeout,
      pttlMs,
      fencingToken: lock.fencingToken,
      ...(lostReason !== undefined && { lostReason }),
    };
  }
}
