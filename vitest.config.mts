import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

const here = (path: string): string => fileURLToPath(new URL(path, import.meta.url));

// Nest's DI and @DisLock read decorator metadata. Vite 8 compiles TypeScript with Oxc, which
// follows tsconfig.json's `experimentalDecorators` and `emitDecoratorMetadata` and records the same
// `design:*` types as tsc (test/decorator-return-types.e2e-spec.ts checks the ones @DisLock reads).
export default defineConfig({
  resolve: { alias: { 'nestjs-dislock': here('./lib/index.ts') } },
  test: {
    globals: true,
    include: ['lib/**/*.spec.ts', 'test/**/*.spec.ts', 'test/**/*.e2e-spec.ts', 'sample-app/**/*.spec.ts'],
    exclude: ['**/node_modules/**', '**/dist/**', 'test/consumers/**'],
    globalSetup: ['test/support/global-setup.ts'],
    // Each file in a child process of its own: suites start redis-server processes, spawn workers
    // and listen on process events.
    pool: 'forks',
    maxWorkers: 2,
    testTimeout: 20_000,
    hookTimeout: 20_000,
  },
});
