import { Inject, Injectable } from '@nestjs/common';
import { Cron } from '@nestjs/schedule';
import { DisLock } from 'nestjs-dislock';
import { APP_CONFIG, type AppConfig } from '../app.config';
import { RedisService } from '../redis.service';

/**
 * A job that every instance schedules and one instance runs per tick: each second, the instance
 * that takes the lock appends a line to the digest (`<keyPrefix>digests`, the last 100 kept); the
 * others find the lock busy and skip (`onBusy: 'skip'`), with a debug line, not an error.
 * `lockAtLeastFor` keeps the tick taken for 500 ms although the job takes a few: an instance whose
 * clock or scheduler runs up to that much late finds it still taken and skips too. `expire` is the
 * most it may hold it (a job stuck longer than that no longer excludes the next tick).
 */
@Injectable()
export class DigestJob {
  constructor(
    @Inject(APP_CONFIG) private readonly config: AppConfig,
    private readonly redis: RedisService,
  ) {}

  @Cron('* * * * * *')
  @DisLock({ key: 'digest', onBusy: 'skip', lockAtLeastFor: 500, expire: 5_000 })
  async publish(): Promise<void> {
    const list = `${this.config.keyPrefix}digests`;
    await this.redis.client.multi().rpush(list, `${Date.now()}:${this.config.instance}`).ltrim(list, -100, -1).exec();
  }
}
