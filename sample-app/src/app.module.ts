import { type DynamicModule, Module } from '@nestjs/common';
import { ScheduleModule } from '@nestjs/schedule';
import { TerminusModule } from '@nestjs/terminus';
import { DisLockModule } from 'nestjs-dislock';
import { APP_CONFIG, type AppConfigInput, resolveConfig } from './app.config';
import { DigestJob } from './digest/digest.job';
import { HealthController } from './health/health.controller';
import { InventoryController } from './inventory/inventory.controller';
import { InventoryService } from './inventory/inventory.service';
import { OrdersController } from './orders/orders.controller';
import { OrdersService } from './orders/orders.service';
import { PriceListController } from './prices/price-list.controller';
import { PriceListService } from './prices/price-list.service';
import { RedisService } from './redis.service';
import { ReportArchive } from './reports/report-archive';
import { ReportController } from './reports/report.controller';
import { ReportExportService } from './reports/report-export.service';
import { ReportService } from './reports/report.service';

@Module({})
export class AppModule {
  /** One instance of the app. Start several on the same Redis: the locks work across all of them. */
  static forRoot(input: AppConfigInput): DynamicModule {
    const config = resolveConfig(input);
    return {
      module: AppModule,
      imports: [
        DisLockModule.forRoot({
          redis: config.redisUrl,
          keyPrefix: `${config.keyPrefix}lock:`,
          // Lease of every lock that sets no `expire` of its own (here: all but orders and the digest).
          lockWatchdogTimeout: config.lockWatchdogTimeout,
        }),
        // Runs DigestJob's @Cron on every instance; its lock lets one of them do it per tick.
        ScheduleModule.forRoot(),
        // GET /health: the locks' health indicator.
        TerminusModule.forRoot({ logger: false }),
      ],
      controllers: [OrdersController, ReportController, InventoryController, PriceListController, HealthController],
      providers: [
        { provide: APP_CONFIG, useValue: config },
        RedisService,
        OrdersService,
        ReportService,
        ReportArchive,
        ReportExportService,
        InventoryService,
        PriceListService,
        DigestJob,
      ],
    };
  }
}
