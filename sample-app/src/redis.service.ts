import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { Redis } from 'ioredis';
import { APP_CONFIG, type AppConfig } from './app.config';

/**
 * The app's own Redis connection, for its data (stock counters) and for looking at lock keys.
 * DisLockModule keeps a connection of its own, created from the same URL.
 */
@Injectable()
export class RedisService implements OnApplicationShutdown {
  readonly client: Redis;

  constructor(@Inject(APP_CONFIG) config: AppConfig) {
    this.client = new Redis(config.redisUrl);
  }

  async onApplicationShutdown(): Promise<void> {
    await this.client.quit();
  }
}
