import type { DynamicModule } from '@nestjs/common';
import { DisLockSetupError } from '../errors';

/**
 * The `DisLockTestingModule.forRoot()` modules made in this process that no application has read
 * yet. Nest reads a module's `imports` when it scans it; one that is never read was passed to
 * something that dropped it, in practice `.overrideModule(DisLockModule).useModule(...)`, which
 * Nest drops without a word (it matches an override by the very object imported, and
 * `DisLockModule.forRoot()`/`forRootAsync()` return a new one per call).
 */
const unread = new Set<DynamicModule>();

/** Records `module` as unread until Nest reads its `imports`; returns it. */
export function trackTestingModule(module: DynamicModule): DynamicModule {
  const imports = module.imports ?? [];
  unread.add(module);
  // Enumerable, so that Nest's `{ module, ...metadata }` copies it (and so reads it) like a plain field.
  Object.defineProperty(module, 'imports', {
    enumerable: true,
    configurable: true,
    get: () => {
      unread.delete(module);
      return imports;
    },
  });
  return module;
}

const FIX =
  'To run an AppModule on the in-memory store, override its store: ' +
  '`DisLockTestingModule.override(Test.createTestingModule({ imports: [AppModule], providers: [DisLockTesting] })).compile()` ' +
  '(see docs/testing.md, "Testing the whole application").';

/**
 * Stops a `DisLockModule` about to connect to Redis (or Redlock) in an application under test that
 * was meant to run on the in-memory store: `testingModuleInApp` when `DisLockTestingModule.forRoot()`
 * is imported in the same application, or a testing module made and never read (an ignored
 * `overrideModule`). Throws before any connection is made.
 */
export function refuseRedisInTest(testingModuleInApp: boolean): void {
  if (testingModuleInApp) {
    throw new DisLockSetupError(
      'DisLockTestingModule.forRoot() is imported in an application that also has a DisLockModule on Redis ' +
        '(e.g. `imports: [AppModule, DisLockTestingModule.forRoot()]`): it adds a second DisLockModule instead of ' +
        `replacing the app's, which stays on Redis. ${FIX}`,
    );
  }
  if (unread.size > 0) {
    // Reported once: the applications that this process starts next are not stopped for it too.
    unread.clear();
    throw new DisLockSetupError(
      'DisLockModule is about to connect to Redis while a DisLockTestingModule.forRoot() made in this process is ' +
        'part of no application: `.overrideModule(DisLockModule).useModule(DisLockTestingModule.forRoot())` ' +
        'replaces nothing (Nest matches an override by the very object imported, and DisLockModule.forRoot() and ' +
        `forRootAsync() return a new one per call), so the app would lock on Redis. ${FIX}`,
    );
  }
}
