import { ConfigurableModuleBuilder } from '@nestjs/common';
import type { DisLockModuleOptions } from '../options/dislock.options';

export const {
  ConfigurableModuleClass: DisLockConfigurableModule,
  MODULE_OPTIONS_TOKEN: DISLOCK_MODULE_OPTIONS,
  OPTIONS_TYPE: DISLOCK_OPTIONS_TYPE,
  ASYNC_OPTIONS_TYPE: DISLOCK_ASYNC_OPTIONS_TYPE,
} = new ConfigurableModuleBuilder<DisLockModuleOptions>()
  .setClassMethodName('forRoot')
  .setExtras({ isGlobal: true }, (definition, extras) => ({ ...definition, global: extras.isGlobal }))
  .build();
