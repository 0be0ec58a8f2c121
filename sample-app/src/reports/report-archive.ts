import { Inject, Injectable } from '@nestjs/common';
import { APP_CONFIG, type AppConfig } from '../app.config';
import { RedisService } from '../redis.service';

/** What the archive keeps of a report: who wrote it last, with which fencing token, how far it got. */
export interface ArchivedReport {
  readonly instance: string;
  readonly fencingToken: number;
  readonly steps: number;
}

/**
 * A fenced write: the record keeps the largest fencing token that has written it, and refuses a
 * smaller one. A holder whose lock ran out without it noticing (a long GC pause, a blocked event
 * loop, a network partition) still carries its old, smaller token, so its late writes bounce
 * instead of overwriting the work of the holder that came after it. The same token may write again.
 *
 * KEYS[1] the record (a hash: token, instance, steps); ARGV[1] token, ARGV[2] instance, ARGV[3] steps.
 * Returns 1 when written, 0 when refused.
 */
const FENCED_WRITE = `
local stored = tonumber(redis.call('hget', KEYS[1], 'token') or '0')
if tonumber(ARGV[1]) < stored then return 0 end
redis.call('hset', KEYS[1], 'token', ARGV[1], 'instance', ARGV[2], 'steps', ARGV[3])
return 1
`;

/** Where report jobs publish their progress, guarded by fencing tokens rather than by trust in the lock. */
@Injectable()
export class ReportArchive {
  constructor(
    private readonly redis: RedisService,
    @Inject(APP_CONFIG) private readonly config: AppConfig,
  ) {}

  /** Record progress of report `name` with the writer's fencing token; `false` when a newer holder has written. */
  async write(name: string, fencingToken: number, steps: number): Promise<boolean> {
    const written = await this.redis.client.eval(
      FENCED_WRITE,
      1,
      this.key(name),
      fencingToken,
      this.config.instance,
      steps,
    );
    return written === 1;
  }

  async read(name: string): Promise<ArchivedReport | null> {
    const record = await this.redis.client.hgetall(this.key(name));
    if (!record.token) return null;
    return { instance: record.instance, fencingToken: Number(record.token), steps: Number(record.steps) };
  }

  private key(name: string): string {
    return `${this.config.keyPrefix}archive:report:${name}`;
  }
}
