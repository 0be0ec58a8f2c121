// Jest for a Nest 12 app (ESM: "type": "module"). Nest 12 is ESM only, so Jest runs in its ESM
// mode: started with `node --experimental-vm-modules` (npm run test:jest), `.ts` files treated as
// ESM and compiled by ts-jest with `useESM`. `isolatedModules` in tsconfig.json makes ts-jest
// transpile only (tsc type-checks). The mapper strips the `.js` that nodenext imports carry
// (`'../src/app.module.js'`), so Jest finds the `.ts` file.
/** @type {import('jest').Config} */
export default {
  testEnvironment: 'node',
  rootDir: '.',
  testRegex: '\\.jest-spec\\.ts$',
  moduleFileExtensions: ['js', 'json', 'ts'],
  extensionsToTreatAsEsm: ['.ts'],
  moduleNameMapper: { '^(\\.{1,2}/.*)\\.js$': '$1' },
  transform: { '^.+\\.ts$': ['ts-jest', { useESM: true }] },
};
