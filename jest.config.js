/** @type {import('jest').Config} */
module.exports = {
  testEnvironment: '<rootDir>/test/support/node-environment.js',
  roots: ['<rootDir>/lib', '<rootDir>/test', '<rootDir>/sample-app'],
  testMatch: ['**/*.spec.ts', '**/*.e2e-spec.ts'],
  transform: { '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.spec.json' }] },
  moduleNameMapper: { '^nestjs-dislock$': '<rootDir>/lib/index.ts' },
  modulePathIgnorePatterns: ['<rootDir>/dist', '<rootDir>/sample-app/dist'],
  globalSetup: '<rootDir>/test/support/global-setup.ts',
  globalTeardown: '<rootDir>/test/support/global-teardown.ts',
  testTimeout: 20_000,
  maxWorkers: 2,
};
