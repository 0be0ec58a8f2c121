// @ts-check
import eslint from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  {
    ignores: [
      'dist',
      'coverage',
      'node_modules',
      'sample-app/dist',
      'bench/dist',
      'bench/results',
      // Projects of their own, built and type-checked against the packed tarball by their runner.
      'test/consumers',
      '**/*.js',
      '**/*.mjs',
      '**/*.mts',
    ],
  },
  eslint.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/no-floating-promises': 'error',
    },
  },
  {
    // sample-app/tsconfig.json resolves 'nestjs-dislock' to the built dist/, which CI lints before
    // building; lint the sample through the root tsconfig, which maps it to lib/.
    files: ['sample-app/**/*.ts'],
    languageOptions: {
      parserOptions: { projectService: false, project: './tsconfig.json', tsconfigRootDir: import.meta.dirname },
    },
  },
  {
    // The sample's own unit tests are not in the root tsconfig: the Vitest ones (test/unit) and the
    // Jest ones (test/jest) each have a tsconfig of their own, with their runner's globals.
    files: ['sample-app/test/**/*.ts'],
    languageOptions: {
      parserOptions: {
        projectService: false,
        project: ['./sample-app/test/tsconfig.json', './sample-app/test/jest/tsconfig.json'],
        tsconfigRootDir: import.meta.dirname,
      },
    },
  },
  {
    files: ['lib/**/*.ts'],
    rules: { '@typescript-eslint/no-explicit-any': 'error' },
  },
  {
    // Tests and the sample app talk to loosely typed HTTP bodies and Redis replies.
    files: ['test/**/*.ts', 'sample-app/**/*.ts', 'bench/**/*.ts'],
    rules: {
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
      '@typescript-eslint/unbound-method': 'off',
      '@typescript-eslint/require-await': 'off',
    },
  },
);
