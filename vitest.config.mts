import { fileURLToPath } from 'node:url';
import swc from 'unplugin-swc';
import { defineConfig } from 'vitest/config';

const here = (path: string): string => fileURLToPath(new URL(path, import.meta.url));

// Nest's DI and @DisLock read decorator metadata. SWC emits it as tsc does (the library's build),
// with the same legacy decorators and class-field semantics as tsconfig.json, whatever transform
// the installed Vite uses by default.
const typescript = swc.vite({
  jsc: {
    parser: { syntax: 'typescript', decorators: true },
    transform: { legacyDecorator: true, decoratorMetadata: true, useDefineForClassFields: false },
    target: 'es2022',
    keepClassNames: true,
  },
  module: { type: 'es6' },
  sourceMaps: true,
});

export default defineConfig({
  plugins: [typescript],
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
