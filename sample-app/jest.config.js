// Jest for the sample app's own unit tests (test/jest/*.jest-spec.ts), next to the Vitest ones in
// test/unit. No Redis: the locks run on DisLockTestingModule's in-memory store.
//
// Nest 12 is ESM only, and Jest's CommonJS `require` loads ESM only on Node 24.9+, so Jest runs
// in its native ESM mode: the TypeScript is compiled to ESM and Jest is started with
// `node --experimental-vm-modules` (see `npm run test:sample-jest`, which `npm test` also runs).
/** @type {import('jest').Config} */
module.exports = {
  rootDir: '.',
  testEnvironment: 'node',
  // `.jest-spec.ts`, not `.spec.ts`: the root Vitest run picks up `sample-app/**/*.spec.ts`.
  testMatch: ['<rootDir>/test/jest/**/*.jest-spec.ts'],
  extensionsToTreatAsEsm: ['.ts'],
  // As vitest.config.mts does: the library from its sources rather than a build.
  moduleNameMapper: { '^nestjs-dislock$': '<rootDir>/../lib/index.ts' },
  transform: {
    // Decorators and their metadata (Nest's DI, @DisLock) come from the tsconfig. ts-jest only
    // transpiles (`isolatedModules`; in ESM mode it reports no type errors anyway):
    // `npm run typecheck:sample-tests` type-checks the tests.
    '^.+\\.ts$': ['ts-jest', { tsconfig: '<rootDir>/test/jest/tsconfig.json', useESM: true }],
  },
  moduleFileExtensions: ['ts', 'js', 'mjs', 'cjs', 'json'],
};
