import swc from 'unplugin-swc';
import { defineConfig, mergeConfig } from 'vitest/config';
import base from './vitest.config.js';

// Nest's Vitest recipe: SWC (reading tsconfig.json's experimentalDecorators and
// emitDecoratorMetadata) compiles the TypeScript instead of Vite's own transform.
export default mergeConfig(base, defineConfig({ plugins: [swc.vite({ module: { type: 'es6' } })] }));
