import { defineConfig } from 'vitest/config';
import tsconfigPaths from 'vite-tsconfig-paths';

// As `nest new` (Nest 12) writes it: Vite's own transform (Oxc) emits the decorator metadata that
// Nest's DI reads. vitest.config.swc.ts runs the same tests through SWC, Nest's documented recipe.
export default defineConfig({
  plugins: [tsconfigPaths()],
  test: {
    globals: true,
    root: './',
    include: ['**/*.spec.ts', '**/*.e2e-spec.ts'],
    testTimeout: 15_000,
    hookTimeout: 15_000,
  },
});
