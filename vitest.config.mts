import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

const here = (path: string): string => fileURLToPath(new URL(path, import.meta.url));

const ALL = ['lib/**/*.spec.ts', 'test/**/*.spec.ts', 'test/**/*.e2e-spec.ts', 'sample-app/**/*.spec.ts'];
/**
 * Suites whose assertions are timing bounds across worker processes (a release wakes a waiter
 * within 100 ms): they run last and alone, so that the heavy process suites of the rest cannot
 * starve their workers of the 2 cores.
 */
const ALONE = ['test/fault-history.e2e-spec.ts'];

// Nest's DI and @DisLock read decorator metadata. Vite 8 compiles TypeScript with Oxc, which
// follows tsconfig.json's `experimentalDecorators` and `emitDecoratorMetadata` and records the same
// `design:*` types as tsc (test/decorator-return-types.e2e-spec.ts checks the ones @DisLock reads).
export default defineConfig({
  resolve: { alias: { 'nestjs-dislock': here('./lib/index.ts') } },
  test: {
    globals: true,
    exclude: ['**/node_modules/**', '**/dist/**', 'test/consumers/**'],
    globalSetup: ['test/support/global-setup.ts'],
    // Each file in a child process of its own: suites start redis-server processes, spawn workers
    // and listen on process events.
    pool: 'forks',
    maxWorkers: 2,
    testTimeout: 20_000,
    hookTimeout: 20_000,
    projects: [
      {
        extends: true,
        test: {
          name: 'suite',
          include: ALL,
          exclude: [...ALONE, '**/node_modules/**', '**/dist/**', 'test/consumers/**'],
        },
      },
      {
        extends: true,
        test: { name: 'alone', include: ALONE, fileParallelism: false, sequence: { groupOrder: 1 } },
      },
    ],
  },
});
