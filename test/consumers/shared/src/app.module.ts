import { Module } from '@nestjs/common';
import { DisLockModule } from 'nestjs-dislock';
import { LocksController } from './locks.controller.js';

const redis = process.env.REDIS_URL;
if (!redis) throw new Error('Set REDIS_URL (redis://127.0.0.1:PORT): this app never guesses a Redis');

@Module({
  // operationTimeout: a short bound on Redis round trips, so that a stopped Redis answers 503 quickly.
  imports: [DisLockModule.forRoot({ redis, operationTimeout: 1_000 })],
  controllers: [LocksController],
})
export class AppModule {}
