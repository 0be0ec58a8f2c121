/**
 * The snippet of docs/configuration.md, "From configuration: `forRootAsync`", as written there:
 * `npm run typecheck` fails if it stops compiling (test/forroot-async.e2e-spec.ts runs the same
 * module). Never run.
 */
import { Module } from '@nestjs/common';
import { ConfigModule, ConfigService } from '@nestjs/config';
import { DisLockModule } from 'nestjs-dislock';

@Module({
  imports: [
    ConfigModule.forRoot(),
    DisLockModule.forRootAsync({
      imports: [ConfigModule], // DisLockModule sees only what its own imports export
      inject: [ConfigService],
      useFactory: (config: ConfigService) => ({ redis: config.getOrThrow<string>('REDIS_URL') }),
    }),
  ],
})
export class AppModule {}
